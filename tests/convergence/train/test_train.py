"""Paired training runs on the tiny model: convergence, pairing, config capture, resume, bad input."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from convergence.__main__ import main as convergence_main
from convergence.train.checkpoint import load_checkpoint
from convergence.train.data import DataSpec
from convergence.train.loop import TrainConfig, computed, defaults_for, lr_at, run
from numerics.errors import BadInput
from numerics.tolerances import floor

ROOT = Path(__file__).resolve().parents[3]


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="session")
def paired(shared_artifact):
    """One 30-step tiny bf16 + mxfp8 run per test session, shared by the xdist workers (read-only:
    tests that change a run copy it first)."""
    def make(out):
        cfg = TrainConfig(model="tiny", recipes=("bf16", "mxfp8"), steps=30, **defaults_for("tiny"))
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # two xdist workers share two cores
        try:
            run(cfg, out, progress=False)
        finally:
            torch.set_num_threads(threads)
    return shared_artifact("paired-tiny", make)


def test_paired_run_losses_fall(paired):
    for recipe in ("bf16", "mxfp8"):
        m = _records(paired / recipe / "metrics.jsonl")
        assert [r["step"] for r in m] == list(range(1, 31))
        first, last = sum(r["loss"] for r in m[:3]) / 3, sum(r["loss"] for r in m[-3:]) / 3
        assert last < 0.75 * first, (recipe, first, last)  # byte-level: ln 256 = 5.5 -> ~3.3
        vals = [r["val_loss"] for r in m if "val_loss" in r]
        assert len(vals) == 3 and vals[-1] < vals[0]


def test_paired_run_mxfp8_differs_from_bf16_by_a_few_percent(paired):
    a = _records(paired / "bf16" / "metrics.jsonl")
    b = _records(paired / "mxfp8" / "metrics.jsonl")
    rel = [abs(x["loss"] - y["loss"]) / x["loss"] for x, y in zip(a, b)]
    hi = floor("training", "mxfp8", "tiny_30_steps", "max_rel_loss_diff")
    lo = floor("training", "mxfp8", "tiny_30_steps", "min_rel_loss_diff")
    assert max(rel) <= hi.floor, hi.describe(max(rel))
    assert rel[0] >= lo.floor, lo.describe(rel[0])


def test_paired_run_shares_initial_weights_and_data(paired):
    a = json.loads((paired / "bf16" / "config.json").read_text())
    b = json.loads((paired / "mxfp8" / "config.json").read_text())
    assert a["init_fingerprint"] == b["init_fingerprint"]
    assert a["data"]["digest"] == b["data"]["digest"]
    assert a["train"] == b["train"]


def test_config_captures_versions_and_recipe(paired):
    c = json.loads((paired / "mxfp8" / "config.json").read_text())
    env = c["environment"]
    assert env["torch"] == torch.__version__ and env["torchao"] and "cuda" in env and "gpus" in env
    assert c["recipe"]["name"] == "mxfp8" and "layers.1.moe.experts.w1" in c["recipe"]["quantized"]
    assert c["recipe"]["torchao_config"]["kernel_preference"] == "EMULATED"
    assert c["tokens_per_step"] == 8 * 128 and c["model"]["name"] == "tiny"


def test_metrics_lines_carry_the_contract_fields(paired):
    r = _records(paired / "mxfp8" / "metrics.jsonl")[9]
    assert {"step", "loss", "grad_norm", "lr", "tokens", "tokens_per_s", "expert_load_max_share",
            "val_loss"} <= set(r)
    shares = r["expert_load_max_share"]
    assert set(shares) == {"layer1", "layer2"} and all(1 / 8 <= s <= 1 for s in shares.values())
    assert r["tokens"] == 10 * 8 * 128


def test_probes_report_every_mxfp8_layer_above_the_floor(paired):
    tol = floor("training", "mxfp8", "probe_layer", "sqnr_db")
    for recipe in ("bf16", "mxfp8"):
        (rec,) = _records(paired / recipe / "probes.jsonl")
        assert rec["step"] == 25
        cfg = json.loads((paired / "mxfp8" / "config.json").read_text())
        assert set(rec["layers"]) == set(cfg["recipe"]["quantized"])
        for layer, stats in rec["layers"].items():
            assert {"out_sqnr_db", "dx_sqnr_db"} < set(stats)
            for key, value in stats.items():
                assert value >= tol.floor, f"{recipe} {layer} {key}: {tol.describe(value)}"


def test_verdict_is_written(paired):
    assert "verdict" in json.loads((paired / "verdict.json").read_text())


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    cfg = TrainConfig(model="tiny", recipes=("bf16",), steps=100, warmup=10)
    lrs = [lr_at(cfg, s) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:])) and lrs[-1] >= cfg.min_lr_ratio


# ------------------------------------------------------------------ resume after a kill
SMALL = ("argparse.py", "typing.py", "inspect.py")  # the standard library modules these tests train on


def _argv(out: Path, corpus: Path, *extra: str) -> list[str]:
    return ["train", "--model", "tiny", "--recipe", "mxfp8", "--steps", "12", "--ckpt-every", "4", "--val-every", "6",
            "--probe-every", "0", "--threads", "1", "--data", str(corpus), "--out", str(out), *extra]


def _in_this_process(argv: list[str]) -> int:
    threads = torch.get_num_threads()
    try:
        return convergence_main(argv)
    finally:
        torch.set_num_threads(threads)  # --threads sets it for the whole process


def test_resume_after_kill_is_bit_identical(tmp_path, stdlib_corpus):
    """A run killed with SIGKILL between checkpoints and continued with --resume in a fresh process logs the same
    curve and ends with the same weights, bit for bit, as the same command run whole (here, in this process:
    test_emulated_mxfp8_is_identical_in_two_fresh_processes shows a process changes no bit)."""
    corpus = stdlib_corpus(tmp_path / "corpus.txt", *SMALL)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "convergence", *_argv(tmp_path / "run", corpus)]
    with open(tmp_path / "run.log", "wb") as log:
        victim = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=log)
        metrics = tmp_path / "run" / "mxfp8" / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if metrics.exists() and metrics.read_text().count("\n") >= 6:
                break
            assert victim.poll() is None, (tmp_path / "run.log").read_text()[-2000:]
            time.sleep(0.02)
        assert victim.poll() is None, "the run finished before it could be killed"
        victim.send_signal(signal.SIGKILL)
        victim.wait()
    killed_at = metrics.read_text().count("\n")
    assert 6 <= killed_at < 12
    done = subprocess.run([*cmd, "--resume"], cwd=ROOT, env=env, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert "mxfp8: resumed from the checkpoint at step " in done.stderr.decode()  # the user is told
    assert _in_this_process(_argv(tmp_path / "ref", corpus)) == 0

    def curve(d):
        return [computed(r)
                for r in _records(d / "mxfp8" / "metrics.jsonl")]

    assert curve(tmp_path / "ref") == curve(tmp_path / "run")
    a = load_checkpoint(tmp_path / "ref" / "mxfp8" / "checkpoint.pt")
    b = load_checkpoint(tmp_path / "run" / "mxfp8" / "checkpoint.pt")
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


# ------------------------------------------------------------------ bad input
def _bad(capsys, *argv) -> str:
    assert convergence_main(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


BASE = ["--model", "tiny", "--steps", "1"]


def test_layers_trains_the_models_first_layers_at_its_widths_and_refuses_a_depth_it_does_not_have(capsys, tmp_path):
    """--layers N (a 16b whose checkpoint fits the disk): the model's first N layers, every width
    and the vocabulary as the model's; a depth below one MoE layer or above the model's is one line."""
    from numerics.layer.configs import get_config

    full = get_config("tiny")
    assert convergence_main(["train", *BASE, "--recipe", "bf16", "--layers", "2", "--ckpt-every", "0",
                             "--out", str(tmp_path / "r")]) == 0
    capsys.readouterr()
    model = json.loads((tmp_path / "r" / "bf16" / "config.json").read_text())["model"]
    assert model["n_layers"] == 2 and model["n_dense_layers"] == full.n_dense_layers == 1
    assert {k: v for k, v in model.items() if k != "n_layers"} == {
        k: v for k, v in dataclasses.asdict(full).items() if k != "n_layers"} | {"vocab_size": model["vocab_size"]}
    for layers in ("1", str(full.n_layers + 1)):  # the line names the option and the depths it takes: 2 to 3
        assert re.search(r"--layers\b.*\b2\b.*\b3\b", _bad(capsys, *BASE, "--layers", layers, "--out",
                                                           str(tmp_path / "x")))


def test_unknown_model_and_recipe_list_the_valid_ones(capsys, tmp_path):
    assert "tiny, proxy, 16b" in _bad(capsys, "--model", "huge", "--steps", "1", "--out", str(tmp_path))
    assert "bf16, mxfp8, mxfp8-wgrad-hp" in _bad(capsys, *BASE, "--recipe", "fp4", "--out", str(tmp_path))


def test_steps_must_be_positive(capsys, tmp_path):
    assert "--steps" in _bad(capsys, "--model", "tiny", "--steps", "0", "--out", str(tmp_path))


def test_missing_or_too_small_data(capsys, tmp_path):
    missing = tmp_path / "no.txt"
    assert str(missing) in _bad(capsys, *BASE, "--data", str(missing), "--out", str(tmp_path / "o"))
    (tmp_path / "small.txt").write_text("tiny text " * 20)
    err = _bad(capsys, *BASE, "--data", str(tmp_path / "small.txt"), "--out", str(tmp_path / "o"))
    assert "1025" in err  # the tokens one batch needs (8 x 128 + 1), which the data does not yield


def test_existing_run_is_not_overwritten_and_resume_names_the_differing_field(capsys, tmp_path, paired):
    out = tmp_path / "copy"
    shutil.copytree(paired, out)
    before = (out / "bf16" / "metrics.jsonl").read_bytes()
    err = _bad(capsys, *BASE, "--recipe", "bf16", "--out", str(out))
    assert "--resume" in err and "--force" in err
    err = _bad(capsys, "--model", "tiny", "--steps", "30", "--seed", "7", "--recipe", "bf16", "--resume",
               "--out", str(out))
    assert "seed=0" in err and "seed=7" in err
    assert (out / "bf16" / "metrics.jsonl").read_bytes() == before


def _checksums(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_resume_from_a_damaged_checkpoint_is_one_line_and_changes_nothing(capsys, tmp_path, paired, damage):
    """A truncated, garbage or empty checkpoint.pt is one line naming it, exit 2, not torch's traceback
    (PytorchStreamReader, UnpicklingError, EOFError)."""
    out = tmp_path / "copy"
    shutil.copytree(paired, out)
    ckpt = out / "bf16" / "checkpoint.pt"
    data = ckpt.read_bytes()
    ckpt.write_bytes({"truncated": data[: len(data) // 2], "garbage": os.urandom(4096), "empty": b""}[damage])
    before = _checksums(out)
    err = _bad(capsys, "--model", "tiny", "--steps", "30", "--recipe", "bf16", "--resume", "--out", str(out))
    assert str(ckpt) in err and "--force" in err and "Traceback" not in err
    assert _checksums(out) == before


def test_resume_without_a_checkpoint_refuses_instead_of_restarting(capsys, tmp_path, paired):
    """With checkpoint.pt deleted after steps were logged, --resume refuses in one line rather than restart at step 1
    over the logged metrics.jsonl."""
    out = tmp_path / "copy"
    shutil.copytree(paired, out)
    (out / "mxfp8" / "checkpoint.pt").unlink()
    before = _checksums(out)
    err = _bad(capsys, "--model", "tiny", "--steps", "30", "--recipe", "mxfp8", "--resume", "--out", str(out))
    assert "logged 30 steps but has no checkpoint" in err
    assert _checksums(out) == before


def test_another_recipe_into_an_existing_run_keeps_its_verdict(capsys, tmp_path, paired):
    """--recipe mxfp8-wgrad-hp into a run of bf16 + mxfp8 keeps its verdict.json: one recipe compares nothing and
    writes no verdict; two other recipes would replace it and are refused."""
    out = tmp_path / "copy"
    shutil.copytree(paired, out)
    verdict = (out / "verdict.json").read_bytes()
    assert convergence_main(["train", *BASE, "--recipe", "mxfp8-wgrad-hp", "--ckpt-every", "0",
                             "--out", str(out)]) == 0
    assert "no verdict: only one recipe" in capsys.readouterr().out
    assert (out / "verdict.json").read_bytes() == verdict
    before = _checksums(out)
    err = _bad(capsys, *BASE, "--recipe", "bf16", "--recipe", "mxfp8-wgrad-hp", "--out", str(tmp_path / "copy"))
    assert "bf16" in err  # the run already there
    shutil.rmtree(out / "bf16")
    shutil.rmtree(out / "mxfp8-wgrad-hp")
    before = _checksums(out)
    err = _bad(capsys, *BASE, "--recipe", "bf16", "--recipe", "mxfp8-wgrad-hp", "--out", str(out))
    assert "verdict.json" in err and "--force" in err  # the verdict another pair of recipes would replace
    assert _checksums(out) == before


def test_an_unwritable_out_is_one_line(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert str(blocker / "run") in _bad(capsys, *BASE, "--out", str(blocker / "run"))
    assert str(blocker) in _bad(capsys, *BASE, "--out", str(blocker))
    assert blocker.read_text() == "not a folder"


def test_train_prints_the_verdict_with_its_reason_and_exits_as_compare_does(capsys, paired):
    """train prints the verdict with its reason and exits with the code compare gives the same runs."""
    from convergence.train.cli import report_verdict

    result = json.loads((paired / "verdict.json").read_text())
    code = report_verdict(result, paired)
    out = capsys.readouterr().out
    r = result["candidates"]["mxfp8"]
    assert f"mxfp8 against bf16: {r['verdict'].upper()}: {r['reason']}" in out
    compare_code = convergence_main(["compare", str(paired / "bf16" / "metrics.jsonl"),
                                     str(paired / "mxfp8" / "metrics.jsonl")])
    assert code == compare_code


def test_resume_of_a_finished_run_changes_nothing(tmp_path, paired):
    out = tmp_path / "copy"
    shutil.copytree(paired, out)
    before = (out / "bf16" / "metrics.jsonl").read_bytes()
    cfg = dataclasses.replace(TrainConfig(model="tiny", recipes=("bf16",), steps=30, **defaults_for("tiny")))
    run(cfg, out, resume=True, progress=False)
    assert (out / "bf16" / "metrics.jsonl").read_bytes() == before


def test_a_stopped_run_exits_4_and_a_finished_one_resumed_again_exits_with_its_verdict(capsys, tmp_path, paired):
    """A run stopped by --stop-after-minutes exits 4 (incomplete, as protocol's), not 0 as a finished one; --resume
    on a finished paired run trains nothing and exits with its verdict's code, redrawing its own curves.png."""
    stopped = tmp_path / "stopped"
    argv = ["train", "--model", "tiny", "--recipe", "bf16", "--steps", "30", "--out", str(stopped)]
    assert convergence_main([*argv, "--stop-after-minutes", "0"]) == 4
    assert "stopped before the end" in capsys.readouterr().out
    out = tmp_path / "copy"
    shutil.copytree(paired, out)
    before = {f: (out / f).read_bytes() for f in ("bf16/metrics.jsonl", "mxfp8/metrics.jsonl")}
    code = convergence_main(["train", "--model", "tiny", "--recipe", "bf16", "--recipe", "mxfp8", "--steps", "30",
                             "--out", str(out), "--resume"])
    compare_code = convergence_main(["compare", str(out / "bf16" / "metrics.jsonl"),
                                     str(out / "mxfp8" / "metrics.jsonl")])
    assert code == compare_code and (out / "curves.png").is_file()  # the finished run's verdict, not an error
    assert {f: (out / f).read_bytes() for f in before} == before  # nothing trained again


def test_a_verdicts_figures_are_replaced_with_it_and_guarded_with_it(tmp_path, paired):
    """Several candidates draw curves_<candidate>.png, the verdict's files: removed by --force, replaced by a run
    that may replace its verdict, and they guard a folder as verdict.json does (the control)."""
    from convergence.train.loop import check_run_dir, compare_and_plot

    out = tmp_path / "three"
    shutil.copytree(paired, out)
    shutil.copytree(paired / "mxfp8", out / "mxfp8-e2m1")  # a second candidate, its logs borrowed
    (out / "verdict.json").unlink()
    (out / "curves.png").unlink()
    recipes = ("bf16", "mxfp8", "mxfp8-e2m1")
    for _ in range(2):  # the second time over the first's figures
        compare_and_plot(out, recipes)
    assert sorted(p.name for p in out.glob("curves*.png")) == ["curves_mxfp8-e2m1.png", "curves_mxfp8.png"]
    cfg = TrainConfig(model="tiny", recipes=recipes, steps=30, **defaults_for("tiny"))
    with pytest.raises(BadInput, match="compares bf16, mxfp8, mxfp8-e2m1"):  # other recipes would replace them
        check_run_dir(dataclasses.replace(cfg, recipes=("bf16", "mxfp8-e2m1")), out, resume=True, force=False)
    (out / "verdict.json").unlink()
    with pytest.raises(BadInput, match="curves_mxfp8-e2m1.png"):  # a figure alone guards a new
        check_run_dir(dataclasses.replace(cfg, recipes=("mxfp8-e5m2", "mxfp8-floor")), out, resume=False,  # run
                      force=False)
    check_run_dir(cfg, out, resume=True, force=False)  # but not the folder's own runs continued (a kill left them)
    check_run_dir(cfg, out, resume=False, force=True)
    assert not list(out.glob("curves*.png")) and not (out / "bf16").exists()


def test_a_fast_only_recipe_without_the_fast_kernel_is_refused_before_any_run(capsys, tmp_path, monkeypatch):
    """E5M2/E2M1 run on the fast kernel only, which --mxfp8-kernel auto picks for them; without Triton, train and
    protocol refuse them before any run: one line, exit 2, nothing trained; recipes the emulated kernel computes
    pass (the control)."""
    from numerics.layer.fast import cast
    from numerics.layer.recipes import check_recipe_kernels

    monkeypatch.setitem(sys.modules, "triton", None)  # import fails as if it were not installed
    monkeypatch.setattr(cast, "_available", functools.cache(cast._available.__wrapped__))  # a cache of its own
    check_recipe_kernels(("bf16", "mxfp8"), "auto", "cpu")
    check_recipe_kernels(("mxfp8-e5m2",), "auto", None)  # a folder only judged: no kernel runs
    for argv in (["train", "--model", "tiny", "--recipe", "mxfp8-e5m2", "--steps", "2", "--out", str(tmp_path / "t")],
                 ["protocol", "--model", "tiny", "--steps", "20", "--replicates", "2", "--control", "mxfp8-e2m1",
                  "--device", "cpu", "--out", str(tmp_path / "p")]):
        assert convergence_main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "mxfp8-e" in err and "Triton" in err, err  # the recipe; what it needs
        assert "emulated" not in err  # the fast kernel's usual advice does not hold for these recipes
    assert not (tmp_path / "t").exists() and not (tmp_path / "p").exists()


def test_a_run_killed_before_its_first_checkpoint_starts_again_on_resume(capsys, tmp_path, paired):
    """A kill before a recipe's first checkpoint (3 steps logged, or 10 while the first was being written): --resume
    starts that recipe again from step 0, saying so, to the same bits as an uninterrupted run, and keeps the other,
    finished recipe; past its first checkpoint the refusal stays (the control:
    test_resume_without_a_checkpoint_refuses_instead_of_restarting)."""
    out = tmp_path / "killed"
    shutil.copytree(paired, out)
    log = out / "bf16" / "metrics.jsonl"
    log.write_text("".join(log.read_text().splitlines(keepends=True)[:3]))  # what a kill at step 3 leaves
    (out / "bf16" / "checkpoint.pt").unlink()
    (out / "verdict.json").unlink()
    (out / "curves.png").unlink()
    argv = ["train", "--model", "tiny", "--recipe", "bf16", "--recipe", "mxfp8", "--steps", "30", "--out", str(out)]
    code = convergence_main([*argv, "--resume"])
    assert code != 2 and "bf16: no checkpoint yet (stopped before its first): starting again" in capsys.readouterr().err
    assert [computed(r) for r in _records(log)] == [computed(r) for r in _records(paired / "bf16" / "metrics.jsonl")]


def test_a_kill_between_the_verdict_and_its_figure_leaves_a_folder_resume_completes(tmp_path, paired):
    """A kill between the verdict's figure and verdict.json (or mid-write of the figure) leaves a folder --resume
    completes without retraining; its verdict is the finished run's, and no temporary is left."""
    out = tmp_path / "killed"
    shutil.copytree(paired, out)
    want = json.loads((paired / "verdict.json").read_text())["verdict"]
    (out / "verdict.json").unlink()  # what the kill left: the figure, no verdict
    (out / ".curves.png.x1y2z3.tmp").write_bytes(b"half a figure")  # and one killed mid-write: removed too
    argv = ["train", "--model", "tiny", "--recipe", "bf16", "--recipe", "mxfp8", "--steps", "30", "--out", str(out)]
    code = convergence_main([*argv, "--resume"])
    assert json.loads((out / "verdict.json").read_text())["verdict"] == want and code != 2
    assert (out / "curves.png").is_file() and not list(out.glob(".*.tmp"))


def test_more_validation_batches_than_the_split_holds_are_said_and_recorded(capsys, tmp_path):
    """--val-batches above what the held-out split holds evaluates on all there are (the proxy's protocol asks 22
    and gets 18 on Python 3.12.3): said once at the run's start and recorded in config.json (batches used,
    asked); a count the split holds is recorded without a word (the control)."""
    from convergence.train.data import Batches, DataSpec, load_tokens

    text = tmp_path / "small.txt"  # a small held-out split: seconds, where the default corpus's takes a minute
    text.write_text("".join(f"line {i} of a small corpus for a short run\n" for i in range(800)))
    spec = DataSpec(path=str(text), val_percent=20)
    held = Batches(load_tokens(spec).val, batch=8, seq=128, seed=0).eval_count(10**6)
    assert 1 < held < 10
    for asked, out in ((held + 5, tmp_path / "more"), (held - 1, tmp_path / "fewer")):
        argv = ["train", "--model", "tiny", "--recipe", "bf16", "--steps", "2", "--val-every", "2", "--data",
                str(text), "--val-percent", "20", "--val-batches", str(asked), "--probe-every", "0",
                "--out", str(out)]
        assert convergence_main(argv) == 0
        said = f"the held-out split holds {held} batches of 8 x 128" in capsys.readouterr().err
        config = json.loads((out / "bf16" / "config.json").read_text())
        used = min(asked, held)
        assert config["validation"] == {"batches": used, "asked": asked} and said == (asked > held)
        assert len(_records(out / "bf16" / "metrics.jsonl")[-1]["val_batch_losses"]) == used


def test_resume_on_other_tokens_is_refused_in_one_line_and_changes_nothing(capsys, tmp_path, paired):
    """The default corpus is the running Python's standard library: a run continued under another Python version
    would train its second half on other text under the same command line. Here the recorded digest is changed,
    as another Python's corpus would have it (test_resume_of_a_finished_run_changes_nothing is the control)."""
    out = tmp_path / "copy"
    shutil.copytree(paired, out)
    path = out / "bf16" / "config.json"
    config = json.loads(path.read_text())
    config["data"].update(python="3.99.0", digest={"train": "0" * 16, "val": "1" * 16})
    path.write_text(json.dumps(config))
    before = (out / "bf16" / "metrics.jsonl").read_bytes()
    err = _bad(capsys, "--model", "tiny", "--steps", "30", "--recipe", "bf16", "--resume", "--out", str(out))
    assert "Python 3.99.0 (train 0000000000000000" in err  # what the run was trained on
    assert (out / "bf16" / "metrics.jsonl").read_bytes() == before and json.loads(path.read_text()) == config


def test_a_run_started_before_a_field_existed_resumes_with_that_fields_default(capsys, tmp_path, paired):
    """A config.json without the fields --layers, --optimizer-state and --val-percent record (written by a version
    without them) ran with their defaults, so --resume accepts it; a field that differs is still named."""
    out = tmp_path / "copy"
    shutil.copytree(paired, out)
    path = out / "bf16" / "config.json"
    config = json.loads(path.read_text())
    for key in ("layers", "optimizer_state"):
        del config["train"][key]
    del config["train"]["data"]["val_percent"]
    path.write_text(json.dumps(config))
    before = (out / "bf16" / "metrics.jsonl").read_bytes()
    run(TrainConfig(model="tiny", recipes=("bf16",), steps=30, **defaults_for("tiny")), out, resume=True,
        progress=False)
    assert (out / "bf16" / "metrics.jsonl").read_bytes() == before
    err = _bad(capsys, "--model", "tiny", "--steps", "30", "--recipe", "bf16", "--val-percent", "20", "--resume",
               "--out", str(out))
    assert "'val_percent': None" in err and "'val_percent': 20" in err


def test_probes_change_no_trained_bit(tmp_path, monkeypatch, stdlib_corpus):
    """The protocol probes its MXFP8 runs and not its BF16 ones, so a probe that moved training would bias every
    MXFP8 verdict by its own effect: an MXFP8 run probed every other step trains the same bits as one never
    probed. A probe planted to nudge one weight is told apart (the control). Four steps: the probe after step 2 is
    followed by two training steps and an evaluation, where a moved weight shows (the control's, from step 3)."""
    from convergence.train import probes as probes_mod
    from convergence.train.ep_identity import compare_runs

    d = defaults_for("tiny") | dict(batch=2, seq=32, val_every=3, val_batches=2, ckpt_every=0,
                                    data=DataSpec(path=str(stdlib_corpus(tmp_path / "corpus.txt", *SMALL))))
    for every in (0, 2):
        run(TrainConfig(model="tiny", recipes=("mxfp8",), steps=4, **(d | {"probe_every": every})),
            tmp_path / f"probe{every}", progress=False)
    assert (tmp_path / "probe2" / "mxfp8" / "probes.jsonl").stat().st_size > 0
    result = compare_runs(tmp_path / "probe0", tmp_path / "probe2")
    assert result["identical"], result["recipes"]["mxfp8"]["first_difference"]

    real = probes_mod.probe

    def nudging(model, *args, **kwargs):
        with torch.no_grad():
            next(model.parameters()).add_(1e-3)
        return real(model, *args, **kwargs)

    monkeypatch.setattr(probes_mod, "probe", nudging)
    run(TrainConfig(model="tiny", recipes=("mxfp8",), steps=4, **(d | {"probe_every": 2})), tmp_path / "nudged",
        progress=False)
    assert compare_runs(tmp_path / "probe0", tmp_path / "nudged")["recipes"]["mxfp8"]["first_difference"]["step"] == 3


@pytest.mark.gpu
def test_paired_run_on_cuda(tmp_path):
    cfg = TrainConfig(model="tiny", recipes=("bf16", "mxfp8"), steps=5, device="cuda",
                      **(defaults_for("tiny") | {"probe_every": 5, "val_every": 5}))
    run(cfg, tmp_path, progress=False)
    for recipe in cfg.recipes:
        m = _records(tmp_path / recipe / "metrics.jsonl")
        assert len(m) == 5 and all(r["loss"] == r["loss"] for r in m)
        assert json.loads((tmp_path / recipe / "config.json").read_text())["environment"]["gpus"]


@pytest.mark.gpu
def test_adamw_moments_in_host_memory_train_and_resume_the_same_bits_on_cuda(tmp_path):
    """--optimizer-state host on one GPU: the same bits as the moments on the GPU, also across a checkpoint
    (pinned host tensors saved, loaded back to host memory) and a resume."""
    from convergence.train.ep_identity import compare_runs

    cfg = TrainConfig(model="tiny", recipes=("bf16",), steps=6, device="cuda", deterministic=True,
                      **(defaults_for("tiny") | {"probe_every": 0, "val_every": 2, "ckpt_every": 2}))
    run(cfg, tmp_path / "device", progress=False)
    host = dataclasses.replace(cfg, optimizer_state="host")
    assert run(host, tmp_path / "host", progress=False, stop_after_s=0) is None  # a checkpoint after step 1
    run(host, tmp_path / "host", resume=True, progress=False)
    for where, state in (("device", "device"), ("host", "host")):  # auto chose the GPU for the tiny model
        assert json.loads((tmp_path / where / "bf16" / "config.json").read_text())["train"]["optimizer_state"] == state
    result = compare_runs(tmp_path / "device", tmp_path / "host")
    assert result["identical"], result["recipes"]["bf16"]["first_difference"]


def test_bench_smoke_prints_the_step_time_ratio(capsys):
    from convergence.train.cli import bench_main
    from convergence.train.perf.bench import step_flops
    from numerics.layer.configs import get_config, param_count

    # the emulated kernel only: the fast one runs in Triton's interpreter on a CPU (seconds a step), and timing it
    # here says nothing about a GPU; its bits are held to emulated's by test_fast_kernel_trains_bit_identically_...
    assert bench_main(["--model", "tiny", "--device", "cpu", "--batch", "2", "--seq", "64", "--steps", "1",
                       "--warmup", "0", "--no-compile", "--kernel", "emulated", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "step-time ratio mxfp8/emulated" in out
    c = get_config("16b")
    assert step_flops(c, 4096) > 6 * (param_count(c)["active"] - param_count(c)["embedding"])


def _fast_problem() -> str | None:
    from numerics.layer.mxfp8 import kernel_problem

    return kernel_problem("fast", "cpu")


@pytest.mark.skipif(_fast_problem() is not None, reason=f"{_fast_problem()}")
def test_fast_kernel_trains_bit_identically_to_emulated(tmp_path, stdlib_corpus):
    """The fast casts change no trained bit: one tiny MXFP8 step and an evaluation after it give identical metrics
    (loss, gradient norm, validation loss). One step is the smallest run that still takes every kernel a training
    run uses: forward, both backward GEMMs, and a forward on weights one AdamW update changed; each takes ~5 s of
    CPU in Triton's interpreter, so a second step would repeat them on other values, which the layer level's
    property tests (tests/numerics/layer/test_fast.py) already vary."""
    d = defaults_for("tiny") | dict(batch=2, seq=32, val_every=1, val_batches=1, probe_every=0, ckpt_every=0,
                                    data=DataSpec(path=str(stdlib_corpus(tmp_path / "corpus.txt", *SMALL))))
    metrics = {}
    for kernel in ("emulated", "fast"):
        cfg = TrainConfig(model="tiny", recipes=("mxfp8",), steps=1, mxfp8_kernel=kernel, **d)
        run(cfg, tmp_path / kernel, progress=False)
        metrics[kernel] = [computed(r)
                           for r in _records(tmp_path / kernel / "mxfp8" / "metrics.jsonl")]
        assert json.loads((tmp_path / kernel / "mxfp8" / "config.json").read_text())["recipe"]["kernel"] == kernel
    assert len(metrics["fast"]) == 1 and {"loss", "grad_norm", "val_loss"} <= set(metrics["fast"][0])
    assert metrics["fast"] == metrics["emulated"]


def test_emulated_mxfp8_is_identical_in_two_fresh_processes(tmp_path):
    """The same short MXFP8 run in two fresh processes started together, one with 1 torch thread and one with 2,
    logs identical metrics, bit for bit. The default batch is kept: its activations (8 x 128 tokens x 64 wide,
    65,536 values) are above ATen's parallel grain (32,768), so the 2-thread process does split its operations.
    So is the default corpus, on which the property holds: on other text (argparse.py, typing.py and inspect.py of
    the standard library as --data) the emulated MXFP8 run differs between 1 and 2 threads from step 3, while BF16
    does not."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    runs = []
    for threads in (1, 2):
        out = tmp_path / f"t{threads}"
        cmd = [sys.executable, "-m", "convergence", "train", "--model", "tiny", "--recipe", "mxfp8", "--steps", "4",
               "--val-every", "4", "--val-batches", "1", "--ckpt-every", "0", "--probe-every", "0",
               "--threads", str(threads), "--out", str(out)]
        runs.append((out, subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)))
    for _, p in runs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err.decode()[-2000:]
    curves = [[computed(r) for r in _records(out / "mxfp8" / "metrics.jsonl")]
              for out, _ in runs]
    assert len(curves[0]) == 4 and "val_loss" in curves[0][-1]
    assert curves[0] == curves[1]


def test_deterministic_flag_holds_for_the_run_on_one_process_and_is_restored(tmp_path, monkeypatch, stdlib_corpus):
    """--deterministic on one process: PyTorch's deterministic algorithms are on while the run trains and
    as before afterwards (not only under torchrun)."""
    from convergence.train import loop

    seen = []
    real_loss_of = loop.loss_of
    monkeypatch.setattr(loop, "loss_of", lambda *a: seen.append(torch.are_deterministic_algorithms_enabled())
                        or real_loss_of(*a))
    d = defaults_for("tiny") | dict(batch=2, seq=32, val_every=0, val_batches=1, probe_every=0, ckpt_every=0,
                                    data=DataSpec(path=str(stdlib_corpus(tmp_path / "corpus.txt", *SMALL))))
    before = torch.are_deterministic_algorithms_enabled()
    for flag in (True, False):
        seen.clear()
        run(TrainConfig(model="tiny", recipes=("bf16",), steps=1, deterministic=flag, **d), tmp_path / str(flag),
            progress=False)
        assert seen and all(s == (flag or before) for s in seen), (flag, seen)
        assert torch.are_deterministic_algorithms_enabled() == before


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux's /proc/self/clear_refs")
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_run_does_not_inherit_the_memory_peaks_of_what_ran_before_it_in_the_process(tmp_path, device):
    """The protocol trains its runs one after another in one process: each run's logged host and GPU peaks are its
    own, not those of a run before it (a resumed one reading a large checkpoint, an MXFP8 one). Control: the
    process's own peaks (ru_maxrss, CUDA's allocator statistics) still hold the 1 GiB blocks made before the run,
    which the run's figures must not."""
    import resource

    def host_gib():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20

    block = bytearray(2**30)
    block[::4096] = b"\x01" * len(block[::4096])  # resident: every page touched
    host_before = host_gib()
    del block
    assert host_gib() == host_before  # the control: a process's peak outlives what made it
    if device == "cuda":
        held = torch.cuda.memory_allocated() / 2**30  # what earlier tests in this process still hold, if anything
        gpu_block = torch.ones(2**28, device=device)  # 1 GiB of float32
        del gpu_block
        assert torch.cuda.max_memory_allocated() / 2**30 >= held + 1
    args = ["train", "--model", "tiny", "--recipe", "bf16", "--steps", "2", "--batch", "2", "--seq", "32",
            "--val-every", "2", "--val-batches", "1", "--threads", "1", "--device", device, "--out", str(tmp_path)]
    assert convergence_main(args) == 0
    records = _records(tmp_path / "bf16" / "metrics.jsonl")
    # the tiny run needs far less than a 1 GiB block (~0.1 GiB of host memory above what the process held)
    assert max(r["host_peak_gib"] for r in records) <= host_gib() < host_before - 0.5
    if device == "cuda":  # the run's peak counts what the process holds, which is not the run's to drop
        assert max(r["gpu_peak_gib"] for r in records) < held + 0.5


def test_phase_times_and_peak_memory_are_measured_and_change_no_computed_bit(tmp_path, stdlib_corpus):
    """Where a step's time goes and how much memory it takes: every record has the run's peak
    host memory (and GPU memory on a GPU), and --phase-times adds forward / backward / optimizer seconds that
    fit inside the step; none of it changes the curve, which is bit-identical without them."""
    args = ["train", "--model", "tiny", "--recipe", "bf16", "--steps", "3", "--batch", "4", "--seq", "32",
            "--data", str(stdlib_corpus(tmp_path / "corpus.txt", *SMALL)),
            "--val-every", "3", "--val-batches", "1", "--threads", "1"]
    assert convergence_main([*args, "--out", str(tmp_path / "plain")]) == 0
    assert convergence_main([*args, "--out", str(tmp_path / "timed"), "--phase-times"]) == 0
    plain, timed = (_records(tmp_path / d / "bf16" / "metrics.jsonl") for d in ("plain", "timed"))
    assert [computed(r) for r in plain] == [computed(r) for r in timed]
    assert "phase_s" not in plain[0] and "gpu_peak_gib" not in plain[0]  # a CPU run has no GPU figure
    hosts = [r["host_peak_gib"] for r in timed]
    assert 0 < hosts[0] <= hosts[-1] < 1024  # a peak: it never falls
    for r in timed:
        phases = r["phase_s"]
        assert set(phases) == {"forward", "backward", "optimizer"} and all(v > 0 for v in phases.values())
        step_s = 4 * 32 / r["tokens_per_s"]
        assert sum(phases.values()) <= step_s * 1.001  # the phases are parts of the timed step
    assert json.loads((tmp_path / "timed" / "bf16" / "config.json").read_text())["train"]["phase_times"] is True


def test_a_run_that_diverges_is_judged_diverged(capsys, tmp_path):
    """A NaN loss stops training (loop: 'the comparison reports it') and is logged as null (JSON has no NaN); the
    verdict must then read it back as the NaN it was and say ``diverged`` (exit 1), as ``compare`` on the logs
    does, not refuse the logs as bad input (exit 2)."""
    out = tmp_path / "run"
    code = convergence_main(["train", "--model", "tiny", "--steps", "6", "--lr", "1e6", "--ckpt-every", "0",
                             "--out", str(out)])
    verdict = json.loads((out / "verdict.json").read_text())["candidates"]["mxfp8"]
    assert code == 1 and verdict["verdict"] == "diverged" and verdict["divergence"]["kind"] == "non_finite"
    assert '"loss": null' in (out / "mxfp8" / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert convergence_main(["compare", str(out / "bf16" / "metrics.jsonl"), str(out / "mxfp8" / "metrics.jsonl")]) == 1
    assert "DIVERGED" in capsys.readouterr().out


def test_train_help_describes_the_command_in_whole_sentences(capsys):
    """The description is the docstring's whole first paragraph: its first line alone stops mid-sentence."""
    with pytest.raises(SystemExit) as exc:
        convergence_main(["train", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    description = out.split("\n\n")[1]  # usage, description, options
    assert description.startswith("python -m convergence train: paired BF16 / MXFP8 pretraining runs")
    assert " ".join(description.split()).endswith("on one process or under ``torchrun --nproc-per-node N ... --ep N``.")
