"""How fast a protocol's replicates drift from their recipe's paired run, and how far its runs spread at each
evaluation.

Public: ``drift(plan, out, status) -> dict | None``, ``spread_by_evaluation(plan, out, status) -> dict | None``,
``SAME_BATCHES``, ``PAIRED_ROLES``; the figure of both is ``convergence.curves.plots.plot_replicate_drift``.

Under the ``rounding`` and ``init`` designs every run of a protocol sees the same batches at every step, so a
replicate's training loss at a step differs from its recipe's paired run (``bf16``, the candidate, the control,
all at the plan's seed) only by the replicate's change and what training has made of it since. The relative
difference ``|loss_replicate - loss_paired| / loss_paired``, averaged over log-spaced bins of steps (1, 2-3, 4-7,
...) and then the median over the recipe's replicates, says whether one recipe amplifies a small change faster
than another: whether MXFP8, whose runs end further apart than BF16's, gets there by drifting faster. The other
designs change the batches, so their per-step losses differ by the data and say nothing about this (None).

The end of that story is the validation loss: ``spread_by_evaluation`` is the runs' spread at each evaluation,
the planning spread's arithmetic at every evaluation instead of the final window, and at the last one each
recipe's runs apart (the control's too). Whether it narrows as training goes on and the learning rate decays says
whether longer runs would buy resolution (``convergence power`` fits that over runs of other lengths; within one
plan's runs it is measured at no cost).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from convergence.curves.jsonl import load_jsonl
from convergence.protocol.folder import metrics_path
from convergence.protocol.plan import ProtocolPlan
from numerics.errors import BadInput

SAME_BATCHES = ("rounding", "init")  # the designs whose runs see the same batches at every step
PAIRED_ROLES = ("baseline", "candidate", "control")  # one run per recipe at the plan's seed, no change


def _bins(steps: int) -> list[tuple[int, int]]:
    """Steps 1..``steps`` in bins [2^j, 2^(j+1)), the last cut at ``steps``: the runs drift over orders of
    magnitude, so equal bins in log(step) show each one."""
    out, lo = [], 1
    while lo <= steps:
        out.append((lo, min(2 * lo, steps + 1)))
        lo *= 2
    return out


def drift(plan: ProtocolPlan, out: Path, status: dict) -> dict | None:
    """Per recipe with a finished paired run and at least one finished replicate: ``runs`` (the replicates),
    ``bins`` ([first step, last step] each), ``median`` (over the replicates, of each one's mean relative
    difference in the bin), ``low`` and ``high`` (their least and greatest). None when the plan's design changes
    the batches. A run whose logged steps are not the paired run's raises ``BadInput`` naming it."""
    if plan.design not in SAME_BATCHES:
        return None
    bins = _bins(plan.steps)
    result = {}
    for ref in (r for r in plan.runs() if r.role in PAIRED_ROLES):
        if status.get(ref.name) != "done":
            continue
        base = load_jsonl(metrics_path(out, ref))
        means = []  # [replicate][bin]
        for r in plan.runs():
            if r.recipe != ref.recipe or r.name == ref.name or status.get(r.name) != "done":
                continue
            run = load_jsonl(metrics_path(out, r))
            if not np.array_equal(run.steps, base.steps):
                raise BadInput(f"{r.name}: its logged steps are not {ref.name}'s ({len(run.steps)} vs "
                               f"{len(base.steps)}): cannot pair them step for step")
            rel = np.abs(run.values - base.values) / np.abs(base.values)
            means.append([float(rel[(base.steps >= lo) & (base.steps < hi)].mean()) for lo, hi in bins])
        if means:
            m = np.array(means)
            result[ref.recipe] = {"runs": len(means), "bins": [[lo, hi - 1] for lo, hi in bins],
                                  "median": np.median(m, axis=0).tolist(), "low": m.min(axis=0).tolist(),
                                  "high": m.max(axis=0).tolist()}
    return result


def spread_by_evaluation(plan: ProtocolPlan, out: Path, status: dict) -> dict | None:
    """The relative spread of the validation loss at each evaluation step that every finished BF16 run (baselines
    and held-out ones) and every finished candidate run logged: each run's loss over the BF16 runs' mean there,
    less one, pooled over the two groups each around its own mean (``power.pooled_spread``, as the planning
    spread is over the final window). ``steps``, ``spread`` (one per step), ``runs`` (BF16's, the candidate's),
    ``dof``; and ``at_last``: at the last of those steps, each recipe's runs (the control's too) as their relative
    standard deviation and count, ``{recipe: (rsd, runs)}`` for recipes with two runs there or more (does one
    recipe's runs end wider apart than another's?). None without a degree of freedom or a step they share."""
    from convergence.curves.power import pooled_spread  # here, not at import: scipy, which --piece never needs

    every: dict[str, list[dict[int, float]]] = {"bf16": [], plan.candidate: [], plan.control: []}
    for r in plan.runs():
        if r.recipe in every and status.get(r.name) == "done":
            curve = load_jsonl(metrics_path(out, r), loss_key="val_loss")
            every[r.recipe].append(dict(zip(curve.steps.tolist(), curve.values.tolist())))
    groups = {recipe: every[recipe] for recipe in ("bf16", plan.candidate)}  # the planning spread's two groups
    dof = sum(len(g) - 1 for g in groups.values() if g)
    steps = sorted(set.intersection(*(set(v) for g in groups.values() for v in g))) if dof >= 1 else []
    if not groups["bf16"] or not steps:
        return None
    spreads = []
    for step in steps:
        mean = float(np.mean([v[step] for v in groups["bf16"]]))
        spreads.append(pooled_spread([[v[step] / mean - 1 for v in g] for g in groups.values()])[0])
    at_last = {}
    for recipe, runs in every.items():
        ends = [v[steps[-1]] for v in runs if steps[-1] in v]
        if len(ends) >= 2:
            at_last[recipe] = (float(np.std(ends, ddof=1) / np.mean(ends)), len(ends))
    return {"steps": steps, "spread": spreads, "runs": (len(groups["bf16"]), len(groups[plan.candidate])),
            "dof": dof, "candidate": plan.candidate, "at_last": at_last}
