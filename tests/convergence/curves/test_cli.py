"""python -m convergence compare / calibrate: exit codes, JSON, plot, refusal to overwrite."""

from __future__ import annotations

import json

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


def test_calibrate_smoke_prints_table(capsys):
    assert main(["calibrate", "--pairs", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n| ") >= 12 and "false alarm" in out and "miss" in out


def test_bench_smoke_small(tmp_path, capsys):
    assert main(["calibrate", "--bench", "--steps", "2000", "--dir", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "jsonl" in out and "tensorboard" in out and np.isfinite(float(out.split("load 2 x")[1].split()[2]))
