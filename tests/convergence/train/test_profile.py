"""python -m convergence profile: a run's step time, tokens/s, phases and peak memory from its metrics.jsonl.

Exact on records whose numbers are known; a planted slower optimizer must show in its phase and in the
step-time ratio (the control); a real CPU run's profile agrees with its own records."""

from __future__ import annotations

import json

import pytest

from convergence.__main__ import main
from convergence.train import profile as pf

TOKENS = 1000  # per step


def _records(steps=6, optimizer=0.4, warm_s=10.0, phases=True):
    """Steps of 2 s (+ the optimizer's extra), the first WARMUP slow; forward 0.5, backward 1.0."""
    out = []
    for s in range(1, steps + 1):
        step_s = (warm_s if s <= pf.WARMUP else 2.0 + optimizer - 0.4)
        r = {"step": s, "loss": 5.0 - 0.1 * s, "grad_norm": 1.0, "tokens": s * TOKENS,
             "tokens_per_s": TOKENS / step_s, "host_peak_gib": 1.0 + 0.1 * s, "gpu_peak_gib": 3.0 if s != 3 else 4.0}
        if phases:
            r["phase_s"] = {"forward": 0.5, "backward": 1.0, "optimizer": optimizer}
        if s % 3 == 0:
            r["val_loss"], r["val_s"] = 4.0 - 0.1 * s, 1.5
        if s % 2 == 0:
            r["probe_s"] = 0.25
        if s in (1, 5):  # two pieces: the second resumed at step 5
            r["setup_s"] = 7.0 if s == 1 else 3.0
        out.append(r)
    return out


def test_profile_reads_known_numbers_exactly():
    p = pf.profile(_records())
    assert p["steps"] == 6 and p["median_over_steps"] == [pf.WARMUP + 1, 6]
    assert p["step_s"] == pytest.approx(2.0) and p["tokens_per_s"] == pytest.approx(500.0)
    assert p["first_step_s"] == pytest.approx(10.0)  # the start-up the medians leave out
    assert p["phase_s"] == pytest.approx({"forward": 0.5, "backward": 1.0, "optimizer": 0.4, "other": 0.1})
    assert p["gpu_peak_gib"] == 4.0 and p["host_peak_gib"] == pytest.approx(1.6)  # the run's peaks
    assert p["val_loss_last"] == pytest.approx(3.4) and p["loss_first"] == pytest.approx(4.9)
    # where the wall time went besides the steps: 2 x 10 + 4 x 2 s of steps, two set-ups, two evaluations
    assert p["steps_total_s"] == pytest.approx(28.0)
    assert (p["setup_s"], p["pieces"], p["val_s"], p["evaluations"], p["probe_s"], p["probes"]) == (10.0, 2, 3.0, 2,
                                                                                                   0.75, 3)
    text = pf.report({"run": p})
    assert "set-up s (pieces)" in text and "10.0 (2)" in text and "3.0 (2)" in text


def test_a_run_logged_before_setup_and_evaluation_times_reads_as_unknown():
    old = [{k: v for k, v in r.items() if k not in ("setup_s", "val_s", "probe_s")} for r in _records()]
    p = pf.profile(old)
    assert (p["setup_s"], p["pieces"], p["val_s"], p["evaluations"], p["probe_s"]) == (None, None, None, None, None)
    assert "n/a (0)" in pf.report({"old": p})


def test_a_planted_slow_optimizer_shows_in_its_phase_and_the_ratio():
    """The control: the same run with the optimizer 1 s slower per step is told apart, and where."""
    base, slow = pf.profile(_records()), pf.profile(_records(optimizer=1.4))
    assert slow["phase_s"]["optimizer"] - base["phase_s"]["optimizer"] == pytest.approx(1.0)
    assert slow["phase_s"]["forward"] == base["phase_s"]["forward"]
    text = pf.report({"base": base, "slow": slow})
    assert "step time slow / base: 1.50x" in text


def test_a_slowdown_for_part_of_a_run_shows_in_its_spans_not_its_median():
    """A run whose steps take 2 s but 3 s for one sixth of them (a machine busy for minutes): the median stays 2 s,
    the spans say 2-3 s; the control, the same run without the slow part, shows 2-2 s.
    Evaluations are given as their fastest and slowest."""
    n = pf.WARMUP + pf.SPANS * pf.SPAN_MIN
    steady = _records(steps=n)
    slow = [dict(r) for r in steady]
    for r in slow[pf.WARMUP + 2 * pf.SPAN_MIN:pf.WARMUP + 3 * pf.SPAN_MIN]:  # the third span, whole
        r["tokens_per_s"] = TOKENS / 3.0
    for r in slow:
        if "val_s" in r and r["step"] > n // 2:
            r["val_s"] = 4.5
    a, b = pf.profile(steady), pf.profile(slow)
    assert a["step_s"] == b["step_s"] == pytest.approx(2.0)
    assert a["step_s_spans"] == pytest.approx([2.0, 2.0]) and b["step_s_spans"] == pytest.approx([2.0, 3.0])
    assert a["val_s_each"] == pytest.approx([1.5, 1.5]) and b["val_s_each"] == pytest.approx([1.5, 4.5])
    text = pf.report({"steady": a, "slow": b})
    assert f"over {pf.SPANS} spans" in text and "2.000-3.000" in text and "1.5-4.5" in text
    assert pf.profile(_records())["step_s_spans"] is None  # too few steps to cut: said as n/a
    assert "n/a" in pf.report({"short": pf.profile(_records())})


def test_a_run_without_phase_times_says_so():
    p = pf.profile(_records(phases=False))
    assert p["phase_s"] is None and p["step_s"] == pytest.approx(2.0)
    assert "made without --phase-times" in pf.report({"run": p})


def test_a_file_without_training_losses_is_not_profiled(tmp_path, capsys):
    """A run's probes.jsonl (steps, no loss) is refused in one line, exit 2, not profiled as n/a everywhere."""
    from convergence.__main__ import main as convergence_main

    probes = tmp_path / "probes.jsonl"
    probes.write_text('{"step": 1, "layer1": {"sqnr_db": 30.0}}\n{"step": 2, "layer1": {"sqnr_db": 31.0}}\n')
    assert convergence_main(["profile", str(probes)]) == 2
    assert "no record has a training loss" in capsys.readouterr().err
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records()))
    assert convergence_main(["profile", str(tmp_path / "m.jsonl")]) == 0  # the control: a run's metrics


def test_profile_of_a_real_cpu_run(tmp_path, capsys):
    """A tiny CPU run with --phase-times: its profile's medians are those of its own records, and the figure
    and JSON are written."""
    args = ["train", "--model", "tiny", "--recipe", "bf16", "--steps", "5", "--batch", "4", "--seq", "32",
            "--val-every", "5", "--val-batches", "1", "--threads", "1", "--phase-times", "--probe-every", "2",
            "--out", str(tmp_path / "r")]
    assert main(args) == 0
    trained = capsys.readouterr().out  # the run ends with its cost and the command that breaks it down
    assert "bf16: 5 steps, median " in trained and "s/step" in trained and "peak host " in trained
    assert f"python -m convergence profile {tmp_path / 'r' / 'bf16'}" in trained
    run = tmp_path / "r" / "bf16"
    assert main(["profile", str(run), "--name", "tiny", "--plot", str(tmp_path / "p.png"),
                 "--json", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    assert "tokens/s" in out and "figure:" in out and (tmp_path / "p.png").stat().st_size > 10_000
    got = json.loads((tmp_path / "p.json").read_text())["tiny"]
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    tail = recs[pf.WARMUP:]
    assert got["tokens_per_s"] == pytest.approx(sorted(r["tokens_per_s"] for r in tail)[len(tail) // 2])
    assert got["phase_s"]["forward"] > 0 and got["phase_s"]["other"] >= 0
    assert got["host_peak_gib"] == max(r["host_peak_gib"] for r in recs) and got["gpu_peak_gib"] is None
    # one piece: its set-up on the first record only; one evaluation (--val-every 5), timed where it is logged
    assert [r["step"] for r in recs if "setup_s" in r] == [1] and got["setup_s"] > 0
    assert [r["step"] for r in recs if "val_s" in r] == [5] and got["evaluations"] == 1 and got["val_s"] > 0
    assert [r["step"] for r in recs if "probe_s" in r] == [2, 4] and got["probes"] == 2 and got["probe_s"] > 0
