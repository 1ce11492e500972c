"""python -m convergence compare / calibrate: exit codes, JSON, plot, refusal to overwrite."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from convergence.__main__ import main
from convergence.curves.synthetic import SyntheticSpec, make_runs


def _write(path, curve, *, nan_ok=True):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for s, v in zip(curve.steps.tolist(), curve.values.tolist()):
            f.write(json.dumps({"step": s, "loss": v, "grad_norm": 1.0, "tokens_per_s": 1e4}) + "\n")
            if s % 500 == 0:
                f.write(json.dumps({"step": s, "val_loss": v}) + "\n")
    return path


def _pair(tmp_path, **kw):
    (base,), cand = make_runs(SyntheticSpec(steps=5_000, noise=0.005), 11, **kw)
    return _write(tmp_path / "bf16" / "metrics.jsonl", base), _write(tmp_path / "mxfp8" / "metrics.jsonl", cand)


@pytest.mark.parametrize("kw, verdict, code", [
    ({}, "equivalent", 0),
    ({"drift": 0.01}, "not_equivalent", 1),
    ({"nan_at": 0.5}, "diverged", 1),
])
def test_compare_cli_verdict_exit_code_and_json(tmp_path, capsys, kw, verdict, code):
    b, c = _pair(tmp_path, **kw)
    out = tmp_path / "v.json"
    assert main(["compare", str(b), str(c), "--json", str(out)]) == code
    r = json.loads(out.read_text())
    assert r["verdict"] == verdict and r["baseline_runs"] == 1 and r["margin"] == 0.0025
    assert "environment" in r and r["inputs"]["candidate"]["extras"] == ["grad_norm", "tokens_per_s", "val_loss"]
    assert capsys.readouterr().out.startswith(f"verdict: {verdict.upper()}")


def test_compare_cli_inconclusive_exits_3(tmp_path):
    (base,), cand = make_runs(SyntheticSpec(steps=300, noise=0.03, phi=0.9), 12)
    b, c = _write(tmp_path / "b.jsonl", base), _write(tmp_path / "c.jsonl", cand)
    assert main(["compare", str(b), str(c)]) == 3


def test_compare_cli_plot_and_no_silent_overwrite(tmp_path, capsys):
    b, c = _pair(tmp_path, drift=0.004)
    png = tmp_path / "cmp.png"
    assert main(["compare", str(b), str(c), "--plot", str(png)]) == 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["compare", str(b), str(c), "--plot", str(png)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert main(["compare", str(b), str(c), "--plot", str(png), "--force"]) == 1


def test_compare_cli_several_baselines(tmp_path):
    bases, cand = make_runs(SyntheticSpec(steps=3_000, seed_spread=0.0005), 13, n_baselines=3)
    paths = [_write(tmp_path / f"b{i}.jsonl", b) for i, b in enumerate(bases)]
    out = tmp_path / "v.json"
    main(["compare", str(paths[0]), str(_write(tmp_path / "c.jsonl", cand)), "--baseline", str(paths[1]),
          "--baseline", str(paths[2]), "--json", str(out)])
    r = json.loads(out.read_text())
    assert r["baseline_runs"] == 3 and r["noise"]["model"] == "baseline_seeds"


@pytest.mark.parametrize("args, match", [
    (["compare", "nope.jsonl", "nope2.jsonl"], "nope.jsonl: no such file"),
    (["compare", "B", "C", "--margin", "-1"], "--margin must be in"),
    (["compare", "B"], "required"),
])
def test_compare_cli_bad_input_exits_2_with_one_line(tmp_path, capsys, monkeypatch, args, match):
    monkeypatch.chdir(tmp_path)
    b, c = _pair(tmp_path)
    args = [str(b) if a == "B" else str(c) if a == "C" else a for a in args]
    try:
        code = main(args)
    except SystemExit as exc:  # argparse usage errors leave through SystemExit(2), also one line
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1


def test_compare_cli_no_overlap_exits_2(tmp_path, capsys):
    b = tmp_path / "b.jsonl"
    c = tmp_path / "c.jsonl"
    b.write_text("".join(json.dumps({"step": s, "loss": 2.0}) + "\n" for s in range(1, 50)))
    c.write_text("".join(json.dumps({"step": s, "loss": 2.0}) + "\n" for s in range(100, 150)))
    assert main(["compare", str(b), str(c)]) == 2
    assert "no overlapping steps" in capsys.readouterr().err


def test_plot_comparison_redraws_from_json_alone(tmp_path):
    from convergence.curves.plots import plot_comparison

    b, c = _pair(tmp_path, nan_at=0.7)
    out = tmp_path / "v.json"
    main(["compare", str(b), str(c), "--json", str(out)])
    png = plot_comparison(json.loads(out.read_text()), tmp_path / "again.png")
    assert png.stat().st_size > 10_000


def test_plot_comparison_of_a_run_too_short_to_draw_raises_no_warning(tmp_path):
    """A 5-step smoke run compares no series; the figure says so, without matplotlib's warning about an empty
    legend (warnings are errors in every tier)."""
    from convergence.curves.plots import plot_comparison

    result = {"verdict": "inconclusive", "reason": "too few points", "margin": 0.0025, "series": None,
              "windows": None, "overall": None, "final_window": None, "divergence": None}
    assert plot_comparison(result, tmp_path / "short.png").stat().st_size > 5_000


def test_calibrate_smoke_prints_table(capsys):
    assert main(["calibrate", "--pairs", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n| ") >= 12 and "false alarm" in out and "miss" in out


def test_bench_smoke_small(tmp_path, capsys):
    assert main(["calibrate", "--bench", "--steps", "2000", "--dir", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "jsonl 2 files + compare" in out and "tensorboard 1 file" in out
    assert np.isfinite(float(out.split("x the json.loads loop")[0].split()[-1]))


@pytest.mark.parametrize("make, match", [
    (lambda d: d.write_text("x"), "is a file"),
    (lambda d: (d.mkdir(), (d / "mine.txt").write_text("keep")), "is not empty"),
])
def test_bench_refuses_a_used_dir_and_changes_nothing(tmp_path, capsys, make, match):
    d = tmp_path / "b"
    make(d)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert main(["calibrate", "--bench", "--steps", "2000", "--dir", str(d)]) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


GOLDEN_BF16 = Path(__file__).resolve().parents[3] / "golden" / "training" / "proxy_bf16_seed0__h200.jsonl"


def _lines(path):
    return path.read_text().splitlines(keepends=True)


def test_compare_cli_half_a_candidate_is_incomplete_not_equivalent(tmp_path, capsys):
    # `head -100 golden/... > half.jsonl`: a run cut short is incomplete (exit 4), never EQUIVALENT
    half = tmp_path / "half.jsonl"
    half.write_text("".join(_lines(GOLDEN_BF16)[:100]))
    out = tmp_path / "v.json"
    assert main(["compare", str(GOLDEN_BF16), str(half), "--json", str(out)]) == 4
    r = json.loads(out.read_text())
    assert r["verdict"] == "incomplete" and "--overlap-only" in r["reason"]
    cand = r["coverage"]["runs"][-1]
    assert cand["role"] == "candidate" and cand["compared_fraction"] == 1.0
    assert r["coverage"]["runs"][0]["compared_points"] == 100 and r["coverage"]["runs"][0]["points"] == 200
    assert r["sensitivity"]["smallest_detectable_difference"] >= r["margin"]
    assert capsys.readouterr().out.startswith("verdict: INCOMPLETE")


def test_compare_cli_shifted_candidate_is_not_judged_on_its_overlap(tmp_path):
    shifted = tmp_path / "shifted.jsonl"
    rows = [json.loads(x) for x in _lines(GOLDEN_BF16)]
    shifted.write_text("".join(json.dumps({**r, "step": r["step"] + 150}) + "\n" for r in rows))
    assert main(["compare", str(GOLDEN_BF16), str(shifted)]) == 4
    out = tmp_path / "v.json"
    code = main(["compare", str(GOLDEN_BF16), str(shifted), "--overlap-only", "--json", str(out)])
    r = json.loads(out.read_text())
    assert code != 4 and r["reason"].startswith("overlap only, steps 151..200")
    assert r["coverage"]["overlap_only"] and not r["coverage"]["complete"]


def test_compare_cli_coverage_control_a_full_or_nearly_full_candidate_is_judged(tmp_path):
    b, c = _pair(tmp_path)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(_lines(c)[:-3]))  # the last two steps and a val line missing: within 1%
    out = tmp_path / "v.json"
    assert main(["compare", str(b), str(cut), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["coverage"]["complete"]


def test_compare_cli_a_short_baseline_is_incomplete_too(tmp_path):
    b, c = _pair(tmp_path)
    short = tmp_path / "short.jsonl"
    short.write_text("".join(_lines(b)[:2000]))
    assert main(["compare", str(short), str(c)]) == 4


def test_compare_cli_a_candidate_that_diverged_and_stopped_is_diverged_not_incomplete(tmp_path):
    b, c = _pair(tmp_path)
    stopped = tmp_path / "nan.jsonl"
    stopped.write_text("".join(_lines(c)[:2000]) + '{"step": 2001, "loss": NaN}\n')
    assert main(["compare", str(b), str(stopped)]) == 1


@pytest.mark.parametrize("where", ["parent_is_a_file", "is_a_directory", "missing_parent"])
def test_compare_cli_unwritable_json_is_exit_2_before_any_verdict(tmp_path, capsys, where):
    b, c = _pair(tmp_path)
    (tmp_path / "afile").write_text("x")
    target = {"parent_is_a_file": tmp_path / "afile" / "v.json", "is_a_directory": tmp_path,
              "missing_parent": tmp_path / "nope" / "v.json"}[where]
    assert main(["compare", str(b), str(c), "--json", str(target)]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.count("\n") == 1 and "Traceback" not in cap.err


def test_compare_cli_a_failed_write_after_the_verdict_is_exit_2(tmp_path, capsys, monkeypatch):
    from convergence.curves import cli
    from numerics.errors import BadInput

    def refuse(path, *a, **k):
        raise BadInput(f"cannot write {path}: No space left on device")

    monkeypatch.setattr(cli, "atomic_write", refuse)
    b, c = _pair(tmp_path)
    assert main(["compare", str(b), str(c), "--json", str(tmp_path / "v.json")]) == 2
    assert "No space left" in capsys.readouterr().err and not (tmp_path / "v.json").exists()
