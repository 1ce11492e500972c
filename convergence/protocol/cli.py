"""python -m convergence protocol: a paired candidate, BF16 replicates and both controls in resumable pieces
(``convergence.protocol``: ``plan`` the runs, ``folder`` their state, ``schedule`` where they run, ``judge`` the
verdicts, ``status`` and ``render`` what --status says).

Executors (``--executor``, ``EXECUTORS``): ``local``, this machine's GPUs or CPU workers; ``slurm``, each run a
Slurm job (``convergence.protocol.slurm.executor``, docs/slurm.md). Bad input is one line on stderr and exit code 2;
the exit codes of a run are in ``main``.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from convergence.curves.decision.equivalence import ENDPOINTS, TESTS
from convergence.protocol import folder, render, schedule
from convergence.protocol.judge import judge, write_results
from convergence.protocol.plan import DESIGNS, PLANTED, TRAIN_OVERRIDES, ProtocolPlan
from convergence.protocol.provenance import hardware_tag, runs_hardware_tag
from convergence.protocol.slurm import executor as slurm_executor
from convergence.protocol.slurm import jobs as slurm_jobs
from convergence.protocol.slurm.node import worker_minutes
from convergence.protocol.status import pairs, progress
from convergence.protocol.worker import check_environment, check_kernels, run_worker
from convergence.train import data as data_mod
from numerics.cli import ArgumentParser, CLIError, seed_arg
from numerics.environment import check_hardware_tag
from numerics.files import check_distinct, check_writable
from numerics.layer.configs import CONFIGS
from numerics.layer.mxfp8 import KERNELS as MXFP8_KERNELS


def local_executor(args, *, slots: int, per_gpu: int, threads: int | None) -> schedule.Executor:
    """This machine: ``slots`` runs at once, ``per_gpu`` of them to a GPU, each worker with ``threads`` threads."""
    return schedule.LocalExecutor(slots=slots, per_gpu=per_gpu,
                                  worker_argv=schedule.protocol_worker(args.out, threads, gpu_share=per_gpu))


def slurm_executor_of(args, *, slots: int, per_gpu: int, threads: int | None) -> schedule.Executor:
    """Each run a Slurm job with the ``--slurm-*`` options, each worker with ``threads`` (default: its CPUs)."""
    options = slurm_executor.options_of(args, args.device)
    if not args.status:  # before the folder changes: a time limit that leaves time to train, and a submitter
        worker_minutes(options.time_minutes, schedule.STARTUP_S.get(args.model, 60.0))
        slurm_jobs.check_submitter()
    return slurm_executor.SlurmExecutor(options, threads=threads or options.cpus,
                                        mixed_environment=args.mixed_environment,
                                        shared=args.slurm_shared_folder, wait=args.slurm_wait)


# --executor NAME -> its factory (the parsed arguments; the runs at once, per GPU, and CPU threads per run)
EXECUTORS: dict[str, Callable[..., schedule.Executor]] = {"local": local_executor, "slurm": slurm_executor_of}


def _protocol_parser() -> ArgumentParser:
    d = ProtocolPlan(model="tiny", steps=2)
    p = ArgumentParser(prog="python -m convergence protocol",
                       description="a paired candidate, BF16 replicates and both controls, judged on validation loss, "
                       "in resumable pieces")
    p.add_argument("--out", required=True, type=Path, help="the protocol's folder (repeat the command to continue)")
    p.add_argument("--model", help=f"one of {', '.join(CONFIGS)}")
    p.add_argument("--steps", type=int)
    p.add_argument("--seed", type=seed_arg, default=d.seed)
    p.add_argument("--replicates", type=int, default=d.replicates, help="BF16 baselines, the paired one included")
    p.add_argument("--candidate-replicates", type=int, default=d.candidate_replicates,
                   help="candidate runs, the paired one included, each with a replicate's change (and as many "
                        "control runs and held-out BF16 runs): below the one-run floor (docs/protocol.md)")
    p.add_argument("--design", default=d.design, help=f"what a replicate changes: {', '.join(DESIGNS)} (fork: "
                   "trunks continued by paired runs)")
    p.add_argument("--candidate", default=d.candidate, help="the recipe judged (default mxfp8)")
    # declared before any run; None: the folder's plan's, or a new plan's default (an older folder keeps its own)
    p.add_argument("--control", default=None, help=f"the positive control: '{PLANTED}' (a new plan's default: the "
                   "held-out BF16 runs made --planted-shift margins worse) or a recipe known to be worse")
    p.add_argument("--planted-shift", type=float, default=None,
                   help=f"the planted control's true effect in margins, 1 to 3 (default {d.planted_shift:g})")
    p.add_argument("--test", default=None, choices=TESTS,
                   help=f"the declared test (a new plan's default {d.test}; two-ranges: the rule before)")
    p.add_argument("--alpha", type=float, default=None, help=f"each one-sided test's level (default {d.alpha:g})")
    p.add_argument("--endpoint", default=None, choices=ENDPOINTS,
                   help="the primary endpoint: the final window (default) or the whole range; the other is reported")
    p.add_argument("--null-control", action="store_true",
                   help="also run mxfp8-null (the seam with no cast) beside its BF16 twin, both --deterministic: they "
                        "must end bit-identical")
    p.add_argument("--trunks", type=int, default=None, help="--design fork: BF16 trunks (default 1)")
    p.add_argument("--fork-step", type=int, default=None, help="--design fork: the trunks' last step")
    p.add_argument("--fork-change", default=d.fork_change, choices=("rounding", "data"),
                   help="--design fork: what tells continuations apart: rows permuted (rounding) or the remaining "
                        "windows' order (data)")
    p.add_argument("--pilot", type=int, default=None, metavar="N",
                   help="--design fork without a candidate: N BF16 continuations per trunk; the result is their spread")
    p.add_argument("--planned-spread", type=float, default=None,
                   help="the run-to-run spread (fork: within a trunk) the plan's projection is computed at (default: "
                        "the model's measured one, convergence.protocol.projection)")
    p.add_argument("--declare-only", action="store_true",
                   help="write OUT/protocol.json and OUT/projection.json (what the plan should decide, its GPU-hours) "
                        "and run nothing")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--mxfp8-kernel", default="auto", choices=["auto", *MXFP8_KERNELS])
    p.add_argument("--margin", type=float, default=d.margin, help="relative equivalence margin (DeepSeek-V3: 0.0025)")
    p.add_argument("--name", default="", help="prefix of the result files (default <model>_long)")
    p.add_argument("--data", help="as convergence train --data (default: the Python standard library)")
    p.add_argument("--val-percent", type=int, default=None, help="as convergence train --val-percent")
    for key in TRAIN_OVERRIDES:
        p.add_argument(f"--{key.replace('_', '-')}", type=float if key == "lr" else int, default=None)
    p.add_argument("--gpus", type=int, default=None, help="runs at once, one per GPU (default: every visible GPU)")
    p.add_argument("--parallel", type=int, default=1,
                   help="runs at once: on the CPU, worker processes; on CUDA, runs per GPU (each held to 1/N of its "
                        "memory; a small model leaves a GPU idle between its kernels)")
    p.add_argument("--stop-after-minutes", type=float, default=None,
                   help="stop every run at a checkpoint by then; the same command continues")
    p.add_argument("--whole-runs", action="store_true",
                   help="with --stop-after-minutes: start a run only when this folder's pace of its recipe says it "
                        "ends by then (for a machine whose disk, so a stopped run's checkpoint, ends with the call)")
    p.add_argument("--mixed-environment", action="store_true",
                   help="continue a plan on a machine whose torch, torchao, CUDA or GPU differ from its runs' "
                        "(refused without it: the verdict would mix the change in; the sidecars then list both)")
    p.add_argument("--status", action="store_true",
                   help="say how far the protocol in --out is (runs done, GPU time left at its pace); run nothing")
    p.add_argument("--plot", type=Path, default=None,
                   help="with --status: draw the last whole level's verdicts as they stand into this PNG")
    p.add_argument("--plot-parting", type=Path, default=None,
                   help="with --status: draw how fast each recipe's replicates part from its paired run into this PNG")
    p.add_argument("--hardware", default=None, help="hardware tag in the result names (default: detected, e.g. h200x2)")
    p.add_argument("--force", action="store_true", help="delete this protocol's runs in --out and start again "
                   "(with --status, which deletes nothing: overwrite --plot's and --plot-parting's files)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads per process")
    p.add_argument("--executor", choices=list(EXECUTORS), default=None,
                   help="where the runs are made: local (the default: this machine's GPUs or CPU workers) or slurm "
                        "(each run a Slurm job: docs/slurm.md); --status reads a folder with Slurm jobs as slurm")
    slurm_executor.add_arguments(p)
    p.add_argument("--piece", help=argparse.SUPPRESS)  # internal: one worker piece of the run NAME
    p.add_argument("--gpu-share", type=int, default=1, help=argparse.SUPPRESS)  # internal: runs sharing its GPU
    return p


def _plan_flags() -> list[str]:
    """The options that make a plan (the plan's fields, its training overrides) or name its results: --status reads
    them from the folder's protocol.json."""
    import dataclasses

    fields = [f.name for f in dataclasses.fields(ProtocolPlan) if f.name != "overrides"]
    return [*fields, *TRAIN_OVERRIDES, "hardware"]


# what a plan declares that a command line may leave out: the folder's plan's then (an older folder keeps its rule
# and control), else a new plan's default
DECLARED = ("test", "alpha", "endpoint", "control", "planted_shift")


def _plan_of(args):
    """The plan the command line gives (checked): a run's, or one --status compares with its folder's."""
    overrides = tuple((k, float(v)) for k in TRAIN_OVERRIDES if (v := getattr(args, k)) is not None)
    held = folder.load_plan(args.out) if (args.out / "protocol.json").is_file() and not args.force else None
    new = ProtocolPlan(model=args.model, steps=args.steps)
    declared = {key: getattr(args, key) if getattr(args, key) is not None else getattr(held or new, key)
                for key in DECLARED}
    fork = dict(trunks=args.trunks or 1, fork_step=args.fork_step or 0, pilot=args.pilot is not None)
    if args.pilot is not None:
        if args.pilot < 2:
            raise CLIError(f"--pilot must be >= 2 (continuations: their spread is the result), got {args.pilot}")
        if args.replicates != parser_default("replicates"):
            raise CLIError("--pilot N gives the continuations per trunk: leave out --replicates")
        fork["candidate_replicates"] = 1
    return ProtocolPlan(model=args.model, steps=args.steps, seed=args.seed,
                        replicates=args.pilot if args.pilot is not None else args.replicates,
                        candidate_replicates=fork.pop("candidate_replicates", args.candidate_replicates),
                        design=args.design, candidate=args.candidate, device=args.device,
                        mxfp8_kernel=args.mxfp8_kernel, margin=args.margin, name=args.name, data=args.data,
                        val_percent=args.val_percent, overrides=overrides, null_control=args.null_control,
                        planned_spread=args.planned_spread, fork_change=args.fork_change, **declared,
                        **fork).check()


def parser_default(key: str):
    return _protocol_parser().get_default(key)


def main(argv: Sequence[str] | None = None) -> int:
    """python -m convergence protocol: see convergence.protocol.plan (the runs) and docs/protocol.md.

    Exit code: 4 while runs are unfinished (repeat the command), 1 when a run failed; once complete, the
    candidate's verdict as ``compare`` exits (0 equivalent, 1 not_equivalent or diverged, 3 inconclusive)."""
    parser = _protocol_parser()
    args = parser.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        raise CLIError(f"--threads must be >= 1, got {args.threads}")
    if args.parallel < 1 or (args.stop_after_minutes is not None
                             and not (0 < args.stop_after_minutes < math.inf)):
        raise CLIError("--parallel must be >= 1 and --stop-after-minutes a number > 0")
    if args.gpus is not None and args.gpus < 1:  # every visible GPU is the default, not 0
        raise CLIError(f"--gpus must be >= 1, got {args.gpus} (leave it out for every visible GPU)")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.piece is not None:  # a worker: one piece of one run of the plan in --out
        return run_worker(args)
    slurm_flags = slurm_executor.flags_given(args, parser)
    if args.status:
        for flag, given in (("--whole-runs", args.whole_runs), ("--stop-after-minutes", args.stop_after_minutes),
                            ("--mixed-environment", args.mixed_environment), ("--gpus", args.gpus),
                            *((f, True) for f in slurm_flags)):
            if given:  # --status runs nothing: a flag for a run would be ignored, and its user think it applied
                raise CLIError(f"{flag} goes with a run, not with --status (which runs nothing)")
        if not (args.out / "protocol.json").is_file():
            raise CLIError(f"--status: {args.out} holds no protocol run")
        # the plan is the folder's: a plan flag beside --status would be ignored, so it is refused, except in the
        # plan's own command with --status added
        given = [key for key in _plan_flags() if getattr(args, key) != parser.get_default(key)]
        if given and (args.model is None or args.steps is None):
            raise CLIError(f"--{given[0].replace('_', '-')} with --status: --status reads the plan from "
                           f"{args.out / 'protocol.json'}; give only --out, or the plan's whole command")
        if given:
            want = _plan_of(args)
            have = folder.check_same_plan(want, args.out)
            changed = [f"{key} {old} (the command: {new})"
                       for key, old, new in folder.changed_fields(have, want.as_dict())]
            if changed:  # --status reports the folder's plan: runs left and time for another plan were printed
                raise CLIError(f"--status reports {args.out}'s plan, which has {'; '.join(changed)}: run the command "
                               "without --status to change the plan (the runs made stay), or give only --out")
            if args.hardware is not None:
                check_hardware_tag(args.hardware)
        check_distinct(plot=args.plot, plot_parting=args.plot_parting)
        for png in (args.plot, args.plot_parting):
            if png is not None:
                check_writable(png, force=args.force)
        plan = folder.load_plan(args.out)  # the pace is kept per runs per GPU (a CPU plan's workers: 1)
        if plan.device != "cuda" and args.parallel != 1:  # a CPU plan's pace is one run's: it would be ignored
            raise CLIError("--parallel with --status picks the pace of N runs per GPU; a CPU plan's is one run's, "
                           "whatever its workers: leave --parallel out")
        per_gpu = args.parallel if plan.device == "cuda" else 1
        # a folder whose runs went to Slurm reads as the Slurm executor sees it, where Slurm's commands are
        name = args.executor or ("slurm" if slurm_jobs.has_jobs(args.out) and shutil.which("squeue") else "local")
        executor = EXECUTORS[name](args, slots=per_gpu, per_gpu=per_gpu, threads=args.threads)
        now = progress(plan, args.out, per_gpu=per_gpu, states=executor.states(plan, args.out))
        render.draw_figures(now, args.plot, args.plot_parting, force=args.force)
        print("\n".join(render.status_lines(now, figure=args.plot, drift_figure=args.plot_parting)))
        return 0
    for flag, png in (("--plot", args.plot), ("--plot-parting", args.plot_parting)):
        if png is not None:
            raise CLIError(f"{flag} goes with --status (a finished protocol writes its own figures)")
    if args.model is None or args.steps is None:
        raise CLIError("--model and --steps are required")
    on_slurm = args.executor == "slurm"
    if slurm_flags and not on_slurm:  # it would be ignored
        raise CLIError(f"{slurm_flags[0]} goes with --executor slurm")
    for flag, given in (("--stop-after-minutes", args.stop_after_minutes is not None),
                        ("--whole-runs", args.whole_runs), ("--gpus", args.gpus is not None),
                        ("--parallel", args.parallel != 1)):
        if on_slurm and given:
            raise CLIError(f"{flag} goes with the local executor: under --executor slurm each run is a job, sized "
                           "by --slurm-time, --slurm-gpus and --slurm-cpus")
    if args.gpus is not None and args.device != "cuda":  # a CPU plan has no GPUs to count: it would be ignored
        raise CLIError("--gpus goes with --device cuda; a CPU plan runs --parallel workers at once")
    plan = _plan_of(args)
    # a folder whose runs are all made is judged anywhere: copied off the GPU machine, it needs no GPU
    # (unless --force is to delete them and run again)
    held = (args.out / "protocol.json").is_file()
    if held and not args.force:  # another plan's runs read as this one's would look damaged (its logs end elsewhere)
        folder.check_same_plan(plan, args.out)
    if args.declare_only:
        return _declare(plan, args)
    before = {r.name: 0 for r in plan.runs()} if held and args.force else folder.run_status(plan, args.out)
    judge_only = not args.force and held and all(v == "done" for v in before.values())
    gpus = (args.gpus or torch.cuda.device_count()) if args.device == "cuda" else 0
    if not judge_only and not on_slurm:  # a Slurm job's node has the GPUs, not the node submitting it
        if args.device == "cuda" and not torch.cuda.is_available():
            raise CLIError("--device cuda: no CUDA device is visible")
        if args.device == "cuda" and not 1 <= gpus <= torch.cuda.device_count():
            raise CLIError(f"--gpus {args.gpus}: this machine has {torch.cuda.device_count()}")
    if args.hardware is not None:
        check_hardware_tag(args.hardware)
    if args.whole_runs and args.stop_after_minutes is None:
        raise CLIError("--whole-runs needs --stop-after-minutes (without a deadline every run is whole)")
    # whether a kernel runs on the device is the training machine's question: a Slurm job's node asks it (run_worker)
    check_kernels(plan, None if judge_only or on_slurm else args.device)
    if plan.data is not None and not judge_only:  # before protocol.json records it: a mistyped path then leaves
        data_mod.check_data_path(plan.data)        # no plan that the corrected command would have to --force
    slots = gpus * args.parallel if args.device == "cuda" else args.parallel
    per_gpu = args.parallel if args.device == "cuda" else 1
    if held and args.force:
        slurm_executor.refuse_active_jobs(args.out, "--force, deleting their runs,", required=on_slurm)
    elif not judge_only and not on_slurm:
        slurm_executor.refuse_active_jobs(args.out, "training their runs here", required=False)
    executor = EXECUTORS[args.executor or "local"](  # its options checked before the folder changes
        args, slots=slots, per_gpu=per_gpu,
        threads=args.threads or (None if on_slurm else max(1, (os.cpu_count() or 1) // max(slots, 1))))
    grew = folder.open_protocol(plan, args.out, force=args.force)
    if grew:
        print(grew, flush=True)
    _write_projection(plan, args.out, again=bool(grew) or args.force)
    if args.force:  # its runs were deleted: read once more
        before = folder.run_status(plan, args.out)
    if not judge_only and not args.mixed_environment and not on_slurm:  # a Slurm job checks its own node
        check_environment(plan, args.out)
    at_once = f"{slots or 1} at a time" + (f" ({per_gpu} per GPU)" if per_gpu > 1 else "")
    print(f"protocol {plan.prefix}: {len(before)} runs of {plan.steps} steps, "
          f"{'as Slurm jobs' if on_slurm else at_once}; done: "
          f"{sum(v == 'done' for v in before.values())}", flush=True)
    stop = None if args.stop_after_minutes is None else 60 * args.stop_after_minutes
    try:
        status = schedule.execute(plan, args.out, executor, stop_after_s=stop, whole_runs=args.whole_runs)
    except schedule.RunFailed as exc:
        print(f"error: a run failed: {exc}", file=sys.stderr)
        return 1
    left = [n for n, v in status.items() if v != "done"]
    if left:
        print(f"{len(status) - len(left)} of {len(status)} runs finished; not yet: "
              + ", ".join(f"{n} ({status[n]}/{plan.steps} steps)" for n in left)
              + (". Repeat the same command once their jobs end: it judges the plan, or submits what did not "
                 "finish again (--status shows the jobs)" if on_slurm else ". Repeat the same command to continue")
              + f" ({args.out})")
        return 4
    on_its_device = not on_slurm and (args.device == "cpu" or torch.cuda.is_available())
    hardware = args.hardware or (hardware_tag(args.device, gpus) if on_its_device
                                 else runs_hardware_tag(plan, args.out))
    command = plan.command("OUT", gpus=gpus, per_gpu=per_gpu, stop_after_minutes=args.stop_after_minutes)
    if plan.pilot:
        from convergence.protocol.pilot import pilot_lines, pilot_note, pilot_result

        result = pilot_result(plan, args.out) | {"environment": _environment()}
        files = write_results(plan, args.out, {"pilot": result}, command, hardware, {"pilot": pilot_note(result)})
        print("\n".join(pilot_lines(result)))
        print(f"pilot complete: {len(files)} result files in {args.out / 'results'} (record.sh lists them in golden/)")
        return 0
    verdicts = judge(plan, args.out)
    files = write_results(plan, args.out, verdicts, command, hardware)
    for name, r in verdicts.items():
        print(render.verdict_line(name, r))
    for line in render.amendment_lines(verdicts):
        print(line)
    for line in render.pairs_lines(pairs(plan, verdicts)):
        print(line)
    print(f"protocol complete: {len(files)} result files in {args.out / 'results'} (record.sh lists them in golden/)")
    from convergence.curves.compare import EXIT_CODES

    return EXIT_CODES[verdicts["verdict"]["verdict"]]  # the candidate's verdict, as compare exits


def _environment() -> dict:
    from numerics.environment import describe

    return describe()


def _write_projection(plan: ProtocolPlan, out: Path, *, again: bool) -> dict:
    """OUT/projection.json: what the plan should decide, written when the plan is declared (or changed), before
    any run of it (``convergence.protocol.projection``)."""
    import json

    from convergence.protocol.projection import projection
    from numerics.files import atomic_write

    path = out / "projection.json"
    p = projection(plan)
    if again or not path.exists():
        atomic_write(path, json.dumps(p, indent=1) + "\n", force=True)
    return p


def _declare(plan: ProtocolPlan, args) -> int:
    """--declare-only: the plan and its projection written, nothing run."""
    from convergence.protocol.projection import projection_lines

    if plan.data is not None:
        data_mod.check_data_path(plan.data)
    grew = folder.open_protocol(plan, args.out, force=args.force)
    if grew:
        print(grew, flush=True)
    p = _write_projection(plan, args.out, again=True)
    print("\n".join(projection_lines(p)))
    print(f"declared in {args.out / 'protocol.json'} and {args.out / 'projection.json'}; run it with: "
          + plan.command(str(args.out)))
    return 0


if __name__ == "__main__":
    import sys

    from numerics.cli import run_main

    sys.exit(run_main(main))
