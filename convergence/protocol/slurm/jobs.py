"""A plan's runs as Slurm jobs, through submitit: submitted once each, their states read back from Slurm.

Public: ``SlurmRun``, ``submit(folder, runs, options) -> Submission``, ``job_states(folder)``,
``wait(folder, names)``, ``has_jobs(folder)``, ``check_submitter()``, ``JobState``, ``STATES``, ``ACTIVE``,
``check_shared_folder(folder, options)``, ``JOBS_FILE``; what a job runs on its node, and when its worker stops,
is ``convergence.protocol.slurm.node`` (``Piece``, ``worker_minutes``, ``torchrun_argv``); what each job asks
Slurm for, ``convergence.protocol.slurm.options.SlurmOptions``.

* What is submitted: each run is one job running its worker command (``SlurmRun.argv``) through ``Piece``; the runs
  of one ``submit`` share their options, so they go as one job array (``executor.batch()``; one run: one job).
  Logs: ``FOLDER/slurm/logs/<job>_0_log.out`` (submitit's, stdout and stderr together), beside submitit's pickles.
* State: ``FOLDER/slurm/jobs.jsonl``, append-only, one line per event, each one write: the intent (a token, the
  runs, the options) before ``sbatch``, the job ids after it. A submitter killed between the two leaves an intent
  whose job carries the token in its name (``mxval-<token>``): it is found again in Slurm, not submitted twice.
  A run whose latest job is pending or running is not submitted again, nor one whose ``SlurmRun.done`` file
  exists; any other is (a failed, cancelled, preempted or timed-out job's run continues from its checkpoint).
  One submitter at a time (a lock file beside the state).
* States: ``squeue`` first (a job just submitted is in it at once, while ``sacct`` lags by seconds), then
  ``sacct`` for jobs that ended. A job neither lists is ``unknown`` (purged from both): not running, so its run
  is submitted again.
* Time limits and preemption (the jobs carry ``--requeue``):
  - the worker is told to stop at a checkpoint ``STOP_MARGIN_S`` + its start-up before the time limit
    (``worker_minutes``); when it exits cleanly and its run is not finished (``SlurmRun.done`` does not exist),
    the job requeues itself (``scontrol requeue``) and continues from that checkpoint, up to ``MAX_REQUEUES``
    times; then it ends and the next ``submit`` continues it;
  - submitit's warning (SIGUSR2 ``SIGNAL_DELAY_S`` before the limit) and a preemption's SIGTERM reach every
    process of the job; a worker inside ``convergence.train.stopping.stop_on_signals`` then stops at the next
    step with its checkpoint. On the warning ``Piece.checkpoint`` (submitit's hook) waits for that before submitit
    requeues the job; a preempted job comes back by itself where the cluster requeues (PreemptMode=REQUEUE), or
    ends ``preempted`` for the next ``submit``; after a SIGTERM (a preemption or ``scancel``) ``Piece`` does not
    requeue it. A worker without the handler ignores the warning (``Piece``
    starts it so) and dies at SIGTERM or the kill, losing the steps since its last checkpoint (atomic, so the
    resumed run is still bit-identical).
* Multi-node runs: one ``Piece`` per node (``srun``, one task per node) starts ``torchrun`` with a c10d rendezvous
  on the job's first node (``torchrun_argv``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import io
import re
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from convergence.protocol.slurm.node import CHECKPOINT_WAIT_S, MAX_REQUEUES, Piece
from convergence.protocol.slurm.options import SlurmOptions
from numerics.errors import BadInput

STATE_DIR = "slurm"
JOBS_FILE = "jobs.jsonl"
LOGS_DIR = "logs"
STATES = ("pending", "running", "completed", "failed", "cancelled", "timeout", "preempted", "unknown")
ACTIVE = ("pending", "running")  # a run with such a job is not submitted again
_SLURM_STATES = {  # Slurm's job states (squeue, sacct) -> ours; the raw one is kept beside it
    "PENDING": "pending", "REQUEUED": "pending", "REQUEUE_HOLD": "pending", "REQUEUE_FED": "pending",
    "RESV_DEL_HOLD": "pending", "CONFIGURING": "running", "RUNNING": "running", "COMPLETING": "running",
    "SUSPENDED": "running", "STOPPED": "running", "SIGNALING": "running", "STAGE_OUT": "running",
    "RESIZING": "running", "COMPLETED": "completed", "FAILED": "failed", "NODE_FAIL": "failed",
    "OUT_OF_MEMORY": "failed", "BOOT_FAIL": "failed", "DEADLINE": "failed", "CANCELLED": "cancelled",
    "REVOKED": "cancelled", "TIMEOUT": "timeout", "PREEMPTED": "preempted",
}
@dataclass(frozen=True)
class SlurmRun:
    """One run to submit: its ``name`` in the plan, its worker command (absolute paths: the job starts in the
    submitter's folder, which need not be where it runs), and ``done``, a file that exists once the run is finished
    (a job then starts nothing, and a worker that stopped without it is continued)."""

    name: str
    argv: tuple[str, ...]
    done: Path | None = None


@dataclass(frozen=True)
class JobState:
    """The latest job of one run: ``state`` one of ``STATES``, ``slurm`` Slurm's own word for it."""

    name: str
    job_id: str
    state: str
    slurm: str = ""
    exit_code: str = ""
    node: str = ""
    log: Path | None = None
    reason: str = ""  # Slurm's reason: why a job waits (Priority, BeginTime, ...) or did not start

    def line(self) -> str:
        """One line for a status report: the state, Slurm's word and reason where they add to it, the exit code of
        a job that ended badly, the node, and the log (or that there is none)."""
        return self.where(state=True, log=True)

    def where(self, *, state: bool = False, log: bool = False) -> str:
        """``job ID`` (with ``state``: its state), Slurm's word and reason where they add to the state, the exit
        code of a job that ended badly, the node; with ``log`` its log, and always that there is none where a job
        that ended wrote none."""
        text = f"job {self.job_id}" + (f" {self.state}" if state else "")
        said = [w for w in (self.slurm if self.slurm.lower() != self.state else "", self.reason) if w]
        if self.exit_code not in ("", "0:0"):
            said.append(f"exit {self.exit_code}")
        text += f" ({', '.join(said)})" if said else ""
        if self.node and self.node != "None assigned":
            text += f" on {self.node}"
        if self.state == "unknown":
            return text + ": neither squeue nor sacct lists it (purged from both); its run is submitted again"
        if self.state != "pending" and self.log is not None:
            if self.log.exists():
                text += f"; log {self.log}" if log else ""
            elif self.state != "running":
                text += (f"; it wrote no log ({self.log}): it ended before starting, or its node does not see this "
                         "folder (not on a shared file system)")
        return text


@dataclass
class Submission:
    """What ``submit`` did: the runs it submitted (name -> job id, and their logs), those it left to their active
    job, and those already finished (their ``done`` file exists)."""

    submitted: dict[str, str] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)
    active: dict[str, JobState] = field(default_factory=dict)
    finished: list[str] = field(default_factory=list)


# ------------------------------------------------------------------ Slurm's commands


def _slurm(cmd: list[str], *, ok_errors: tuple[str, ...] = ()) -> str:
    """The stdout of a Slurm command, or BadInput with its own error line; '' when its error is one of
    ``ok_errors``."""
    if shutil.which(cmd[0]) is None:
        raise BadInput(f"{cmd[0]} is not on PATH: the Slurm executor runs where Slurm's commands do (a login node); "
                       "elsewhere use the local executor")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        err = " ".join(r.stderr.split()) or f"exit {r.returncode}"
        if any(e in err for e in ok_errors):
            return ""
        raise BadInput(f"{' '.join(cmd[:1])}: {err}")
    return r.stdout


def _expand(job_id: str) -> list[str]:
    """sacct's ``123_[1-3,5%2]`` (pending tasks of an array, collapsed) as ``123_1 123_2 123_3 123_5``."""
    m = re.fullmatch(r"(\d+)_\[([0-9,\-]+)(?:%\d+)?\]", job_id)
    if m is None:
        return [job_id]
    out = []
    for part in m.group(2).split(","):
        lo, _, hi = part.partition("-")
        out += [f"{m.group(1)}_{i}" for i in range(int(lo), int(hi or lo) + 1)]
    return out


def _query(job_ids: Sequence[str]) -> dict[str, dict[str, str]]:
    """job id -> {"State", "ExitCode", "NodeList", "Reason"} for the jobs (or array tasks) squeue or sacct lists:
    squeue's for a job it holds as pending or running, else sacct's (with the exit code), else squeue's (a job
    that just ended, before sacct has it)."""
    bases = ",".join(sorted({j.split("_")[0] for j in job_ids}, key=int))
    if not bases:
        return {}
    live: dict[str, dict[str, str]] = {}
    # squeue knows a job the moment it is submitted and for minutes after it ends; an id it no longer holds is
    # no error here
    for line in _slurm(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T|%N|%r", "-j", bases],
                       ok_errors=("Invalid job id",)).splitlines():
        jid, state, node, reason = (line.split("|") + ["", "", ""])[:4]
        live[jid.strip()] = {"State": state.strip(), "ExitCode": "", "NodeList": node.strip(), "Reason": reason}
    got = {j: v for j, v in live.items() if _SLURM_STATES.get(v["State"]) in ACTIVE}
    for line in _slurm(["sacct", "-n", "-P", "-X", "-o", "JobID,State,ExitCode,NodeList,Reason", "-j",
                        bases]).splitlines():
        jid, state, code, node, reason = (line.split("|") + ["", "", "", ""])[:5]
        for one in _expand(jid.strip()):
            got.setdefault(one, {"State": (state.split() or [""])[0], "ExitCode": code, "NodeList": node,
                                 "Reason": reason})
    return live | got


def _state(name: str, job_id: str, info: dict[str, str] | None, logs: Path) -> JobState:
    from submitit.core.utils import JobPaths

    log = JobPaths(logs, job_id=job_id, task_id=0).stdout
    if info is None:
        return JobState(name, job_id, "unknown", log=log)
    slurm = info["State"]
    reason = "" if info["Reason"] in ("None", "") else info["Reason"]
    return JobState(name, job_id, _SLURM_STATES.get(slurm, "unknown"), slurm, info["ExitCode"], info["NodeList"], log,
                    reason)


# ------------------------------------------------------------------ the state file


def _state_dir(folder: Path) -> Path:
    return Path(folder).resolve() / STATE_DIR


def _latest(folder: Path) -> tuple[dict[str, str], list[dict]]:
    """(run name -> its latest job id, the intents with no job id recorded) from ``jobs.jsonl``."""
    from convergence.train.checkpoint import JsonlLog

    latest: dict[str, str] = {}
    intents: dict[str, dict] = {}
    for rec in JsonlLog(_state_dir(folder) / JOBS_FILE).records():
        if "submit" in rec:
            intents[rec["submit"]] = rec
        elif "submitted" in rec and rec["submitted"] in intents:
            latest.update(zip(intents.pop(rec["submitted"])["runs"], rec["job_ids"]))
        elif "refused" in rec:
            intents.pop(rec["refused"], None)
    return latest, list(intents.values())


def _recover(intent: dict) -> list[str] | None:
    """The job ids of an intent whose submitter died after ``sbatch``: found by the job's name, or None when no
    job of that name exists (sbatch never ran). squeue holds every job that could run twice; sacct, asked by name,
    only today's: an older finished job is not found, and its run is submitted again, as it would be anyway."""
    name = f"mxval-{intent['submit']}"
    out = _slurm(["squeue", "-h", "-o", "%F", "--name", name]) or _slurm(  # %F: an array's own id
        ["sacct", "-n", "-P", "-X", "-o", "JobID", "--name", name])
    ids = sorted({int(line.split("_")[0]) for line in out.split() if line.strip()})
    if not ids:
        return None
    runs = intent["runs"]
    return [str(ids[0])] if len(runs) == 1 else [f"{ids[0]}_{i}" for i in range(len(runs))]


def job_states(folder: Path, names: Sequence[str] | None = None) -> dict[str, JobState]:
    """The latest job of each run of ``folder`` that has one (of ``names`` when given), as Slurm sees it now."""
    latest, intents = _latest(folder)
    for intent in intents:
        ids = _recover(intent)
        if ids is not None:
            latest.update(zip(intent["runs"], ids))
    if names is not None:
        latest = {n: j for n, j in latest.items() if n in names}
    info = _query(list(latest.values()))
    logs = _state_dir(folder) / LOGS_DIR
    return {n: _state(n, j, info.get(j), logs) for n, j in latest.items()}


def _close_intents(folder: Path) -> None:
    """Record what became of intents whose submitter died: the job ids found in Slurm, or that none exists."""
    for intent in _latest(folder)[1]:
        ids = _recover(intent)
        _append(folder, {"submitted": intent["submit"], "job_ids": ids, "recovered": True} if ids is not None else
                {"refused": intent["submit"], "error": "no job of its name: its submitter stopped before sbatch"})


def _append(folder: Path, record: dict) -> None:
    from convergence.train.checkpoint import JsonlLog

    JsonlLog(_state_dir(folder) / JOBS_FILE).append(record)


# ------------------------------------------------------------------ the folder's file system

# file systems of one machine's own disk or memory: a job on another node cannot see a folder on them
LOCAL_FILE_SYSTEMS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "tmpfs", "ramfs", "overlay", "vfat",
                      "exfat", "ntfs3", "squashfs"}


def file_system(path: Path) -> tuple[str, str]:
    """(type, mount point) of the file system holding ``path``, from /proc/self/mounts; ("", "") where unknown."""
    path = Path(path).resolve()
    best = ("", "")
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return best
    for line in mounts:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].encode().decode("unicode_escape")  # \040 for a space
        if (path == Path(point) or Path(point) in path.parents) and len(point) >= len(best[1]):
            best = (parts[2], point)
    return best


def cluster_nodes(partition: str | None) -> set[str]:
    """The node names of ``partition`` (the default partition's when None) as sinfo lists them."""
    cmd = ["sinfo", "-h", "-N", "-o", "%N"] + ([] if partition is None else ["-p", partition])
    return {n for n in _slurm(cmd).split()}


def check_shared_folder(folder: Path, options: SlurmOptions) -> None:
    """BadInput when ``folder`` is on a local file system (``LOCAL_FILE_SYSTEMS``) and the jobs may run on another
    node than this one. The check's limits: a cluster of this one node sees every folder; a network or parallel
    file system (nfs, lustre, gpfs, beegfs, ceph, ...) or one this list does not know is taken as shared, and a
    local one that a cluster does share (rare) is refused. A job whose node cannot see the folder writes no log:
    ``JobState.line`` says so."""
    nodes = cluster_nodes(options.partition)
    if not nodes or nodes <= {socket.gethostname().split(".")[0]}:  # none: an unknown partition, sbatch's to refuse
        return
    kind, point = file_system(folder)
    if kind in LOCAL_FILE_SYSTEMS:
        where = f"partition {options.partition}" if options.partition else "the default partition"
        raise BadInput(f"{folder} is on {kind} mounted at {point}, a local file system, and {where} has "
                       f"{len(nodes)} nodes: a job on another node would not see it; put the plan on the cluster's "
                       "shared file system")


# ------------------------------------------------------------------ submitting


def check_submitter() -> None:
    """BadInput unless this machine can submit: submitit installed, ``sbatch`` on PATH."""
    try:
        import submitit  # noqa: F401
    except ImportError:
        raise BadInput("the Slurm executor needs submitit: pip install 'mxval[slurm]'") from None
    if shutil.which("sbatch") is None:
        raise BadInput("sbatch is not on PATH: the Slurm executor runs where Slurm's commands do (a login node); "
                       "elsewhere use the local executor")


def _executor(folder: Path, options: SlurmOptions, name: str):
    check_submitter()
    import submitit

    ex = submitit.SlurmExecutor(folder=_state_dir(folder) / LOGS_DIR, max_num_timeout=MAX_REQUEUES)
    ex.update_parameters(**options.parameters(name))
    return ex


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """One submitter at a time on ``folder`` (flock; a file system without locks, e.g. Lustre mounted without
    ``flock``, goes on unlocked)."""
    d = _state_dir(folder)
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "submit.lock", "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX)
        except OSError:
            pass
        yield


def _sbatch_error(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    errors = re.findall(r"sbatch: error: (.*?)(?= sbatch: error:|$)", text)
    return errors[-1] if errors else text[-300:]


def submit(folder: Path, runs: Sequence[SlurmRun], options: SlurmOptions, *, nproc_per_node: int | None = None,
           shared: bool = False) -> Submission:
    """Submit each of ``runs`` that is not finished and whose latest job is not pending or running, as one job
    array (one job for one run), recording it in ``FOLDER/slurm/jobs.jsonl``. ``nproc_per_node``: processes of a
    run on each node (default: its GPUs there, at least 1); above 1, or on several nodes, a job starts torchrun.
    ``shared``: skip the shared-folder check (``check_shared_folder``). BadInput: bad options, no sbatch or
    submitit, sbatch's own refusal (an unknown partition, account or qos), a folder other nodes cannot see."""
    options = options.check()
    folder = Path(folder).resolve()
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise BadInput(f"runs submitted twice in one call: {sorted({n for n in names if names.count(n) > 1})}")
    nproc = nproc_per_node or max(1, options.per_node()[0])
    token = uuid.uuid4().hex[:12]
    ex = _executor(folder, options, f"mxval-{token}")
    if not shared:
        check_shared_folder(folder, options)
    done = Submission()
    with _locked(folder):
        _close_intents(folder)
        states = job_states(folder, names)
        done.active = {n: s for n, s in states.items() if s.state in ACTIVE}
        done.finished = [r.name for r in runs if r.name not in done.active and r.done is not None and r.done.exists()]
        todo = [r for r in runs if r.name not in done.active and r.name not in done.finished]
        if not todo:
            return done
        _append(folder, {"submit": token, "runs": [r.name for r in todo], "options": dataclasses.asdict(options),
                         "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": socket.gethostname()})
        try:  # sbatch's own output (submitit prints its errors) goes into the one line below, not to the terminal
            with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()), ex.batch():
                jobs = [ex.submit(Piece(r.argv, done=r.done, nodes=options.nodes, nproc_per_node=nproc,
                                        max_requeues=MAX_REQUEUES, checkpoint_wait_s=CHECKPOINT_WAIT_S))
                        for r in todo]
        except Exception as exc:  # submitit's FailedJobError carries sbatch's stderr
            _append(folder, {"refused": token, "error": _sbatch_error(exc)})
            raise BadInput(f"sbatch refused the jobs: {_sbatch_error(exc)}") from None
        _append(folder, {"submitted": token, "job_ids": [j.job_id for j in jobs]})
    done.submitted = {r.name: j.job_id for r, j in zip(todo, jobs)}
    done.logs = {r.name: j.paths.stdout for r, j in zip(todo, jobs)}
    return done


def has_jobs(folder: Path) -> bool:
    """Whether ``folder`` has had runs submitted to Slurm (its ``slurm/jobs.jsonl`` exists)."""
    return (_state_dir(folder) / JOBS_FILE).is_file()


def wait(folder: Path, names: Sequence[str], *, poll_s: float = 1.0, timeout_s: float | None = None
         ) -> dict[str, JobState]:
    """Poll until no job of ``names`` is pending or running (or ``timeout_s`` passed); their last states."""
    t0 = time.monotonic()
    while True:
        states = job_states(folder, names)
        if not any(s.state in ACTIVE for s in states.values()):
            return states
        if timeout_s is not None and time.monotonic() - t0 > timeout_s:
            return states
        time.sleep(poll_s)
