"""The ``slurm`` executor of the protocol: each run still to make is a Slurm job (``convergence.protocol.slurm.jobs``
submits it, ``convergence.protocol.slurm.node`` runs it), and each run's state reads as its job's.

Public: ``SlurmExecutor``, ``run_states(folder_states, jobs)``, ``add_arguments(parser)``, ``flags_given(args,
parser)``, ``options_of(args, device)``, ``refuse_active_jobs(out, doing, required)``.

* What a job runs: the run's worker piece (``schedule.protocol_worker``) with ``--batch-job``: on its node it checks
  that the node computes runs as the runs made so far (``provenance.environment_change``; the login node need not
  have the plan's GPUs or libraries), records its own pace with its job id and node in ``OUT/pace.jsonl``, and stops
  at a checkpoint by ``node.worker_minutes`` of the time limit or at Slurm's warning or a preemption's SIGTERM
  (``convergence.train.stopping``). A job on a finished run starts nothing.
* The runs of one call share their options, so they go as one job array; a run whose latest job is pending or
  running is not submitted again, nor a finished one; the rest (never submitted, failed, cancelled, timed out,
  preempted) are, each continuing from its checkpoint. The job ids live in ``OUT/slurm/jobs.jsonl``.
* A fork plan's continuation is submitted once its trunk's checkpoint is on the shared folder (``forks.ready``):
  the call that submits the trunks says which runs wait for them, and a later call (or ``--slurm-wait``, which
  waits for the trunks and then submits the rest) submits those.
* A run trains in one process: one GPU (a CUDA plan) or none (a CPU plan) per job; runs of several GPUs or nodes
  need a protocol piece under torchrun, which does not exist yet, and are refused.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from convergence.protocol import forks
from convergence.protocol.folder import run_dir, run_state
from convergence.protocol.plan import ProtocolPlan, RunSpec
from convergence.protocol.schedule import STARTUP_S, LocalExecutor, RunFailed, RunState, protocol_worker
from convergence.protocol.slurm import jobs as slurm
from convergence.protocol.slurm.node import worker_minutes
from convergence.protocol.slurm.options import SlurmOptions
from numerics.errors import BadInput

ENDED = ("cancelled", "timeout", "preempted")  # a job that ended before its run: the run is submitted again
WAIT_POLL_S = 2.0  # --slurm-wait asks Slurm this often (one squeue and one sacct: cheap for the controller)
WAIT_REPORT_S = 60.0  # and says how far the jobs are this often


def run_states(folder_states: dict[str, RunState], jobs: dict[str, slurm.JobState]) -> dict[str, RunState]:
    """Each run's state with its latest job's beside it: a finished run is ``done`` whatever its job; an active
    job's run ``pending`` or ``running``; a failed job's ``failed`` (with its log); a cancelled, timed-out or
    preempted one's that word, unless the run has no checkpoint to continue from (``restart``); otherwise (its job
    completed, or Slurm no longer lists it) the folder's. ``where``: the job, its node and Slurm's reason."""
    out = {}
    for name, s in folder_states.items():
        job = jobs.get(name)
        if job is None or s.state == "done":
            out[name] = s
            continue
        state = s.state
        if job.state in slurm.ACTIVE or job.state == "failed" or (job.state in ENDED and s.state != "restart"):
            state = job.state
        log = job.log if job.log is not None and job.log.exists() else s.log
        out[name] = RunState(state, s.steps, log, job.where(state=state != job.state))
    return out


def _done_sign(plan: ProtocolPlan, out: Path, spec: RunSpec, status: dict) -> Path | None:
    """The file whose existence says a job of ``spec`` has nothing left to do: its compacted log (a finished run's,
    ``folder.finish_run``, and a trunk's at its stop, ``schedule.run_piece``); none for a lost trunk made again,
    whose compacted log of record is there before it is (``forks.remaking``; ``status``: the plan's runs' states,
    read once for all its trunks)."""
    return None if forks.remaking(plan, out, spec, status) else run_dir(out, spec) / "metrics.jsonl.gz"


class SlurmExecutor:
    """Runs as Slurm jobs with ``options`` (``SlurmOptions``), each worker with ``threads`` torch threads
    (None: torch's default); ``mixed_environment`` as the command's flag; ``shared``: skip the check that the
    folder is on a shared file system; ``wait``: wait for the jobs, then raise ``RunFailed`` for a failed one."""

    def __init__(self, options: SlurmOptions, *, threads: int | None = None, mixed_environment: bool = False,
                 shared: bool = False, wait: bool = False, progress: bool = True):
        self.options, self.threads, self.mixed_environment = options, threads, mixed_environment
        self.shared, self.wait, self.progress = shared, wait, progress
        self.submission: slurm.Submission | None = None

    def states(self, plan: ProtocolPlan, out: Path) -> dict[str, RunState]:
        folder = LocalExecutor().states(plan, out)
        return run_states(folder, slurm.job_states(out)) if slurm.has_jobs(out) else folder

    def run(self, plan: ProtocolPlan, out: Path, runs: Sequence[RunSpec], *, stop_after_s: float | None,
            whole_runs: bool) -> None:
        if stop_after_s is not None or whole_runs:
            raise BadInput("--stop-after-minutes and --whole-runs go with the local executor: a Slurm job stops at "
                           "a checkpoint before its time limit (--slurm-time)")
        if not runs:
            return
        out = Path(out).resolve()
        waiting = [s for s in runs if not forks.ready(plan, out, s)]  # a continuation whose trunk is not there yet
        runs = [s for s in runs if s not in waiting]
        argv = protocol_worker(out, self.threads,
                               extra=("--batch-job", *(["--mixed-environment"] if self.mixed_environment else [])))
        minutes = worker_minutes(self.options.time_minutes, STARTUP_S.get(plan.model, 60.0))
        names = [s.name for s in runs]
        before = slurm.job_states(out, names) if slurm.has_jobs(out) else {}
        status = {s.name: run_state(plan, out, s) for s in plan.runs()} if any(s.stop_at for s in runs) else {}
        todo = [slurm.SlurmRun(s.name, tuple(argv(s.name, minutes)), _done_sign(plan, out, s, status)) for s in runs]
        sub = self.submission = slurm.submit(out, todo, self.options, shared=self.shared)
        for name, job in sub.submitted.items():
            if name in before:  # what became of its last job: a failure is said, not resubmitted in silence
                self._say(f"{name}: its {before[name].line()}; submitted again as job {job}")
        if sub.submitted:
            ids = sorted({j.split("_")[0] for j in sub.submitted.values()})
            self._say(f"submitted {len(sub.submitted)} run(s) as Slurm job{'s' * (len(ids) > 1)} {', '.join(ids)} "
                      f"({'array' if any('_' in j for j in sub.submitted.values()) else 'one job'}); their logs: "
                      f"{next(iter(sub.logs.values())).parent}")
        if sub.active:
            self._say(f"{len(sub.active)} run(s) left to their jobs: "
                      + ", ".join(f"{n} ({s.where(state=True)})" for n, s in sub.active.items()))
        if waiting:
            self._say(f"{len(waiting)} run(s) wait for their trunk's checkpoint: "
                      + ("submitted once it is there" if self.wait else
                         "repeat the same command once the trunks' jobs end to submit them"))
        if self.wait:
            self._wait(out, names)
            if waiting and any(forks.ready(plan, out, s) for s in waiting):
                self.run(plan, out, waiting, stop_after_s=None, whole_runs=False)

    def _wait(self, out: Path, names: list[str]) -> None:
        said = time.monotonic()
        while True:
            states = slurm.wait(out, names, poll_s=WAIT_POLL_S, timeout_s=WAIT_REPORT_S)
            active = [s for s in states.values() if s.state in slurm.ACTIVE]
            if not active:
                break
            if time.monotonic() - said >= WAIT_REPORT_S:
                said = time.monotonic()
                self._say(f"waiting for {len(active)} job(s): " + ", ".join(
                    f"{s.name} {s.state}" for s in active))
        failed = [s for s in states.values() if s.state == "failed"]
        if failed:
            raise RunFailed("; ".join(f"{s.name}: {s.line()}" for s in failed))

    def _say(self, text: str) -> None:
        if self.progress:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()


# ------------------------------------------------------------------ the command line

# --slurm-* flag -> (SlurmOptions field or None, argparse keywords)
_FLAGS = {
    "--slurm-partition": ("partition", dict(metavar="NAME", help="the jobs' partition (default: the cluster's)")),
    "--slurm-account": ("account", dict(metavar="NAME", help="the account the jobs are charged to")),
    "--slurm-qos": ("qos", dict(metavar="NAME", help="the jobs' quality of service")),
    "--slurm-time": ("time_minutes", dict(metavar="MINUTES", type=int, default=60, help=(
        "each job's time limit (default 60); a run longer than that continues in the same job, requeued"))),
    "--slurm-gpus": ("gpus", dict(metavar="N", type=int, help="GPUs per run (default: 1 on a CUDA plan, else 0)")),
    "--slurm-cpus": ("cpus", dict(metavar="N", type=int, help=(
        "CPUs per run (default: the cluster's); also the worker's torch threads unless --threads says"))),
    "--slurm-mem-gb": ("mem_gb", dict(metavar="GB", type=float, help="memory per run (default: the cluster's)")),
    "--slurm-nodes": ("nodes", dict(metavar="N", type=int, default=1, help="nodes per run (a run trains in one "
                                                                            "process: 1)")),
    "--slurm-constraint": ("constraint", dict(metavar="FEATURES", help="the nodes' features (sbatch --constraint)")),
    "--sbatch-flag": ("sbatch_flags", dict(action="append", default=[], metavar="--FLAG[=VALUE]", help=(
        "another sbatch flag for every job (repeatable), e.g. --sbatch-flag=--exclusive"))),
    "--slurm-shared-folder": (None, dict(action="store_true", help=(
        "skip the check that --out is on a file system the cluster's nodes share (a local one that they do share)"))),
    "--slurm-wait": (None, dict(action="store_true", help=(
        "wait for the jobs to end, then judge as a local run does (without it the command submits, exits 4, and "
        "judges when run again once they are done)"))),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--slurm-*`` flags and ``--sbatch-flag`` (``--executor slurm`` only; docs/slurm.md)."""
    for flag, (_, kw) in _FLAGS.items():
        parser.add_argument(flag, **kw)
    parser.add_argument("--batch-job", action="store_true", help=argparse.SUPPRESS)  # internal: a piece in a job


def flags_given(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    """The Slurm flags given on the command line (their value is not the default)."""
    return [f for f in _FLAGS if getattr(args, f[2:].replace("-", "_")) != parser.get_default(f[2:].replace("-", "_"))]


def options_of(args: argparse.Namespace, device: str) -> SlurmOptions:
    """The jobs' options from the flags, checked (``BadInput``: one line). A run trains in one process: more than
    one GPU or node per run is refused, and a CUDA plan's runs need their GPU."""
    values = {field: getattr(args, flag[2:].replace("-", "_")) for flag, (field, _) in _FLAGS.items() if field}
    values["sbatch_flags"] = tuple(values["sbatch_flags"])
    if values["gpus"] is None:
        values["gpus"] = 1 if device == "cuda" else 0
    if values["gpus"] > 1 or values["nodes"] > 1:
        raise BadInput(f"--slurm-gpus {values['gpus']} --slurm-nodes {values['nodes']}: a protocol run trains in one "
                       "process (one GPU or the CPU); runs over several GPUs or nodes are not supported yet")
    if device == "cuda" and values["gpus"] != 1:
        raise BadInput(f"--slurm-gpus {values['gpus']} on a --device cuda plan: each run needs its GPU")
    return SlurmOptions(**values).check()


def refuse_active_jobs(out: Path, doing: str, *, required: bool) -> None:
    """BadInput when a run of ``out`` has a Slurm job pending or running: ``doing`` (deleting or training its runs
    here) would race it. Without Slurm's commands on PATH, only when ``required`` (else nothing can be asked)."""
    if not slurm.has_jobs(out) or (not required and shutil.which("squeue") is None):
        return
    active = {n: s for n, s in slurm.job_states(out).items() if s.state in slurm.ACTIVE}
    if active:
        name, job = next(iter(active.items()))
        raise BadInput(f"{out}: {len(active)} run(s) have Slurm jobs pending or running ({name}: "
                       f"{job.where(state=True)}{', ...' if len(active) > 1 else ''}); {doing} would race them: wait "
                       "for them (--status), or scancel them first")
