"""How fast a protocol's runs part: each replicate's training loss against its recipe's paired run, step by step.

Public: ``parting(plan, out, status) -> dict | None``, ``parting_lines(result) -> list[str]``,
``spread_by_evaluation(plan, out, status) -> dict | None``, ``spread_line(result, last_step) -> str``, ``SAME_BATCHES``,
``PAIRED_ROLES``; the parting's figure is ``convergence.curves.plots.plot_parting``.

Under the ``rounding`` and ``init`` designs every run of a protocol sees the same batches at every step, so a
replicate's training loss at a step differs from its recipe's paired run (``bf16``, the candidate, the control,
all at the plan's seed) only by the replicate's change and what training has made of it since. The relative
difference ``|loss_replicate - loss_paired| / loss_paired``, averaged over log-spaced bins of steps (1, 2-3, 4-7,
...) and then the median over the recipe's replicates, says whether one recipe amplifies a small change faster than
another: the question README #15 asks of MXFP8, whose runs end further apart than BF16's. The other designs
change the batches, so their per-step losses differ by the data and say nothing about this (None).

The end of that story is the validation loss: ``spread_by_evaluation`` is the runs' spread at each evaluation,
the planning spread's arithmetic at every evaluation instead of the final window, and at the last one each recipe's
runs apart (the control's too). Whether it narrows as training
goes on and the learning rate decays says whether longer runs would buy resolution (``convergence power`` fits that
over runs of other lengths; within one plan's runs it is measured at no cost).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from convergence.curves import power
from convergence.curves.jsonl import load_jsonl
from convergence.protocol import plan as pr
from numerics.errors import BadInput

SAME_BATCHES = ("rounding", "init")  # the designs whose runs see the same batches at every step
PAIRED_ROLES = ("baseline", "candidate", "control")  # one run per recipe at the plan's seed, no change


def _bins(steps: int) -> list[tuple[int, int]]:
    """Steps 1..``steps`` in bins [2^j, 2^(j+1)), the last cut at ``steps``: the runs part over orders of
    magnitude, so equal bins in log(step) show each one."""
    out, lo = [], 1
    while lo <= steps:
        out.append((lo, min(2 * lo, steps + 1)))
        lo *= 2
    return out


def parting(plan: pr.ProtocolPlan, out: Path, status: dict) -> dict | None:
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
        base = load_jsonl(pr.metrics_path(out, ref))
        means = []  # [replicate][bin]
        for r in plan.runs():
            if r.recipe != ref.recipe or r.name == ref.name or status.get(r.name) != "done":
                continue
            run = load_jsonl(pr.metrics_path(out, r))
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


def parting_lines(result: dict, at: tuple[int, ...] = (2, 8, 64, 512)) -> list[str]:
    """One line per recipe: the median relative difference in the bins that hold the steps ``at`` and the last,
    with the least and greatest replicate's beside it (the replicates can part in groups: proto5's MXFP8 ones in
    steps 8-15 did, and the median of an even count then jumps between them)."""
    lines = []
    for recipe, r in result.items():
        picks = [i for i, (lo, hi) in enumerate(r["bins"]) if any(lo <= s <= hi for s in at)]
        picks += [] if len(r["bins"]) - 1 in picks else [len(r["bins"]) - 1]
        cells = ", ".join(f"{r['bins'][i][0]}-{r['bins'][i][1]}: {r['median'][i]:.1e}"
                          + (f" ({r['low'][i]:.1e} to {r['high'][i]:.1e})" if r["runs"] > 1 else "") for i in picks)
        lines.append(f"{recipe} ({r['runs']} replicate{'s' * (r['runs'] > 1)}) steps {cells}")
    return lines


def spread_by_evaluation(plan: pr.ProtocolPlan, out: Path, status: dict) -> dict | None:
    """The relative spread of the validation loss at each evaluation step that every finished BF16 run (baselines
    and held-out ones) and every finished candidate run logged: each run's loss over the BF16 runs' mean there,
    less one, pooled over the two groups each around its own mean (``power.pooled_spread``, as the planning
    spread is over the final window). ``steps``, ``spread`` (one per step), ``runs`` (BF16's, the candidate's),
    ``dof``; and ``at_last``: at the last of those steps, each recipe's runs (the control's too) as their relative
    standard deviation and count, ``{recipe: (rsd, runs)}`` for recipes with two runs there or more (does one
    recipe's runs end wider apart than another's? README #15 cites it). None without a degree of freedom or a
    step they share."""
    every: dict[str, list[dict[int, float]]] = {"bf16": [], plan.candidate: [], plan.control: []}
    for r in plan.runs():
        if r.recipe in every and status.get(r.name) == "done":
            curve = load_jsonl(pr.metrics_path(out, r), loss_key="val_loss")
            every[r.recipe].append(dict(zip(curve.steps.tolist(), curve.values.tolist())))
    groups = {recipe: every[recipe] for recipe in ("bf16", plan.candidate)}  # the planning spread's two groups
    dof = sum(len(g) - 1 for g in groups.values() if g)
    steps = sorted(set.intersection(*(set(v) for g in groups.values() for v in g))) if dof >= 1 else []
    if not groups["bf16"] or not steps:
        return None
    spreads = []
    for step in steps:
        mean = float(np.mean([v[step] for v in groups["bf16"]]))
        spreads.append(power.pooled_spread([[v[step] / mean - 1 for v in g] for g in groups.values()])[0])
    at_last = {}
    for recipe, runs in every.items():
        ends = [v[steps[-1]] for v in runs if steps[-1] in v]
        if len(ends) >= 2:
            at_last[recipe] = (float(np.std(ends, ddof=1) / np.mean(ends)), len(ends))
    return {"steps": steps, "spread": spreads, "runs": (len(groups["bf16"]), len(groups[plan.candidate])),
            "dof": dof, "candidate": plan.candidate, "at_last": at_last}


def spread_line(result: dict, last_step: int) -> str:
    """One line: the spread at each evaluation, and what it is not (the runs' learning rate decays to
    ``last_step``: an earlier evaluation is mid-schedule, not the end of a shorter run)."""
    cells = ", ".join(f"{s}: {v:.2%}" for s, v in zip(result["steps"], result["spread"]))
    bf16, cand = result["runs"]
    each = ", ".join(f"{recipe} {rsd:.2%} ({n} runs)" for recipe, (rsd, n) in result.get("at_last", {}).items())
    return (f"validation loss spread at each evaluation ({bf16} BF16 and {cand} {result['candidate']} runs, pooled, "
            f"{result['dof']} degrees of freedom): {cells} (mid-schedule before step {last_step}: not what a "
            f"shorter run would end at)" + (f"; at step {result['steps'][-1]}, each recipe's runs apart (relative "
                                             f"standard deviation): {each}" if each else ""))
