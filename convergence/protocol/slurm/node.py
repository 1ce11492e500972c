"""What a Slurm job of the protocol runs on its node (``convergence.protocol.slurm.jobs`` submits it).

Public: ``Piece`` (the job's callable, pickled by submitit), ``worker_minutes(time_minutes, startup_s)``,
``torchrun_argv(argv, ...)``, ``rendezvous_port(job_id)``, ``first_host()``, ``PieceFailed``, and the timing
constants ``SIGNAL_DELAY_S``, ``STOP_MARGIN_S``, ``MAX_REQUEUES``, ``CHECKPOINT_WAIT_S``.

Imports nothing heavy: the job unpickles ``Piece`` before its worker starts.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from numerics.errors import BadInput

# submitit's default: SIGUSR2 this many seconds before the time limit (Slurm may send it up to 60 s earlier still)
SIGNAL_DELAY_S = 90
# a worker stops this long (plus its start-up) before the time limit: before the earliest warning (90 + 60 s) and
# with 30 s for its last step, its checkpoint and its exit
STOP_MARGIN_S = SIGNAL_DELAY_S + 60 + 30
# a run its time limit cuts into more pieces than this asks for a longer --time; the cap ends the cycle of a worker
# that never gets past its start-up within the limit (the next submit continues it)
MAX_REQUEUES = 20
# seconds Piece.checkpoint waits for its worker to write its checkpoint after the warning: less than the 90 s the
# warning leaves, so submitit's requeue comes before the kill
CHECKPOINT_WAIT_S = 60

# the c10d rendezvous port of a multi-process run: from the job id, so that two jobs sharing their first node take
# different ports; below Linux's ephemeral range (32768-60999), where outgoing connections take theirs
PORT_BASE, PORT_SPAN = 20000, 10000


def worker_minutes(time_minutes: int, startup_s: float) -> float:
    """The ``--stop-after-minutes`` of a worker in a job of this time limit: its training stops, with a checkpoint,
    ``startup_s`` (what it spends before training) + ``STOP_MARGIN_S`` before the limit."""
    left = time_minutes * 60 - startup_s - STOP_MARGIN_S
    if left <= 0:
        need = math.ceil((startup_s + STOP_MARGIN_S) / 60) + 1
        raise BadInput(f"Slurm time limit {time_minutes} min leaves a worker no training time (its start-up "
                       f"{startup_s:.0f} s and a {STOP_MARGIN_S} s margin before the limit): ask {need} min or more")
    return left / 60


class PieceFailed(RuntimeError):
    """The worker exited with an error: the job ends FAILED, its log holds the worker's output."""


def rendezvous_port(job_id: str) -> int:
    """The port of job ``job_id`` (``SLURM_JOB_ID``: each task of an array has its own)."""
    return PORT_BASE + int(job_id) % PORT_SPAN


def first_host() -> str:
    """The first node of this job (``scontrol show hostnames $SLURM_JOB_NODELIST``), this host outside a job."""
    nodes = os.environ.get("SLURM_JOB_NODELIST")
    if not nodes:
        return socket.gethostname()
    out = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True, text=True, check=True)
    return out.stdout.split()[0]


def torchrun_argv(argv: Sequence[str], *, nodes: int, nproc_per_node: int, host: str, port: int,
                  run_id: str) -> list[str]:
    """``argv`` (``python -m module ...`` or ``python script ...``) under torchrun: ``nproc_per_node`` processes on
    each of ``nodes`` nodes, meeting through a c10d rendezvous at ``host:port`` (the job's first node), ``run_id``
    naming the rendezvous (the job id: a requeued job meets afresh)."""
    python, *rest = argv
    launch = [python, "-m", "torch.distributed.run", f"--nnodes={nodes}", f"--nproc-per-node={nproc_per_node}",
              "--rdzv-backend=c10d", f"--rdzv-endpoint={host}:{port}", f"--rdzv-id={run_id}"]
    return launch + rest  # "-m module args" is torchrun's own spelling for a module, a script path its default


def _ignore_usr2() -> None:
    # submitit's warning (SIGUSR2) reaches every process of the job; its default action would kill a worker that
    # does not handle it before submitit's own handler could requeue the job. A worker that handles it
    # (convergence.train.stopping) installs its handler over this.
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


class Piece:
    """A job's callable: run ``argv`` (under torchrun when ``nodes`` x ``nproc_per_node`` > 1) unless ``done``
    exists; when the worker exits cleanly and ``done`` does not exist, requeue the job (at most ``max_requeues``
    times) so that it continues from the worker's checkpoint, unless the job got SIGTERM (a ``scancel`` is the
    user's stop; a preempted job is Slurm's to requeue). ``checkpoint`` is submitit's hook for its warning
    signal: it waits for the worker to stop and hands submitit this piece again to requeue."""

    def __init__(self, argv: Sequence[str], *, done: Path | None = None, nodes: int = 1, nproc_per_node: int = 1,
                 max_requeues: int = 0, checkpoint_wait_s: float = 60.0):
        self.argv = list(argv)
        self.done = None if done is None else Path(done)
        self.nodes, self.nproc_per_node = nodes, nproc_per_node
        self.max_requeues, self.checkpoint_wait_s = max_requeues, checkpoint_wait_s
        self._proc: subprocess.Popen | None = None

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_proc"}

    def __setstate__(self, state):
        self.__dict__.update(state, _proc=None)

    def command(self) -> list[str]:
        if self.nodes * self.nproc_per_node == 1:
            return self.argv
        job = os.environ.get("SLURM_JOB_ID", "0")
        return torchrun_argv(self.argv, nodes=self.nodes, nproc_per_node=self.nproc_per_node, host=first_host(),
                             port=rendezvous_port(job), run_id=job)

    def __call__(self) -> str:
        if self.done is not None and self.done.exists():
            return f"already done: {self.done}"
        cmd = self.command()
        print(f"piece: {' '.join(cmd)}", flush=True)
        terminated = []
        before = signal.getsignal(signal.SIGTERM)

        def on_term(signum, frame):  # note it, and leave it to submitit's handler as before
            terminated.append(signum)
            if callable(before):
                before(signum, frame)

        signal.signal(signal.SIGTERM, on_term)
        try:
            self._proc = subprocess.Popen(cmd, preexec_fn=_ignore_usr2)  # its output goes to the job's log
            while self._proc.poll() is None:  # poll, not wait(): checkpoint() polls it too, from a signal handler
                time.sleep(0.5)
        finally:
            signal.signal(signal.SIGTERM, before)
        code = self._proc.returncode
        if code != 0:
            raise PieceFailed(f"the worker exited {code}: {' '.join(cmd)}")
        if self.done is None or self.done.exists() or int(os.environ.get("SLURM_PROCID", "0")) != 0:
            return "finished"
        if terminated:  # scancel (the user's stop) or a preemption (Slurm requeues it where the cluster does)
            return "stopped by SIGTERM before its end: not requeued here; submit it again to continue"
        restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
        if restarts >= self.max_requeues:
            return f"stopped before its end; not requeued after {restarts} requeues: submit it again"
        job = os.environ["SLURM_JOB_ID"]
        print(f"piece: stopped before its end ({self.done} not written): requeueing job {job}", flush=True)
        # refused where Slurm is requeueing the job already (a preemption's SIGTERM stopped the worker): either way
        # the run continues, and otherwise the next submit continues it
        r = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
        return "requeued" if r.returncode == 0 else f"not requeued: {' '.join(r.stderr.split())}"

    def checkpoint(self):
        """submitit's hook when its warning signal arrives (time limit near, or a preemption that signals first):
        give the worker up to ``checkpoint_wait_s`` to stop at its checkpoint, then this piece again to requeue."""
        from submitit.core.utils import DelayedSubmission

        t0 = time.monotonic()
        while self._proc is not None and self._proc.poll() is None and time.monotonic() - t0 < self.checkpoint_wait_s:
            time.sleep(0.5)
        return DelayedSubmission(self)
