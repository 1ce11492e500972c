"""How many runs, and GPU-hours, a declared test needs: per design, test and true difference.

Public: ``Design``, ``independent(spread, se_set)``, ``fork(spread, se_set, ...)``, ``runs_per_arm(design, test,
delta, margin, ...)``, ``favourable``, ``verdict_chance``, ``aim_of(delta, margin)``, ``pace_costs(path)``,
``endpoint_spread(result)``, ``pilot_spread(pilot)``, ``part_cost_s(...)``, ``table(...)``, ``report_table(rows)``,
``EXPLAINED_AT_FORK``, ``TEST_ROWS``.

Designs (n runs per arm: n BF16 and n candidate runs; the estimate's variance ``spread^2 * 2/n + se_set^2``):

* ``independent`` (the k16 plan's): every run from step 0, runs of one recipe ``spread`` apart (their levels over the
  endpoint, pooled over both arms); the spread is estimated on ``2n - 2`` degrees of freedom (the pooled number;
  the verdict's Welch degrees of freedom are at most that, and close to it for equal arms and spreads).
* ``fork``: trunks are BF16 runs to the fork step (``fork_fraction`` of the run), and each trunk is continued by
  ``pairs_per_trunk`` BF16 and as many candidate runs (``python -m convergence train --fork-from``). What the
  trunk decides is shared by its continuations and cancels in the difference, so ``spread`` is the spread of a
  continuation's level within a trunk; the candidate's estimand is "the candidate from the fork step on". The
  spread is estimated within trunks, on ``2n - 2 * trunks`` degrees of freedom; that takes the candidate's effect
  to be the same on every trunk (a trunk-by-recipe interaction would add its variance / trunks, and a judge that
  takes the trunk as a block would have ``trunks - 1`` degrees of freedom). Until a pilot measures it, the
  within-trunk spread is assumed to be ``sqrt(1 - EXPLAINED_AT_FORK)`` times the independent one, and every
  output says it is an assumption.

Tests (``convergence.curves.decision.equivalence.chance``, exact for normal run levels): ``equivalence`` and
``non-inferiority`` at ``alpha``, powered at a stated true difference for the verdict that is right there
(``aim_of``): inside the margin the favourable one (equivalent, non_inferior: 0 by default), beyond it the
unfavourable one (not_equivalent, inferior: a candidate that much worse detected, e.g. at twice the margin, the
planted positive control's shift); exactly at the margin neither is right, and no number of runs reaches the power.
Each row also gives the chance of the favourable verdict at a true difference of +margin (the type-I point: at most
alpha). The row
``two-ranges`` is the rule before (both ranges' Bonferroni intervals) approximated by one range at its level,
``(1 - confidence) / 4`` a side: what the same question cost under it.

Cost (``part_cost_s``, the one formula, also ``convergence.protocol.projection.plan_cost_s``'s): a run of the whole
length costs ``run_s`` (BF16) or ``candidate_run_s`` GPU-seconds, start-up included; a part of a run costs
``startup_s + fraction * (run_s - startup_s)``, so that a fork's trunk and continuations each pay a start-up again;
a run trained ``--deterministic`` (a fork's trunk) trains at ``deterministic_pace`` times the step time (its
start-up unchanged). ``pace_costs`` reads measured costs from a protocol folder's ``pace.jsonl``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from convergence.curves.decision.equivalence import chance
from convergence.curves.jsonl import is_number
from numerics.errors import BadInput
from numerics.files import read_json_lines

# A run's level early in training explains most of its level at the end: on the proxy's 48 k16 runs (lr 3e-4), the
# level at step 500 explains 66 % (BF16) and 81 % (MXFP8) of the variance of the final-window level across runs;
# 70 % is the round figure. A fork at step 500 shares all that state, so its continuations should spread about
# sqrt(0.3) ~ 0.55x as much: an estimate from independent curves, not a measurement of forks.
EXPLAINED_AT_FORK = 0.70
N_MAX = 1_000_000  # runs per arm searched before "none": beyond any plan
TEST_ROWS = ("equivalence", "non-inferiority", "two-ranges")


@dataclass(frozen=True)
class Design:
    name: str  # "independent" or "fork"
    spread: float  # a run's level spread: between independent runs, or within a trunk
    se_set: float = 0.0  # the held-out set's standard error (taken as known)
    pairs_per_trunk: int = 0  # fork: BF16 / candidate pairs continued from each trunk
    fork_fraction: float = 0.0  # fork: the trunk's share of a run's steps (fork step / steps)
    source: str = ""  # where the spread comes from: "measured ..." or "assumed ..."

    def trunks(self, n: int) -> int:
        return math.ceil(n / self.pairs_per_trunk) if self.name == "fork" else 0

    def dof(self, n: int) -> float:
        """Degrees of freedom of the spread with n runs per arm: pooled over both arms (independent) or within
        trunks (fork); one pair per trunk leaves the pairs' differences, n - 1."""
        if self.name == "fork" and self.pairs_per_trunk == 1:
            return float(n - 1)
        return float(2 * n - 2 * max(self.trunks(n), 1))

    def cost_s(self, n: int, run_s: float, candidate_run_s: float, startup_s: float = 0.0,
               deterministic_pace: float = 1.0) -> float:
        """GPU-seconds of n runs per arm (and the trunks they continue, trained deterministic)."""
        if self.name != "fork":
            return n * (run_s + candidate_run_s)
        f = self.fork_fraction
        return (self.trunks(n) * part_cost_s(run_s, f, startup_s, deterministic_pace)
                + n * (part_cost_s(run_s, 1 - f, startup_s) + part_cost_s(candidate_run_s, 1 - f, startup_s)))


def part_cost_s(whole_s: float, fraction: float, startup_s: float, pace: float = 1.0) -> float:
    """GPU-seconds of ``fraction`` of a run whose whole costs ``whole_s`` (a start-up of ``startup_s`` included),
    trained at ``pace`` times its step time (a deterministic run's): module docstring."""
    if fraction == 1 and pace == 1:
        return whole_s
    return startup_s + fraction * (whole_s - startup_s) * pace


def independent(spread: float, se_set: float = 0.0, source: str = "") -> Design:
    return Design("independent", spread, se_set, source=source)


def fork(spread: float | None, se_set: float = 0.0, *, pairs_per_trunk: int = 8, fork_fraction: float = 1 / 3,
         independent_spread: float | None = None, source: str = "") -> Design:
    """A fork design; without a measured within-trunk ``spread``, the assumed one (``EXPLAINED_AT_FORK``)."""
    if pairs_per_trunk < 1 or not 0 < fork_fraction < 1:
        raise BadInput(f"a fork design needs >= 1 pair per trunk and a fork step inside the run, got "
                       f"{pairs_per_trunk} and a fraction {fork_fraction:g}")
    if spread is None:
        if independent_spread is None:
            raise BadInput("a fork design needs its within-trunk spread, or the independent one to assume it from")
        spread = math.sqrt(1 - EXPLAINED_AT_FORK) * independent_spread
        source = (f"assumed: sqrt(1 - {EXPLAINED_AT_FORK:.2f}) x the independent spread {independent_spread:.3%} "
                  "(not measured: a fork pilot measures it)")
    return Design("fork", spread, se_set, pairs_per_trunk, fork_fraction, source)


def aim_of(delta: float, margin: float) -> str:
    """The verdict that is right at a true difference ``delta``: favourable inside the margin, else unfavourable."""
    return "favourable" if abs(delta) < margin else "unfavourable"


def verdict_chance(design: Design, test: str, delta: float, margin: float, n: int, *, aim: str = "favourable",
                   alpha: float = 0.05, confidence: float = 0.95) -> float:
    """The chance that n runs per arm give the ``aim`` verdict (favourable or unfavourable) at a true difference
    ``delta``."""
    if test == "two-ranges":  # one range at the Bonferroni level of the rule before
        test, alpha = "equivalence", (1 - confidence) / 4
    return chance(test, delta, margin, alpha=alpha, sigma=design.spread, c=2 / n, dof=design.dof(n),
                  se_set=design.se_set)[aim]


def favourable(design: Design, test: str, delta: float, margin: float, n: int, *, alpha: float = 0.05,
               confidence: float = 0.95) -> float:
    """The chance that n runs per arm give the favourable verdict at a true difference ``delta``."""
    return verdict_chance(design, test, delta, margin, n, alpha=alpha, confidence=confidence)


def runs_per_arm(design: Design, test: str, delta: float, margin: float, *, alpha: float = 0.05,
                 power: float = 0.8, confidence: float = 0.95, aim: str | None = None) -> int | None:
    """The fewest runs per arm (>= 2) that give the ``aim`` verdict (default: the right one at ``delta``,
    ``aim_of``) with probability ``power`` at a true difference ``delta``; None when ``N_MAX`` do not (the held-out
    set's error alone is too large, or ``delta`` is at the margin)."""
    aim = aim or aim_of(delta, margin)

    def enough(n: int) -> bool:
        return verdict_chance(design, test, delta, margin, n, aim=aim, alpha=alpha, confidence=confidence) >= power

    hi = 2
    while not enough(hi):
        if hi >= N_MAX:
            return None
        hi = min(2 * hi, N_MAX)
    lo = max(2, hi // 2)
    if enough(lo):
        return lo
    while hi - lo > 1:  # enough(hi), not enough(lo); the chance rises with n (the fork's trunks step the dof
        mid = (lo + hi) // 2  # by at most one trunk's worth: a step of under a run is left to the search's grain)
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return hi


def endpoint_spread(result: dict, part: str = "final_window") -> tuple[float, int, float]:
    """(spread, degrees of freedom, held-out set error) of a ``compare --metric val_loss`` result's part: the BF16
    and candidate runs' levels pooled, each around their own mean (``power.pooled_spread``)."""
    from convergence.curves.power import pooled_spread

    p = result.get(part) or {}
    groups = [list(p.get("replicate_levels") or []), list(p.get("candidate_levels") or [])]
    pooled = pooled_spread([g for g in groups if len(g) > 1])
    if pooled is None:
        raise BadInput(f"the result's {part} holds no spread (fewer than two runs in every group)")
    return pooled[0], pooled[1], float(p.get("se_set") or 0.0)


def pilot_spread(r: dict, where: str = "pilot") -> tuple[float, int]:
    """(within-trunk final-window spread, its degrees of freedom) of a fork pilot's result
    (``convergence.protocol.pilot``); ``BadInput`` for another file."""
    fw = r.get("final_window") if isinstance(r, dict) else None
    if not isinstance(fw, dict) or r.get("kind") != "fork pilot" or not is_number(r.get("fork_spread")) \
            or not r["fork_spread"] > 0:
        raise BadInput(f"{where}: not a fork pilot's result (python -m convergence protocol --design fork --pilot N "
                       "writes it in OUT/results/*_pilot__*.json)")
    return float(r["fork_spread"]), int(fw.get("dof") or 0)


def pace_costs(path: Path) -> dict[str, float]:
    """Mean GPU-seconds of a finished run per recipe, from a protocol folder's ``pace.jsonl`` (``path``: the file
    or the folder): each run's pieces
    since its last start at step 0, their wall seconds divided by the runs that shared their GPU (``per_gpu``);
    the runs that reached the file's last step count (a fork's trunk and continuations, parts of a run, do not)."""
    entries = read_json_lines(path, what="pace", hint="a protocol folder's pace.jsonl lists its pieces",
                              need={"recipe": str}, inside="pace.jsonl")
    for e in entries:
        if not all(is_number(e.get(k)) and e[k] >= 0 for k in ("from_step", "to_step", "wall_s")):
            raise BadInput(f"{path}: a pace entry without numbers >= 0 for from_step, to_step and wall_s ({e})")
    steps = max(e["to_step"] for e in entries)
    chains: dict[str, list[dict]] = {}
    done: dict[str, list[float]] = {}
    for e in entries:
        chain = chains.setdefault(str(e.get("run")), [])
        if e["from_step"] == 0:
            chain.clear()
        chain.append(e)
        if e["to_step"] == steps and chain[0]["from_step"] == 0:
            cost = sum(x["wall_s"] / max(1, int(x.get("per_gpu") or 1)) for x in chain)
            done.setdefault(str(e.get("recipe")), []).append(cost)
    return {recipe: sum(v) / len(v) for recipe, v in done.items()}


def table(designs: list[Design], margin: float, *, deltas=(0.0,), tests=TEST_ROWS, alpha: float = 0.05,
          power: float = 0.8, confidence: float = 0.95, run_s: float | None = None,
          candidate_run_s: float | None = None, startup_s: float = 0.0,
          deterministic_pace: float = 1.0) -> list[dict]:
    """One row per design, test and true difference: runs per arm for ``power`` of the right verdict there
    (``aim``: favourable or unfavourable, ``aim_of``), total runs, GPU-hours (with a cost per run) and the
    favourable verdict's chance at +margin with those runs."""
    rows = []
    for d in designs:
        for test in tests:
            for delta in deltas:
                n = runs_per_arm(d, test, delta, margin, alpha=alpha, power=power, confidence=confidence)
                row = {"design": d.name, "spread": d.spread, "spread_source": d.source, "se_set": d.se_set,
                       "test": test, "true_difference": delta, "aim": aim_of(delta, margin),
                       "runs_per_arm": n, "trunks": None,
                       "total_runs": None, "gpu_hours": None, "favourable_at_margin": None}
                if n is not None:
                    row["trunks"] = d.trunks(n) or None
                    row["total_runs"] = 2 * n + d.trunks(n)
                    row["favourable_at_margin"] = favourable(d, test, margin, margin, n, alpha=alpha,
                                                             confidence=confidence)
                    if run_s is not None:
                        c = run_s if candidate_run_s is None else candidate_run_s
                        row["gpu_hours"] = d.cost_s(n, run_s, c, startup_s, deterministic_pace) / 3600
                rows.append(row)
    return rows


def report_table(rows: list[dict], margin: float, power: float, alpha: float) -> str:
    """The rows as a table a user reads, with the designs' spreads and where they come from."""
    out = [f"runs per arm for {power:.0%} power at margin +-{margin:.3%}, alpha {alpha:g} (two-ranges: the rule "
           "before, one range at its Bonferroni level), of the verdict that is right at the true difference "
           "(inside the margin: equivalent or non_inferior; beyond it: not_equivalent or inferior, the worse "
           "candidate detected); 'at +margin': the favourable verdict's chance when the candidate is exactly a "
           "margin worse"]
    seen = {}
    for r in rows:
        seen.setdefault(r["design"], f"{r['design']}: spread {r['spread']:.3%}, held-out set s.e. {r['se_set']:.3%}"
                        + (f" ({r['spread_source']})" if r["spread_source"] else ""))
    out += list(seen.values())
    out.append("| design | test | true difference | powered | runs per arm | trunks | total runs | GPU-hours | "
               "at +margin |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        n = r["runs_per_arm"]
        said = {"favourable": "favourable", "unfavourable": "detected"}[r.get("aim", "favourable")]
        out.append(f"| {r['design']} | {r['test']} | {r['true_difference']:+.3%} | {said} | "
                   + (f"{n} | {r['trunks'] or '-'} | {r['total_runs']} | "
                      + ("-" if r["gpu_hours"] is None else f"{r['gpu_hours']:.1f}")
                      + f" | {r['favourable_at_margin']:.1%} |" if n is not None else
                      f"none up to {N_MAX:,} | - | - | - | - |"))
    return "\n".join(out)
