"""Power of the paired verdict on validation loss: how many replicates and steps a margin needs.

Public: ``half_width(k, spread, se_set=0, confidence=0.95, m=1)``, ``replicates_needed(spread, target, ...)``,
``floor_half_width(spread, se_set, confidence)``, ``replicates_for_equivalence(spread, margin, se_set, ...)``,
``pooled_spread(groups)``, ``spread_interval(spread, dof)``,
``spread_ratio(baseline, candidate)``, ``pair_correlation(baseline, candidate)``,
``fit_spread(points)``, ``steps_needed(fit, spread)``, ``Measured`` / ``measured(result)`` (from a
``compare --metric val_loss`` result), ``with_larger_set(m, times)``, ``analyse(measurements, ...)``,
``report(analysis)``.

The verdict (``convergence.curves.paired``) puts ``x_c +- t(1 - (1 - c)/4, k - 1) * sqrt(s^2 (1 + 1/k) + e^2)``
around the candidate's relative difference, with ``s`` the spread of the k baseline replicates and ``e`` the
held-out set's standard error. So, for a measured ``s`` and ``e``:

* more baselines shrink the half-width towards ``z(1 - (1 - c)/4) * sqrt(s^2 + e^2)`` (2.24 x at c = 95 %),
  never below, while the candidate is one run: its own run-to-run noise stays in the estimate;
* candidate replicates (m runs of the candidate, ``--candidate-replicates``) remove that floor: with m = k
  runs each the half-width is ``t * sqrt(2 s^2 / k + e^2)`` (the candidate's spread taken equal to the
  baselines' for planning; the verdict measures both), which falls towards ``z * e``: then only the held-out
  set's error is left, and the set must grow;
* ``s`` may fall as the runs get longer (the replicates' losses converging as the learning rate decays): with
  ``s`` measured at two or more run lengths, ``s = a * steps^b`` is fitted in log-log and solved for the
  length at which the chosen number of replicates reaches the target. Within the proxy's 1,500-step runs at
  lr 3e-4 it did not fall (``protocol --status``'s spread at each evaluation, docs/studies/proxy-protocol.md);
* ``e`` falls as 1/sqrt(batches) of the held-out set (``--val-batches``), up to the split's size
  (``with_larger_set``; measured on the proxy at lr 3e-4, 18 -> 290 batches of a 2 % -> 20 % split: MXFP8's
  final-fifth set error fell 3.2x and E2M1's 6.3x, where 1/sqrt says 4.0x).

Equivalence can be shown only when the half-width is below the margin, and with room for the estimate:
a candidate truly ``d`` away needs ``|d| + half-width <= margin``. ``analyse`` therefore reports the
replicates for a half-width of the margin and of half the margin.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from convergence.curves.jsonl import is_number
from convergence.curves.paired import between_runs

K_MAX = 64  # beyond this the t-quantile is within 1 % of the normal one: more replicates buy nothing
BALANCED_MAX = 4096  # with candidate replicates the half-width keeps falling as 1/sqrt(k): search this far


def _level(confidence: float) -> float:
    return 1 - (1 - confidence) / 4  # two ranges (whole and final), two-sided: as the verdict


def half_width(k: int, spread: float, se_set: float = 0.0, confidence: float = 0.95, m: int = 1,
               cand_spread: float | None = None) -> float:
    """The verdict's interval half-width with ``k`` baselines of spread ``spread`` (k >= 2) and ``m`` candidate
    runs of spread ``cand_spread`` (default the same; ``convergence.curves.paired.between_runs``)."""
    if k < 2:
        return math.inf
    se, dof = between_runs(k, spread, m, spread if cand_spread is None else cand_spread)  # m = 1: one run's formula
    return float(stats.t.ppf(_level(confidence), dof)) * math.sqrt(se ** 2 + se_set ** 2)


def floor_half_width(spread: float, se_set: float = 0.0, confidence: float = 0.95) -> float:
    """The half-width infinitely many replicates would give."""
    return float(stats.norm.ppf(_level(confidence))) * math.sqrt(spread ** 2 + se_set ** 2)


def replicates_needed(spread: float, target: float, se_set: float = 0.0, confidence: float = 0.95, *,
                      balanced: bool = False, k_max: int | None = None, cand_spread: float | None = None) -> int | None:
    """The fewest baselines (k >= 2) whose half-width is at most ``target`` (``balanced``: as many candidate
    runs as baselines, of spread ``cand_spread``, default ``spread``); None if ``k_max`` do not suffice (default
    ``BALANCED_MAX`` balanced, else ``K_MAX``)."""
    k_max = k_max or (BALANCED_MAX if balanced else K_MAX)
    ks = range(2, k_max + 1)
    se, dof = _each_k(ks, spread, se_set, balanced, spread if cand_spread is None else cand_spread)
    return _first(ks, stats.t.ppf(_level(confidence), dof) * se <= target)


def replicates_for_equivalence(spread: float, margin: float, se_set: float = 0.0, confidence: float = 0.95, *,
                               chance: float = 0.8, k_max: int | None = None,
                               cand_spread: float | None = None) -> int | None:
    """The fewest k = m (as many candidate runs as baselines) with which a candidate *identical* to BF16 is called
    ``equivalent`` with probability ``chance``; None if ``k_max`` (default ``BALANCED_MAX``) do not suffice.

    ``replicates_needed(..., target=margin)`` gives an interval half-width equal to the margin, and an interval that
    wide lies inside the margin only when its estimate is exactly 0: measured through the verdict's code
    (``paired.statistics``, k = m = 197 at spread 1 %, set error 0.045 %, the proxy's numbers), an identical
    candidate was called equivalent 3.7 % +- 0.8 % of the time. Equivalence needs ``|estimate| + half-width <=
    margin``; with the estimate ~ N(0, se) that holds with probability ``chance`` when ``margin >= (t + z) * se``,
    ``z`` the normal quantile at ``(1 + chance) / 2`` (the whole range and the final window are taken as one: on the
    proxy their levels move together, and the final window's spread is the one planned with)."""
    k_max = k_max or BALANCED_MAX
    z = float(stats.norm.ppf((1 + chance) / 2))
    ks = range(2, k_max + 1)
    se, dof = _each_k(ks, spread, se_set, True, spread if cand_spread is None else cand_spread)
    return _first(ks, (stats.t.ppf(_level(confidence), dof) + z) * se <= margin)


def _each_k(ks: range, spread: float, se_set: float, balanced: bool, cand_spread: float):
    """For every k of ``ks``: the standard error with the set's, and the degrees of freedom, of ``k`` baselines
    and ``k`` (``balanced``) or one candidate run, as ``half_width`` computes them one k at a time (the same
    Python operations, so the same bits); numpy arrays, for one scipy quantile call over all of them instead of
    one call per k (a --status asked scipy ~100,000 times)."""
    per_k = [between_runs(k, spread, k if balanced else 1, cand_spread) for k in ks]
    return (np.array([math.sqrt(se ** 2 + se_set ** 2) for se, _ in per_k]),
            np.array([dof for _, dof in per_k], dtype=float))


def _first(ks: range, enough: np.ndarray) -> int | None:
    """The first k for which ``enough`` holds; None if none does."""
    hit = np.flatnonzero(enough)
    return ks[int(hit[0])] if hit.size else None


def pooled_spread(groups: list[list[float]]) -> tuple[float, int] | None:
    """(spread, degrees of freedom) of runs in groups that may differ in their mean (BF16 runs, a candidate's
    runs): each around its own mean, pooled; None without a degree of freedom."""
    dof = sum(len(g) - 1 for g in groups if len(g) > 1)
    if dof < 1:
        return None
    squares = sum(float(((np.asarray(g) - np.mean(g)) ** 2).sum()) for g in groups if len(g) > 1)
    return math.sqrt(squares / dof), dof


def spread_ratio(baseline: list[float], candidate: list[float]) -> dict | None:
    """Do the candidate's runs spread more (or less) than the baselines'? Each group's spread around its own mean,
    their ratio, and the F-test's two-sided p for equal spreads (normal runs); None unless both have two runs and
    the baselines some spread.
    Planning with one pooled spread assumes them equal; the verdict itself does not (Welch)."""
    if len(baseline) < 2 or len(candidate) < 2:
        return None
    sb, sc = float(np.std(baseline, ddof=1)), float(np.std(candidate, ddof=1))
    if sb == 0:
        return None
    da, dc = len(baseline) - 1, len(candidate) - 1
    one_sided = float(stats.f.sf((sc / sb) ** 2, dc, da))
    return {"baseline": sb, "candidate": sc, "ratio": sc / sb, "dof": (da, dc),
            "p_equal": min(1.0, 2 * min(one_sided, 1 - one_sided))}


def pair_correlation(baseline: list[float], candidate: list[float]) -> dict | None:
    """Do paired runs end alike? ``baseline[i]`` and ``candidate[i]`` are the levels of two runs with the same
    change (a protocol's BF16 replicate i and its candidate replicate i: same initial weights, data and row order).
    Their Pearson correlation r with its two-sided p (no correlation: the t test with n - 2 degrees of freedom), and
    the spread of a pair's difference against that of two runs taken apart, ``sqrt(s_b^2 + s_c^2)``: over n pairs
    the pairs' mean difference has their ratio, ``sqrt(1 - 2 r s_b s_c / (s_b^2 + s_c^2))``, times the standard
    error of the groups' taken apart, below 1 only when r > 0 (with n - 1 degrees of freedom instead of Welch's
    up to 2n - 2). None with fewer than three pairs or a group without spread."""
    if len(baseline) != len(candidate):
        raise ValueError(f"pairs need as many baseline levels as candidate ones, got {len(baseline)} and "
                         f"{len(candidate)}")
    n = len(baseline)
    if n < 3:
        return None
    b, c = np.asarray(baseline, dtype=float), np.asarray(candidate, dtype=float)
    sb, sc = float(np.std(b, ddof=1)), float(np.std(c, ddof=1))
    if sb == 0 or sc == 0:
        return None
    r = float(np.clip(np.corrcoef(b, c)[0, 1], -1.0, 1.0))
    p = 0.0 if abs(r) == 1 else float(2 * stats.t.sf(abs(r) * math.sqrt((n - 2) / (1 - r * r)), n - 2))
    return {"n": n, "r": r, "p": p, "paired_spread": float(np.std(c - b, ddof=1)),
            "apart_spread": math.sqrt(sb * sb + sc * sc)}


def spread_interval(spread: float, dof: int, confidence: float = 0.95) -> tuple[float, float]:
    """Where the true spread lies, given one measured with ``dof`` degrees of freedom (normal runs: dof s^2 /
    sigma^2 is chi-square): with 3 the interval spans 0.57x to 3.7x the measured spread, with 30 0.80x to 1.34x."""
    a = (1 - confidence) / 2
    return (spread * math.sqrt(dof / stats.chi2.ppf(1 - a, dof)), spread * math.sqrt(dof / stats.chi2.ppf(a, dof)))


def fit_spread(points: list[tuple[int, float]]) -> tuple[float, float] | None:
    """(a, b) with spread = a * steps^b, least squares in log-log; None with fewer than two run lengths."""
    pts = [(s, v) for s, v in points if s > 0 and v > 0]
    if len({s for s, _ in pts}) < 2:
        return None
    x, y = np.log([s for s, _ in pts]), np.log([v for _, v in pts])
    b, log_a = np.polyfit(x, y, 1)
    return float(math.exp(log_a)), float(b)


def steps_needed(fit: tuple[float, float], spread: float) -> float | None:
    """Run length at which the fitted spread falls to ``spread``; None if it does not fall with steps."""
    a, b = fit
    return None if b >= 0 else (spread / a) ** (1 / b)


def _spread_for(k: int, target: float, se_set: float, confidence: float) -> float | None:
    """The largest replicate spread with which k baselines reach ``target`` (None: the set's error alone is
    too large)."""
    t = float(stats.t.ppf(_level(confidence), k - 1))
    rest = (target / t) ** 2 - se_set ** 2
    return None if rest <= 0 else math.sqrt(rest / (1 + 1 / k))


@dataclass(frozen=True)
class Measured:
    steps: int  # length of the runs
    replicates: int  # k baselines
    spread: float  # their spread (final window)
    se_set: float  # the held-out set's standard error (0 when not measured: see se_set_measured)
    estimate: float | None = None  # the candidate's relative difference, when the result is a verdict
    source: str = ""
    heldout_batches: int | None = None  # the batches se_set is over (results before it was recorded: None)
    se_set_measured: bool = True  # False: the runs logged no per-batch losses, and the planned numbers leave it out


def measured(result: dict, source: str = "") -> Measured:
    """The numbers of a ``compare --metric val_loss`` result's final window."""
    if result.get("metric") != "val_loss" or not result.get("final_window"):
        raise ValueError(f"{source or 'result'}: not a compare --metric val_loss result with a final window")
    fw = result["final_window"]
    where = source or "result"
    if fw.get("seed_spread") is None:
        raise ValueError(f"{where}: fewer than two baselines, no spread measured")

    def number(key: str, value, *, low: float = 0.0, none_ok: bool = False):
        """A finite JSON number >= low (None where allowed): a damaged result printed 'spread -1.000%' or nan."""
        if value is None and none_ok:
            return None
        if not is_number(value) or not math.isfinite(value) or value < low:
            raise ValueError(f"{where}: final_window.{key} must be a finite number >= {low:g}, got {value!r}")
        return value

    levels = fw["replicate_levels"]
    if not isinstance(levels, list) or len(levels) < 2:
        raise ValueError(f"{where}: final_window.replicate_levels must list two replicates or more, got {levels!r}")
    batches = number("heldout_batches", fw.get("heldout_batches"), low=2, none_ok=True)
    if batches is not None and type(batches) is not int:
        raise ValueError(f"{where}: final_window.heldout_batches must be a whole number, got {batches!r}")
    return Measured(steps=int(result["coverage"]["compared_steps"][1]), replicates=len(levels),
                    spread=float(number("seed_spread", fw["seed_spread"])),
                    se_set=float(number("se_set", fw.get("se_set") or 0.0)),
                    estimate=number("estimate", fw.get("estimate"), low=-math.inf, none_ok=True), source=source,
                    heldout_batches=batches, se_set_measured=fw.get("se_set") is not None)


def with_larger_set(m: Measured, times: float) -> Measured:
    """``m`` as it would be with a held-out set of ``times`` as many batches (spread over a split large enough):
    the set's error divided by sqrt(times), everything else as measured."""
    if not times > 0:
        raise ValueError(f"a held-out set {times} times as large")
    if not m.se_set_measured:  # taken as 0: dividing it would change nothing and claim it had
        raise ValueError(f"{m.source or 'measured'}: no held-out set error was measured (its runs logged no "
                         "per-batch losses), so a larger set's effect cannot be planned")
    batches = None if m.heldout_batches is None else round(m.heldout_batches * times)
    return dataclasses.replace(m, se_set=m.se_set / math.sqrt(times), heldout_batches=batches,
                               source=f"{m.source or 'measured'} with a held-out set {times:g}x as large (its error "
                                      f"/ {math.sqrt(times):.2f})")


def analyse(ms: list[Measured], *, margin: float = 0.0025, confidence: float = 0.95,
            ks: tuple[int, ...] = (2, 3, 4, 6, 8, 12, 16, 32)) -> dict:
    """Per measurement: the half-width for each k, the replicates for margin and margin/2, the floor; over the
    measurements (two lengths or more): the spread's power law and the steps at which k = 4, 8, 16 reach
    the margin and half of it."""
    rows = []
    for m in ms:
        hw = {k: half_width(k, m.spread, m.se_set, confidence) for k in ks}
        hw_bal = {k: half_width(k, m.spread, m.se_set, confidence, m=k) for k in ks}
        rows.append({"measured": dataclasses.asdict(m), "half_width": hw, "half_width_balanced": hw_bal,
                     "floor": floor_half_width(m.spread, m.se_set, confidence),
                     "floor_balanced": floor_half_width(0.0, m.se_set, confidence),
                     "replicates_for_margin": replicates_needed(m.spread, margin, m.se_set, confidence),
                     "replicates_for_half_margin": replicates_needed(m.spread, margin / 2, m.se_set, confidence),
                     "balanced_for_margin": replicates_needed(m.spread, margin, m.se_set, confidence, balanced=True),
                     "balanced_for_margin_without_set_error": replicates_needed(
                         m.spread, margin, 0.0, confidence, balanced=True)})
    fit = fit_spread([(m.steps, m.spread) for m in ms])
    longest = max(ms, key=lambda m: m.steps) if ms else None
    plans = []
    if fit and longest:
        for k in (4, 8, 16):
            for target in (margin, margin / 2):
                s = _spread_for(k, target, longest.se_set, confidence)
                n = None if s is None else steps_needed(fit, s)
                plans.append({"replicates": k, "half_width": target, "spread_needed": s, "steps_needed": n})
    return {"margin": margin, "confidence": confidence, "rows": rows, "fit": fit, "plans": plans}


def report(a: dict) -> str:
    m = a["margin"]
    out = [f"margin +-{m:.3%}, family confidence {a['confidence']:.0%} (two ranges, as the verdict)"]
    for r in a["rows"]:
        x = r["measured"]
        # the final window's: what these rows plan for (the verdict's estimate is the whole range's)
        est = "" if x["estimate"] is None else f", the candidate's final-window estimate {x['estimate']:+.3%}"
        lo, hi = spread_interval(x["spread"], x["replicates"] - 1)
        out.append(f"{x['source'] or 'measured'}: {x['replicates']} replicates at {x['steps']} steps, spread "
                   f"{x['spread']:.3%} (95 % interval {lo:.3%} to {hi:.3%}), held-out set s.e. "
                   + (f"{x['se_set']:.3%}" + (f" over {x['heldout_batches']} batches" if x.get("heldout_batches")
                                              else "") if x.get("se_set_measured", True) else
                      "not measured (no per-batch losses; left out, so the runs asked for below may be too few)")
                   + est)
        out.append("  half-width with k replicates: " + ", ".join(f"k={k} {v:.3%}" for k, v in r["half_width"].items()))
        need = {t: r[f"replicates_for_{t}"] for t in ("margin", "half_margin")}
        out.append(f"  replicates for a half-width <= {m:.3%}: {need['margin'] or f'more than {K_MAX}'}; "
                   f"<= {m / 2:.3%}: {need['half_margin'] or f'more than {K_MAX}'}; floor (any k) {r['floor']:.3%}"
                   + ("" if r["floor"] < m else " -- no number of baselines reaches the margin with one candidate run"))
        out.append("  with as many candidate runs as baselines (--candidate-replicates k): " + ", ".join(
            f"k={k} {v:.3%}" for k, v in r["half_width_balanced"].items()))
        bal, clean = r["balanced_for_margin"], r["balanced_for_margin_without_set_error"]
        out.append(f"  k = m for a half-width <= {m:.3%}: " + (
            f"{bal} + {bal} runs" if bal else f"none up to {BALANCED_MAX}: the held-out set's error alone gives a "
            f"floor of {r['floor_balanced']:.3%}") + (
            "" if bal or not clean else
            f"; with a held-out set large enough that its error vanishes, {clean} + {clean}"))
    if a["fit"]:
        ca, b = a["fit"]
        out.append(f"spread vs run length: {ca:.4g} * steps^{b:.3f}")
        for p in a["plans"]:
            n = p["steps_needed"]
            out.append(f"  k={p['replicates']}, half-width {p['half_width']:.3%}: spread <= "
                       + ("(the set's error alone is too large)" if p["spread_needed"] is None else
                          f"{p['spread_needed']:.3%} -> " + (f"~{n:,.0f} steps" if n else "not reached: the spread "
                                                            "does not fall with steps")))
    elif len(a["rows"]) == 1:
        out.append("one run length measured: how the spread falls with steps needs a second length "
                   "(run the protocol with another --steps and pass both results)")
    return "\n".join(out)
