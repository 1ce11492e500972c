"""``mxval.notebook``: the notebooks' helpers, tested without a kernel (``tests/test_notebooks.py`` runs the notebooks
themselves where nbclient is installed)."""

from __future__ import annotations

import pytest

from convergence.curves.load import load_curves
from mxval.notebook import NotebookInputError, validate_training_runs


def test_validate_training_runs_reads_the_protocol_folder_validate_writes(tmp_path, fake_validate_folder):
    """The BF16 baseline and its replicates, then the candidate: the held-out run and the control are not among
    them (the curves level judges the same runs). Notebook 03 used to look for training/seed*/mxfp8/metrics.jsonl,
    which validate stopped writing when it began running the protocol, and refused every validate folder."""
    names = fake_validate_folder(tmp_path)
    runs = validate_training_runs(tmp_path)
    assert [n for n, _ in runs] == ["bf16", "bf16_rounding1", "bf16_rounding2", "mxfp8"]
    assert {"mxfp8-head", "bf16_rounding3"} <= set(names) - {n for n, _ in runs}
    assert runs[-1][1].relative_to(tmp_path).as_posix() == "training/runs/mxfp8/mxfp8/metrics.jsonl.gz"
    curves = load_curves([p for _, p in runs])  # what the notebook does next: the gzip files read as JSONL
    assert [len(c) for c in curves] == [200] * 4


def test_validate_training_runs_refuses_a_folder_without_a_training_level_in_one_message(tmp_path):
    (tmp_path / "training" / "seed0" / "mxfp8").mkdir(parents=True)  # the layout validate wrote before the protocol
    (tmp_path / "training" / "seed0" / "mxfp8" / "metrics.jsonl").write_text('{"step": 1, "loss": 3.0}\n')
    with pytest.raises(NotebookInputError, match=r"holds no training level \(training/protocol\.json\)"):
        validate_training_runs(tmp_path)


def test_validate_training_runs_names_a_run_the_training_level_did_not_finish(tmp_path, fake_validate_folder):
    fake_validate_folder(tmp_path, steps=20)
    (tmp_path / "training" / "runs" / "bf16_rounding2" / "bf16" / "metrics.jsonl.gz").unlink()
    with pytest.raises(NotebookInputError, match=r"runs/bf16_rounding2/bf16/metrics\.jsonl does not exist"):
        validate_training_runs(tmp_path)
    (tmp_path / "training" / "protocol.json").write_text("{")  # damaged: the plan reader's one line, as a message
    with pytest.raises(NotebookInputError, match="protocol.json"):
        validate_training_runs(tmp_path)


def test_validate_verdict_line_names_validates_own_verdict_beside_the_notebooks(tmp_path):
    """Notebook 03 compares training loss of the first MXFP8 run; validate's curves level judges validation loss
    with every MXFP8 run, and the two can differ: the notebook prints validate's own beside its, each named."""
    from mxval.notebook import validate_verdict_line

    assert validate_verdict_line(tmp_path) is None  # a folder without a curves level: nothing to add
    (tmp_path / "curves").mkdir()
    (tmp_path / "curves" / "verdict.json").write_text(
        '{"verdict": "inconclusive", "reason": "interval straddles", "metric": "val_loss"}')
    line = validate_verdict_line(tmp_path)
    assert "val_loss, every candidate run): inconclusive: interval straddles" in line
    (tmp_path / "curves" / "verdict.json").write_text("[1, 2]")
    with pytest.raises(NotebookInputError, match="verdict.json"):
        validate_verdict_line(tmp_path)
