"""From a comparison's statistics to its verdict: the rule, the coverage, the sensitivity and the resolution line.

Public: ``EXIT_CODES``, ``rule_of(result)``, ``coverage(baselines, candidates, lo, hi, options)``,
``sensitivity(result)``, ``resolution(result)``, ``statistics_verdict(result)``, ``verdict(result, div, base_div)``.

The rule is the result's ``test`` (``convergence.curves.decision.equivalence``): ``two-ranges`` (``LEGACY``; a result
without the field was judged by it) needs both ranges inside the margin; ``equivalence`` and ``non-inferiority``
decide on the declared endpoint alone (``endpoint``: the final window or the whole range) and report the other part as a
secondary endpoint that never decides.
"""

from __future__ import annotations

import math

import numpy as np

from convergence.curves.decision.equivalence import LEGACY, PART_OF

# the command-line contract of a verdict (docs/curves.md: compare exits 0 / 1 / 3 / 4, and 2 for bad input); the
# non-inferiority words keep the codes' meaning: 0 the test's claim is shown, 1 its opposite
EXIT_CODES = {"equivalent": 0, "non_inferior": 0, "not_equivalent": 1, "inferior": 1, "diverged": 1,
              "inconclusive": 3, "incomplete": 4}
RANGE_NAMES = {"overall": "whole range", "final_window": "final window"}


def rule_of(r: dict) -> str:
    """The test a result was judged by (``LEGACY`` when it names none: results from before the field)."""
    return r.get("test") or LEGACY


def coverage(baselines: list, candidates: list, lo: int, hi: int, o) -> dict:
    """How much of each run the compared steps ``lo..hi`` cover, and whether that is all of it."""
    runs = [("baseline", b) for b in baselines] + [("candidate", c) for c in candidates]
    span = max(int(c.steps[-1]) for _, c in runs) - min(int(c.steps[0]) for _, c in runs)
    interval = max(int(np.median(np.diff(c.steps.astype(np.float64)))) if len(c) > 1 else 0 for _, c in runs)
    tol = max(math.ceil(o.coverage_fraction * span), interval)
    rows, short = [], []
    for role, c in runs:
        first, last = int(c.steps[0]), int(c.steps[-1])
        inside = int(((c.steps >= lo) & (c.steps <= hi)).sum())
        rows.append({"role": role, "source": c.meta.source, "steps": [first, last], "points": len(c),
                     "compared_points": inside, "compared_fraction": inside / len(c),
                     "not_compared_steps": {"start": lo - first, "end": last - hi}})
        if lo - first > tol or last - hi > tol:
            short.append(f"{role} {c.name} has steps {first}..{last}")
    return {"compared_steps": [lo, hi], "tolerance_steps": tol, "complete": not short,
            "overlap_only": o.overlap_only, "runs": rows, "short": short}


def sensitivity(r: dict) -> dict | None:
    """The half-width and what the intervals bound (``two-ranges``: the wider of the two ranges; a declared test:
    its endpoint's)."""
    rule = rule_of(r)
    parts = [r["overall"], r["final_window"]] if rule == LEGACY else [r[PART_OF[r["endpoint"]]]]
    judged = [p for p in parts if p and p.get("half_width") is not None]
    if not judged:
        return None
    hw = max(p["half_width"] for p in judged)
    ivs = [p.get("interval") for p in parts]
    reach = max(abs(x) for iv in ivs for x in iv) if all(ivs) else None
    apart = max((iv[0] if iv[0] > 0 else -iv[1] if iv[1] < 0 else 0.0) for iv in ivs) if all(ivs) else 0.0
    out = {"half_width": hw, "smallest_detectable_difference": r["margin"] + hw,
           "equivalence_provable": hw < r["margin"],
           # what the intervals bound, whatever the margin: both inside +-reach (equivalent at any margin from
           # there), or one clear of 0 by apart (not_equivalent at any margin below). A margin picked after
           # seeing them is no test; these describe the runs for a reader whose margin differs from the one set.
           "intervals_reach": reach, "intervals_clear_of_zero_by": apart or None,
           "note": "a true relative difference of margin + half_width is called "
                   + ("inferior" if rule == "non-inferiority" else "not_equivalent") + " about half the time (its "
                   "estimate falls on either side of it), more often the further beyond; the favourable verdict "
                   "can only be reached when half_width < margin"}
    if rule != LEGACY:
        out["smallest_margin"] = judged[0]["smallest_margin"]  # the favourable verdict at any margin above it
    return out


def resolution(r: dict) -> str:
    """What the judged runs could resolve, for the verdict line. ``two-ranges``: the interval half-width, the
    difference that would be called not_equivalent about half the time (``margin + half-width``: the power curve's
    50 % point, not a difference always called so), and how far the intervals reach (and clear 0). A declared
    test: the half-width of its interval and the smallest margin that would give the favourable verdict."""
    sens = r.get("sensitivity")
    if not sens:
        return f"resolution unknown: {(r.get('overall') or {}).get('why') or 'too few compared points'}"
    rule = rule_of(r)
    if rule != LEGACY:
        small = sens["smallest_margin"]
        if rule == "equivalence":
            at = f"equivalent at any margin above +-{small:.3%}"
        else:
            at = "non_inferior at any margin above 0" if small <= 0 else \
                f"non_inferior at any margin above +{small:.3%}"
        return (f"resolves +-{sens['half_width']:.3%} ({1 - 2 * r['alpha']:.0%} interval half-width); the same runs "
                f"would be {at}")
    reach, apart = sens.get("intervals_reach"), sens.get("intervals_clear_of_zero_by")  # absent in older results
    bounds = ("" if reach is None else f"; its intervals lie within +-{reach:.3%}"
              + ("" if apart is None else f" and clear of 0 by {apart:.3%}"))
    return (f"resolves +-{sens['half_width']:.3%}: a difference of +-{sens['smallest_detectable_difference']:.3%} "
            f"is called not_equivalent about half the time{bounds}")


def statistics_verdict(r: dict) -> tuple[str, str]:
    """The verdict and its reason from the judged parts, by the result's rule (``rule_of``)."""
    ov, fi = r["overall"], r["final_window"]
    if ov is None:
        return "inconclusive", "too few compared points"
    rule = rule_of(r)
    if rule != LEGACY:
        key = PART_OF[r["endpoint"]]
        part = r[key]
        where = f"{RANGE_NAMES[key]} (steps {part['start_step']}..{part['end_step']})"
        return part["decision"], f"{where}: {part['why']}"
    decisions = {"whole range": ov["decision"], "final window": fi["decision"]}
    for name, dec in decisions.items():
        if dec == "not_equivalent":
            part = ov if name == "whole range" else fi
            return "not_equivalent", f"{name}: {part['why']}"
    if all(d == "equivalent" for d in decisions.values()):
        return "equivalent", f"whole range: {ov['why']}; final window: {fi['why']}"
    part, name = (ov, "whole range") if ov["decision"] != "equivalent" else (fi, "final window")
    return "inconclusive", f"{name}: {part['why']}"


def verdict(r: dict, div: dict | None, base_div: list) -> tuple[str, str]:
    """Candidate ``diverged``, then a diverged baseline (``inconclusive``), then ``incomplete``, then the
    statistics (``statistics_verdict``)."""
    if div:
        return "diverged", f"candidate diverged at step {div['step']} ({div['kind']})"
    if base_div:
        d = base_div[0]
        return "inconclusive", f"baseline {d['source']} diverged at step {d['step']} ({d['kind']})"
    cov = r["coverage"]
    lo, hi = cov["compared_steps"]
    if not cov["complete"]:
        if not cov["overlap_only"]:
            return "incomplete", (f"only steps {lo}..{hi} are in every run ({'; '.join(cov['short'])}; "
                                  f"tolerance {cov['tolerance_steps']} steps); pass --overlap-only to judge "
                                  "the overlap alone")
        found, reason = statistics_verdict(r)
        return found, f"overlap only, steps {lo}..{hi} ({'; '.join(cov['short'])}): {reason}"
    return statistics_verdict(r)
