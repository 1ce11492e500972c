"""The comparator on synthetic curves with a known truth (convergence.curves.synthetic)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy import stats

from convergence.curves.compare import CompareOptions, compare_curves
from convergence.curves.synthetic import SyntheticSpec, make_runs, specs

M = CompareOptions().margin


def test_compare_default_margin_is_deepseek_v3s_quarter_percent():
    assert M == 0.0025


def _max_false_alarms(n: int, rate: float = 0.05, p: float = 1e-4) -> int:
    """Largest count a comparator with false-alarm rate `rate` exceeds with probability < p."""
    return int(stats.binom.isf(p, n, rate))


def test_compare_identical_processes_false_alarm_rate_is_controlled():
    spec = SyntheticSpec(steps=5_000, noise=0.015, phi=0.8)
    n = 120
    counts = Counter(compare_curves(*make_runs(spec, seed))["verdict"] for seed in range(n))
    alarms = counts["not_equivalent"] + counts["diverged"]
    assert alarms <= _max_false_alarms(n), counts


@settings(max_examples=12)
@given(spec=specs(max_noise=0.015), seed=st.integers(0, 2**31 - 1))
def test_compare_identical_processes_rarely_alarm_over_process_space(spec, seed):
    n = 10
    counts = Counter(compare_curves(*make_runs(spec, seed + i))["verdict"] for i in range(n))
    assert counts["diverged"] == 0, counts
    assert counts["not_equivalent"] <= _max_false_alarms(n), counts


@settings(max_examples=15)
@given(spec=specs(min_steps=4_000, max_noise=0.01), seed=st.integers(0, 2**31 - 1),
       sign=st.sampled_from([1, -1]))
@example(spec=SyntheticSpec(steps=4_000, noise=0.01, phi=0.9, log_every=5), seed=0, sign=1)
def test_compare_drift_of_four_margins_is_not_equivalent(spec, seed, sign):
    r = compare_curves(*make_runs(spec, seed, drift=sign * 4 * M))
    assert r["verdict"] == "not_equivalent", (r["reason"], r["noise"])
    assert r["interval"][0] > M if sign > 0 else r["interval"][1] < -M


@settings(max_examples=10)
@given(spec=specs(min_steps=10_000, max_noise=0.01, max_phi=0.8), seed=st.integers(0, 2**31 - 1))
def test_compare_ramp_to_four_margins_is_not_equivalent(spec, seed):
    r = compare_curves(*make_runs(spec, seed, drift=4 * M, drift_shape="ramp"))
    assert r["verdict"] == "not_equivalent", r["reason"]


@settings(max_examples=15)
@given(spec=specs(), seed=st.integers(0, 2**31 - 1), at=st.floats(0.05, 0.95))
def test_compare_injected_nan_is_diverged_at_its_step(spec, seed, at):
    bases, cand = make_runs(spec, seed, nan_at=at)
    r = compare_curves(bases, cand)
    assert r["verdict"] == "diverged" and r["divergence"]["kind"] == "non_finite"
    assert r["divergence"]["step"] == int(cand.steps[np.flatnonzero(np.isnan(cand.values))[0]])


@settings(max_examples=15)
@given(spec=specs(max_noise=0.01), seed=st.integers(0, 2**31 - 1), at=st.floats(0.2, 0.9),
       height=st.floats(0.15, 2.0))
def test_compare_non_recovering_spike_is_diverged(spec, seed, at, height):
    bases, cand = make_runs(spec, seed, spike_at=at, spike_height=height)
    r = compare_curves(bases, cand)
    assert r["verdict"] == "diverged", r["reason"]
    jump = int(cand.steps[int(at * (len(cand) - 1))])
    assert abs(r["divergence"]["step"] - jump) <= 0.02 * spec.steps + spec.log_every, r["divergence"]


def test_compare_recovering_spike_is_not_diverged():
    bases, cand = make_runs(SyntheticSpec(steps=10_000), 3)
    cand.values[5000:5020] *= 1.5  # 20 steps of +50%, then back: a healthy loss spike
    r = compare_curves(bases, cand)
    assert r["divergence"] is None and r["verdict"] != "diverged"


def test_compare_final_rise_is_diverged():
    bases, cand = make_runs(SyntheticSpec(steps=10_000, noise=0.005), 4)
    cand.values[7000:] *= np.linspace(1.0, 1.2, 3000)  # slow blow-up, no single spike
    r = compare_curves(bases, cand)
    assert r["verdict"] == "diverged" and r["divergence"]["kind"] in ("final_rise", "spike")


def test_compare_baseline_divergence_is_inconclusive():
    bases, cand = make_runs(SyntheticSpec(steps=5_000), 5)
    bases[0].values[4000] = np.inf
    r = compare_curves(bases, cand)
    assert r["verdict"] == "inconclusive" and "baseline" in r["reason"]


def test_compare_several_baselines_use_seed_spread_and_say_so():
    spec = SyntheticSpec(steps=5_000, seed_spread=0.003)
    r = compare_curves(*make_runs(spec, 6, n_baselines=4))
    assert r["baseline_runs"] == 4 and r["noise"]["model"] == "baseline_seeds"
    ov = r["overall"]
    assert ov["se_between"] is not None and ov["seed_spread"] > 0
    assert ov["noise_source"] == "baseline_seeds"  # 0.3% seed spread dominates the step noise here


def test_compare_one_baseline_says_noise_is_residual():
    r = compare_curves(*make_runs(SyntheticSpec(steps=3_000), 7))
    assert r["noise"]["model"] == "residual" and "seed-to-seed" in r["noise"]["note"]
    assert 0 < r["noise"]["correlation_time"] < 20


def test_compare_too_short_is_inconclusive_with_numbers():
    r = compare_curves(*make_runs(SyntheticSpec(steps=40, noise=0.01, phi=0.95), 8))
    assert r["verdict"] == "inconclusive"


def test_compare_result_carries_the_numbers_that_decided_it():
    r = compare_curves(*make_runs(SyntheticSpec(steps=5_000), 9))
    for key in ("verdict", "margin", "interval", "final_window", "divergence", "baseline_runs", "noise",
                "alignment", "reason"):
        assert key in r
    for part in (r["overall"], r["final_window"]):
        assert {"estimate", "interval", "windows", "window_points", "decision", "se_within"} <= set(part)


@pytest.mark.parametrize("bad", [{"margin": 0.0}, {"confidence": 1.0}, {"final_fraction": 0.0}])
def test_compare_options_reject_nonsense(bad):
    from numerics.errors import BadInput

    with pytest.raises(BadInput):
        CompareOptions(**bad).check()
