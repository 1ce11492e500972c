"""One piece of one run of a protocol plan, as a worker process runs it (``python -m convergence protocol --out OUT
--piece NAME``: a local worker slot, or a Slurm job on its node), and the checks a machine that trains runs makes
first: its kernels and its environment against the runs made so far.

Public: ``run_worker(args)``, ``check_kernels(plan, device)``, ``check_environment(plan, out)``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from convergence.protocol import folder, forks, render, schedule
from convergence.protocol.plan import ProtocolPlan
from convergence.protocol.provenance import environment_change
from numerics.errors import BadInput
from numerics.layer.mxfp8 import kernel_problem as mxfp8_problem
from numerics.layer.recipes import NULL_CONTROLS, check_recipe_kernels


def check_environment(plan: ProtocolPlan, out: Path) -> None:
    """CLIError when this machine computes runs differently from the plan's runs made so far."""
    from numerics.environment import describe

    changed = render.environment_change_line(environment_change(plan, out, describe()))
    if changed:
        raise BadInput(f"{out}: this machine computes runs differently from the plan's runs made so far "
                       f"({changed}); its runs are compared with each other: continue where they match, or "
                       "pass --mixed-environment to go on with both")


def _since_start_s() -> float | None:
    """Seconds since this process started (Linux's /proc), its interpreter's start-up included, as a local
    worker's parent times it; None where unknown."""
    try:
        started = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        return float(Path("/proc/uptime").read_text().split()[0]) - started / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def check_kernels(plan: ProtocolPlan, device: str | None) -> None:
    """One line when the plan's MXFP8 kernel cannot run its recipes, and (``device``: not None) when it cannot run
    on this machine's ``device``; None where no run trains here (a folder only judged, a Slurm submitter)."""
    problem = None if device is None or plan.mxfp8_kernel == "auto" else mxfp8_problem(plan.mxfp8_kernel, device)
    if problem:
        raise BadInput(f"--mxfp8-kernel: {problem}")
    recipes = {r.recipe for r in plan.runs()} - {"bf16"}
    check_recipe_kernels(sorted(recipes - set(NULL_CONTROLS)), plan.mxfp8_kernel, device)
    check_recipe_kernels(sorted(recipes & set(NULL_CONTROLS)), "auto", device)


def run_worker(args) -> int:
    """``--piece NAME``: one piece of one run of the plan in --out; nothing on a finished run. A scheduler's
    SIGTERM (preemption, scancel) or SIGUSR2 (Slurm's warning) stops it at its next step, with its checkpoint.
    With ``--batch-job`` (a Slurm job, whose submitter neither sees its node nor times it) it checks its node's
    GPU and environment and records its own pace, with its job id and node."""
    import signal
    import socket
    import time

    from convergence.train.stopping import stop_on_signals

    t0 = time.monotonic() - (_since_start_s() or 0.0)
    plan = folder.load_plan(args.out)
    spec = next((s for s in plan.runs() if s.name == args.piece), None)
    if spec is None:
        raise BadInput(f"--piece {args.piece}: no run of that name in {args.out}'s plan")
    with stop_on_signals(signal.SIGTERM, signal.SIGUSR2):
        before = folder.run_state(plan, args.out, spec)
        # a job requeued after its run finished, or a run made elsewhere meanwhile; not a lost trunk, made again
        if before == "done" and not forks.remaking(plan, args.out, spec):
            print(f"{spec.name}: finished already; nothing to do", file=sys.stderr, flush=True)
            return 0
        before = before if folder.can_continue(args.out, spec) else 0
        where = None
        if args.batch_job:
            task = os.environ.get("SLURM_ARRAY_TASK_ID")
            job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{task}" if task else os.environ.get("SLURM_JOB_ID")
            where = {"slurm_job": job, "node": socket.gethostname()}
            print(f"{spec.name}: piece in Slurm job {job} on {where['node']}, from step {before}", file=sys.stderr,
                  flush=True)
            if plan.device == "cuda" and not torch.cuda.is_available():
                raise BadInput(f"{spec.name}: no CUDA device visible on {where['node']} (the jobs asked "
                               f"--slurm-gpus 1; CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')})")
            check_kernels(plan, plan.device)
            if not args.mixed_environment:
                check_environment(plan, args.out)
        if args.gpu_share > 1 and plan.device == "cuda":  # the memory check then sees this run's share
            torch.cuda.set_per_process_memory_fraction(1 / args.gpu_share)
        stop = None if args.stop_after_minutes is None else 60 * args.stop_after_minutes
        schedule.run_piece(plan, spec, args.out, stop_after_s=stop)
        if where is not None:
            schedule.record_pace(args.out, spec, before, folder.run_state(plan, args.out, spec),
                                 time.monotonic() - t0, 1, *schedule.run_ends(plan, spec), where=where)
    return 0
