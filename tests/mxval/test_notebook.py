"""``mxval.notebook``: the notebooks' helpers, tested without a kernel (``tests/test_notebooks.py`` runs the notebooks
themselves where nbclient is installed)."""

from __future__ import annotations

import pytest

from convergence.curves.load import load_curves
from mxval.notebook import NotebookInputError, training_runs


def test_validate_training_runs_reads_the_protocol_folder_validate_writes(tmp_path, fake_validate_folder):
    """The BF16 baseline and its replicates, then the candidate: the held-out run and the null control are not
    among them (the curves level judges the same runs)."""
    names = fake_validate_folder(tmp_path)
    runs, left_out = training_runs(tmp_path)
    assert left_out == []
    assert [n for n, _ in runs] == ["bf16", "bf16_rounding1", "bf16_rounding2", "mxfp8"]
    assert {"mxfp8-null", "bf16_rounding3"} <= set(names) - {n for n, _ in runs}
    assert runs[-1][1].relative_to(tmp_path).as_posix() == "training/runs/mxfp8/mxfp8/metrics.jsonl.gz"
    curves = load_curves([p for _, p in runs])  # what the notebook does next: the gzip files read as JSONL
    assert [len(c) for c in curves] == [200] * 4


def test_validate_training_runs_refuses_a_folder_without_a_training_level_in_one_message(tmp_path):
    (tmp_path / "training" / "seed0" / "mxfp8").mkdir(parents=True)  # the layout validate wrote before the protocol
    (tmp_path / "training" / "seed0" / "mxfp8" / "metrics.jsonl").write_text('{"step": 1, "loss": 3.0}\n')
    with pytest.raises(NotebookInputError, match=r"holds no training level \(training/protocol\.json\) and is no "
                                                 r"protocol folder"):
        training_runs(tmp_path)


def test_validate_training_runs_names_a_run_the_training_level_did_not_finish(tmp_path, fake_validate_folder):
    fake_validate_folder(tmp_path, steps=20)
    (tmp_path / "training" / "runs" / "bf16_rounding2" / "bf16" / "metrics.jsonl.gz").unlink()
    with pytest.raises(NotebookInputError, match=r"runs/bf16_rounding2/bf16/metrics\.jsonl does not exist"):
        training_runs(tmp_path)
    (tmp_path / "training" / "protocol.json").write_text("{")  # damaged: the plan reader's one line, as a message
    with pytest.raises(NotebookInputError, match="protocol.json"):
        training_runs(tmp_path)


def test_training_runs_reads_a_protocol_folder_and_leaves_out_its_unfinished_baselines(tmp_path,
                                                                                       fake_validate_folder):
    """A ``convergence protocol --out`` folder is read as validate's training level is (the same plan, the same
    files); one still running gives its finished baselines and names the rest, while the baseline and the
    candidate it compares must be finished."""
    fake_validate_folder(tmp_path, steps=20)  # the quick plan's length: every run finished
    out = tmp_path / "training"
    runs, left_out = training_runs(out)
    assert [n for n, _ in runs] == ["bf16", "bf16_rounding1", "bf16_rounding2", "mxfp8"] and left_out == []
    (out / "runs" / "bf16_rounding1" / "bf16" / "metrics.jsonl.gz").unlink()  # not started yet
    runs, left_out = training_runs(out)
    assert [n for n, _ in runs] == ["bf16", "bf16_rounding2", "mxfp8"] and left_out == ["bf16_rounding1"]
    assert [len(c) for c in load_curves([p for _, p in runs])] == [20] * 3
    (out / "runs" / "mxfp8" / "mxfp8" / "metrics.jsonl.gz").unlink()  # the candidate itself: nothing to compare
    with pytest.raises(NotebookInputError, match=r"has not finished its run mxfp8 \(0 of 20 steps\)"):
        training_runs(out)


def test_own_verdict_line_names_the_folders_own_verdict_beside_the_notebooks(tmp_path):
    """Notebook 03 compares training loss of the first MXFP8 run; validate's curves level and the protocol judge
    validation loss with every MXFP8 run, and the two can differ: the notebook prints the folder's own beside
    its, each named."""
    from mxval.notebook import own_verdict_line

    assert own_verdict_line(tmp_path) is None  # a folder without a verdict: nothing to add
    (tmp_path / "results").mkdir()  # a whole protocol's results/
    (tmp_path / "results" / "proxy_long_verdict__h200.json").write_text(
        '{"verdict": "not_equivalent", "reason": "outside", "metric": "val_loss"}')
    assert "proxy_long_verdict__h200.json: val_loss, every candidate run): not_equivalent: outside" in \
        own_verdict_line(tmp_path)
    (tmp_path / "curves").mkdir()
    (tmp_path / "curves" / "verdict.json").write_text(
        '{"verdict": "inconclusive", "reason": "interval straddles", "metric": "val_loss"}')
    line = own_verdict_line(tmp_path)  # validate's, where both are
    assert "val_loss, every candidate run): inconclusive: interval straddles" in line
    (tmp_path / "curves" / "verdict.json").write_text("[1, 2]")
    with pytest.raises(NotebookInputError, match="verdict.json"):
        own_verdict_line(tmp_path)


def test_own_verdict_line_judges_a_running_protocols_last_whole_level_as_its_status_does(tmp_path,
                                                                                          val_loss_protocol):
    """A protocol folder without results/ (a plan still running) gets the verdict ``protocol --status`` judges on
    its last whole level, marked interim, with whether each control came out as it must (here a control 5 % worse:
    not_equivalent; the held-out BF16 runs: equivalent); before a level is whole, None; a damaged log, one message."""
    from convergence.protocol.folder import metrics_path
    from mxval.notebook import own_verdict_line

    plan, write = val_loss_protocol
    for r in plan.levels()[0].runs()[:-1]:  # the first level less one run: nothing whole to judge
        write(r)
    assert own_verdict_line(tmp_path) is None
    for r in plan.levels()[1].runs():
        write(r)
    line = own_verdict_line(tmp_path)
    assert "judged here, interim, k = 2, m = 2 of the plan's k = 3, m = 4: a partial plan decides nothing): " \
           "EQUIVALENT:" in line, line
    assert line.endswith("controls: positive_control not_equivalent (as it must), negative_control equivalent "
                         "(as it must)"), line
    assert own_verdict_line(tmp_path.parent) is None  # no protocol there at all
    metrics_path(tmp_path, plan.run("candidate")).write_text('{"step": 1, "val_loss": [}\n')
    with pytest.raises(NotebookInputError, match="cannot judge its runs"):
        own_verdict_line(tmp_path)
