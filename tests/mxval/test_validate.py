"""mxval validate: the whole ladder into results/<timestamp>/, the report, the summary, exit codes.

One quick end-to-end run (module fixture) feeds the report tests; orchestration rules (a failed or
crashed level, dependent levels, exit codes) are tested with stand-in level functions.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mxval.__main__ import main as mxval_main
from mxval.validate import run as validate
from mxval.validate.ladder import LEVELS, Check, LevelResult, level_status, make_plan


def test_validate_quick_run_end_to_end(tmp_path):
    """One quick run (every level it can run on CPU), then everything a reviewer reads from it."""
    out = tmp_path / "run"
    rc = validate.main(["--quick", "--out", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    assert rc == 0 and summary["exit_code"] == 0, summary
    for name in ("report.md", "report.html", "summary.json", "tensor/report.json", "figures/tensor_sqnr.png",
                 "layer/layers.json", "communication/check.json",
                 "curves/verdict.json", "figures/layer_sqnr.png", "figures/training.png", "figures/curves.png",
                 "logs/layer.log", "training/runs/mxfp8/mxfp8/metrics.jsonl.gz",  # finished runs: compacted
                 "training/runs/bf16_rounding2/bf16/metrics.jsonl.gz",
                 "training/runs/mxfp8-null/mxfp8-null/metrics.jsonl.gz",  # the null control, on a CPU
                 "curves/positive_control.json", "curves/negative_control.json", "curves/null_control.json"):
        assert (out / name).is_file(), name
    assert not list(out.rglob("checkpoint.pt"))  # the runs' checkpoints are not kept in a report folder
    assert not list(out.rglob("metrics.jsonl"))

    levels = summary["levels"]
    assert list(levels) == list(LEVELS)
    assert all((out / a).is_file() for level in levels.values() for a in level["artifacts"])  # the files there are
    assert [levels[n]["status"] for n in ("tensor", "layer", "communication", "training")] == ["pass"] * 4
    # the curves row is the declared test's verdict once its controls came out as they must: at 20 steps a CPU whose
    # rounding replicates barely part (their spread ~1e-5 here) resolves the margin by TOST on the final window,
    # where one whose replicates part leaves it inconclusive, saying what to do about it; MXFP8 never fails here
    curves_status = {"equivalent": "pass", "inconclusive": "inconclusive"}[levels["curves"]["numbers"]["verdict"]]
    assert levels["curves"]["status"] == curves_status
    assert curves_status == "pass" or "--steps" in levels["curves"]["enable"]
    tensor = levels["tensor"]["numbers"]
    assert tensor["blocks_unexplained"] == 0 and tensor["blocks_bit_exact"] < tensor["blocks"]
    assert set(tensor["blocks_known_findings"]) >= {"F1", "F2"}  # known torchao findings, counted not hidden
    # the lowest SQNR per element format: MXFP8's E4M3 is not to be read off FP4's
    assert all(f"{e} " in levels["tensor"]["summary"] for e in ("e4m3", "e5m2", "e2m1"))

    # summary.json: versions, hardware, key numbers, the skipped DeepEP part with how to enable it
    assert summary["environment"]["torch"] and summary["environment"]["torchao"]
    assert summary["hardware"]["device"] == "cpu" and summary["hardware"]["cpu_count"] >= 1
    comm = levels["communication"]
    assert comm["numbers"]["failures"] == 0 and comm["numbers"]["cases"] > 10
    deepep = [c for c in comm["checks"] if c["status"] == "skipped"]
    assert deepep and "DeepEP" in deepep[0]["name"] and "deep_ep" in comm["enable"]
    curves = levels["curves"]["numbers"]
    assert curves["baselines"] == 3 and curves["noise_model"] == "replicates"
    assert curves["half_width"] > 0 and "resolves +-" in levels["curves"]["summary"]  # what this size can resolve
    # each control's name says what it must come out as, in words
    assert {c["name"].split(" (")[0]: c["name"].split(") ")[-1] for c in levels["curves"]["checks"][1:]} == {
        "positive control": "is not equivalent", "negative control": "covers zero", "null control": "is identical"}
    # the declared test's numbers, and each control by its own check: the null control's identity on this CPU
    assert (curves["test"], curves["endpoint"], curves["interval_level"]) == ("equivalence", "final", 0.9)
    assert 0 <= curves["p_no_difference"] <= 1 and 0 <= curves["p_test"] <= 1 and curves["resolves"] > 0
    assert curves["controls"]["null_control"]["outcome"] == {"check": "identical", "passed": True}
    assert curves["controls"]["negative_control"]["outcome"]["check"] == "covers_zero"
    assert levels["layer"]["numbers"]["below_floor"] == 0

    # report.html is self-contained: every figure embedded, nothing fetched
    html = (out / "report.html").read_text()
    srcs = re.findall(r'src="([^"]*)"', html)
    assert len(srcs) == sum(len(r["figures"]) for r in levels.values()) == 4
    assert all(s.startswith("data:image/png;base64,") for s in srcs)
    assert 'href="http' not in html and "<link" not in html and "<script" not in html
    assert all(f"id='{name}'" in html for name in LEVELS)

    # report.md: one row per level with its status, figures linked
    md = (out / "report.md").read_text()
    for name, rec in levels.items():
        assert re.search(rf"\| {name} \| \*\*{validate.MARK[rec['status']]}\*\* \|", md), name
    assert "![layer](figures/layer_sqnr.png)" in md


def test_validate_refuses_an_existing_results_folder(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("a user's result")
    rc = mxval_main(["validate", "--out", str(tmp_path), "--levels", "layer"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and str(tmp_path) in err[0]
    assert (tmp_path / "mine.txt").read_text() == "a user's result" and len(list(tmp_path.iterdir())) == 1


def test_validate_unwritable_results_folder_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    rc = mxval_main(["validate", "--out", str(blocker / "results")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: cannot write the results folder")


def test_validate_reads_every_levels_option(tmp_path, capsys):
    """--levels given twice: both count, as the error for an unknown level in the second shows (the single
    --levels of the tests above is the control)."""
    rc = mxval_main(["validate", "--out", str(tmp_path / "r"), "--levels", "tensor", "--levels", "gpu"])
    assert rc == 2 and "--levels 'tensor,gpu'" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--levels", "tensor,gpu"], ["--levels", ""], ["--steps", "3"], ["--steps", "10"]])
def test_validate_bad_arguments_exit_2(argv, tmp_path, capsys):
    rc = mxval_main(["validate", "--out", str(tmp_path / "r"), *argv])
    assert rc == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_validate_refuses_steps_that_give_the_curves_one_evaluation(capsys):
    """The tiny model evaluates every 10 steps and at its last: 10 steps give one evaluation (refused, saying the
    fewest steps that work), 11 give two (the control: accepted)."""
    refused = r"--steps 10: the tiny model is evaluated every 10 steps .* --steps 11 or more"
    with pytest.raises(validate.CLIError, match=refused):
        validate._check_evaluations(make_plan(gpus=0, deep_ep=False, steps=10))
    validate._check_evaluations(make_plan(gpus=0, deep_ep=False, steps=11))


def test_validate_default_folder_is_new_per_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = validate.prepare_out(None)
    (first / "x").write_text("")
    second = validate.prepare_out(None)
    assert first != second and first.parent == second.parent == Path("results")


def _fake(status: str, crash: bool = False, level: str = "layer"):
    def run(plan, out, progress):
        progress("working")
        if crash:
            raise RuntimeError("boom")
        return LevelResult(level, status, f"fake {status}", (Check("fake", status, "detail"),))
    return run


def test_validate_interrupted_writes_the_levels_that_finished_and_can_be_replaced(tmp_path, monkeypatch, capsys):
    """Ctrl-C leaves report.md and summary.json for the levels that finished, exit 130, and the folder can be
    replaced with --force. Its status is inconclusive though the finished levels passed: not every level asked was
    judged; the same levels run whole pass (the control, below)."""
    from mxval.__main__ import main as mxval_main

    def interrupt(plan, out, progress):
        raise KeyboardInterrupt

    monkeypatch.setitem(validate.RUNNERS, "tensor", _fake("pass", level="tensor"))
    monkeypatch.setitem(validate.RUNNERS, "layer", interrupt)
    out = tmp_path / "r"
    assert mxval_main(["validate", "--out", str(out), "--levels", "tensor,layer,curves"]) == 130
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] == "layer" and summary["exit_code"] == 130
    assert summary["status"] == "inconclusive"  # the finished levels passed, but not every level asked was judged
    assert summary["levels"]["tensor"]["status"] == "pass"
    assert all("interrupted" in summary["levels"][n]["summary"] for n in ("layer", "curves"))
    assert "INTERRUPTED" in (out / "report.md").read_text() and (out / "report.html").exists()
    monkeypatch.setitem(validate.RUNNERS, "layer", _fake("pass"))
    assert mxval_main(["validate", "--out", str(out), "--levels", "layer"]) == 2  # never without asking
    assert "--force" in capsys.readouterr().err
    assert mxval_main(["validate", "--out", str(out), "--levels", "layer", "--force"]) == 0
    whole = json.loads((out / "summary.json").read_text())
    assert whole["interrupted"] is None and whole["status"] == "pass"


def test_validate_force_refuses_a_folder_that_is_not_validate_results(tmp_path, capsys):
    from mxval.__main__ import main as mxval_main

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert mxval_main(["validate", "--out", str(mine), "--force", "--levels", "layer"]) == 2
    assert str(mine) in capsys.readouterr().err and (mine / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize("status, code", [("pass", 0), ("inconclusive", 0), ("fail", 1)])
def test_validate_exit_code_follows_the_levels(status, code, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(validate.RUNNERS, "layer", _fake(status))
    rc = validate.main(["--out", str(tmp_path / "r"), "--levels", "layer"])
    assert rc == code
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["levels"]["layer"]["status"] == status


def test_validate_a_crashing_level_fails_and_the_ladder_goes_on(tmp_path, monkeypatch):
    monkeypatch.setitem(validate.RUNNERS, "training", _fake("pass", crash=True))
    monkeypatch.setitem(validate.RUNNERS, "layer", _fake("pass"))
    rc = validate.main(["--out", str(tmp_path / "r"), "--levels", "layer,training,curves"])
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert rc == 1
    assert summary["levels"]["layer"]["status"] == "pass"
    assert summary["levels"]["training"]["status"] == "fail"
    assert "RuntimeError: boom" in summary["levels"]["training"]["summary"]
    assert "RuntimeError: boom" in (tmp_path / "r" / "logs" / "training.log").read_text()
    assert summary["levels"]["curves"]["status"] == "skipped"
    assert "training" in summary["levels"]["curves"]["summary"]


def test_level_status_rules():
    c = lambda s: Check("x", s)  # noqa: E731
    assert level_status([c("pass"), c("skipped")]) == "pass"
    assert level_status([c("pass"), c("inconclusive")]) == "inconclusive"
    assert level_status([c("inconclusive"), c("fail")]) == "fail"
    assert level_status([c("skipped")]) == "skipped" and level_status([]) == "skipped"


@pytest.mark.parametrize("gpus, deep_ep, layer, model, ep", [
    (0, False, "tiny", "tiny", "reference"),
    (1, False, "16b", "proxy", "reference"),
    (2, False, "16b", "proxy", "reference"),
    (2, True, "16b", "proxy", "deepep"),
])
def test_make_plan_sizes_follow_the_hardware(gpus, deep_ep, layer, model, ep):
    plan = make_plan(gpus=gpus, deep_ep=deep_ep)
    assert (plan.layer_config, plan.train_model, plan.ep_backend) == (layer, model, ep)
    assert plan.device == ("cuda" if gpus else "cpu")
    quick = make_plan(gpus=gpus, deep_ep=deep_ep, quick=True)
    assert quick.layer_config == "tiny" and quick.train_model == "tiny"
    assert quick.train_steps < plan.train_steps and quick.ep_cases < plan.ep_cases


@pytest.mark.gpu
def test_validate_quick_on_gpu(tmp_path):
    rc = validate.main(["--quick", "--out", str(tmp_path / "r")])
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["plan"]["device"] == "cuda"
    assert rc == 0, {k: v["summary"] for k, v in summary["levels"].items()}


def _golden_protocol() -> dict[str, dict]:
    root = Path(__file__).resolve().parents[2] / "golden" / "training"
    return {n: json.loads((root / f"proxy_long_{n}__h200x2.json").read_text())
            for n in ("verdict", "positive_control", "negative_control")}


def test_protocol_checks_trust_the_verdict_only_when_both_controls_come_out_as_expected():
    """On the golden 2 x H200 protocol the negative control is inconclusive, so the candidate's not_equivalent is
    reported as not trusted (inconclusive), not as a failure of MXFP8; with both controls as expected it stands."""
    from convergence.protocol.plan import plan_from_dict
    from mxval.validate.levels import protocol_checks

    verdicts = _golden_protocol()
    pp = plan_from_dict(verdicts["verdict"]["protocol"]["plan"])  # judged by the rule before declared tests
    cand, pos, neg = protocol_checks(verdicts, pp)
    assert (pos.status, neg.status) == ("pass", "inconclusive")
    assert cand.status == "inconclusive" and "not trusted" in cand.detail and "negative control" in cand.detail
    verdicts["negative_control"] = dict(verdicts["negative_control"], verdict="equivalent")
    cand, pos, neg = protocol_checks(verdicts, pp)
    assert (cand.status, pos.status, neg.status) == ("fail", "pass", "pass")  # a trusted not_equivalent fails
    verdicts["positive_control"] = dict(verdicts["positive_control"], verdict="equivalent")  # the planted miss
    assert [c.status for c in protocol_checks(verdicts, pp)] == ["inconclusive", "inconclusive", "pass"]


def test_curves_summary_puts_a_control_that_missed_before_the_verdict_it_makes_untrusted():
    """A control that missed makes the curves row inconclusive, so the row says so before the verdict it untrusts;
    and the training note describes the replicates the table lists (one seed, one benign change each)."""
    from mxval.validate.levels import curves_summary
    from mxval.validate.report import READING

    verdicts = _golden_protocol()  # its negative control came out inconclusive
    line = curves_summary(verdicts)
    assert line.startswith("not trusted at this size: the negative control came out inconclusive, where equivalent "
                           "was expected; the candidate's comparison alone: not_equivalent: "), line
    verdicts["negative_control"] = dict(verdicts["negative_control"], verdict="equivalent")  # the control: trusted
    assert curves_summary(verdicts).startswith("not_equivalent: ")
    assert "other seeds" not in READING["training"] and "init / data / rows" in READING["training"]


def test_a_folder_a_kill_left_without_a_summary_can_be_replaced_with_force(tmp_path, capsys):
    """SIGKILL leaves no summary.json; validate marks its folder before anything else, so --force still empties a
    folder a kill left; a folder it did not write stays refused (the control)."""
    from mxval.__main__ import main as mxval_main

    out = validate.prepare_out(tmp_path / "killed")
    (out / "tensor").mkdir()  # what a kill mid-run leaves: levels' files, no summary.json
    assert mxval_main(["validate", "--out", str(out), "--levels", "tensor"]) == 2
    assert "--force" in capsys.readouterr().err
    assert validate.prepare_out(out, force=True) == out and not (out / "tensor").exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("a user's file")
    assert mxval_main(["validate", "--out", str(mine), "--levels", "tensor", "--force"]) == 2
    assert str(mine) in capsys.readouterr().err and (mine / "notes.txt").exists()
