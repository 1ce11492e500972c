"""FSDP2 + expert-parallel training on CPU (gloo), tiny model: exactness where it is exact, the
documented tolerance where it is not, determinism, resume, compare-compatibility and bad input.

Every multi-rank run is a ``torchrun --standalone`` subprocess with a timeout, so a hang fails the test
instead of the suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from convergence.__main__ import main as convergence_main
from convergence.train.data import DataSpec
from convergence.train.ep_identity import compare_runs
from convergence.train.loop import TrainConfig, computed, defaults_for, run
from numerics.tolerances import floor

ROOT = Path(__file__).resolve().parents[3]
STEPS = 10
BASE = ["--model", "tiny", "--steps", str(STEPS), "--val-every", "5", "--ckpt-every", "5", "--threads", "1"]
TIMEOUT_S = 180  # a 10-step tiny EP=2 run takes ~10 s on 2 CI cores; a hang must fail, not stall CI


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.pop("WORLD_SIZE", None)
    return env


def torchrun(nproc: int, args: list[str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "-m", "convergence", "train", *args]
    return subprocess.run(cmd, check=False, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S)


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="session")
def corpus(shared_artifact, stdlib_corpus) -> Path:
    """~0.3 MB of text: each rank tokenizes it in milliseconds (the default corpus takes seconds)."""
    return shared_artifact("corpus.txt", lambda out: stdlib_corpus(out, "argparse.py", "typing.py", "inspect.py",
                                                                    "dataclasses.py"))


@pytest.fixture(scope="session")
def common(corpus) -> list[str]:
    return [*BASE, "--recipe", "bf16", "--data", str(corpus)]


@pytest.fixture(scope="session")
def ep2_run(shared_artifact, common) -> Path:
    def make(out):
        r = torchrun(2, [*common, "--out", str(out), "--ep", "2", "--deterministic"])
        assert r.returncode == 0, r.stderr[-3000:]
    return shared_artifact("ep2-tiny", make)


@pytest.fixture(scope="session")
def single_run(shared_artifact, corpus) -> Path:
    def make(out):
        cfg = TrainConfig(model="tiny", recipes=("bf16",), steps=STEPS, data=DataSpec(path=str(corpus)),
                          **(defaults_for("tiny") | {"val_every": 5, "ckpt_every": 5, "probe_every": 0}))
        run(cfg, out, progress=False)
    return shared_artifact("single-tiny", make)


def test_ep2_rerun_with_activation_checkpointing_stopped_and_resumed_is_bit_identical(ep2_run, common, tmp_path):
    """A second FSDP2 + EP run of the same command, in fresh processes, with every block recomputed in backward (the
    16B's default), stopped after its first step and resumed from its checkpoint: the same bits as the first run in
    every metric, expert load included (the recompute's dispatch must not count tokens twice). The step before the
    stop is compared on its own first, so a difference there (a rerun that is not deterministic, or a recompute
    that changes bits) is told apart from one the resume brings (steps after it)."""
    args = [*common, "--out", str(tmp_path), "--ep", "2", "--deterministic", "--activation-checkpointing",
            "--phase-times"]
    first = torchrun(2, [*args, "--stop-after-minutes", "0"])  # checkpoints after step 1 and stops
    assert first.returncode == 0, first.stderr[-3000:]
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["train"]["activation_checkpointing"]
    (step1,) = _records(tmp_path / "bf16" / "metrics.jsonl")
    assert computed(step1) == computed(_records(ep2_run / "bf16" / "metrics.jsonl")[0]), "rerun or recompute"
    assert (tmp_path / "bf16" / "checkpoint" / "meta.json").exists()
    second = torchrun(2, [*args, "--resume"])
    assert second.returncode == 0, second.stderr[-3000:]
    result = compare_runs(ep2_run, tmp_path)
    assert result["identical"], result["recipes"]["bf16"]["first_difference"]
    assert {"loss", "grad_norm", "val_loss", "expert_load_max_share"} <= set(result["compared_fields"])
    # the measurements (the slowest rank's phases, the largest rank's peak) are logged, outside the comparison
    rec = _records(tmp_path / "bf16" / "metrics.jsonl")[-1]
    assert set(rec["phase_s"]) == {"forward", "backward", "optimizer"} and rec["host_peak_gib"] > 0


def test_ep2_matches_single_process_within_tolerance(ep2_run, single_run):
    config = json.loads((ep2_run / "bf16" / "config.json").read_text())
    assert config["distributed"]["world_size"] == 2 and config["distributed"]["backend_class"] == "AllToAllReference"
    single = json.loads((single_run / "bf16" / "config.json").read_text())
    assert config["init_fingerprint"] == single["init_fingerprint"]  # the same initial weights
    a, b = _records(single_run / "bf16" / "metrics.jsonl"), _records(ep2_run / "bf16" / "metrics.jsonl")
    assert [r["step"] for r in b] == list(range(1, STEPS + 1))
    worst = max(abs(y["loss"] - x["loss"]) / x["loss"] for x, y in zip(a, b))
    tol = floor("training", "bf16", "ep_vs_single_10_steps", "max_rel_loss_diff")
    assert worst <= tol.floor, tol.describe(worst)
    assert all("dispatch_combine_share" in r and 0 <= r["dispatch_combine_share"] <= 1 for r in b)


def test_ep1_under_fsdp_is_bit_identical_to_single_process(single_run, common, tmp_path, monkeypatch):
    """One rank, FSDP2-wrapped, experts through EPDispatch + AllToAllReference: exactly the
    single-process arithmetic (same sort order, same slot fold, clip_grad_norm_'s operations). In this process
    (a one-rank group, torn down after the run): the arithmetic, not a process boundary, is under test."""
    import torch

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    threads = torch.get_num_threads()
    try:
        assert convergence_main(["train", *common, "--out", str(tmp_path), "--ep", "1"]) == 0
    finally:
        torch.set_num_threads(threads)  # --threads 1 set it for this process
    result = compare_runs(single_run, tmp_path)
    assert result["identical"], result["recipes"]["bf16"]["first_difference"]


def test_compare_accepts_distributed_runs_unchanged(ep2_run, single_run, tmp_path, capsys):
    out = tmp_path / "verdict.json"
    code = convergence_main(["compare", str(single_run / "bf16" / "metrics.jsonl"),
                             str(ep2_run / "bf16" / "metrics.jsonl"), "--json", str(out)])
    verdict = json.loads(out.read_text())["verdict"]
    assert verdict in ("equivalent", "not_equivalent", "diverged", "inconclusive")
    assert code == {"equivalent": 0, "not_equivalent": 1, "diverged": 1, "inconclusive": 3}[verdict]
    assert verdict != "diverged", capsys.readouterr().out


def _error_lines(r: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (r.stdout + r.stderr).splitlines() if line.startswith("error:")]


def test_bad_input_found_by_rank0_only_reaches_every_rank(ep2_run, common):
    """Rank 0 alone sees that the output already holds a run; the other rank learns it through one
    collective and exits quietly: one line, every rank gone (no hang: the subprocess has a timeout)."""
    r = torchrun(2, [*common, "--out", str(ep2_run), "--ep", "2", "--deterministic"])
    lines = _error_lines(r)
    assert r.returncode != 0 and len(lines) == 1 and "already holds a run" in lines[0], r.stderr[-2000:]
    assert "[rank" not in r.stdout + r.stderr  # no rank printed a traceback (torchrun's agent reports the exit)


@pytest.mark.parametrize(("world", "rank", "ep", "message"), [
    (None, None, "2", "--ep 2 needs 2 processes but the world size is 1"),  # no torchrun: a 1-rank group
    ("2", "0", None, "pass --ep 2"),  # torchrun without --ep: found before any group exists
    ("2", "1", None, None),
])
def test_bad_input_world_size_one_line_on_rank0(world, rank, ep, message, common, tmp_path, capsys,
                                                monkeypatch):
    """One line from rank 0, nothing from the others, exit code 2 everywhere."""
    for key, value in (("WORLD_SIZE", world), ("RANK", rank)):
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    code = convergence_main(["train", *common, "--out", str(tmp_path), *(["--ep", ep] if ep else [])])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == [] if message is None else (len(err) == 1 and message in err[0]), err


def test_mxfp8_ep2_trains(corpus, tmp_path):
    """MXFP8 (torchao, emulated) under FSDP2 + EP: ranks receive row counts that are not multiples of
    32, which torchao's grouped GEMM needs; EPDispatch pads them (see ep_dispatch.ROW_ALIGN)."""
    args = ["--model", "tiny", "--recipe", "mxfp8", "--steps", "2", "--val-every", "2", "--val-batches", "1",
            "--threads", "1", "--data", str(corpus)]
    r = torchrun(2, [*args, "--out", str(tmp_path), "--ep", "2", "--probe-every", "2"])
    assert r.returncode == 0, r.stderr[-3000:]
    recs = _records(tmp_path / "mxfp8" / "metrics.jsonl")
    assert len(recs) == 2 and all(5.0 < x["loss"] < 6.0 for x in recs)  # ln 256 = 5.55 at the start
    # probes under FSDP2 + EP: every rank probes, rank 0 writes once, sharded dense weights gathered
    (probe,) = _records(tmp_path / "mxfp8" / "probes.jsonl")
    assert probe["step"] == 2 and (probe["rank"], probe["ranks"]) == (0, 2)
    layers = probe["layers"]
    assert any("attention" in f for f in layers) and any("experts" in f for f in layers), sorted(layers)
    # MXFP8 against BF16 on the layer's own inputs: E4M3 gives ~28 dB on Gaussian data; 15 dB is far below
    # any healthy layer and far above a layer run on wrong (e.g. shard-sized) weights, which would not run
    assert all(15 < v < 60 for rec in layers.values() for v in rec.values()), layers


TOKEN_CASES = ("same", "other python", "missing file")


def _tokens_rank(rank: int, corpus: str, out: str) -> None:
    """One rank of the token-agreement cases, one process group per case: load its spec's tokens (their meta
    replaced by this rank's entry, as another host's corpus would make it), write what happened and what it
    printed to ``out/<case>-rank<rank>.json``."""
    import contextlib
    import io

    import torch.distributed as dist

    from convergence.train import data as data_mod
    from convergence.train.data import DataSpec
    from convergence.train.distributed import PeerFailed, load_tokens_everywhere

    real = data_mod.load_tokens
    for n, case in enumerate(TOKEN_CASES):
        good = DataSpec(path=corpus)
        specs = [good, DataSpec(path=str(Path(out, "absent.txt"))) if case == "missing file" else good]
        meta = {"python": "3.12.3"}
        metas = [meta, {"python": "3.11.7", "digest": {"train": "c" * 16, "val": "d" * 16}}
                 if case == "other python" else meta]

        def load(spec, meta=metas[rank]):
            tokens = real(spec)
            tokens.meta.update(meta)
            return tokens

        data_mod.load_tokens = load
        dist.init_process_group("gloo", init_method=f"file://{Path(out, f'store{n}')}", rank=rank,
                                world_size=len(specs))
        printed = io.StringIO()
        try:
            with contextlib.redirect_stderr(printed):
                load_tokens_everywhere(specs[rank])
            result = "agreed"
        except PeerFailed as exc:
            result = f"PeerFailed: {exc}"
        finally:
            dist.destroy_process_group()
        Path(out, f"{case}-rank{rank}.json").write_text(json.dumps({"result": result, "stderr": printed.getvalue()}))


@pytest.fixture(scope="module")
def token_agreement(tmp_path_factory, corpus) -> dict[str, list[dict]]:
    """Each case of the tests below on two spawned ranks, all cases in one spawn (each rank imports torch once)."""
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("tokens")
    mp.spawn(_tokens_rank, args=(str(corpus), str(out)), nprocs=2, join=True)
    return {case: [json.loads((out / f"{case}-rank{r}.json").read_text()) for r in range(2)] for case in TOKEN_CASES}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", TOKEN_CASES)
def test_ranks_that_read_other_tokens_or_none_stop_together(token_agreement, corpus, case):
    """Every rank reads its own host's data: a rank on another Python's standard library (its digest differs), or
    one whose data file is missing, stops every rank with one line from rank 0, instead of one model trained on
    two texts or a rank left waiting; ranks on the same tokens go on (the control)."""
    ranks = token_agreement[case]
    results = [r["result"] for r in ranks]
    if case == "same":
        assert results == ["agreed", "agreed"]
        return
    assert all(r.startswith("PeerFailed") for r in results)
    lines = [[line for line in r["stderr"].splitlines() if line.startswith("error:")] for r in ranks]
    assert len(lines[0]) == 1 and lines[1] == [], lines
    # the line names the rank that differs and what it read
    want = (f"rank 1 {corpus} of Python 3.11.7 (train cccccccccccccccc, val dddddddddddddddd)" if case == "other python"
            else "rank 1: data path")
    assert want in lines[0][0], lines[0][0]
