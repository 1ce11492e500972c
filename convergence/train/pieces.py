"""Run a protocol's runs in resumable pieces: at most ``slots`` at a time, each stopping by one deadline.

Public: ``execute(plan, out, *, slots, per_gpu, stop_after_s, worker_argv, progress) -> dict`` (name -> "done" or
steps logged), ``protocol_worker(out, threads, gpu_share)``, ``gpus_of_slots(slots, per_gpu)``, ``RunFailed``,
``STARTUP_S``.

* One slot: the pieces run in this process, one after another, on the token stream loaded once.
* Several slots: one worker process per slot (``worker_argv(name, minutes)``, by default
  ``protocol_worker(out)``: ``python -m convergence protocol --out OUT --piece NAME ...``), pinned to one
  GPU each through ``CUDA_VISIBLE_DEVICES`` on a CUDA plan, ``per_gpu`` of them to a GPU (slot i on GPU
  i mod the number of GPUs); each writes its output to ``OUT/logs/NAME.log``.
* Order: the plan's, runs already started first, so at most ``slots`` checkpoints exist at any time.
* Time: a piece is told to stop ``STARTUP_S`` before the deadline (what it spends outside its training clock:
  starting, loading, building the model, writing its checkpoint); none starts with less than ``MIN_PIECE_S``
  of training time left. The next call continues every run from its checkpoint.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from convergence.train import protocol as pr

# Seconds a piece spends outside its training clock. tiny: measured 5 s of CPU time (process start and
# imports ~1.5 s, the standard-library corpus ~4 s; 15 s wall while four other processes shared 2 cores).
# proxy: measured on an H200 (2026-11-30): a whole 1,500-step BF16 run took 237-241 s wall, 178 s of it in
# training steps, so ~60 s went to start-up, 30 evaluations and the exit; 16b: an estimate, not yet measured.
STARTUP_S = {"tiny": 10.0, "proxy": 60.0, "16b": 180.0}
MIN_PIECE_S = 5.0  # below this a piece would spend more time starting than training


class RunFailed(Exception):
    """A worker exited with an error (its log names the cause)."""


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
            worker_argv: Callable[[str, float | None], list[str]] | None = None, progress: bool = True) -> dict:
    out = Path(out)
    start = time.monotonic()
    deadline = None if stop_after_s is None else start + stop_after_s
    startup = STARTUP_S.get(plan.model, 60.0)

    def budget() -> float | None:
        """Training seconds a piece starting now may take, or None for no limit."""
        return None if deadline is None else deadline - time.monotonic() - startup

    if slots <= 1:
        tokens = None
        for spec in _order(plan, pr.run_status(plan, out)):
            left = budget()
            if left is not None and left < MIN_PIECE_S:
                break
            t0 = time.monotonic()
            if tokens is None:
                from convergence.train import data as data_mod

                tokens = data_mod.load_tokens(plan.train_config(spec).data)
            done = pr.run_piece(plan, spec, out, stop_after_s=left, tokens=tokens, progress=progress)
            _line(progress, f"{spec.name}: {'finished' if done else 'stopped'} at "
                            f"{pr.run_status(plan, out)[spec.name]} ({time.monotonic() - t0:.0f} s)")
            if not done:
                break
        return pr.run_status(plan, out)
    return _parallel(plan, out, slots, budget, worker_argv or protocol_worker(out), progress,
                     gpus=gpus_of_slots(slots, per_gpu))


def gpus_of_slots(slots: int, per_gpu: int = 1) -> list[str]:
    """The ``CUDA_VISIBLE_DEVICES`` value of each slot: ``slots / per_gpu`` GPUs (the visible ones, in order),
    filled round-robin so that the first pieces spread over every GPU."""
    n = max(1, slots // max(per_gpu, 1))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in range(n))).split(",")[:n]
    return [visible[i % len(visible)] for i in range(slots)]


def _parallel(plan, out: Path, slots: int, budget, worker_argv, progress, *, gpus: list[str]) -> dict:
    (out / "logs").mkdir(parents=True, exist_ok=True)
    queue = _order(plan, pr.run_status(plan, out))
    running: dict[int, tuple[pr.RunSpec, subprocess.Popen, float, object]] = {}
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
                spec = queue.pop(0)
                env = dict(os.environ)
                if plan.device == "cuda":
                    env["CUDA_VISIBLE_DEVICES"] = gpus[slot]
                log = open(out / "logs" / f"{spec.name}.log", "ab")
                minutes = None if left is None else left / 60
                proc = subprocess.Popen(worker_argv(spec.name, minutes), env=env, stdout=log, stderr=log)
                running[slot] = (spec, proc, time.monotonic(), log)
                where = f"GPU {gpus[slot]}" if plan.device == "cuda" else f"worker {slot}"
                _line(progress, f"{spec.name}: piece started on {where}")
            for slot, (spec, proc, t0, log) in list(running.items()):
                if proc.poll() is None:
                    continue
                log.close()
                del running[slot]
                state = pr.run_status(plan, out)[spec.name]
                _line(progress, f"{spec.name}: piece ended ({'finished' if state == 'done' else f'at step {state}'}, "
                                f"{time.monotonic() - t0:.0f} s wall, exit {proc.returncode})")
                if proc.returncode != 0:
                    log_path = out / "logs" / f"{spec.name}.log"
                    failures.append(f"{spec.name} exited {proc.returncode} (log: {log_path})")
            if running and time.monotonic() - last_report >= 30:
                status = pr.run_status(plan, out)
                _line(progress, "  running: " + ", ".join(f"{s.name} {status[s.name]}/{plan.steps}"
                                                          for s, *_ in running.values()))
                last_report = time.monotonic()
            time.sleep(0.2)
    finally:  # left running only by an exception or Ctrl-C: no worker outlives this process
        for _spec, proc, _t0, log in running.values():
            proc.terminate()
            proc.wait()
            log.close()
    if failures:
        raise RunFailed("; ".join(failures))
    return pr.run_status(plan, out)
