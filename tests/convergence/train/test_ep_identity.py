"""python -m convergence ep-identity: which fields it compares, the first difference, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

from convergence.__main__ import main as convergence_main
from convergence.train.ep_identity import compare_runs
from convergence.train.loop import MEASURED_FIELDS


def _run(root: Path, backend: str, losses: list[float], tps: float, val: dict | None = None,
         deterministic: bool | None = None) -> Path:
    d = root / backend / "bf16"
    d.mkdir(parents=True)
    recs = [{"step": i + 1, "loss": x, "grad_norm": 1.0, "tokens_per_s": tps * (i + 1),
             "dispatch_combine_s": 0.01 * i, "dispatch_combine_share": 0.1, "expert_load_max_share": {"layer1": 0.2}}
            for i, x in enumerate(losses)]
    for r in recs:
        r.update({"val_loss": val[r["step"]]} if val and r["step"] in val else {})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    train = {} if deterministic is None else {"train": {"deterministic": deterministic}}
    (d / "config.json").write_text(json.dumps({"distributed": {"ep": 2, "ep_backend": backend}, **train,
                                               "environment": {"gpus": [f"GPU of {backend}"]}}))
    return root / backend


def test_ep_identity_ignores_only_timing_fields(tmp_path, capsys):
    a = _run(tmp_path, "reference", [5.5, 5.25, 5.0], tps=1000.0)
    b = _run(tmp_path, "deepep", [5.5, 5.25, 5.0], tps=1500.0)
    out = tmp_path / "golden.json"
    assert convergence_main(["ep-identity", str(a), str(b), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "IDENTICAL" in text and "compared fields: expert_load_max_share, grad_norm, loss, step" in text
    assert "tokens/s B / A: 1.500" in text  # medians after the warm-up steps, from the same files
    result = json.loads(out.read_text())
    assert result["identical"] and result["excluded_fields"] == list(MEASURED_FIELDS)
    assert "environment" in result and result["recipes"]["bf16"]["b"]["ep_backend"] == "deepep"
    assert result["recipes"]["bf16"]["b"]["environment"] == {"gpus": ["GPU of deepep"]}  # where each run ran


def test_ep_identity_names_first_differing_step_and_field(tmp_path, capsys):
    a = _run(tmp_path, "reference", [5.5, 5.25, 5.0], tps=1.0)
    b = _run(tmp_path, "deepep", [5.5, 5.25, 5.000000000000001], tps=1.0)
    assert convergence_main(["ep-identity", str(a / "bf16" / "metrics.jsonl"), str(b)]) == 1
    assert "DIFFER at step 3, field loss: A 5.0 vs B 5.000000000000001" in capsys.readouterr().out
    short = _run(tmp_path / "s", "deepep", [5.5, 5.25], tps=1.0)
    d = compare_runs(a, short)["recipes"]["bf16"]["first_difference"]
    assert d == {"step": 3, "field": "<record count>", "a": 3, "b": 2}


def test_ep_identity_says_how_far_apart_differing_runs_end(tmp_path, capsys):
    """Two runs that part at step 2 end 10 % apart in loss and 1 % in validation loss (the last step both
    evaluated: B's last evaluation has no partner); identical runs carry no such block."""
    a = _run(tmp_path, "reference", [5.5, 5.0, 4.0], tps=1.0, val={2: 5.0, 3: 4.0}, deterministic=False)
    b = _run(tmp_path, "deepep", [5.5, 5.5, 4.4], tps=1.0, val={2: 5.05}, deterministic=False)
    assert convergence_main(["ep-identity", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "at the end: loss at step 3: A 4 vs B 4.4 (B +10.000% from A)" in out
    assert "at the end: val_loss at step 2: A 5 vs B 5.05 (B +1.000% from A)" in out
    assert "without --deterministic" in out
    same = compare_runs(a, a)["recipes"]["bf16"]
    assert same["identical"] and same["at_end"] is None


def test_ep_identity_end_difference_takes_a_zero_or_text_loss_without_a_traceback(tmp_path, capsys):
    """A loss of 0 in A has no relative difference (it divided by zero); a text val_loss is not a number to measure
    (it raised TypeError): the last evaluation with numbers on both sides is the one reported (the control)."""
    a = _run(tmp_path, "reference", [5.5, 0.0], tps=1.0, val={1: 5.0, 2: "high"}, deterministic=False)
    b = _run(tmp_path, "deepep", [5.5, 0.5], tps=1.0, val={1: 5.05, 2: 4.0}, deterministic=False)
    assert convergence_main(["ep-identity", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "at the end: loss at step 2: A 0 vs B 0.5 (A is 0: no relative difference)" in out
    assert "at the end: val_loss at step 1: A 5 vs B 5.05 (B +1.000% from A)" in out


def test_ep_identity_refuses_a_config_whose_parts_are_not_objects(tmp_path, capsys):
    a = _run(tmp_path, "reference", [5.5], tps=1.0)
    b = _run(tmp_path, "deepep", [5.5], tps=1.0)
    cfg = b / "bf16" / "config.json"
    cfg.write_text(json.dumps({"distributed": "ep2"}))
    assert convergence_main(["ep-identity", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'distributed'" in err and str(cfg) in err  # the field and its file


def test_ep_identity_bad_input_one_line(tmp_path, capsys):
    a = _run(tmp_path, "reference", [5.5], tps=1.0)
    assert convergence_main(["ep-identity", str(a), str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.strip().endswith("missing does not exist")
    (tmp_path / "x.json").write_text("{}")
    assert convergence_main(["ep-identity", str(a), str(a), "--json", str(tmp_path / "x.json")]) == 2
    assert "pass --force" in capsys.readouterr().err


def test_ep_identity_reads_a_finished_protocol_runs_compacted_log_and_refuses_a_file_without_losses(tmp_path,
                                                                                                   capsys):
    """A protocol run keeps its logs gzip once finished (convergence.protocol.folder.compact_run): such a run folder
    is read, and the compacted runs compare as their plain logs do, identical and not; a probes file (steps, no
    loss) or a text loss is one line, exit 2, not DIFFERENT (exit 1)."""
    import gzip

    a = _run(tmp_path, "reference", [5.5, 5.25, 5.0], tps=1.0)
    b = _run(tmp_path, "deepep", [5.5, 5.25, 5.1], tps=1.0)
    for run in (a, b):
        log = run / "bf16" / "metrics.jsonl"
        log.with_name("metrics.jsonl.gz").write_bytes(gzip.compress(log.read_bytes(), mtime=0))
        log.unlink()
    assert convergence_main(["ep-identity", str(a), str(a)]) == 0
    assert convergence_main(["ep-identity", str(a), str(b)]) == 1
    assert "DIFFER at step 3, field loss" in capsys.readouterr().out
    probes, text = tmp_path / "probes.jsonl", tmp_path / "text.jsonl"
    probes.write_text('{"step": 1, "layer1": {"sqnr_db": 30.0}}\n')
    text.write_text('{"step": 1, "loss": "x"}\n')
    for bad, says in ((probes, "no record has a training loss"), (text, "is not a number")):
        assert convergence_main(["ep-identity", str(bad), str(a)]) == 2
        err = capsys.readouterr().err
        assert says in err and str(bad) in err and err.count("\n") == 1, err


def test_recipe_picks_inside_a_folder_and_is_refused_for_two_files(tmp_path, capsys):
    """--recipe with a run folder on one side and a metrics file on the other picks the folder's recipe; with
    two files there is nothing to pick, so it is refused rather than ignored."""
    a = _run(tmp_path, "reference", [5.5, 5.25, 5.0], tps=1.0)
    b = _run(tmp_path, "deepep", [5.5, 5.25, 5.0], tps=1.0)
    file_b = str(b / "bf16" / "metrics.jsonl")
    assert convergence_main(["ep-identity", str(a), file_b, "--recipe", "bf16"]) == 0
    assert "IDENTICAL" in capsys.readouterr().out
    assert convergence_main(["ep-identity", str(a / "bf16" / "metrics.jsonl"), file_b, "--recipe", "bf16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--recipe" in err


def test_two_folders_of_different_recipes_are_refused_a_file_against_a_folder_is_compared(tmp_path, capsys):
    """Two folders holding one recipe each, bf16 and mxfp8, are refused (compared as one recipe under the first's
    name they would come out IDENTICAL); a metrics file against a folder of one recipe is compared (the control)."""
    a = _run(tmp_path, "reference", [5.5, 5.25, 5.0], tps=1.0)
    b = _run(tmp_path, "deepep", [5.5, 5.25, 5.0], tps=1.0)
    (b / "bf16").rename(b / "mxfp8")
    assert convergence_main(["ep-identity", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bf16" in err and "mxfp8" in err  # the two recipes
    assert convergence_main(["ep-identity", str(a), str(b / "mxfp8" / "metrics.jsonl")]) == 0
    assert "IDENTICAL" in capsys.readouterr().out


def test_a_recipe_folder_is_a_run_as_its_help_says(tmp_path, capsys):
    """--help says "run directory": a run's recipe folder (OUT/<recipe>, where its metrics.jsonl lies) is read as
    that recipe's run, against another recipe folder or an OUT folder; --recipe naming another recipe is refused
    (the control)."""
    a = _run(tmp_path, "reference", [5.5, 5.25, 5.0], tps=1.0)
    b = _run(tmp_path, "deepep", [5.5, 5.25, 5.0], tps=1.0)
    assert convergence_main(["ep-identity", str(a / "bf16"), str(b / "bf16")]) == 0
    assert "IDENTICAL" in capsys.readouterr().out
    assert convergence_main(["ep-identity", str(a / "bf16"), str(b)]) == 0
    assert "IDENTICAL" in capsys.readouterr().out
    assert convergence_main(["ep-identity", str(a / "bf16"), str(b), "--recipe", "mxfp8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is one run's folder (bf16)" in err
