"""How far a protocol folder is, as data: runs done per verdict group, what computed them, the last whole level
judged in memory (with what the whole plan should resolve and whether the pairs end alike), the replicates' drift
and the spread at each evaluation, each run's state, and the compute time left at the folder's pace. Nothing is
written; ``convergence.protocol.render`` words it for ``--status`` and draws its figures.

Public: ``progress(plan, out, per_gpu, states) -> Progress``, ``projection(plan, verdicts, levels, whole)``,
``planning_levels(plan, sub, out, status)``, ``design_rows(plan, verdicts, levels, out)``, ``pairs(plan, verdicts)``,
``time_left(plan, out, states, per_gpu)``,
``GROUPS``; the data: ``Progress``, ``Group``, ``Level``, ``Projection``, ``Needs``, ``Pairs``, ``TimeLeft``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from convergence.protocol import replicate_drift
from convergence.protocol.folder import last_whole_level, metrics_path
from convergence.protocol.judge import judge
from convergence.protocol.plan import ProtocolPlan, RunSpec
from convergence.protocol.provenance import made_with
from convergence.protocol.schedule import LocalExecutor, RunState, expected_wall_s
from numerics.errors import BadInput

GROUPS = (("trunks (BF16, to the fork step)", ("trunk",)),
          ("baselines (BF16 + replicates)", ("baseline", "replicate")),
          ("candidate (+ replicates)", ("candidate", "candidate_replicate")),
          ("positive control (+ replicates)", ("control", "control_replicate")),
          ("negative control (held-out BF16)", ("heldout",)),
          ("null control (mxfp8-null)", ("null_control",)))  # a group without runs in the plan is not shown
RANGES = ("overall", "final_window")  # the verdict's two ranges: the whole range and the final window


@dataclass(frozen=True)
class Group:
    title: str
    done: int
    runs: int


@dataclass(frozen=True)
class Needs:
    """What the margin would need when the whole plan would not resolve it. ``floor``: set when no number of runs
    reaches it, the half-width the held-out set's error ``se_set`` alone leaves; else ``k`` (k = m for an interval
    as wide as the margin), ``k_low`` .. ``k_high`` over the spread's interval, ``k_equivalent`` (for a candidate
    identical to BF16 to be called equivalent 8 times in 10), and with the two groups' spreads apart
    (``spreads_apart``: ``power.spread_ratio``'s) ``k_apart``. None for a k: more than ``power.BALANCED_MAX``."""

    se_set: float
    floor: float | None = None
    k: int | None = None
    k_low: int | None = None
    k_high: int | None = None
    k_equivalent: int | None = None
    spreads_apart: dict | None = None
    k_apart: int | None = None


@dataclass(frozen=True)
class Projection:
    """What the whole plan (``k``, ``m``) should resolve at the spread measured so far (``whole``: the plan's own
    runs, by the planning formula), in ``range``, the verdict's range whose half-width is the wider; ``spread``
    over ``dof`` degrees of freedom from ``bf16_runs`` and ``candidate_runs``, with its 95 % interval, and the
    half-width at the spread and at the interval's ends; ``other_ranges``: range -> (half-width, spread);
    ``needs``: set when the half-width is wider than the margin."""

    k: int
    m: int
    margin: float
    candidate: str
    whole: bool
    range: str
    spread: float
    dof: int
    spread_interval: tuple[float, float]
    bf16_runs: int
    candidate_runs: int
    half_width: float
    half_width_interval: tuple[float, float]
    other_ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    needs: Needs | None = None


@dataclass(frozen=True)
class Pairs:
    """A judged recipe's runs and the BF16 baselines with the same change: per range, ``power.pair_correlation``'s
    result (``r``, ``p``, ``n``, ``paired_spread``, ``apart_spread``)."""

    recipe: str
    by_range: dict[str, dict]


@dataclass(frozen=True)
class Level:
    """The last whole level of the plan (k = ``replicates``, m = ``candidate_replicates``; ``whole``: the plan
    itself), judged here: its ``verdicts``, or ``error`` when it cannot be judged; ``projection`` (None before a
    spread is measured), ``planning_error`` when not every finished run could join it (the level's own runs
    then did), and ``pairs``."""

    replicates: int
    candidate_replicates: int
    whole: bool
    verdicts: dict | None = None
    error: str | None = None
    projection: Projection | None = None
    planning_error: str | None = None
    pairs: list[Pairs] = field(default_factory=list)
    designs: list[dict] = field(default_factory=list)
    designs_note: str = ""
    resolves: str | None = None


@dataclass(frozen=True)
class TimeLeft:
    """Compute seconds left at the folder's pace, whole runs one after another: ``seconds`` over ``recipes``
    ((recipe, a whole run's seconds, runs' worth left)); ``no_pace``: (recipe, runs left) with no pace yet."""

    seconds: float
    recipes: list[tuple[str, float, float]]
    no_pace: list[tuple[str, int]]


@dataclass(frozen=True)
class Progress:
    plan: ProtocolPlan
    out: Path
    done: int
    groups: list[Group]
    made_with: dict
    level: Level | None
    drift: dict | None
    drift_error: str | None
    spread: dict | None
    spread_error: str | None
    states: dict[str, RunState]
    left: TimeLeft


def progress(plan: ProtocolPlan, out: Path, per_gpu: int = 1, states: dict[str, RunState] | None = None) -> Progress:
    """How far ``out`` is. ``states``: each run's, as the executor that makes them sees it (default: the folder's,
    ``LocalExecutor.states``); ``per_gpu``: the pace of that many runs to a GPU."""
    states = LocalExecutor().states(plan, out) if states is None else states
    status = {name: "done" if s.state == "done" else s.steps for name, s in states.items()}
    runs = plan.runs()
    groups = [Group(title, sum(status[r.name] == "done" for r in group), len(group))
              for title, roles in GROUPS for group in [[r for r in runs if r.role in roles]] if group]
    sub = last_whole_level(plan, out, status)
    drift = spread = drift_error = spread_error = None
    try:
        drift = replicate_drift.drift(plan, out, status)
    except (BadInput, ValueError) as exc:
        drift_error = str(exc)
    try:
        spread = replicate_drift.spread_by_evaluation(plan, out, status)
    except (BadInput, ValueError) as exc:
        spread_error = str(exc)
    return Progress(plan, Path(out), sum(v == "done" for v in status.values()), groups, made_with(plan, out),
                    None if sub is None else _level(plan, sub, out, status), drift, drift_error, spread, spread_error,
                    states, time_left(plan, out, states, per_gpu))


def _level(plan: ProtocolPlan, sub: ProtocolPlan, out: Path, status: dict) -> Level:
    whole = sub.candidate_replicates == plan.candidate_replicates  # levels are indexed by m; the last is the plan
    kw = dict(replicates=sub.replicates, candidate_replicates=sub.candidate_replicates, whole=whole)
    try:
        verdicts = judge(sub, out)
    except (BadInput, ValueError) as exc:
        return Level(**kw, error=str(exc))
    levels, planning_error = None, None  # a whole plan: its verdicts' own runs are every run
    if not whole:
        try:
            levels = planning_levels(plan, sub, out, status)
        except (BadInput, ValueError) as exc:  # a finished run outside the level: plan from the level's runs
            planning_error = str(exc)
    rows, note = design_rows(plan, verdicts, levels, out)
    return Level(**kw, verdicts=verdicts, projection=projection(plan, verdicts, levels, whole=whole),
                 planning_error=planning_error, pairs=pairs(sub, verdicts), designs=rows, designs_note=note,
                 resolves=declared_resolution(plan, rows))


def declared_resolution(plan: ProtocolPlan, rows: list[dict]) -> str | None:
    """What the whole plan should resolve by its declared test at the spread measured so far (the first design
    row's: this folder's), in words; None under the rule before (``projection`` says it) or without a spread."""
    import math

    from scipy import stats

    from convergence.protocol.projection import arms

    if plan.legacy or not rows:
        return None
    c, dof = arms(plan)
    if dof < 1:
        return None
    spread, se_set = rows[0]["spread"], rows[0]["se_set"]
    half = float(stats.t.ppf(1 - plan.alpha, dof)) * math.sqrt(spread ** 2 * c + se_set ** 2)
    shape = f"k = {plan.replicates}, m = {plan.candidate_replicates}" + (
        f" in each of {plan.trunks} trunks" if plan.design == "fork" else "")
    return (f"at the spread measured so far ({spread:.3%}, {rows[0]['spread_source'].removeprefix('measured: ')}) "
            f"the whole plan ({shape}) should resolve about +-{half:.3%} by its {plan.test} test (the "
            f"{1 - 2 * plan.alpha:.0%} interval's half-width, {dof:g} degrees of freedom), against a margin of "
            f"+-{plan.margin:.3%}")


def design_rows(plan: ProtocolPlan, verdicts: dict, levels: dict | None, out: Path) -> tuple[list[dict], str]:
    """``designs.table``'s rows from this folder's final window (the plan's margin and alpha; at no true difference
    and at twice the margin), and a line saying where its numbers come from: independent runs at the spread of
    every finished BF16 and candidate run pooled (each group around its own mean), the fork's assumed from it; a
    fork plan's own within-trunk spread instead. GPU-hours at the folder's pace (``designs.pace_costs``, whole
    runs; else none)."""
    from convergence.curves import power
    from convergence.curves.decision import designs
    from convergence.protocol.folder import PACE_FILE
    from convergence.protocol.schedule import STARTUP_S

    fw = verdicts["verdict"].get("final_window") or {}
    se_set = fw.get("se_set") or 0.0
    if plan.design == "fork":
        spread = (fw.get("blocked") or {}).get("spread")
        if spread is None:
            return [], "no within-trunk spread measured yet"
        ds = [designs.fork(spread, se_set, pairs_per_trunk=plan.replicates, fork_fraction=plan.fork_step / plan.steps,
                           source=f"measured: this folder's final window, within trunks, {fw.get('dof'):g} "
                                  "degrees of freedom")]
    else:
        if levels is not None:
            bf16, cand = levels["final_window"]
        else:
            held = (verdicts.get("negative_control") or {}).get("final_window") or {}
            bf16 = list(fw.get("replicate_levels") or []) + list(held.get("candidate_levels") or [])
            cand = list(fw.get("candidate_levels") or [])
        pooled = power.pooled_spread([bf16, cand])
        if pooled is None or not pooled[0] > 0:
            return [], "no spread measured yet"
        ind = designs.independent(pooled[0], se_set, source=f"measured: this folder's final window, {len(bf16)} "
                                  f"BF16 and {len(cand)} {plan.candidate} runs, {pooled[1]} degrees of freedom")
        ds = [ind, designs.fork(None, se_set, independent_spread=pooled[0], fork_fraction=1 / 3)]
    pace = Path(out) / PACE_FILE
    costs = designs.pace_costs(pace) if pace.is_file() else {}
    run_s = costs.get("bf16")
    cand_s = costs.get(plan.candidate, run_s)
    rows = designs.table(ds, plan.margin, deltas=(0.0, 2 * plan.margin), alpha=plan.alpha, run_s=run_s,
                         candidate_run_s=cand_s, startup_s=STARTUP_S.get(plan.model, 60.0))
    cost = ("no whole BF16 run's pace in this folder: no GPU-hours" if run_s is None else
            f"GPU-hours at this folder's pace: a BF16 run {run_s:.0f} s, {plan.candidate} {cand_s:.0f} s, a start-up "
            f"{STARTUP_S.get(plan.model, 60.0):.0f} s per trunk and continuation")
    return rows, cost + ("" if plan.design == "fork" else "; the fork at a third of the run")


def planning_levels(plan: ProtocolPlan, sub: ProtocolPlan, out: Path, status: dict) -> dict[str, tuple[list, list]]:
    """Per range (``overall``, ``final_window``): the levels of every finished BF16 run and every finished
    candidate run, against the baselines of ``sub`` (the last whole level): for planning, a run the level does not
    hold yet says as much about the spread as one it does (the verdicts stay the level's). The same arithmetic as
    the verdict's (``convergence.curves.compare``, its ``candidate_levels``)."""
    from convergence.curves.compare import compare_paths

    baselines = [metrics_path(out, r) for r in sub.baselines()]
    groups = []
    for recipe in ("bf16", plan.candidate):
        first, *more = [metrics_path(out, r) for r in plan.runs() if r.recipe == recipe and status[r.name] == "done"]
        groups.append(compare_paths(baselines, first, margin=plan.margin, metric="val_loss",
                                    candidate_replicates=more, each_once=False))  # BF16 runs are baselines too
    return {part: (list(groups[0][part]["candidate_levels"]), list(groups[1][part]["candidate_levels"]))
            for part in RANGES}


def projection(plan: ProtocolPlan, verdicts: dict, levels: dict[str, tuple[list, list]] | None = None, *,
               whole: bool = False) -> Projection | None:
    """What the whole plan should resolve (``convergence power``'s arithmetic), and, when that is wider than the
    margin, how many runs would reach it (``Needs``); None before a spread is measured. The spread is that of the
    range whose half-width is the wider, as the verdict's "resolves" is (the verdict needs both ranges inside the
    margin), pooled over every BF16 run (the baselines and the held-out ones: one group) and the candidate's runs
    (around their own mean; the planning formula takes the two spreads equal), with its 95 % interval: a spread from
    a few runs is uncertain by a factor of two or more, and the runs it asks for by its square. A half-width of the
    margin is not a verdict of equivalent (that needs |estimate| + half-width <= margin, so an identical candidate
    is then called equivalent only by luck): ``Needs.k_equivalent`` gives 8 chances in 10. The two groups' spreads
    apart and the runs they ask for follow: a candidate's runs need not spread as BF16's do. ``levels`` (BF16's,
    the candidate's, per range: ``planning_levels``) replaces the verdicts' own with every finished run's."""
    from convergence.curves import power

    conf = verdicts["verdict"].get("confidence", 0.95)
    k, m = plan.replicates, plan.candidate_replicates

    def plan_part(part: str):
        """(bf16 levels, candidate levels, (spread, dof), se_set, half-width) of one range, or None."""
        fw = verdicts["verdict"].get(part) or {}
        if levels is not None:
            lv = levels.get(part)
        elif "replicate_levels" in fw:
            held_out = verdicts.get("negative_control", {}).get(part, {}).get("candidate_levels") or []
            lv = (list(fw["replicate_levels"]) + list(held_out), fw.get("candidate_levels") or [])
        else:
            lv = None
        pooled = None if lv is None else power.pooled_spread([lv[0], lv[1]])
        if pooled is None:
            return None
        se = fw.get("se_set") or 0.0
        return lv[0], lv[1], pooled, se, power.half_width(k, pooled[0], se, conf, m=m)

    parts = {p: got for p in RANGES if (got := plan_part(p)) is not None}
    if not parts:
        return None
    part = max(parts, key=lambda p: parts[p][4])
    bf16, candidate, (spread, dof), se_set, _ = parts[part]
    lo, hi = power.spread_interval(spread, dof)
    hw = [power.half_width(k, s, se_set, conf, m=m) for s in (spread, lo, hi)]
    result = Projection(k, m, plan.margin, plan.candidate, whole, part, spread, dof, (lo, hi), len(bf16),
                        len(candidate), hw[0], (hw[1], hw[2]),
                        {p: (v[4], v[2][0]) for p, v in parts.items() if p != part})
    if hw[0] <= plan.margin:
        return result

    def worst(per_part):  # the verdict needs every range: the most runs any asks for (None: out of reach)
        per_part = list(per_part)
        return None if any(v is None for v in per_part) else max(per_part)

    spreads = {p: (v[2][0], *power.spread_interval(*v[2])) for p, v in parts.items()}
    need = [worst(power.replicates_needed(spreads[p][i], plan.margin, v[3], conf, balanced=True)
                  for p, v in parts.items()) for i in range(3)]
    if need[0] is None:
        se_max = max(v[3] for v in parts.values())
        return dataclasses.replace(result, needs=Needs(se_max, floor=power.floor_half_width(0.0, se_max, conf)))
    eq = worst(power.replicates_for_equivalence(v[2][0], plan.margin, v[3], conf) for v in parts.values())
    needs = Needs(se_set, k=need[0], k_low=need[1], k_high=need[2], k_equivalent=eq)
    ratio = power.spread_ratio(bf16, candidate)
    if ratio is not None:
        ratios = [(power.spread_ratio(v[0], v[1]), v[3]) for v in parts.values()]
        apart = worst(power.replicates_needed(r["baseline"], plan.margin, se, conf, balanced=True,
                                              cand_spread=r["candidate"]) for r, se in ratios if r)
        needs = dataclasses.replace(needs, spreads_apart=ratio, k_apart=apart)
    return dataclasses.replace(result, needs=needs)


def pairs(plan: ProtocolPlan, verdicts: dict) -> list[Pairs]:
    """Do a judged run and the BF16 baseline with the same change end alike (``power.pair_correlation``)? The
    verdicts judge the groups apart (Welch); judging the pairs' differences would narrow the interval only if
    they did. One entry per judged recipe with three pairs or more among ``plan``'s baselines (the held-out runs
    have none: their changes are not the baselines'), from the verdicts' own levels (validation loss only)."""
    from convergence.curves import power

    def change(s: RunSpec) -> tuple:
        return s.seed, s.data_seed, s.row_order

    baseline_of = {change(s): i for i, s in enumerate(plan.baselines())}
    found = []
    for name in ("verdict", "positive_control"):
        judged = plan.judged(name)
        matched = [(baseline_of[change(s)], j) for j, s in enumerate(judged) if change(s) in baseline_of]
        got = {}
        for part in RANGES:
            r = (verdicts.get(name) or {}).get(part) or {}
            base, cand = r.get("replicate_levels"), r.get("candidate_levels")
            if base is None or cand is None or len(base) != len(plan.baselines()) or len(cand) != len(judged):
                continue
            corr = power.pair_correlation([base[i] for i, _ in matched], [cand[j] for _, j in matched])
            if corr is not None:
                got[part] = corr
        if got:
            found.append(Pairs(judged[0].recipe, got))
    return found


def time_left(plan: ProtocolPlan, out: Path, states: dict[str, RunState], per_gpu: int = 1) -> TimeLeft:
    """The compute time the runs not done need at this folder's pace (``expected_wall_s``): a stopped run its
    steps left, a run that starts again (no checkpoint here) all of them; a fork's trunk and continuations their
    own part of the run (``forks.span``), each priced as a whole run of ``recipes``' seconds; a finished trunk
    whose checkpoint is lost while a continuation needs it (``forks.lost_trunks``) all its steps again."""
    from convergence.protocol.forks import lost_trunks, span

    runs = plan.runs()
    status = {name: "done" if st.state == "done" else st.steps for name, st in states.items()}
    states = states | {t.name: RunState("restart", 0) for t in lost_trunks(plan, out, status)}
    total, recipes, no_pace = 0.0, [], []
    for recipe in dict.fromkeys(r.recipe for r in runs):
        todo = [(r, states[r.name]) for r in runs if r.recipe == recipe and states[r.name].state != "done"]
        if not todo:
            continue
        need = expected_wall_s(out, plan, recipe, per_gpu)
        if need is None:
            no_pace.append((recipe, len(todo)))
            continue
        share = 0.0
        for r, st in todo:
            first, last = span(plan, r)
            done = 0 if st.state == "restart" else max(st.steps - first, 0)  # the rest resume
            share += (last - first - done) / plan.steps
        total += need[0] * share
        recipes.append((recipe, need[0], share))
    return TimeLeft(total, recipes, no_pace)
