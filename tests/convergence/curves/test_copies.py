"""compare refuses replicates that are one run, however the copy was made: the same file under another name, in
another folder, or gzip'd. Counted twice, a run shrinks the replicates' spread (to nothing with two copies: a
zero-width interval and a verdict the data cannot carry)."""

from __future__ import annotations

import gzip
import json
import shutil

import numpy as np
import pytest

from convergence.__main__ import main

STEPS = range(50, 1001, 50)


def _write_run(path, seed: int):
    """A run's metrics: training loss every step, validation loss and its 8 batches' losses every 50 steps."""
    rng = np.random.default_rng(seed)
    level = 1 + rng.normal(0, 0.003)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for step in range(1, STEPS[-1] + 1):
            rec = {"step": step, "loss": level * (2 + 3 / step ** 0.5) * (1 + rng.normal(0, 0.01))}
            if step in STEPS:
                batches = [level * (2 + 3 / step ** 0.5) * (1 + rng.normal(0, 0.002)) for _ in range(8)]
                rec |= {"val_loss": sum(batches) / 8, "val_batch_losses": batches}
            f.write(json.dumps(rec) + "\n")
    return path


def _copy(kind: str, run, tmp_path):
    if kind == "renamed":
        return shutil.copyfile(run, tmp_path / "another_name.jsonl")
    if kind == "gzipped":
        path = tmp_path / "packed.jsonl.gz"
        path.write_bytes(gzip.compress(run.read_bytes()))
        return path
    (tmp_path / "elsewhere").mkdir()
    return shutil.copyfile(run, tmp_path / "elsewhere" / run.name)  # the same file name, another folder


@pytest.mark.parametrize("metric", ["val_loss", "loss"])
@pytest.mark.parametrize("kind", ["renamed", "gzipped", "another_folder"])
def test_compare_refuses_two_replicates_that_are_one_run_naming_both(tmp_path, capsys, kind, metric):
    runs = [_write_run(tmp_path / f"run{i}.jsonl", seed=i) for i in range(3)]
    copy = _copy(kind, runs[0], tmp_path)
    argv = ["compare", str(runs[0]), str(runs[2]), "--baseline", str(copy), "--metric", metric]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{runs[0]} and {copy} are the same run" in err, err


def test_compare_refuses_two_candidate_runs_that_are_one_run(tmp_path, capsys):
    runs = [_write_run(tmp_path / f"run{i}.jsonl", seed=i) for i in range(3)]
    copy = _copy("gzipped", runs[2], tmp_path)
    assert main(["compare", str(runs[0]), str(runs[2]), "--baseline", str(runs[1]), "--candidate-replicate",
                 str(copy), "--metric", "val_loss"]) == 2
    assert f"{runs[2]} and {copy} are the same run" in capsys.readouterr().err


def test_compare_takes_replicates_that_are_different_runs(tmp_path, capsys):
    """The control: the same command over three runs of their own gives a verdict, one of compare's exit codes."""
    runs = [_write_run(tmp_path / f"run{i}.jsonl", seed=i) for i in range(4)]
    for metric in ("val_loss", "loss"):
        code = main(["compare", str(runs[0]), str(runs[3]), "--baseline", str(runs[1]), "--baseline", str(runs[2]),
                     "--metric", metric])
        assert code in (0, 1, 3), capsys.readouterr().err
        assert capsys.readouterr().out.startswith("verdict: ")
