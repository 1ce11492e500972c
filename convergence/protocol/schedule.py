"""Which run goes where: a protocol's runs made in resumable pieces through an executor.

Public: ``execute(plan, out, executor, *, stop_after_s, whole_runs) -> dict`` (name -> "done" or steps logged),
``Executor`` (the seam), ``LocalExecutor``, ``RunState``, ``run_piece(plan, spec, out, ...)``, ``todo_status``,
``PaceHold``, ``expected_wall_s(out, plan, recipe, per_gpu, slowest)``, ``record_pace``, ``protocol_worker(out,
threads, gpu_share)``, ``gpus_of_slots(slots, per_gpu)``, ``RunFailed``, ``STARTUP_S``, ``MIN_PIECE_S``,
``PACE_MARGIN``, ``RECENT_RUNS``.

``execute`` tidies the runs already finished and hands an executor the runs still to make, in order: the runs
already started first, then the plan's order (``ProtocolPlan.runs``: nested levels), so at most as many
checkpoints exist as runs go at once. A fork plan's continuation (``RunSpec.after``) is started only once its trunk's
checkpoint is here (``forks.ready``); a trunk's checkpoint is deleted once no run needs it (``forks.release``,
after every piece and at the end of ``execute``), and a lost one is made again, bit-identically
(``forks.lost_trunks``, ``forks.check_remade``). An executor makes them, or as many as its time allows, and says
where each run stands (``Executor.states``: what ``--status`` shows). Each run's piece is the same entry point
whatever runs it: ``run_piece``, in this process or as ``python -m convergence protocol --out OUT --piece NAME``
(``protocol_worker``).

``LocalExecutor`` runs them on this machine:

* One slot: the pieces run in this process, one after another, on the token stream loaded once.
* Several slots: one worker process per slot, pinned to one GPU each through ``CUDA_VISIBLE_DEVICES`` on a CUDA
  plan, ``per_gpu`` of them to a GPU (slot i on GPU i mod the number of GPUs); each writes its output to
  ``OUT/logs/NAME.log``.
* Time: a piece is told to stop ``STARTUP_S`` before the deadline (what it spends outside its training clock:
  starting, loading, building the model, writing its checkpoint); none starts with less than ``MIN_PIECE_S`` of
  training time left. The next call continues every run from its checkpoint. A started run whose checkpoint is not
  in the folder starts again at step 0, and is scheduled and paced as a run not yet started.
* Pace: every piece appends its recipe, steps and wall seconds to ``OUT/pace.jsonl``. With ``whole_runs``, a run not
  yet started is started only when the slowest of its recipe's last ``RECENT_RUNS`` finished runs
  (``expected_wall_s``), +``PACE_MARGIN``, says it ends within the seconds its piece is given (the deadline less a
  start-up; other runs that fit go first): for a machine whose disk does not outlive the call, where a stopped
  run's checkpoint is lost with it. A recipe with no pace yet is started (the first piece measures it); a recipe
  held back is a ``PaceHold`` in ``LocalExecutor.holds``.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from convergence.curves.jsonl import is_number
from convergence.protocol import forks
from convergence.protocol.folder import (
    PACE_FILE,
    can_continue,
    compact_run,
    finish_run,
    resumable_status,
    run_dir,
    run_state,
    run_status,
)
from convergence.protocol.plan import ProtocolPlan, RunSpec
from convergence.train import data as data_mod
from convergence.train.checkpoint import JsonlLog
from convergence.train.loop import train_recipe
from convergence.train.placement import deterministic_mode
from numerics.errors import BadInput

# Seconds a piece spends outside its training clock. tiny: measured 5 s of CPU time (process start and imports
# ~1.5 s, the standard-library corpus ~4 s; 15 s wall while four other processes shared 2 cores). proxy: on an H200
# (torch 2.11, CUDA 13.0) a whole 1,500-step BF16 run took 237-241 s wall, 178 s of it in training steps, so ~60 s
# went to start-up, 30 evaluations and the exit. 16b: an estimate, not measured.
STARTUP_S = {"tiny": 10.0, "proxy": 60.0, "16b": 180.0}
MIN_PIECE_S = 5.0  # below this a piece would spend more time starting than training
# --whole-runs asks for this much more than the expected time: a whole run's pace varies between runs of one recipe
# by a few percent on one GPU (proxy on an H200: BF16 whole runs 263 and 274 s with the evaluations and start-up,
# 4 % apart; E2M1 390 and ~417 s, 7 %); 10 % leaves room for that and for a slower start.
PACE_MARGIN = 1.10
# A whole run's pace comes from the recipe's last RECENT_RUNS finished runs, not from all of them: the code and the
# machine change between calls, and the latest runs are the current code's. --whole-runs asks the slowest of them,
# not their mean: the MX recipes' speed differed between H200 machines far more than between runs on one (E2M1 341 s
# on one machine, 390 and ~417 s on another, BF16 250 s on both), and a pace too short costs the whole run (stopped
# at the deadline, its checkpoint lost), one too long only the idle end of a call.
RECENT_RUNS = 3


class RunFailed(Exception):
    """A run's piece failed (its log names the cause)."""


@dataclass(frozen=True)
class RunState:
    """One run as an executor sees it: ``state`` is ``done``, ``stopped`` (``steps`` logged; it continues from its
    checkpoint), ``restart`` (steps logged, no checkpoint here: it starts again at step 0), ``pending`` (nothing
    logged yet, or waiting where it was submitted), ``running``, ``failed``, or how a batch job ended before its
    run did: ``cancelled``, ``timeout``, ``preempted`` (the run continues from its checkpoint when submitted again);
    ``log`` its output, ``where`` where it runs or waits (a worker slot, a job id), when the executor knows."""

    state: str
    steps: int
    log: Path | None = None
    where: str | None = None


class Executor(Protocol):
    """Where a protocol's runs are made. ``run`` makes (continues, or submits) ``runs`` in their order, each by
    ``run_piece`` (in this process or through the worker command ``protocol_worker``), stopping every piece by
    ``stop_after_s`` (None: each runs to its end); it raises ``RunFailed`` when a run failed. ``states`` says
    where each run of the plan stands."""

    def run(self, plan: ProtocolPlan, out: Path, runs: Sequence[RunSpec], *, stop_after_s: float | None,
            whole_runs: bool) -> None: ...

    def states(self, plan: ProtocolPlan, out: Path) -> dict[str, RunState]: ...


def execute(plan: ProtocolPlan, out: Path, executor: Executor | None = None, *, stop_after_s: float | None = None,
            whole_runs: bool = False) -> dict[str, int | str]:
    """Make the plan's runs still to make through ``executor`` (default: ``LocalExecutor()``, one at a time here);
    returns each run's state after it (``resumable_status``: "done", or the steps it continues from)."""
    out = Path(out)
    finished = run_status(plan, out)  # read once: tidying a finished run changes no run's state
    for spec in plan.runs():  # a kill after a run's last step left its checkpoint and plain logs: tidy them now
        if finished[spec.name] == "done" and spec.stop_at is None:  # a trunk's checkpoint: forks.release's
            finish_run(run_dir(out, spec))
    forks.release(plan, out, finished)
    status = todo_status(plan, out, finished)
    todo = sorted((s for s in plan.runs() if status[s.name] != "done"), key=lambda s: status[s.name] == 0)
    (executor or LocalExecutor()).run(plan, out, todo, stop_after_s=stop_after_s, whole_runs=whole_runs)
    forks.release(plan, out, run_status(plan, out))
    return resumable_status(plan, out)


def todo_status(plan: ProtocolPlan, out: Path, finished: dict | None = None) -> dict[str, int | str]:
    """``resumable_status`` (of ``finished``, the runs' states already read), with a lost trunk at 0: it is made
    again from step 0 (``forks.lost_trunks``), so it is ordered, fitted and paced as a run not yet started."""
    status = resumable_status(plan, out, finished)
    for trunk in forks.lost_trunks(plan, out, status):
        status[trunk.name] = 0
    return status


def run_piece(plan: ProtocolPlan, spec: RunSpec, out: Path, *, stop_after_s: float | None,
              tokens: data_mod.TokenData | None = None, progress: bool = True) -> bool:
    """Continue one run from its checkpoint (or start it) for at most ``stop_after_s``; True when it is done.
    A finished run keeps no checkpoint (its last step writes none, and an earlier one is deleted) and its logs
    are compacted to gzip (``finish_run``); a stopped one stays plain, for training to append to. A trunk stops at
    its ``stop_at`` with its checkpoint (``forks``: kept for its continuations) and its logs compacted (what says
    a Slurm job of it has nothing left to do); one made again, its checkpoint
    lost, must log what it did before (``forks.set_aside``, ``forks.settle_remade``). A run's ``deterministic``
    holds while it trains."""
    cfg = forks.train_config(plan, spec, out)
    tokens = tokens or data_mod.load_tokens(cfg.data)
    for other in plan.runs():  # the folder's runs are compared with each other: all on the same tokens
        made = run_dir(out, other) / "config.json"
        if made.is_file():
            data_mod.check_same_data(made, tokens.meta)
            break
    folder = run_dir(out, spec)
    remade = forks.remaking(plan, out, spec)
    if remade and run_state(plan, out, spec) == "done":  # lost: made again from step 0, held to its earlier logs
        forks.set_aside(out, spec)
    with deterministic_mode(cfg.deterministic, cfg.device):
        done = train_recipe(cfg, spec.recipe, folder, tokens, resume=True, progress=progress,
                            stop_after_s=stop_after_s, final_checkpoint=False, stop_at_step=spec.stop_at)
    if done and spec.stop_at is not None:  # a trunk at its stop: logs as a finished run's, its checkpoint kept
        compact_run(folder)
    if remade and done:
        forks.settle_remade(plan, out, spec)
    if done and spec.stop_at is None:
        finish_run(folder)
    return done


def run_ends(plan: ProtocolPlan, spec: RunSpec) -> tuple[int, int]:
    """``record_pace``'s ``total_steps`` and ``first_step`` of a run (``forks.span``)."""
    first, last = forks.span(plan, spec)
    return last, first


def record_pace(out: Path, spec: RunSpec, steps_before, steps_after, wall_s: float, per_gpu: int,
                total_steps: int, first_step: int = 0, where: dict | None = None) -> None:
    """Append one piece's pace (the steps it added and its wall seconds, start-up included) to ``OUT/pace.jsonl``,
    with the host CPU it ran on: machines of one GPU model ran the MX recipes ~16 % apart, and a run's pieces may
    run on different machines. ``total_steps``: the run's last step (a trunk's stop), ``first_step``: its first
    (a continuation's fork step: the steps before are its trunk's); ``where``: more about where it ran (a batch
    job's id and node)."""
    from numerics.environment import cpu_model

    def count(v):
        return total_steps if v == "done" else max(int(v), first_step)

    entry = {"run": spec.name, "recipe": spec.recipe, "per_gpu": per_gpu, "from_step": count(steps_before),
             "to_step": count(steps_after), "wall_s": round(wall_s, 2), "cpu": cpu_model()} | (where or {})
    JsonlLog(Path(out) / PACE_FILE).append(entry)


def expected_wall_s(out: Path, plan: ProtocolPlan, recipe: str, per_gpu: int = 1,
                    slowest: bool = False, steps: int | None = None) -> tuple[float, str] | None:
    """(wall seconds, how it was estimated) a run of ``recipe`` in ``plan`` training ``steps`` steps (default the
    plan's: a whole run; a fork's trunk or continuation trains part of them) is expected to take, start-up
    included, from the pieces in ``OUT/pace.jsonl`` run ``per_gpu`` to a GPU; None when there are none. From the
    recipe's last ``RECENT_RUNS`` finished runs when there are any: their mean, or with ``slowest`` the slowest
    (what ``--whole-runs`` asks). A run made in one piece of those steps counts its wall seconds; otherwise each
    piece's seconds less its start-up (``STARTUP_S`` of the plan's model), per step, times ``steps``, plus one
    start-up, from the last piece that started at the run's first step (an earlier start lost its checkpoint).
    With no finished run, the pieces' seconds per step, the same way."""
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
    startup, want = STARTUP_S.get(plan.model, 60.0), steps or plan.steps
    spans = {r.name: forks.span(plan, r) for r in plan.runs()}

    def whole_s(chain: list[dict]) -> float:
        training = sum(max(e["wall_s"] - startup, 0.0) for e in chain)
        return startup + training * want / sum(e["to_step"] - e["from_step"] for e in chain)

    chains: dict[str, list[dict]] = {}  # each run's pieces since its last start at its first step
    finished = []
    for e in pieces:
        first, last = spans.get(e.get("run", ""), (0, plan.steps))
        chain = chains.setdefault(e.get("run", ""), [])
        if e["from_step"] == first:
            chain.clear()
        chain.append(e)
        if e["to_step"] == last:
            finished.append(e["wall_s"] if len(chain) == 1 and last - first == want else whole_s(chain))
    recent = finished[-RECENT_RUNS:]
    if recent:
        n = f"{len(recent)} {recipe} run{'s' * (len(recent) > 1)}"
        if slowest:
            return max(recent), f"the slowest of the last {n}" if len(recent) > 1 else f"the last {n}"
        return sum(recent) / len(recent), f"the last {n}"
    return whole_s(pieces), f"{len(pieces)} {recipe} pieces, each less its start-up"


@dataclass(frozen=True)
class PaceHold:
    """A recipe whose runs ``--whole-runs`` does not start in this call: ``run`` (its first such run) should take
    ``need_s`` (``how``: ``expected_wall_s``'s estimate), ``asked_s`` with ``PACE_MARGIN``, and its piece would be
    given ``given_s``; ``call_minutes`` is the length of call that would start it whole, when no call of this
    length could (None when a fresh call of this length would)."""

    run: str
    recipe: str
    need_s: float
    how: str
    asked_s: float
    given_s: float
    call_minutes: float | None


def protocol_worker(out: Path, threads: int | None = None, gpu_share: int = 1,
                    extra: Sequence[str] = ()) -> Callable[[str, float | None], list[str]]:
    """The command of one worker piece: ``python -m convergence protocol --out OUT --piece NAME``, stopping after
    ``minutes`` (None: when its run is done) with ``threads`` torch CPU threads (None: torch's default) and, when
    ``gpu_share`` runs share a GPU, at most 1/``gpu_share`` of its memory; ``extra``: flags added at its end."""

    def argv(name: str, minutes: float | None) -> list[str]:
        cmd = [sys.executable, "-m", "convergence", "protocol", "--out", str(out), "--piece", name]
        if minutes is not None:
            cmd += ["--stop-after-minutes", f"{minutes:.4f}"]
        if gpu_share > 1:
            cmd += ["--gpu-share", str(gpu_share)]
        return cmd + ([] if threads is None else ["--threads", str(threads)]) + list(extra)

    return argv


def gpus_of_slots(slots: int, per_gpu: int = 1) -> list[str]:
    """The ``CUDA_VISIBLE_DEVICES`` value of each slot: ``slots / per_gpu`` GPUs (the visible ones, in order),
    filled round-robin so that the first pieces spread over every GPU."""
    n = max(1, slots // max(per_gpu, 1))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in range(n))).split(",")[:n]
    return [visible[i % len(visible)] for i in range(slots)]


def _say(progress: bool, text: str) -> None:
    if progress:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


class LocalExecutor:
    """This machine: ``slots`` runs at once (one: in this process; more: ``worker_argv(name, minutes)`` processes,
    by default ``protocol_worker(out)``), ``per_gpu`` of them to a GPU on a CUDA plan; the module docstring says
    how pieces are timed and paced. ``holds``: the ``PaceHold`` of each recipe ``whole_runs`` kept from starting
    in the last ``run``."""

    def __init__(self, *, slots: int = 1, per_gpu: int = 1,
                 worker_argv: Callable[[str, float | None], list[str]] | None = None, progress: bool = True):
        self.slots, self.per_gpu, self.worker_argv, self.progress = slots, per_gpu, worker_argv, progress
        self.holds: list[PaceHold] = []

    def states(self, plan: ProtocolPlan, out: Path) -> dict[str, RunState]:
        """Each run as its folder says: done, stopped (with its checkpoint), restart (without) or pending."""
        states = {}
        for spec in plan.runs():
            v = run_state(plan, out, spec)
            log = Path(out) / "logs" / f"{spec.name}.log"
            log = log if log.is_file() else None
            if v == "done":
                states[spec.name] = RunState("done", plan.steps, log)
            else:
                kind = "pending" if v == 0 else "stopped" if can_continue(out, spec) else "restart"
                states[spec.name] = RunState(kind, v, log)
        return states

    def run(self, plan: ProtocolPlan, out: Path, runs: Sequence[RunSpec], *, stop_after_s: float | None,
            whole_runs: bool) -> None:
        out = Path(out)
        self.holds = []
        deadline = None if stop_after_s is None else time.monotonic() + stop_after_s
        startup = STARTUP_S.get(plan.model, 60.0)
        status = todo_status(plan, out)  # a run's entry changes only by its own piece, read back after it
        held = set()

        def budget() -> float | None:
            """Training seconds a piece starting now may take, or None for no limit."""
            return None if deadline is None else deadline - time.monotonic() - startup

        def fits(spec: RunSpec) -> bool:
            """False when ``whole_runs`` and a run not yet started would not end, at its pace, in its piece's
            seconds: what the piece will be given (the deadline less a start-up), not the time to the deadline, or
            a run asking the deadline's seconds would be started and cut a start-up short of its end."""
            if not whole_runs or deadline is None or status[spec.name] != 0:
                return True
            first, last = forks.span(plan, spec)
            need = expected_wall_s(out, plan, spec.recipe, self.per_gpu, slowest=True, steps=last - first)
            left = budget()
            if need is None or PACE_MARGIN * need[0] <= left:
                return True
            if (spec.recipe, need) not in held:  # once a recipe and pace: its later runs wait for the same figure
                held.add((spec.recipe, need))
                asked = PACE_MARGIN * need[0]
                # more than a piece of a call this long gets even at its start: no such call ever starts it
                never = None if asked <= stop_after_s - startup else math.ceil((asked + startup) / 6) / 10
                hold = PaceHold(spec.name, spec.recipe, need[0], need[1], asked, left, never)
                self.holds.append(hold)
                _say(self.progress, _hold_line(hold, stop_after_s))
            return False

        if self.slots <= 1:
            self._in_process(plan, out, runs, status, budget, fits)
        else:
            self._workers(plan, out, runs, status, budget, fits)

    def _in_process(self, plan, out: Path, runs, status: dict, budget, fits) -> None:
        tokens = None
        for spec in runs:
            left = budget()
            if left is not None and left < MIN_PIECE_S:
                break
            before = status[spec.name]
            if not fits(spec) or not forks.ready(plan, out, spec):  # a trunk held back: its runs wait with it
                continue
            t0 = time.monotonic()
            if tokens is None:
                tokens = data_mod.load_tokens(plan.train_config(spec).data)
            try:
                done = run_piece(plan, spec, out, stop_after_s=left, tokens=tokens, progress=self.progress)
            except (BadInput, KeyboardInterrupt):
                raise
            except Exception as exc:  # as a worker's failure: its traceback in its log, one line and exit 1
                log = out / "logs" / f"{spec.name}.log"
                log.parent.mkdir(parents=True, exist_ok=True)
                with open(log, "a") as f:
                    traceback.print_exc(file=f)
                first = (str(exc).splitlines() or [""])[0]
                raise RunFailed(f"{spec.name} raised {type(exc).__name__}: {first} (log: {log})") from exc
            after = status[spec.name] = run_state(plan, out, spec)
            record_pace(out, spec, before, after, time.monotonic() - t0, self.per_gpu, *run_ends(plan, spec))
            forks.release(plan, out, status)
            _say(self.progress, f"{spec.name}: {'finished' if done else 'stopped'} at {after} "
                                f"({time.monotonic() - t0:.0f} s)")
            if not done:
                break

    def _workers(self, plan, out: Path, runs, status: dict, budget, fits) -> None:
        (out / "logs").mkdir(parents=True, exist_ok=True)
        gpus = gpus_of_slots(self.slots, self.per_gpu)
        worker_argv = self.worker_argv or protocol_worker(out)
        queue = list(runs)
        running: dict[int, tuple[RunSpec, subprocess.Popen, float, object, object]] = {}
        failures, last_report = [], time.monotonic()
        try:
            while running or (queue and not failures):  # after a failure: let the running pieces end, start no more
                for slot in range(self.slots):
                    if slot in running or not queue or failures:
                        continue
                    left = budget()
                    if left is not None and left < MIN_PIECE_S:
                        queue = []
                        break
                    pick = next((i for i, q in enumerate(queue) if forks.ready(plan, out, q) and fits(q)), None)
                    if pick is None:  # nothing left fits: a pace only grows more certain and the time only shorter
                        trunks = {r.name for r, *_ in running.values()} | {q.name for q in queue}
                        if any(q.after in trunks for q in queue):  # waiting for a trunk that is still training
                            break
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
                    _say(self.progress, f"{spec.name}: piece started on {where}")
                for slot, (spec, proc, t0, log, before) in list(running.items()):
                    if proc.poll() is None:
                        continue
                    log.close()
                    del running[slot]
                    state = status[spec.name] = run_state(plan, out, spec)
                    record_pace(out, spec, before, state, time.monotonic() - t0, self.per_gpu, *run_ends(plan, spec))
                    forks.release(plan, out, status)
                    _say(self.progress, f"{spec.name}: piece ended ("
                                        f"{'finished' if state == 'done' else f'at step {state}'}, "
                                        f"{time.monotonic() - t0:.0f} s wall, exit {proc.returncode})")
                    if proc.returncode != 0:
                        failures.append(f"{spec.name} exited {proc.returncode} (log: {out / 'logs' / spec.name}.log)")
                if running and time.monotonic() - last_report >= 30:
                    _say(self.progress, "  running: " + ", ".join(f"{s.name} {run_state(plan, out, s)}/{plan.steps}"
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


def _hold_line(hold: PaceHold, stop_after_s: float) -> str:
    never = "" if hold.call_minutes is None else (
        f"; no call of --stop-after-minutes {stop_after_s / 60:.1f} starts it whole (it needs {hold.call_minutes:.1f} "
        "minutes): give it a longer call, or run it without --whole-runs where its checkpoint outlives the call")
    return (f"{hold.run}: not started, nor the later {hold.recipe} runs: a whole run should take {hold.need_s:.0f} s "
            f"({hold.how}), {hold.asked_s:.0f} s with {PACE_MARGIN - 1:.0%} more asked; its piece would be given "
            f"{hold.given_s:.0f} s (to the deadline less a start-up)" + never)
