"""The protocol's data in words and pictures, for ``python -m convergence protocol`` (and notebook 03's helper):
``--status`` (``status_lines``, ``draw_figures``), a verdict (``verdict_line``), what computed the runs
(``made_with_line``, ``environment_change_line``), the replicates' drift, the spread at each evaluation, the
projection and the pairs.

Public: ``status_lines(progress, figure, drift_figure)``, ``draw_figures(progress, figure, drift_figure, force)``,
``verdict_line(name, r)``, ``made_with_line(made)``, ``environment_change_line(diffs)``, ``drift_lines(result)``,
``spread_line(result, last_step)``, ``projection_text(p)``, ``pairs_lines(found)``, ``amendment_lines(verdicts)``.
"""

from __future__ import annotations

from pathlib import Path

from convergence.protocol.status import Pairs, Progress, Projection

WHERE = {"overall": "the whole range", "final_window": "the final window"}
IN_RANGE = {"overall": "over the whole range", "final_window": "in the final window"}


def verdict_line(name: str, r: dict) -> str:
    """One verdict as the protocol prints it: the decision, for a control whether it came out as it must (a plan
    with a declared test: by its own check, ``judge.control_outcome``), the reason (the estimate, its interval, the
    p-value against no difference and the test's), what the runs resolve and the secondary endpoint."""
    from convergence.curves.compare import resolution

    proto = r["protocol"]
    exp, ok, outcome = proto["expected"], proto["as_expected"], proto.get("outcome")
    mark = "OK" if ok else "FAILED"
    if outcome is None:
        check = "" if exp is None else f" [control: expected {exp}: {mark}]"
        return f"{name:<17} {r['verdict'].upper()}{check}: {r['reason']}; {resolution(r)}" + _secondary(r)
    if outcome["check"] == "identical":
        return f"{name:<17} {r['verdict'].upper()} [control: expected identical: {mark}]: {r['reason']}"
    if outcome["check"] == "covers_zero":
        covers = {True: "yes", False: "no", None: "cannot tell"}[outcome["covers_zero"]]
        said = "" if outcome["interval"] is None else (
            f"{outcome['interval_level']:.0%} interval [{outcome['interval'][0]:+.3%}, {outcome['interval'][1]:+.3%}],"
            f" p = {outcome['p_no_difference']:.3g} against no difference; ")
        return (f"{name:<17} COVERS 0: {covers.upper()} [control: expected yes: {mark}]: {said}its test: "
                f"{r['verdict']}: {r['reason']}")
    chance = outcome.get("planned_chance")
    planted = "" if outcome.get("planted_shift") is None else f"planted +{outcome['planted_shift']:.3%}, "
    said = f"{planted}planned chance {chance:.0%}" if chance is not None else f"{planted}no planned chance"
    return (f"{name:<17} {r['verdict'].upper()} [control: detected ({outcome['detected_as']}): "
            f"{'yes' if ok else 'no'}; {said}]: {r['reason']}; {resolution(r)}")


def amendment_lines(verdicts: dict[str, dict]) -> list[str]:
    """One line for each change of the plan made after some of its runs had finished, as ``judge`` put them in its
    verdicts (``protocol.amendments``): the verdicts were declared before those runs, and are read knowing it."""
    changes = next(iter(verdicts.values()), {}).get("protocol", {}).get("amendments", [])
    return [f"amended: {', '.join(f'{k} {was} -> {now}' for k, (was, now) in c['changed'].items())} after "
            f"{len(c['finished_runs'])} run(s) had finished (not declared before them)" for c in changes]


def _secondary(r: dict) -> str:
    """A declared test's other part, reported, never deciding."""
    from convergence.curves.decision.equivalence import PART_OF

    if not r.get("endpoint") or not r.get("test") or r["test"] == "two-ranges":
        return ""
    other = next(p for e, p in PART_OF.items() if e != r["endpoint"])
    part = r.get(other) or {}
    if part.get("interval") is None:
        return ""
    lo, hi = part["interval"]
    return (f"; secondary, {WHERE[other]} (never decides): {part['estimate']:+.3%} [{lo:+.3%}, {hi:+.3%}], "
            f"p = {part['p_no_difference']:.3g} against no difference")


def made_with_line(made: dict) -> str | None:
    """``provenance.made_with``'s in one line, a field on which the runs differ marked MIXED (None when no run has
    recorded its environment)."""
    parts = [f"{f} {vs[0][0]}" if len(vs) == 1 else
             f"{f} MIXED ({'; '.join(f'{v} in {len(runs)}' for v, runs in vs)})" for f, vs in made.items()]
    return ", ".join(parts) or None


def environment_change_line(diffs: dict) -> str | None:
    """``provenance.environment_change``'s in one line (None when nothing differs)."""
    return "; ".join(f"{f} {now} here, " + ", ".join(f"{v} in {len(runs)} run(s) ({runs[0]}"
                                                     f"{', ...' if len(runs) > 1 else ''})" for v, runs in other)
                     for f, (now, other) in diffs.items()) or None


def drift_lines(result: dict, at: tuple[int, ...] = (2, 8, 64, 512)) -> list[str]:
    """One line per recipe of ``replicate_drift.drift``: the median relative difference in the bins that hold the
    steps ``at`` and the last, with the least and greatest replicate's beside it (replicates can drift in groups,
    and the median of an even count then jumps between them)."""
    lines = []
    for recipe, r in result.items():
        picks = [i for i, (lo, hi) in enumerate(r["bins"]) if any(lo <= s <= hi for s in at)]
        picks += [] if len(r["bins"]) - 1 in picks else [len(r["bins"]) - 1]
        cells = ", ".join(f"{r['bins'][i][0]}-{r['bins'][i][1]}: {r['median'][i]:.1e}"
                          + (f" ({r['low'][i]:.1e} to {r['high'][i]:.1e})" if r["runs"] > 1 else "") for i in picks)
        lines.append(f"{recipe} ({r['runs']} replicate{'s' * (r['runs'] > 1)}) steps {cells}")
    return lines


def spread_line(result: dict, last_step: int) -> str:
    """``replicate_drift.spread_by_evaluation``'s in one line, and what it is not (the runs' learning rate decays
    to ``last_step``: an earlier evaluation is mid-schedule, not the end of a shorter run)."""
    cells = ", ".join(f"{s}: {v:.2%}" for s, v in zip(result["steps"], result["spread"]))
    bf16, cand = result["runs"]
    each = ", ".join(f"{recipe} {rsd:.2%} ({n} runs)" for recipe, (rsd, n) in result.get("at_last", {}).items())
    return (f"validation loss spread at each evaluation ({bf16} BF16 and {cand} {result['candidate']} runs, pooled, "
            f"{result['dof']} degrees of freedom): {cells} (mid-schedule before step {last_step}: not what a "
            f"shorter run would end at)" + (f"; at step {result['steps'][-1]}, each recipe's runs apart (relative "
                                             f"standard deviation): {each}" if each else ""))


def projection_text(p: Projection | None) -> str:
    """``status.projection``'s in words (two lines when the two groups' spreads apart ask for other runs)."""
    from convergence.curves.power import BALANCED_MAX

    if p is None:
        return "the whole plan's resolution: unknown (no spread measured yet)"
    so_far, should = ("of its runs", "by the planning formula resolves") if p.whole else \
        ("measured so far", "should resolve")
    other = [f"{WHERE[r]} +-{hw:.3%} at its spread {spread:.3%}" for r, (hw, spread) in p.other_ranges.items()]
    text = (f"at the spread {so_far} ({p.spread:.3%}, {p.bf16_runs} BF16 and {p.candidate_runs} {p.candidate} "
            f"runs, {p.dof} degrees of freedom; 95 % interval {p.spread_interval[0]:.3%} to "
            f"{p.spread_interval[1]:.3%}) the whole plan (k = {p.k}, m = {p.m}) {should} about +-{p.half_width:.3%} "
            f"(+-{p.half_width_interval[0]:.3%} to +-{p.half_width_interval[1]:.3%}) in {WHERE[p.range]}"
            + (f" (the wider of the verdict's two ranges; {other[0]})" if other else "")
            + f", against a margin of +-{p.margin:.3%}")
    n = p.needs
    if n is None:
        return text
    if n.floor is not None:
        return text + (f"; +-{p.margin:.3%} is out of reach with this held-out set: its error ({n.se_set:.3%}) "
                       f"alone leaves +-{n.floor:.3%} at any k = m (a larger set: --val-batches)")

    def runs(k):  # the plan's runs: k baselines, and k each of the candidate, the control and the held-out runs
        return f"{k} ({4 * k} runs)" if k else f"more than {BALANCED_MAX}"

    text += (f"; +-{p.margin:.3%} needs about k = m = {n.k} ({4 * n.k} runs; {n.k_low} to "
             f"{n.k_high or f'more than {BALANCED_MAX}'} over the spread's interval), an interval as wide as the "
             "margin: for a candidate identical to BF16 to be called equivalent 8 times in 10, about k = m = "
             + runs(n.k_equivalent))
    r = n.spreads_apart
    if r is None:
        return text
    return text + (f"\n  the pooled spread takes {p.candidate}'s runs to spread as BF16's: they spread "
                   f"{r['candidate']:.3%} against {r['baseline']:.3%} ({r['ratio']:.2f}x; equal spreads: F-test "
                   f"p = {r['p_equal']:.2f}); taken apart, +-{p.margin:.3%} needs about k = m = " + runs(n.k_apart))


def pairs_lines(found: list[Pairs]) -> list[str]:
    """``status.pairs``'s, one line a judged recipe."""
    lines = []
    for pair in found:
        part, first = next(iter(pair.by_range.items()))
        said = ", ".join(f"{c['r']:+.2f} {IN_RANGE[p]} (p = {c['p']:.2f})" for p, c in pair.by_range.items())
        lines.append(f"pairs ({first['n']} pairs of BF16 and {pair.recipe} runs with the same change): their levels "
                     f"correlate {said}; a pair's difference spreads {first['paired_spread']:.3%} against "
                     f"{first['apart_spread']:.3%} for two runs apart ({IN_RANGE[part]}): over these runs, the mean "
                     f"difference of the pairs has {first['paired_spread'] / first['apart_spread']:.2f}x the "
                     "standard error of the groups' taken apart (Welch, as the verdicts judge)")
    return lines


def status_lines(p: Progress, figure: Path | None = None, drift_figure: Path | None = None) -> list[str]:
    """``--status``: how far the folder is (``status.progress``), naming the figures ``draw_figures`` drew."""
    plan = p.plan
    lines = [f"{plan.prefix} in {p.out}: {p.done} of {len(p.states)} runs done ({plan.steps} steps each)"]
    lines += [f"  {g.title}: {g.done} of {g.runs}" for g in p.groups]
    made = made_with_line(p.made_with)
    if made:
        lines.append(f"  made with {made}")
    lv = p.level
    if lv is not None and not lv.whole:
        lines.append(f"  complete as the smaller protocol k = {lv.replicates}, m = {lv.candidate_replicates}: judge "
                     f"it with the same command and --replicates {lv.replicates} --candidate-replicates "
                     f"{lv.candidate_replicates} (the runs made stay; the larger plan continues with its own)")
    if lv is not None and lv.error is not None:
        lines.append(f"    cannot judge it: {lv.error}")
    elif lv is not None:
        lines += [f"    {verdict_line(name, r)}" for name, r in lv.verdicts.items()]
        lines += [f"    {line}" for line in amendment_lines(lv.verdicts)]
        if not lv.whole:
            lines.append("    (interim: the plan's verdict is the whole plan's; stopping because an interim one "
                         "looks decided would bias it, stopping for want of compute time does not)")
        if lv.planning_error is not None:
            lines.append(f"  cannot plan from every finished run ({lv.planning_error}): planning from the level's runs")
        # a plan with a declared test: what its test resolves; the projection by the two-ranges rule for one under it
        lines.append("  " + (projection_text(lv.projection) if lv.resolves is None else lv.resolves))
        lines += [f"  {line}" for line in pairs_lines(lv.pairs)]
        if lv.designs:
            from convergence.curves.decision.designs import report_table

            lines.append(f"  runs a declared test needs, by design ({lv.designs_note}):")
            lines += [f"    {line}" for line in report_table(lv.designs, plan.margin, 0.8, plan.alpha).splitlines()]
        elif lv.designs_note:
            lines.append(f"  runs a declared test needs, by design: {lv.designs_note}")
        if figure is not None:
            lines.append(f"  figure: {figure}")
    if figure is not None and lv is None:
        lines.append("  no figure: no level is whole yet")
    lines += _drift_status(p, drift_figure)
    if p.spread_error is not None:
        lines.append(f"  validation loss spread at each evaluation: cannot tell: {p.spread_error}")
    elif p.spread is not None:
        lines.append("  " + spread_line(p.spread, plan.steps))
    started = [_started(name, s, plan.steps) for name, s in p.states.items()
               if s.state != "done" and (s.state != "pending" or s.where is not None)]  # a queued job is named
    if started:
        lines.append("  started: " + ", ".join(started))
    left = p.left
    no_pace = ", ".join(f"{recipe} x {n}" for recipe, n in left.no_pace)
    if left.recipes:
        lines.append(f"  left: about {left.seconds / 3600:.1f} GPU-hours at this folder's pace ("
                     + ", ".join(f"{recipe} {s:.0f} s x {share:.1f}" for recipe, s, share in left.recipes) + ")"
                     + (f"; no pace yet for {no_pace}" if no_pace else ""))
    elif no_pace:
        lines.append(f"  left: {no_pace} runs, no pace measured yet")
    return lines


def _started(name: str, s, steps: int) -> str:
    note = {"restart": " (no checkpoint here: starts again at step 0)"}.get(s.state, f" ({s.state})")
    note = "" if s.state == "stopped" else note
    where = f" [{s.where}]" if s.where else ""
    log = f" (log: {s.log})" if s.state == "failed" and s.log else ""
    return f"{name} {s.steps}/{steps}{note}{where}{log}"


def _drift_status(p: Progress, figure: Path | None) -> list[str]:
    if p.drift_error is not None:
        return [f"  replicates drift: cannot tell: {p.drift_error}"]
    if p.drift is None:
        return [f"  replicates drift: not measured: the {p.plan.design} design changes the batches"] if figure else []
    if not p.drift:
        return ["  no drift figure: no recipe has a finished paired run and replicate yet"] if figure else []
    return ["  replicates drift from their recipe's paired run (|training loss - the paired run's| / loss, same "
            "batches; median over the replicates, least to greatest in brackets):",
            *(f"  - {line}" for line in drift_lines(p.drift)), *([f"  drift figure: {figure}"] if figure else [])]


def draw_figures(p: Progress, figure: Path | None, drift_figure: Path | None, *, force: bool = False) -> None:
    """``--plot``: the last whole level's verdicts as they stand; ``--plot-parting``: the replicates' drift with
    the spread at each evaluation beside it. A figure with nothing to draw is not written (``status_lines`` says
    why)."""
    from convergence.curves.plots import plot_replicate_drift, plot_verdicts

    plan, lv = p.plan, p.level
    runs = f"{p.done} of {len(p.states)} runs of {plan.steps} steps"
    if figure is not None and lv is not None and lv.verdicts is not None:
        plot_verdicts({n: r for n, r in lv.verdicts.items() if r.get("final_window")}, figure, force=force,
                      title=f"{plan.prefix}: {runs}; judged as k = {lv.replicates}, m = {lv.candidate_replicates}"
                            + ("" if lv.whole else " (interim)"))
    if drift_figure is not None and p.drift:
        plot_replicate_drift(p.drift, drift_figure, force=force, spread=p.spread,
                             title=f"{plan.prefix}: how far each replicate is from its recipe's paired run "
                                   f"({p.done} runs of {plan.steps} steps; design {plan.design})")
