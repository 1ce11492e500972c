"""The blocked estimate of a fork design (``convergence.curves.paired.within_blocks``): its arithmetic, its refusals,
and its calibration on simulated trunks (TOST at alpha through ``equivalence.judge``): the interval covers the truth
at its level, a candidate a margin worse is called equivalent at most alpha of the time, and at no difference the
equivalence rate is the design's planned power (``designs``' fork arithmetic), within the simulation's error."""

from __future__ import annotations

import math

import numpy as np
import pytest

from convergence.curves.decision import designs
from convergence.curves.decision.equivalence import decisions
from convergence.curves.paired import between_runs, within_blocks
from numerics.errors import BadInput


def test_within_blocks_pools_the_spread_around_each_block_and_recipe():
    """Two blocks of two runs each recipe: s_w^2 = sum of squares around the four group means / 4, the estimate's
    variance s_w^2 (1/2 + 1/2) / 2."""
    base, cand = [0.0, 0.2, 1.0, 1.4], [0.1, 0.5, 1.2, 1.4]
    blocks = (["a", "a", "b", "b"], ["a", "a", "b", "b"])
    got = within_blocks(base, cand, blocks)
    squares = 0.02 + 0.08 + 0.08 + 0.02  # (0.1^2 * 2), (0.2^2 * 2), (0.2^2 * 2), (0.1^2 * 2)
    assert got["dof"] == 4 and got["spread"] == pytest.approx(math.sqrt(squares / 4))
    assert got["se_between"] == pytest.approx(math.sqrt(squares / 4) * math.sqrt(1.0) / math.sqrt(2))
    assert got["block_differences"] == pytest.approx([0.2, 0.1])


def test_within_blocks_with_one_run_each_uses_the_blocks_differences_and_refuses_an_unbalanced_design():
    got = within_blocks([0.0, 1.0, 2.0], [0.3, 1.1, 2.5], (["a", "b", "c"], ["a", "b", "c"]))
    d = np.array([0.3, 0.1, 0.5])
    assert got["estimator"] == "blocks' differences" and got["dof"] == 2
    assert got["se_between"] == pytest.approx(d.std(ddof=1) / math.sqrt(3))
    with pytest.raises(BadInput, match="as many baselines"):
        within_blocks([0.0, 0.1, 1.0], [0.2, 1.1, 1.2], (["a", "a", "b"], ["a", "b", "b"]))


def _simulate(rng, n_sims, trunks, pairs, spread, truth, trunk_sd, interaction_sd=0.0):
    """Levels of ``n_sims`` fork protocols: each trunk shifts its continuations by N(0, trunk_sd) (both recipes),
    the candidate's by ``truth`` (+ a trunk's own N(0, interaction_sd)); every continuation N(0, spread) around."""
    shift = rng.normal(0, trunk_sd, (n_sims, trunks, 1))
    inter = rng.normal(0, interaction_sd, (n_sims, trunks, 1))
    base = shift + rng.normal(0, spread, (n_sims, trunks, pairs))
    cand = shift + truth + inter + rng.normal(0, spread, (n_sims, trunks, pairs))
    return base.reshape(n_sims, -1), cand.reshape(n_sims, -1)


def _judge_all(base, cand, trunks, pairs, margin, alpha, blocked=True) -> dict:
    """Each protocol's TOST decision (1 equivalent), interval ends and, blocked, interaction p: the verdict's own
    ``decisions`` on ``within_blocks``' standard errors (or, apart, Welch's: the independent design's)."""
    labels = [t for t in range(trunks) for _ in range(pairs)]
    est = cand.mean(axis=1) - base.mean(axis=1)
    if blocked:
        got = [within_blocks(b, c, (labels, labels)) for b, c in zip(base, cand)]
        se, dof = np.array([w["se_between"] for w in got]), np.array([w["dof"] for w in got])
        p = np.array([w["interaction_p"] for w in got])
    else:
        se, dof = between_runs(pairs * trunks, base.std(axis=1, ddof=1), pairs * trunks, cand.std(axis=1, ddof=1))
        p = None
    code, lo, hi = decisions(est, se, dof, test="equivalence", alpha=alpha, margin=margin)
    return {"equivalent": code == 1, "lo": lo, "hi": hi, "interaction_p": p}


# 3,000 simulated protocols a point: a rate's standard error is at most 0.9 %, so 3.5 of them (a tolerance of 3 %)
# leave a false failure near 5e-4 per comparison
N, TOL = 3000, 0.03


def test_blocked_tost_is_calibrated_and_its_power_is_the_fork_designs():
    """4 trunks of 4 pairs, within-trunk spread 1, trunks 3x as far apart, margin 1, alpha 0.05: at a true
    difference of +margin, equivalent at most alpha of the time; the 90 % interval covers the truth 90 % of the
    time; at 0, equivalent at the rate ``designs.favourable`` plans for the fork design (c = 2/16, 24 dof). The
    control: the same runs judged apart (Welch), the trunks' spread in the error, are equivalent far less often."""
    rng = np.random.default_rng(7)
    t, p, margin, alpha = 4, 4, 1.0, 0.05
    at_margin = _judge_all(*_simulate(rng, N, t, p, 1.0, margin, 3.0), t, p, margin, alpha)
    assert at_margin["equivalent"].mean() <= alpha + TOL
    base, cand = _simulate(rng, N, t, p, 1.0, 0.0, 3.0)
    at_zero = _judge_all(base, cand, t, p, margin, alpha)
    assert ((at_zero["lo"] <= 0) & (0 <= at_zero["hi"])).mean() == pytest.approx(0.90, abs=TOL)
    planned = designs.favourable(designs.fork(1.0, pairs_per_trunk=p, fork_fraction=0.5), "equivalence", 0.0,
                                 margin, t * p, alpha=alpha)
    assert designs.fork(1.0, pairs_per_trunk=p, fork_fraction=0.5).dof(t * p) == 24
    rate = at_zero["equivalent"].mean()
    assert rate == pytest.approx(planned, abs=TOL)
    assert _judge_all(base, cand, t, p, margin, alpha, blocked=False)["equivalent"].mean() < rate / 2


def test_blocked_interaction_check_sees_an_effect_that_depends_on_the_trunk():
    """Without interaction its p is uniform (small 5 % of the time); a candidate effect that differs between trunks
    by twice the within-trunk spread makes it small most of the time (the control)."""
    rng = np.random.default_rng(8)
    calm = _judge_all(*_simulate(rng, 1000, 4, 4, 1.0, 0.0, 3.0), 4, 4, 1.0, 0.05)["interaction_p"]
    assert (calm < 0.05).mean() == pytest.approx(0.05, abs=TOL)
    mixed = _judge_all(*_simulate(rng, 1000, 4, 4, 1.0, 0.0, 3.0, 2.0), 4, 4, 1.0, 0.05)["interaction_p"]
    assert (mixed < 0.05).mean() > 0.5
