"""Forks (convergence.train.checkpoint) on the tiny model: a trunk stopped at a step, forks from its checkpoint that
continue it bit for bit or perturbed, into another recipe, through a stop and --resume, and the inputs a fork
refuses."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from convergence.__main__ import main as convergence_main
from convergence.curves.compare import compare_paths
from convergence.train.checkpoint import load_checkpoint
from convergence.train.loop import computed

STEPS, FORK = 12, 6
COMMON = ["--model", "tiny", "--steps", str(STEPS), "--ckpt-every", "4", "--val-every", "3", "--probe-every", "0",
          "--batch", "4", "--seq", "64", "--threads", "1"]


def _train(*argv: str) -> int:
    return convergence_main(["train", *COMMON, *argv])


def _curve(run: Path) -> list[dict]:
    return [computed(json.loads(line)) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _weights(run: Path) -> dict:
    return load_checkpoint(run / "checkpoint.pt")["model"]


def _same_weights(a: Path, b: Path) -> bool:
    wa, wb = _weights(a), _weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An uninterrupted 12-step BF16 run, and a trunk: the same command stopped at step 6 (exit 0, no verdict)."""
    root = tmp_path_factory.mktemp("fork")
    assert _train("--recipe", "bf16", "--out", str(root / "ref")) == 0
    assert _train("--recipe", "bf16", "--out", str(root / "trunk"), "--stop-at-step", str(FORK)) == 0
    return root


def test_a_trunk_stops_at_its_step_with_a_checkpoint_there_and_continues_as_the_uninterrupted_run(runs, tmp_path):
    trunk = runs / "trunk" / "bf16"
    assert load_checkpoint(trunk / "checkpoint.pt")["step"] == FORK
    assert _curve(trunk) == _curve(runs / "ref" / "bf16")[:FORK]  # the whole run's schedule up to the fork step
    cont = tmp_path / "trunk"
    shutil.copytree(runs / "trunk", cont)
    assert _train("--recipe", "bf16", "--out", str(cont), "--resume") == 0
    assert _curve(cont / "bf16") == _curve(runs / "ref" / "bf16")


def test_a_fork_without_perturbation_continues_its_trunk_bit_for_bit_and_another_recipe_runs(runs, tmp_path, capsys):
    """BF16 and MXFP8 forked from the BF16 trunk at step 6 in one command: the BF16 fork is the uninterrupted run,
    record for record and weight for weight; the MXFP8 fork trains from the trunk's weights (its first six records
    are the trunk's), its config names the trunk, and the pair is compared as any two runs are (verdict.json)."""
    out = tmp_path / "forks"
    code = _train("--recipe", "bf16", "--recipe", "mxfp8", "--out", str(out), "--fork-from",
                  str(runs / "trunk" / "bf16"), "--fork-step", str(FORK))
    assert code in (0, 1, 3)  # the verdict's exit code
    assert "bf16: forked from " in capsys.readouterr().err
    ref = runs / "ref" / "bf16"
    assert _curve(out / "bf16") == _curve(ref) and _same_weights(out / "bf16", ref)
    mx = _curve(out / "mxfp8")
    assert [r["step"] for r in mx] == list(range(1, STEPS + 1)) and mx[:FORK] == _curve(ref)[:FORK]
    assert mx[FORK]["loss"] != _curve(ref)[FORK]["loss"]  # MXFP8 from the fork on
    fork = json.loads((out / "mxfp8" / "config.json").read_text())["fork"]
    trunk_cfg = json.loads((runs / "trunk" / "bf16" / "config.json").read_text())
    assert fork["trunk"] == str((runs / "trunk" / "bf16").resolve()) and fork["step"] == FORK
    assert fork["trunk_recipe"] == "bf16" and fork["trunk_init_fingerprint"] == trunk_cfg["init_fingerprint"]
    assert json.loads((out / "verdict.json").read_text())["candidates"]["mxfp8"]["verdict"]
    r = compare_paths([out / "bf16" / "metrics.jsonl"], out / "mxfp8" / "metrics.jsonl")
    assert r["coverage"]["complete"]  # the copied records make the curves align from step 1


@pytest.mark.parametrize("flag", ["--row-order", "--data-seed"])
def test_a_perturbed_fork_shares_its_trunks_records_and_records_what_it_perturbed(runs, tmp_path, flag):
    """A fork with a replicate perturbation keeps the trunk's records to step 6 and records the perturbation; drawn
    from another shuffle (--data-seed, the control of the bit-identity above) it trains on other batches and parts
    from the uninterrupted run at once. (Another row order permutes each batch's rows: on this CPU at the tiny
    model's sizes the gradients often come out bit-identical, as the protocol's rounding design found, so only
    the GPU pilot measures how far such continuations spread.)"""
    out = tmp_path / "perturbed"
    assert _train("--recipe", "bf16", "--out", str(out), "--fork-from", str(runs / "trunk" / "bf16"),
                  "--fork-step", str(FORK), flag, "7") == 0
    got, ref = _curve(out / "bf16"), _curve(runs / "ref" / "bf16")
    assert got[:FORK] == ref[:FORK]
    fork = json.loads((out / "bf16" / "config.json").read_text())["fork"]
    key = flag[2:].replace("-", "_")
    assert fork["perturbation"][key] == [None, 7]
    assert (fork["repeated_window_share"] > 0) == (key == "data_seed")
    if key == "data_seed":
        assert all(a["loss"] != b["loss"] for a, b in zip(got[FORK:], ref[FORK:]))


def test_a_stopped_fork_resumes_bit_identically_and_one_without_a_checkpoint_starts_again_from_its_trunk(runs,
                                                                                                          tmp_path):
    """A fork stopped after its first step (--stop-after-minutes 0: exit 4) and continued with --resume ends as the
    uninterrupted run, though its trunk has moved on since (continued to the end: its checkpoint is no longer at
    the fork step, which a fork with its own checkpoint does not need); with its own checkpoint deleted (a kill
    before its first), --resume forks again from a trunk at the fork step and ends the same."""
    trunk = tmp_path / "trunk"
    shutil.copytree(runs / "trunk", trunk)
    out = tmp_path / "stopped"
    argv = ["--recipe", "bf16", "--out", str(out), "--fork-from", str(trunk / "bf16"), "--fork-step", str(FORK)]
    assert _train(*argv, "--stop-after-minutes", "0") == 4
    assert [r["step"] for r in _curve(out / "bf16")] == list(range(1, FORK + 2))
    again = tmp_path / "again"
    shutil.copytree(out, again)
    (again / "bf16" / "checkpoint.pt").unlink()
    assert _train("--recipe", "bf16", "--out", str(trunk), "--resume") == 0  # the trunk moves on to step 12
    ref = runs / "ref" / "bf16"
    assert _train(*argv, "--resume") == 0
    assert _curve(out / "bf16") == _curve(ref) and _same_weights(out / "bf16", ref)
    argv_again = [str(again) if a == str(out) else a for a in argv]
    assert _train(*argv_again, "--resume") == 2  # it needs the trunk at step 6, which is gone: refused
    shutil.rmtree(trunk)
    shutil.copytree(runs / "trunk", trunk)
    assert _train(*argv_again, "--resume") == 0
    assert _curve(again / "bf16") == _curve(ref) and _same_weights(again / "bf16", ref)


def _checksums(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("extra", "words"), [
    (["--fork-step", "4"], "its checkpoint is at step 6, not 4"),
    (["--fork-step", "0"], "--fork-step must be inside the run"),
    (["--fork-step", str(STEPS)], "--fork-step must be inside the run"),
    (["--fork-step", "6", "--lr", "0.001"], "the trunk ran with lr=0.003, this run has lr=0.001"),
    (["--fork-step", "6", "--seed", "1"], "the trunk ran with seed=0, this run has seed=1"),
    (["--fork-step", "6", "--ep", "1"], "drop --ep"),
    ([], "--fork-from and --fork-step go together"),
])
def test_a_fork_refuses_a_trunk_it_cannot_continue_in_one_line(runs, tmp_path, capsys, extra, words):
    """Exit 2 with one line, nothing written and the trunk unchanged: a fork step where the trunk has no checkpoint,
    outside (0, steps), a trunk of another configuration, a distributed fork, a step without a trunk."""
    before = _checksums(runs / "trunk")
    out = tmp_path / "refused"
    assert _train("--recipe", "bf16", "--out", str(out), "--fork-from", str(runs / "trunk" / "bf16"), *extra) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err
    assert _checksums(runs / "trunk") == before and not (out / "bf16").exists()


def test_a_fork_refuses_a_folder_that_holds_no_trunk_and_a_stop_outside_the_run(runs, tmp_path, capsys):
    for trunk, words in ((runs / "trunk", "no run there (no config.json) (give the trunk's run folder"),
                         (tmp_path / "nowhere", "no run there (no config.json)")):
        assert _train("--recipe", "bf16", "--out", str(tmp_path / "x"), "--fork-from", str(trunk),
                      "--fork-step", str(FORK)) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, err
    no_ckpt = tmp_path / "no_ckpt"
    shutil.copytree(runs / "trunk" / "bf16", no_ckpt)
    (no_ckpt / "checkpoint.pt").unlink()
    assert _train("--recipe", "bf16", "--out", str(tmp_path / "y"), "--fork-from", str(no_ckpt),
                  "--fork-step", str(FORK)) == 2
    assert "no checkpoint.pt (a trunk is a run stopped at the fork step" in capsys.readouterr().err
    assert _train("--recipe", "bf16", "--out", str(tmp_path / "z"), "--stop-at-step", str(STEPS)) == 2
    assert "--stop-at-step must be inside the run" in capsys.readouterr().err
