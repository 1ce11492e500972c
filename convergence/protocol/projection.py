"""What a plan should decide, said before any run: the declared test's chances at its planned spread, the
controls' chances, and the GPU-hours, level by level.

Public: ``projection(plan, costs=None) -> dict``, ``planning_spread(plan)``, ``arms(plan)``, ``plan_cost_s(plan,
costs)``, ``projection_lines(p)``, ``PLANNED``, ``COSTS``.

The chances are ``convergence.curves.decision.equivalence.chance`` (exact for normal run levels) for the estimate
the plan's verdicts compute: k baselines against m judged runs, ``c = 1/k + 1/m`` on ``k + m - 2`` degrees of
freedom (the planning number: ``designs``), and in a fork plan per trunk, over its ``trunks`` blocks: ``c = (1/k +
1/m) / trunks`` on ``trunks (k + m - 2)`` (``convergence.curves.paired.within_blocks``). For the verdict: the
favourable verdict at no true difference (the power) and at +margin (the type-I point, at most alpha). For the
planted positive control (the held-out runs made ``planted_shift`` margins worse): the chance the test calls it
unfavourable; for the negative control: its interval covers 0 with probability 1 - alpha. The spread is the plan's
``planned_spread``, or the model's measured one (``PLANNED``; a fork plan's within-trunk spread is the fork
pilot's where one was measured at the plan's fork step and length, else assumed from the independent one,
``designs.fork``, and said so); a model without one has no chances in advance, and says so.

Levels: the plan's nested smaller plans (``ProtocolPlan.levels``), each with its runs, cost and chances. A plan is
judged once, at the level its compute reached: stopping at a level chosen by the compute time is unbiased,
stopping because a verdict looks decided is not (no interim looks are declared).
"""

from __future__ import annotations

import math

from convergence.curves.decision import designs
from convergence.curves.decision.equivalence import WORDS, chance
from convergence.protocol.plan import PLANTED, ProtocolPlan

# The proxy's run-to-run spread of the final-window level (relative), and its held-out set's standard error, from
# the k16 plan (golden/training/proxy_long_lr3e-4_k16_*: 32 BF16 and 16 MXFP8 runs of 1,500 steps at lr 3e-4, 290
# held-out batches of a 20 % split, one H200): the 32 BF16 runs (baselines and held-out) and the 16 MXFP8 runs
# pooled, each group around its own mean, 46 degrees of freedom (tests/convergence/protocol/test_declared.py
# re-derives it from the golden verdicts). It holds
# for plans of that length, learning rate and held-out set; another plan gives its own --planned-spread.
# A fork plan's within-trunk spread, the same way, from the fork pilot (golden/training/
# proxy_fork_h100_pilot__h100.json: 8 BF16 continuations of one deterministic trunk from step 500 to 1,500, the k16
# plan's learning rate and held-out set, one H100; 7 degrees of freedom, 95 % interval 0.211-0.650 %): it holds
# for a fork at that step of a run of that length; any other fork step plans with the assumed one (designs.fork).
PLANNED = {"proxy": {"spread": 0.0096264, "se_set": 0.00032849,
                     "source": "the k16 plan's final window (32 BF16, 16 MXFP8 runs of 1,500 steps, lr 3e-4, "
                               "290 held-out batches; H200)",
                     "fork": {"fork_step": 500, "steps": 1500, "spread": 0.0031927,
                              "source": "the fork pilot's final window (8 BF16 continuations of one trunk from "
                                        "step 500 to 1,500, lr 3e-4, 290 held-out batches; H100)"}}}
# GPU-seconds of a whole run and of a start-up on an H200 (proxy, 1,500 steps): 6.6 H200-hours over the k16 plan's
# 64 runs (BF16, MXFP8 and E2M1 together: 371 s a run); a start-up ~60 s (convergence.protocol.schedule.STARTUP_S),
# paid again by each trunk and continuation. A deterministic run (fork trunks, the null control and its twin) trains
# 1.41x slower: the H200 fork pilot's deterministic BF16 trunk made 49.8k tokens/s, its continuations 70.3k
# (dev/gpu/proxy_fork; 1.47x on an H100)
COSTS = {"proxy": {"run_s": 371.25, "candidate_run_s": 371.25, "startup_s": 60.0, "deterministic_pace": 1.41,
                   "source": "the k16 plan's 6.6 H200-hours / 64 runs; deterministic runs 1.41x"}}


def planning_spread(plan: ProtocolPlan) -> tuple[float | None, float, str]:
    """(spread, held-out set error, where they come from) the plan's chances are computed at; spread None when
    there is none to plan with."""
    known = PLANNED.get(plan.model)
    se_set = known["se_set"] if known else 0.0
    if plan.planned_spread is not None:
        kind = "within-trunk spread" if plan.design == "fork" else "spread"
        return plan.planned_spread, se_set, f"declared: --planned-spread ({kind})"
    if known is None:
        return None, 0.0, f"no measured spread for model {plan.model} (declare one with --planned-spread)"
    if plan.design != "fork":
        return known["spread"], se_set, f"measured: {known['source']}"
    pilot = known.get("fork") or {}
    if (pilot.get("fork_step"), pilot.get("steps")) == (plan.fork_step, plan.steps):
        return pilot["spread"], se_set, f"measured (within-trunk spread): {pilot['source']}"
    d = designs.fork(None, se_set, independent_spread=known["spread"])
    return d.spread, se_set, f"{d.source}; the independent one {known['source']}"


def arms(plan: ProtocolPlan) -> tuple[float, float]:
    """(c, dof) of the verdict's estimate: module docstring."""
    k, m = plan.replicates, plan.candidate_replicates
    if plan.design == "fork":
        return (1 / k + 1 / m) / plan.trunks, float(plan.trunks * (k + m - 2))
    return 1 / k + 1 / m, float(k + m - 2)


def _chances(plan: ProtocolPlan, spread: float, se_set: float) -> dict:
    c, dof = arms(plan)
    if dof < 1:
        return {"dof": dof, "note": "no degree of freedom for the spread at this level"}
    kw = dict(alpha=plan.alpha, sigma=spread, c=c, dof=dof, se_set=se_set)
    test = plan.test
    at_zero, at_margin = chance(test, 0.0, plan.margin, **kw), chance(test, plan.margin, plan.margin, **kw)
    sd = math.sqrt(spread ** 2 * c + se_set ** 2)
    good, bad = WORDS[test]
    out = {"dof": dof, "sd": sd, "verdict": {"favourable": good, f"chance_{good}_at_0": at_zero["favourable"],
                                              f"chance_{bad}_at_0": at_zero["unfavourable"],
                                              f"chance_{good}_at_margin": at_margin["favourable"]}}
    if plan.control == PLANTED:
        delta = plan.planted_shift * plan.margin
        out["positive_control"] = {"planted_shift": delta, "detected_as": bad,
                                   "chance_detected": chance(test, delta, plan.margin, **kw)["unfavourable"]}
    out["negative_control"] = {"chance_covers_zero": 1 - plan.alpha}
    return out


def plan_cost_s(plan: ProtocolPlan, costs: dict) -> float:
    """GPU-seconds of every run of ``plan``: a run of a candidate or control recipe ``candidate_run_s``, of BF16
    (and the null control) ``run_s``; a fork's trunk and continuation their share of a run plus a start-up each;
    a deterministic run at ``deterministic_pace`` (default 1) times the step time (``designs.part_cost_s``)."""
    from convergence.protocol.forks import span

    total = 0.0
    for r in plan.runs():
        whole = costs["run_s"] if r.recipe == "bf16" or r.role == "null_control" else costs["candidate_run_s"]
        first, last = span(plan, r)
        pace = costs.get("deterministic_pace", 1.0) if r.deterministic else 1.0
        total += designs.part_cost_s(whole, (last - first) / plan.steps, costs["startup_s"], pace)
    return total


def projection(plan: ProtocolPlan, costs: dict | None = None) -> dict:
    """The plan's projection (module docstring): the spread it plans with, the chances of the whole plan
    (``verdict``, ``positive_control``, ``negative_control``) and ``levels`` (each level's runs, GPU-hours and
    chances); ``costs`` (``run_s``, ``candidate_run_s``, ``startup_s``, ``source``): default ``COSTS``' for the
    model, else no GPU-hours."""
    spread, se_set, source = planning_spread(plan)
    costs = costs or COSTS.get(plan.model)
    out = {"test": plan.test, "alpha": plan.alpha, "endpoint": plan.endpoint, "margin": plan.margin,
           "design": plan.design, "spread": spread, "se_set": se_set, "spread_source": source,
           "costs": costs, "early_stopping": "none on the data: judged once, at the last whole level the compute "
                                             "reached (a level chosen by the compute time is unbiased)"}
    if plan.pilot:  # its runs and their cost, no chances
        return out | {"runs": len(plan.runs()), "gpu_hours": None if costs is None else plan_cost_s(plan, costs) / 3600,
                      "note": "a pilot measures a spread; no verdict to plan"}
    if plan.legacy:
        return out | {"note": "a plan under the rule before declared tests: no projection"}
    levels = []
    for sub in plan.levels():
        row = {"replicates": sub.replicates, "candidate_replicates": sub.candidate_replicates,
               "trunks": sub.trunks if plan.design == "fork" else None, "runs": len(sub.runs()),
               "gpu_hours": None if costs is None else plan_cost_s(sub, costs) / 3600}
        if spread is not None:
            row |= _chances(sub, spread, se_set)
        levels.append(row)
    whole = levels[-1]
    return out | {k: whole.get(k) for k in ("runs", "gpu_hours", "verdict", "positive_control", "negative_control",
                                            "sd")} | {"levels": levels}


def projection_lines(p: dict) -> list[str]:
    """The projection in words, for the command line."""
    lines = [f"declared: {p['test']} at alpha {p['alpha']:g} on the {p['endpoint']} endpoint, margin "
             f"+-{p['margin']:.3%}, design {p['design']}; {p.get('runs', '?')} runs"
             + ("" if p.get("gpu_hours") is None else f", about {p['gpu_hours']:.1f} GPU-hours "
                f"({p['costs']['source']})")]
    if p.get("note"):
        return lines + [f"  {p['note']}"]
    if p["spread"] is None:
        return lines + [f"  chances in advance: none ({p['spread_source']})"]
    v = p["verdict"] or {}
    good = v.get("favourable")
    lines.append(f"  at a spread of {p['spread']:.3%} ({p['spread_source']}): the estimate's s.d. {p['sd']:.3%}; "
                 f"{good} with probability {v.get(f'chance_{good}_at_0', math.nan):.1%} when the candidate is "
                 f"BF16's equal, {v.get(f'chance_{good}_at_margin', math.nan):.1%} when it is exactly a margin worse")
    pc = p.get("positive_control")
    if pc:
        lines.append(f"  positive control (held-out runs +{pc['planted_shift']:.3%}): called {pc['detected_as']} "
                     f"with probability {pc['chance_detected']:.1%}")
    lines.append(f"  negative control: covers 0 with probability {p['negative_control']['chance_covers_zero']:.0%}")
    lines.append(f"  early stopping: {p['early_stopping']}")
    return lines
