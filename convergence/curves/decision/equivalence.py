"""The standard tests on one declared endpoint: equivalence (two one-sided tests) and non-inferiority, and their
exact power.

Public: ``TESTS``, ``LEGACY``, ``ENDPOINTS``, ``PART_OF``, ``WORDS``, ``judge(estimate, se, dof, *, test, alpha,
margin) -> dict``, ``decisions(...)`` (the same decision on arrays, for simulations), ``chance(...)`` (the exact
probability of each verdict), ``describe(test, alpha)``.

The endpoint is one relative difference ``d`` (candidate against the pooled BF16 reference; higher loss is worse)
with a standard error ``se`` on ``dof`` degrees of freedom (``convergence.curves.paired``: the runs' spread, Welch-
Satterthwaite with candidate replicates, the held-out set's jackknife). With ``t = t(1 - alpha, dof)`` the
``1 - 2 alpha`` interval is ``d +- t se``; each end is a one-sided ``1 - alpha`` bound.

* ``equivalence`` (TOST, Schuirmann 1987, J. Pharmacokinet. Biopharm. 15:657): ``equivalent`` when the whole
  ``1 - 2 alpha`` interval lies strictly inside ``(-margin, +margin)``, i.e. both one-sided tests reject at level
  alpha (H0: d <= -margin, H0: d >= +margin); its p-value is the larger of the two. ``not_equivalent`` when that
  same interval lies wholly outside ``[-margin, +margin]`` (the one-sided test of ``|d| <= margin`` on that side
  rejects at alpha); else ``inconclusive``. A candidate exactly on the margin is called equivalent at most alpha of
  the time.
* ``non-inferiority`` (one-sided: is the candidate worse than BF16 by less than the margin?): ``non_inferior``
  when the upper ``1 - alpha`` bound is below ``+margin`` (H0: d >= margin rejected at alpha), ``inferior`` when
  the lower ``1 - alpha`` bound is above ``+margin``, else ``inconclusive``. Its own words, not ``equivalent`` /
  ``not_equivalent``: a candidate much better than BF16 is non-inferior but not equivalent, and a reader of the
  verdict word alone must not take the one-sided claim for the two-sided one. The exit codes keep their meaning:
  0 the claim the test makes is shown (``non_inferior``), 1 its opposite is shown (``inferior``), 3 neither.
* ``two-ranges`` (``LEGACY``): the rule results were judged by before a test was declared: equivalence on the
  whole compared range *and* the final window, each with a two-sided ``1 - (1 - confidence)/2`` interval
  (Bonferroni over the two). Kept so that those results re-judge exactly as recorded; a plan or result that names
  no test was judged by it. ``convergence.curves.compare`` decides it; this module does the other two.

Every judged part states the estimate, its interval, the p-value against no difference (the two-sided t-test on
the same standard error and degrees of freedom), the test's own p-value, the half-width (what the data resolve)
and the smallest margin at which the same numbers would give the favourable verdict (a margin chosen after seeing
it is no test; it says what the runs resolve to a reader whose margin differs).

Power (``chance``): ``d`` is normal around the true difference ``delta`` with variance ``sigma^2 c + e^2`` (the
runs' spread ``sigma``, ``c = 1/k + 1/m`` or ``1 + 1/k`` for one candidate run, the held-out set's error ``e``),
and the spread is estimated with ``dof`` degrees of freedom independently of ``d`` (normal runs), so
``s^2 / sigma^2 ~ chi^2_dof / dof``. Conditional on ``s`` the verdict is a normal probability; integrating over
the chi-square distribution gives its exact probability (for ``e = 0`` and non-inferiority this is the noncentral
t distribution; for equivalence it is Owen's Q, which the integral computes without the usual two-t
approximation). Welch's degrees of freedom are random and at most ``k + m - 2``; planning takes that pooled number
(for equal arms and spreads Welch's stays close to it): ``tests/convergence/curves/test_equivalence.py`` holds the
formula to simulated protocols judged by the verdict's code (within their simulation error).
"""

from __future__ import annotations

import functools
import math

import numpy as np

LEGACY = "two-ranges"
TESTS = ("equivalence", "non-inferiority", LEGACY)
ENDPOINTS = ("final", "whole")
PART_OF = {"final": "final_window", "whole": "overall"}  # the result's part each endpoint names
WORDS = {"equivalence": ("equivalent", "not_equivalent"), "non-inferiority": ("non_inferior", "inferior")}
# nodes of the integral over the estimated spread: midpoints of equal-probability slices of chi^2 / dof. The
# conditional probability is smooth in s except where t * se(s) reaches the margin; 4,000 slices put the integral
# within 1e-4 of scipy's noncentral t (tests), far below any simulation's error
_NODES = 4000


def describe(test: str, alpha: float) -> str:
    """The test in words, for a report line."""
    if test == "equivalence":
        return f"equivalence (TOST) at alpha {alpha:g}: the {1 - 2 * alpha:.0%} interval inside +-margin"
    if test == "non-inferiority":
        return f"non-inferiority at alpha {alpha:g}: the one-sided {1 - alpha:.0%} upper bound below +margin"
    return "two-ranges: whole range and final window, each interval inside +-margin (Bonferroni)"


def _sf(num: float, se: float, dof: float) -> float:
    """P(T > num / se) for T ~ t(dof), with se = 0 read as an infinitely precise estimate."""
    if se > 0:
        from scipy import stats  # here, not at import: a plan or a training worker reads this module's names only

        return float(stats.t.sf(num / se, dof))
    return 0.0 if num > 0 else 1.0 if num < 0 else 0.5


def decisions(estimate, se, dof, *, test: str, alpha: float, margin: float):
    """The decision of each (estimate, se, dof) (numpy arrays or scalars): 1 favourable (equivalent,
    non_inferior), -1 unfavourable (not_equivalent, inferior), 0 inconclusive; and the interval's ends."""
    from scipy import stats

    half = stats.t.ppf(1 - alpha, dof) * np.asarray(se, dtype=float)
    lo, hi = estimate - half, estimate + half
    if test == "equivalence":
        good, bad = (lo > -margin) & (hi < margin), (lo > margin) | (hi < -margin)
    elif test == "non-inferiority":
        good, bad = hi < margin, lo > margin
    else:
        raise ValueError(f"test must be one of {', '.join(WORDS)}, got {test!r}")
    return np.where(good, 1, np.where(bad, -1, 0)), lo, hi


def judge(estimate: float, se: float, dof: float, *, test: str, alpha: float, margin: float) -> dict:
    """One endpoint judged by ``test``: the decision, the ``1 - 2 alpha`` interval, the p-values, the half-width
    and the smallest margin that would give the favourable verdict (the module docstring)."""
    code, lo, hi = decisions(estimate, se, dof, test=test, alpha=alpha, margin=margin)
    lo, hi, code = float(lo), float(hi), int(code)
    good, bad = WORDS[test]
    decision = {1: good, -1: bad, 0: "inconclusive"}[code]
    p_zero = min(1.0, 2 * _sf(abs(estimate), se, dof))
    p_below = _sf(estimate + margin, se, dof)  # H0: d <= -margin
    p_above = _sf(margin - estimate, se, dof)  # H0: d >= +margin
    iv = f"[{lo:+.3%}, {hi:+.3%}]"
    if test == "equivalence":
        p_test, smallest = max(p_below, p_above), max(abs(lo), abs(hi))
        where = {1: f"inside +-{margin:.3%}", -1: f"wholly outside +-{margin:.3%}",
                 0: f"straddles +-{margin:.3%}"}[code]
        why = (f"{estimate:+.3%}, {1 - 2 * alpha:.0%} interval {iv} {where}; p = {p_zero:.3g} against no difference, "
               f"TOST p = {p_test:.3g}")
    else:
        p_test, smallest = p_above, hi
        where = {1: f"upper bound {hi:+.3%} below +{margin:.3%}", -1: f"lower bound {lo:+.3%} above +{margin:.3%}",
                 0: f"bounds {iv} straddle +{margin:.3%}"}[code]
        why = (f"{estimate:+.3%}, one-sided {1 - alpha:.0%} {where}; p = {p_zero:.3g} against no difference, "
               f"non-inferiority p = {p_test:.3g}")
    return {"decision": decision, "interval": [lo, hi], "interval_level": 1 - 2 * alpha, "half_width": hi - estimate,
            "p_no_difference": p_zero, "p_test": p_test, "p_below_minus_margin": p_below,
            "p_above_margin": p_above, "smallest_margin": smallest, "why": why}


@functools.lru_cache(maxsize=1024)
def _spread_nodes(dof: float) -> np.ndarray:
    """s^2 / sigma^2 at the midpoints of ``_NODES`` equal-probability slices of chi^2 / dof, read-only: kept per dof,
    as a power table asks ``chance`` for the same few dof hundreds of times (4,000 chi^2 quantiles each)."""
    from scipy import stats

    u = (np.arange(_NODES) + 0.5) / _NODES
    w = stats.chi2.ppf(u, dof) / dof
    w.flags.writeable = False
    return w


def chance(test: str, delta: float, margin: float, *, alpha: float, sigma: float, c: float, dof: float,
           se_set: float = 0.0) -> dict:
    """The exact probabilities of the favourable, unfavourable and inconclusive verdicts at a true relative
    difference ``delta``, for runs of spread ``sigma`` (``c``: the estimate's variance in units of sigma^2),
    the spread estimated on ``dof`` degrees of freedom, and a held-out set error ``se_set`` taken as known (the
    module docstring)."""
    from scipy import stats

    if test not in WORDS:
        raise ValueError(f"test must be one of {', '.join(WORDS)}, got {test!r}")
    sd = math.sqrt(sigma ** 2 * c + se_set ** 2)  # the estimate's true standard deviation
    w = _spread_nodes(float(dof))  # s^2 / sigma^2 at equal-probability slices
    half = float(stats.t.ppf(1 - alpha, dof)) * np.sqrt(sigma ** 2 * c * w + se_set ** 2)
    if sd == 0:
        raise ValueError("no spread and no set error: every verdict is certain")
    norm = stats.norm
    if test == "equivalence":
        good = np.clip(norm.cdf((margin - half - delta) / sd) - norm.cdf((-margin + half - delta) / sd), 0, None)
        bad = norm.sf((margin + half - delta) / sd) + norm.cdf((-margin - half - delta) / sd)
    else:
        good = norm.cdf((margin - half - delta) / sd)
        bad = norm.sf((margin + half - delta) / sd)
    g, b = float(good.mean()), float(bad.mean())
    return {"favourable": g, "unfavourable": b, "inconclusive": max(0.0, 1 - g - b)}
