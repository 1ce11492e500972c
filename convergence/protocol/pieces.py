"""Run a protocol's runs in resumable pieces: at most ``slots`` at a time, each stopping by one deadline.

Public: ``execute(plan, out, *, slots, per_gpu, stop_after_s, whole_runs, worker_argv, progress) -> dict`` (name ->
"done" or steps logged), ``expected_wall_s(out, plan, recipe, per_gpu, slowest)``,
``progress_report(plan, out, per_gpu)``, ``planning_levels(plan, sub, out, status)``,
``projection(plan, verdicts, levels)``, ``resumable_status(plan, out, status)``,
``protocol_worker(out, threads, gpu_share)``, ``gpus_of_slots(slots, per_gpu)``, ``RunFailed``, ``STARTUP_S``,
``PACE_FILE``, ``PACE_MARGIN``, ``RECENT_RUNS``.

* One slot: the pieces run in this process, one after another, on the token stream loaded once.
* Several slots: one worker process per slot (``worker_argv(name, minutes)``, by default
  ``protocol_worker(out)``: ``python -m convergence protocol --out OUT --piece NAME ...``), pinned to one
  GPU each through ``CUDA_VISIBLE_DEVICES`` on a CUDA plan, ``per_gpu`` of them to a GPU (slot i on GPU
  i mod the number of GPUs); each writes its output to ``OUT/logs/NAME.log``.
* Order: the plan's, runs already started first, so at most ``slots`` checkpoints exist at any time. A started
  run whose checkpoint is not in the folder (copied off a machine whose disk ended with the call) starts again
  at step 0, and is scheduled and paced as a run not yet started (``resumable_status``).
* Time: a piece is told to stop ``STARTUP_S`` before the deadline (what it spends outside its training clock:
  starting, loading, building the model, writing its checkpoint); none starts with less than ``MIN_PIECE_S``
  of training time left. The next call continues every run from its checkpoint.
* Pace: every piece appends its recipe, steps and wall seconds to ``OUT/pace.jsonl``. With ``whole_runs``, a
  run not yet started is started only when the slowest of its recipe's last ``RECENT_RUNS`` finished runs
  (``expected_wall_s``), +``PACE_MARGIN``, says it ends within the seconds its piece is given (the deadline less a
  start-up; other runs that fit go first): for a machine whose disk does not outlive the call, where a stopped
  run's checkpoint is lost with it and its minutes with it. A recipe with no pace yet is started (the first
  piece measures it).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from convergence.curves.jsonl import is_number
from convergence.protocol import plan as pr
from convergence.train.checkpoint import JsonlLog
from numerics.errors import BadInput

# Seconds a piece spends outside its training clock. tiny: measured 5 s of CPU time (process start and
# imports ~1.5 s, the standard-library corpus ~4 s; 15 s wall while four other processes shared 2 cores).
# proxy: measured on an H200 (2026-11-30): a whole 1,500-step BF16 run took 237-241 s wall, 178 s of it in
# training steps, so ~60 s went to start-up, 30 evaluations and the exit; 16b: an estimate, not yet measured.
STARTUP_S = {"tiny": 10.0, "proxy": 60.0, "16b": 180.0}
MIN_PIECE_S = 5.0  # below this a piece would spend more time starting than training
PACE_FILE = "pace.jsonl"
# --whole-runs asks for this much more than the expected time: a whole run's pace varies between runs of one
# recipe by a few percent on one GPU (proxy on an H200, 2026-12-01: BF16 whole runs 263 and 274 s with the
# evaluations and start-up, 4 % apart; E2M1 390 and ~417 s on one machine, 7 %); 10 % leaves room for that and
# for a slower start.
PACE_MARGIN = 1.10
# A whole run's pace comes from the recipe's last RECENT_RUNS finished runs, not from all of them: the code and the
# machine change between sessions, and the latest runs are the current code's (stop 29 took the proxy's BF16 whole
# runs from ~305 s to ~255 s; on 2026-12-01 the mean of all nine, 275 s, asked 302 s with the margin and kept a run
# that the last three, 255 s, say fits in the 286 s left from starting). --whole-runs asks the slowest of them, not
# their mean: the MX recipes' speed differs between lent H200s far more than between runs on one (E2M1 341 s on
# one session's machine, 390 and ~417 s on the next session's, BF16 250 s on both), a session's first runs take
# their pace from the last session's machine, and a pace too short costs the whole run (stopped at the deadline,
# its checkpoint lost: 366 s on 2026-12-01), one too long only the idle end of a call.
RECENT_RUNS = 3


class RunFailed(Exception):
    """A worker exited with an error (its log names the cause)."""


def record_pace(out: Path, spec: pr.RunSpec, steps_before, steps_after, wall_s: float, per_gpu: int,
                total_steps: int) -> None:
    """Append one piece's pace (the steps it added and its wall seconds, start-up included) to ``OUT/pace.jsonl``,
    with the host CPU it ran on: the lent H200 machines ran the MX recipes ~16 % apart (README, #15), and a
    run's pieces may run on different machines."""
    from numerics.environment import cpu_model

    def count(v):
        return total_steps if v == "done" else int(v)

    entry = {"run": spec.name, "recipe": spec.recipe, "per_gpu": per_gpu, "from_step": count(steps_before),
             "to_step": count(steps_after), "wall_s": round(wall_s, 2), "cpu": cpu_model()}
    JsonlLog(Path(out) / PACE_FILE).append(entry)


def expected_wall_s(out: Path, plan: pr.ProtocolPlan, recipe: str, per_gpu: int = 1,
                    slowest: bool = False) -> tuple[float, str] | None:
    """(wall seconds, how it was estimated) a whole run of ``recipe`` in ``plan`` is expected to take, start-up
    included, from the pieces in ``OUT/pace.jsonl`` run ``per_gpu`` to a GPU; None when there are none. From the
    recipe's last ``RECENT_RUNS`` finished runs when there are any: their mean, or with ``slowest`` the slowest
    (what ``--whole-runs`` asks). A run made in one piece counts its wall seconds; one made in pieces, each
    piece's seconds less its start-up (``STARTUP_S`` of the plan's model) plus one start-up, from the last piece
    that started at step 0 (an earlier start lost its checkpoint). With no finished run, the pieces' seconds per
    step, the same way."""
    path = Path(out) / PACE_FILE
    if not path.is_file():
        return None
    pieces = []
    for e in JsonlLog(path).records():  # a last line cut by a killed process is left out; other damage is refused
        nums = [e.get(k) for k in ("from_step", "to_step", "wall_s")]
        if not all(is_number(v) and math.isfinite(v) and v >= 0 for v in nums):  # NaN or -5 s: nonsense
            raise BadInput(f"{path}: a pace entry without numbers >= 0 for from_step, to_step and wall_s ({e}): "
                           "damaged; restore it, e.g. from git")
        if e.get("recipe") == recipe and e.get("per_gpu", 1) == per_gpu and e["to_step"] > e["from_step"]:
            pieces.append(e)
    if not pieces:
        return None
    startup, steps = STARTUP_S.get(plan.model, 60.0), plan.steps

    def whole_s(chain: list[dict]) -> float:
        training = sum(max(e["wall_s"] - startup, 0.0) for e in chain)
        return startup + training * steps / sum(e["to_step"] - e["from_step"] for e in chain)

    chains: dict[str, list[dict]] = {}  # each run's pieces since its last start at step 0
    finished = []
    for e in pieces:
        chain = chains.setdefault(e.get("run", ""), [])
        if e["from_step"] == 0:
            chain.clear()
        chain.append(e)
        if e["to_step"] == steps:
            finished.append(e["wall_s"] if len(chain) == 1 else whole_s(chain))
    recent = finished[-RECENT_RUNS:]
    if recent:
        n = f"{len(recent)} {recipe} run{'s' * (len(recent) > 1)}"
        if slowest:
            return max(recent), f"the slowest of the last {n}" if len(recent) > 1 else f"the last {n}"
        return sum(recent) / len(recent), f"the last {n}"
    return whole_s(pieces), f"{len(pieces)} {recipe} pieces, each less its start-up"


GROUPS = (("baselines (BF16 + replicates)", ("baseline", "replicate")),
          ("candidate (+ replicates)", ("candidate", "candidate_replicate")),
          ("positive control (+ replicates)", ("control", "control_replicate")),
          ("negative control (held-out BF16)", ("heldout",)))


def progress_report(plan: pr.ProtocolPlan, out: Path, per_gpu: int = 1, *, figure: Path | None = None,
                    parting_figure: Path | None = None, force: bool = False) -> list[str]:
    """Lines saying how far a protocol folder is: runs done per verdict group, the last whole level and its
    verdicts as they stand (judged in memory, nothing written but ``figure``, their picture, when asked), how
    fast each recipe's runs part (``convergence.protocol.parting``; ``parting_figure``, its picture), runs
    started, and the GPU time left to run at this folder's pace (whole runs, one after another; runs of a recipe
    with no pace yet are named)."""
    status = pr.run_status(plan, out)
    runs = plan.runs()
    done = sum(v == "done" for v in status.values())
    lines = [f"{plan.prefix} in {out}: {done} of {len(runs)} runs done ({plan.steps} steps each)"]
    for title, roles in GROUPS:
        group = [r for r in runs if r.role in roles]
        lines.append(f"  {title}: {sum(status[r.name] == 'done' for r in group)} of {len(group)}")
    made = pr.made_with(plan, out)
    if made:
        lines.append(f"  made with {made}")
    sub = pr.last_whole_level(plan, out, status)
    if sub is not None and sub.candidate_replicates < plan.candidate_replicates:
        lines.append(f"  complete as the smaller protocol k = {sub.replicates}, m = {sub.candidate_replicates}: judge "
                     f"it with the same command and --replicates {sub.replicates} --candidate-replicates "
                     f"{sub.candidate_replicates} (the runs made stay; the larger plan continues with its own)")
    if sub is not None:  # what the runs made say so far: the last whole level judged here, nothing written
        try:
            verdicts = pr.judge(sub, out)
            lines += [f"    {pr.verdict_line(name, r)}" for name, r in verdicts.items()]
        except (BadInput, ValueError) as exc:
            lines.append(f"    cannot judge it: {exc}")
        else:
            levels = None  # a whole plan: its verdicts' own runs are every run
            whole = sub.candidate_replicates == plan.candidate_replicates  # levels are indexed by m; the last is plan
            if not whole:
                lines.append("    (interim: the plan's verdict is the whole plan's; stopping because an interim one "
                             "looks decided would bias it, stopping for want of GPU time does not)")
                try:
                    levels = planning_levels(plan, sub, out, status)
                except (BadInput, ValueError) as exc:  # a finished run outside the level: plan from the level's
                    lines.append(f"  cannot plan from every finished run ({exc}): planning from the level's runs")
            # for a whole plan too: what its pooled spread says a plan needs to reach the margin (#15's 64 runs
            # resolved +-0.92 %; the scale for +-0.25 % is the question its owner is left with)
            lines.append("  " + projection(plan, verdicts, levels, whole=whole))
            lines += pairs_lines(sub, verdicts)
            if figure is not None:
                from convergence.curves.plots import plot_verdicts

                interim = "" if whole else " (interim)"
                plot_verdicts(verdicts, figure, force=force,
                              title=f"{plan.prefix}: {done} of {len(runs)} runs of {plan.steps} steps; judged as "
                                    f"k = {sub.replicates}, m = {sub.candidate_replicates}{interim}")
                lines.append(f"  figure: {figure}")
    if figure is not None and sub is None:
        lines.append("  no figure: no level is whole yet")
    spread, spread_lines = _spread_report(plan, out, status)
    lines += _parting_report(plan, out, status, parting_figure, force, spread) + spread_lines
    resumable = resumable_status(plan, out, status)  # a started run without its checkpoint here is at 0
    started = [f"{r.name} {status[r.name]}/{plan.steps}" + ("" if resumable[r.name] else
                                                            " (no checkpoint here: starts again at step 0)")
               for r in runs if status[r.name] not in ("done", 0)]
    if started:
        lines.append("  started: " + ", ".join(started))
    status = resumable  # what is left: a run without its checkpoint, all of it
    total, parts, unknown = 0.0, [], []
    for recipe in dict.fromkeys(r.recipe for r in runs):
        todo = [r for r in runs if r.recipe == recipe and status[r.name] != "done"]
        if not todo:
            continue
        need = expected_wall_s(out, plan, recipe, per_gpu)
        if need is None:
            unknown.append(f"{recipe} x {len(todo)}")
            continue
        share = sum(1 - int(status[r.name]) / plan.steps for r in todo)
        total += need[0] * share
        parts.append(f"{recipe} {need[0]:.0f} s x {share:.1f}")
    if parts:
        lines.append(f"  left: about {total / 3600:.1f} GPU-hours at this folder's pace (" + ", ".join(parts) + ")"
                     + (f"; no pace yet for {', '.join(unknown)}" if unknown else ""))
    elif unknown:
        lines.append(f"  left: {', '.join(unknown)} runs, no pace measured yet")
    return lines


def _parting_report(plan: pr.ProtocolPlan, out: Path, status: dict, figure: Path | None, force: bool,
                    spread: dict | None = None) -> list[str]:
    from convergence.protocol import parting

    try:
        result = parting.parting(plan, out, status)
    except (BadInput, ValueError) as exc:
        return [f"  runs part: cannot tell: {exc}"]
    if result is None:
        return [f"  runs part: not measured: the {plan.design} design changes the batches"] if figure else []
    if not result:
        return ["  no parting figure: no recipe has a finished paired run and replicate yet"] if figure else []
    lines = ["  runs part (|training loss - the recipe's paired run's| / loss, same batches; median over the "
             "replicates, least to greatest in brackets):", *(f"  - {line}" for line in parting.parting_lines(result))]
    if figure is not None:
        from convergence.curves.plots import plot_parting

        done = sum(v == "done" for v in status.values())
        plot_parting(result, figure, force=force, spread=spread,
                     title=f"{plan.prefix}: how far each replicate is from its recipe's paired run "
                           f"({done} runs of {plan.steps} steps; design {plan.design})")
        lines.append(f"  parting figure: {figure}")
    return lines


def _spread_report(plan: pr.ProtocolPlan, out: Path, status: dict) -> tuple[dict | None, list[str]]:
    """The spread at each evaluation (``parting.spread_by_evaluation``, also drawn beside the parting) and its
    status line."""
    from convergence.protocol import parting

    try:
        result = parting.spread_by_evaluation(plan, out, status)
    except (BadInput, ValueError) as exc:
        return None, [f"  validation loss spread at each evaluation: cannot tell: {exc}"]
    return result, ([] if result is None else ["  " + parting.spread_line(result, plan.steps)])


def planning_levels(plan: pr.ProtocolPlan, sub: pr.ProtocolPlan, out: Path,
                    status: dict) -> dict[str, tuple[list, list]]:
    """Per range (``overall``, ``final_window``): the levels of every finished BF16 run and every finished candidate
    run, against the baselines of
    ``sub`` (the last whole level): for planning, a run the level does not hold yet says as much about the spread
    as one it does (the verdicts stay the level's). The same arithmetic as the verdict's
    (``convergence.curves.compare``, its ``candidate_levels``)."""
    from convergence.curves.compare import compare_paths

    baselines = [pr.metrics_path(out, r) for r in sub.baselines()]
    groups = []
    for recipe in ("bf16", plan.candidate):
        first, *more = [pr.metrics_path(out, r) for r in plan.runs() if r.recipe == recipe and status[r.name] == "done"]
        r = compare_paths(baselines, first, margin=plan.margin, metric="val_loss", candidate_replicates=more,
                          each_once=False)  # the BF16 runs are also the baselines: only their levels are read
        groups.append(r)
    return {part: (list(groups[0][part]["candidate_levels"]), list(groups[1][part]["candidate_levels"]))
            for part in ("overall", "final_window")}


def projection(plan: pr.ProtocolPlan, verdicts: dict, levels: tuple[list, list] | None = None, *,
               whole: bool = False) -> str:
    """What the whole plan should resolve (``convergence power``'s arithmetic), and, when that is wider than the
    margin, how many runs would reach it. The spread is that of the range (whole or final window) whose half-width
    is the wider, as the verdict's "resolves" is, pooled over every BF16 run (the
    baselines and the held-out ones: one group) and the candidate's runs (around their own mean; the planning
    formula takes the two spreads equal), with its 95 % interval: a spread from a few runs is uncertain by a
    factor of two or more, and the runs it asks for by its square. "+-margin needs k = m" is the half-width's: an
    identical candidate is then called equivalent only by luck, so the line also gives the k = m with which it is
    called equivalent 8 times in 10 (``power.replicates_for_equivalence``). Then the two spreads apart, the F-test
    of their equality and the runs they ask for: a candidate's runs need not spread as BF16's do. ``levels`` (BF16's,
    the candidate's, per range: ``planning_levels``) replaces the verdicts' own with every finished run's; ``whole``:
    the plan is whole, so its verdicts' own half-widths are measured, and the line says what the formula gives."""
    from convergence.curves import power

    conf = verdicts["verdict"].get("confidence", 0.95)
    k, m = plan.replicates, plan.candidate_replicates

    def plan_part(part: str):
        """(bf16 levels, candidate levels, (spread, dof), se_set, half-width) of one range, or None."""
        fw = verdicts["verdict"].get(part) or {}
        if isinstance(levels, dict):
            lv = levels.get(part)
        elif levels is not None:  # a pair of lists: the final window's (as planning_levels returned before)
            lv = levels if part == "final_window" else None
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

    # the verdict needs both ranges inside the margin and its "resolves" is the wider one's half-width: plan with
    # the range that binds (on .gpu/proto5 at 34 runs the whole range spread 1.13 % against the final window's
    # 1.00 %, so the final window alone said +-0.84 % where the verdict would resolve +-0.94 %)
    parts = {p: got for p in ("overall", "final_window") if (got := plan_part(p)) is not None}
    if not parts:
        return "the whole plan's resolution: unknown (no spread measured yet)"
    part = max(parts, key=lambda p: parts[p][4])
    bf16, candidate, (spread, dof), se_set, _ = parts[part]
    lo, hi = power.spread_interval(spread, dof)
    hw = [power.half_width(k, s, se_set, conf, m=m) for s in (spread, lo, hi)]
    where = {"overall": "the whole range", "final_window": "the final window"}
    other = [f"{where[p]} +-{v[4]:.3%} at its spread {v[2][0]:.3%}" for p, v in parts.items() if p != part]
    so_far, should = ("of its runs", "by the planning formula resolves") if whole else \
        ("measured so far", "should resolve")
    line = (f"at the spread {so_far} ({spread:.3%}, {len(bf16)} BF16 and {len(candidate)} {plan.candidate} "
            f"runs, {dof} degrees of freedom; 95 % interval {lo:.3%} to {hi:.3%}) the whole plan (k = {k}, m = {m}) "
            f"{should} about +-{hw[0]:.3%} (+-{hw[1]:.3%} to +-{hw[2]:.3%}) in {where[part]}"
            + (f" (the wider of the verdict's two ranges; {other[0]})" if other else "")
            + f", against a margin of +-{plan.margin:.3%}")
    if hw[0] <= plan.margin:
        return line

    def worst(per_part):  # the verdict needs every range: the most runs any asks for (None: out of reach)
        per_part = list(per_part)
        return None if any(v is None for v in per_part) else max(per_part)

    spreads = {p: (v[2][0], *power.spread_interval(*v[2])) for p, v in parts.items()}
    need = [worst(power.replicates_needed(spreads[p][i], plan.margin, v[3], conf, balanced=True)
                  for p, v in parts.items()) for i in range(3)]
    if need[0] is None:
        se_set = max(v[3] for v in parts.values())
        floor = power.floor_half_width(0.0, se_set, conf)
        return line + (f"; +-{plan.margin:.3%} is out of reach with this held-out set: its error ({se_set:.3%}) "
                       f"alone leaves +-{floor:.3%} at any k = m (a larger set: --val-batches)")
    # the plan's runs: k baselines, and k each of the candidate, the control and the held-out BF16 runs
    most = need[2] or f"more than {power.BALANCED_MAX}"
    line += (f"; +-{plan.margin:.3%} needs about k = m = {need[0]} ({4 * need[0]} runs; {need[1]} to {most} "
             f"over the spread's interval)")
    # a half-width of the margin is not a verdict of equivalent: that needs |estimate| + half-width <= margin, so
    # an identical candidate at need[0] is called equivalent only when its estimate lands at 0 (measured: 3.7 %)
    eq = worst(power.replicates_for_equivalence(v[2][0], plan.margin, v[3], conf) for v in parts.values())
    line += (", an interval as wide as the margin: for a candidate identical to BF16 to be called equivalent 8 "
             "times in 10, about k = m = " + (f"{eq} ({4 * eq} runs)" if eq else f"more than {power.BALANCED_MAX}"))
    ratio = power.spread_ratio(bf16, candidate)
    if ratio is None:
        return line
    ratios = [(power.spread_ratio(v[0], v[1]), v[3]) for v in parts.values()]
    apart = worst(power.replicates_needed(r["baseline"], plan.margin, se, conf, balanced=True,
                                          cand_spread=r["candidate"]) for r, se in ratios if r)
    return line + (f"\n  the pooled spread takes {plan.candidate}'s runs to spread as BF16's: they spread "
                   f"{ratio['candidate']:.3%} against {ratio['baseline']:.3%} ({ratio['ratio']:.2f}x; equal spreads: "
                   f"F-test p = {ratio['p_equal']:.2f}); taken apart, +-{plan.margin:.3%} needs about k = m = "
                   + (f"{apart} ({4 * apart} runs)" if apart else f"more than {power.BALANCED_MAX}"))


def pairs_lines(plan: pr.ProtocolPlan, verdicts: dict) -> list[str]:
    """Do a judged run and the BF16 baseline with the same change end alike (``power.pair_correlation``)? The
    verdicts judge the groups apart (Welch); judging the pairs' differences would narrow the interval only if
    they did. One line per judged recipe with three pairs or more among ``plan``'s baselines (the held-out runs
    have none: their changes are not the baselines'), from the verdicts' own levels (validation loss only)."""
    from convergence.curves import power

    def change(s: pr.RunSpec) -> tuple:
        return s.seed, s.data_seed, s.row_order

    where = {"overall": "over the whole range", "final_window": "in the final window"}
    baseline_of = {change(s): i for i, s in enumerate(plan.baselines())}
    lines = []
    for name in ("verdict", "positive_control"):
        judged = plan.judged(name)
        pairs = [(baseline_of[change(s)], j) for j, s in enumerate(judged) if change(s) in baseline_of]
        got = {}
        for part in where:
            r = (verdicts.get(name) or {}).get(part) or {}
            base, cand = r.get("replicate_levels"), r.get("candidate_levels")
            if base is None or cand is None or len(base) != len(plan.baselines()) or len(cand) != len(judged):
                continue
            corr = power.pair_correlation([base[i] for i, _ in pairs], [cand[j] for _, j in pairs])
            if corr is not None:
                got[part] = corr
        if not got:
            continue
        part, first = next(iter(got.items()))
        said = ", ".join(f"{c['r']:+.2f} {where[p]} (p = {c['p']:.2f})" for p, c in got.items())
        lines.append(f"  pairs ({first['n']} pairs of BF16 and {judged[0].recipe} runs with the same change): their "
                     f"levels correlate {said}; a pair's difference spreads {first['paired_spread']:.3%} against "
                     f"{first['apart_spread']:.3%} for two runs apart ({where[part]}): over these runs, the mean "
                     f"difference of the pairs has {first['paired_spread'] / first['apart_spread']:.2f}x the "
                     "standard error of the groups' taken apart (Welch, as the verdicts judge)")
    return lines


def resumable_status(plan: pr.ProtocolPlan, out: Path, status: dict | None = None) -> dict[str, int | str]:
    """``plan.run_status`` (or ``status``, already read), with a started run whose checkpoint is not here
    (``plan.can_continue``) at 0: it starts again at step 0, so it is ordered, fitted (``whole_runs``) and paced
    as a run not yet started."""
    status = pr.run_status(plan, out) if status is None else status
    return {s.name: 0 if status[s.name] not in ("done", 0) and not pr.can_continue(out, s) else status[s.name]
            for s in plan.runs()}


def _order(plan: pr.ProtocolPlan, status: dict) -> list[pr.RunSpec]:
    todo = [s for s in plan.runs() if status[s.name] != "done"]
    return sorted(todo, key=lambda s: status[s.name] == 0)  # stable: started runs first, then plan order


def _line(progress, text: str) -> None:
    if progress:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


def protocol_worker(out: Path, threads: int | None = None,
                    gpu_share: int = 1) -> Callable[[str, float | None], list[str]]:
    """The command of one worker piece: ``python -m convergence protocol --out OUT --piece NAME``, stopping after
    ``minutes`` (None: when its run is done) with ``threads`` torch CPU threads (None: torch's default) and, when
    ``gpu_share`` runs share a GPU, at most 1/``gpu_share`` of its memory."""

    def argv(name: str, minutes: float | None) -> list[str]:
        cmd = [sys.executable, "-m", "convergence", "protocol", "--out", str(out), "--piece", name]
        if minutes is not None:
            cmd += ["--stop-after-minutes", f"{minutes:.4f}"]
        if gpu_share > 1:
            cmd += ["--gpu-share", str(gpu_share)]
        return cmd + ([] if threads is None else ["--threads", str(threads)])

    return argv


def execute(plan: pr.ProtocolPlan, out: Path, *, slots: int = 1, per_gpu: int = 1, stop_after_s: float | None = None,
            whole_runs: bool = False, worker_argv: Callable[[str, float | None], list[str]] | None = None,
            progress: bool = True) -> dict:
    out = Path(out)
    start = time.monotonic()
    deadline = None if stop_after_s is None else start + stop_after_s
    finished = pr.run_status(plan, out)  # read once: tidying a finished run changes no run's state
    for spec in plan.runs():  # a kill after a run's last step left its checkpoint and plain logs: tidy them now
        if finished[spec.name] == "done":
            pr.finish_run(pr.run_dir(out, spec))
    status = resumable_status(plan, out, finished)  # a run's entry changes only by its own piece, read back after it
    startup = STARTUP_S.get(plan.model, 60.0)
    told = set()

    def budget() -> float | None:
        """Training seconds a piece starting now may take, or None for no limit."""
        return None if deadline is None else deadline - time.monotonic() - startup

    def fits(spec: pr.RunSpec, steps_logged) -> bool:
        """False when ``whole_runs`` and a run not yet started would not end, at its pace, in its piece's seconds."""
        if not whole_runs or deadline is None or steps_logged != 0:
            return True
        need = expected_wall_s(out, plan, spec.recipe, per_gpu, slowest=True)
        # what its piece will be given, not the time to the deadline: a piece is told to stop a start-up before
        # it, so a run asking the deadline's seconds (its set-up included) was started and cut (2026-12-04:
        # bf16_rounding23, 281 s asked, stopped at step 1492 of 1500 and lost with the machine)
        left = budget()
        if need is None or PACE_MARGIN * need[0] <= left:
            return True
        if (spec.recipe, need) not in told:  # once a recipe and pace: its later runs wait for the same figure
            told.add((spec.recipe, need))
            asked = PACE_MARGIN * need[0]
            # more than a piece of a call this long gets even at its start: no such call ever starts it (2026-12-04:
            # mxfp8_rounding15 asked 518 s of 598-s calls, whose pieces get ~503 s, and waited a session)
            never = "" if asked <= stop_after_s - startup else (
                f"; no call of --stop-after-minutes {stop_after_s / 60:.1f} starts it whole (it needs "
                f"{math.ceil((asked + startup) / 6) / 10:.1f} minutes): give it a longer call, or run it without "
                "--whole-runs on a machine the next call will find warm")
            _line(progress, f"{spec.name}: not started, nor the later {spec.recipe} runs: a whole run should take "
                            f"{need[0]:.0f} s ({need[1]}), {asked:.0f} s with {PACE_MARGIN - 1:.0%} "
                            f"more asked; its piece would be given {left:.0f} s (to the deadline less a start-up)"
                            + never)
        return False

    if slots <= 1:
        tokens = None
        for spec in _order(plan, status):
            left = budget()
            if left is not None and left < MIN_PIECE_S:
                break
            before = status[spec.name]
            if not fits(spec, before):
                continue
            t0 = time.monotonic()
            if tokens is None:
                from convergence.train import data as data_mod

                tokens = data_mod.load_tokens(plan.train_config(spec).data)
            try:
                done = pr.run_piece(plan, spec, out, stop_after_s=left, tokens=tokens, progress=progress)
            except (BadInput, KeyboardInterrupt):
                raise
            except Exception as exc:  # as a worker's failure: its traceback in its log, one line and exit 1
                log = out / "logs" / f"{spec.name}.log"
                log.parent.mkdir(parents=True, exist_ok=True)
                with open(log, "a") as f:
                    traceback.print_exc(file=f)
                first = (str(exc).splitlines() or [""])[0]
                raise RunFailed(f"{spec.name} raised {type(exc).__name__}: {first} (log: {log})") from exc
            after = status[spec.name] = pr.run_state(plan, out, spec)
            record_pace(out, spec, before, after, time.monotonic() - t0, per_gpu, plan.steps)
            _line(progress, f"{spec.name}: {'finished' if done else 'stopped'} at {after} "
                            f"({time.monotonic() - t0:.0f} s)")
            if not done:
                break
        return status
    return _parallel(plan, out, slots, budget, fits, worker_argv or protocol_worker(out), progress, status,
                     gpus=gpus_of_slots(slots, per_gpu), per_gpu=per_gpu)


def gpus_of_slots(slots: int, per_gpu: int = 1) -> list[str]:
    """The ``CUDA_VISIBLE_DEVICES`` value of each slot: ``slots / per_gpu`` GPUs (the visible ones, in order),
    filled round-robin so that the first pieces spread over every GPU."""
    n = max(1, slots // max(per_gpu, 1))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in range(n))).split(",")[:n]
    return [visible[i % len(visible)] for i in range(slots)]


def _parallel(plan, out: Path, slots: int, budget, fits, worker_argv, progress, status: dict, *, gpus: list[str],
              per_gpu: int) -> dict:
    (out / "logs").mkdir(parents=True, exist_ok=True)
    queue = _order(plan, status)
    running: dict[int, tuple[pr.RunSpec, subprocess.Popen, float, object, object]] = {}
    failures, last_report = [], time.monotonic()
    try:
        while running or (queue and not failures):  # after a failure: let the running pieces end, start no more
            for slot in range(slots):
                if slot in running or not queue or failures:
                    continue
                left = budget()
                if left is not None and left < MIN_PIECE_S:
                    queue = []
                    break
                pick = next((i for i, q in enumerate(queue) if fits(q, status[q.name])), None)
                if pick is None:  # nothing left fits: a pace only grows more certain and the time only shorter
                    queue = []
                    break
                spec = queue.pop(pick)
                env = dict(os.environ)
                if plan.device == "cuda":
                    env["CUDA_VISIBLE_DEVICES"] = gpus[slot]
                log = open(out / "logs" / f"{spec.name}.log", "ab")
                minutes = None if left is None else left / 60
                proc = subprocess.Popen(worker_argv(spec.name, minutes), env=env, stdout=log, stderr=log)
                running[slot] = (spec, proc, time.monotonic(), log, status[spec.name])
                where = f"GPU {gpus[slot]}" if plan.device == "cuda" else f"worker {slot}"
                _line(progress, f"{spec.name}: piece started on {where}")
            for slot, (spec, proc, t0, log, before) in list(running.items()):
                if proc.poll() is None:
                    continue
                log.close()
                del running[slot]
                state = pr.run_state(plan, out, spec)
                record_pace(out, spec, before, state, time.monotonic() - t0, per_gpu, plan.steps)
                _line(progress, f"{spec.name}: piece ended ({'finished' if state == 'done' else f'at step {state}'}, "
                                f"{time.monotonic() - t0:.0f} s wall, exit {proc.returncode})")
                if proc.returncode != 0:
                    log_path = out / "logs" / f"{spec.name}.log"
                    failures.append(f"{spec.name} exited {proc.returncode} (log: {log_path})")
            if running and time.monotonic() - last_report >= 30:
                _line(progress, "  running: " + ", ".join(f"{s.name} {pr.run_state(plan, out, s)}/{plan.steps}"
                                                          for s, *_ in running.values()))
                last_report = time.monotonic()
            time.sleep(0.2)
    finally:  # left running only by an exception or Ctrl-C: no worker outlives this process
        for _spec, proc, _t0, log, _before in running.values():
            proc.terminate()
            proc.wait()
            log.close()
    if failures:
        raise RunFailed("; ".join(failures))
    return pr.run_status(plan, out)
