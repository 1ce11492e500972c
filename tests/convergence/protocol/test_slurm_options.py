"""The Slurm executor's parts that need no Slurm: options, the worker's deadline, the torchrun launch, the folder
check, state lines and the job's callable (with a stand-in ``scontrol``)."""

from __future__ import annotations

import math
import os
import pickle
import signal
import sys
import threading
from pathlib import Path

import pytest

from convergence.protocol.slurm import jobs as sl
from convergence.protocol.slurm.node import (
    SIGNAL_DELAY_S,
    Piece,
    PieceFailed,
    rendezvous_port,
    torchrun_argv,
    worker_minutes,
)
from convergence.protocol.slurm.options import SlurmOptions
from numerics.errors import BadInput


@pytest.mark.parametrize("bad", [
    {"partition": "a b"}, {"account": ""}, {"qos": "x'y"}, {"constraint": "a\nb"},
    {"time_minutes": 0}, {"time_minutes": 1.5}, {"time_minutes": True}, {"gpus": -1}, {"nodes": 0}, {"cpus": 0},
    {"mem_gb": 0}, {"mem_gb": math.nan}, {"mem_gb": math.inf}, {"gpus": 3, "nodes": 2}, {"cpus": 5, "nodes": 2},
    {"sbatch_flags": ("exclusive",)}, {"sbatch_flags": ("--time=5",)}, {"sbatch_flags": ("--array=0-3",)},
    {"sbatch_flags": ("--requeue",)}, {"sbatch_flags": ("--comment=a\nb",)}, {"sbatch_flags": ("--Mail=x",)},
])
def test_slurm_options_check_refuses_bad_values_in_one_line(bad):
    with pytest.raises(BadInput) as exc:
        SlurmOptions(**bad).check()
    assert "\n" not in str(exc.value)


def test_slurm_options_check_takes_good_values():  # the control: the same fields, values Slurm takes
    opts = SlurmOptions(partition="gpu", account="proj-1", qos="high", time_minutes=240, gpus=16, cpus=64,
                           mem_gb=512, nodes=2, constraint="h100&ib", sbatch_flags=("--exclusive", "--reservation=r1"))
    assert opts.check() is opts


def test_slurm_options_spread_a_run_over_its_nodes_in_submitits_sbatch_script(tmp_path):
    submitit_slurm = pytest.importorskip("submitit.slurm.slurm")
    opts = SlurmOptions(partition="gpu", account="proj", time_minutes=90, gpus=16, cpus=64, mem_gb=512, nodes=2,
                           sbatch_flags=("--exclusive", "--reservation=r1")).check()
    assert opts.per_node() == (8, 32, 256)
    script = submitit_slurm._make_sbatch_string(command="true", folder=tmp_path, **opts.parameters("mxval-t"))
    lines = set(script.splitlines())
    for flag in ("--gpus-per-node=8", "--cpus-per-task=32", "--mem=262144M", "--nodes=2", "--ntasks-per-node=1",
                 "--time=90", "--partition=gpu", "--account=proj", "--job-name=mxval-t", "--requeue", "--exclusive",
                 "--reservation=r1", f"--signal=USR2@{SIGNAL_DELAY_S}"):
        assert f"#SBATCH {flag}" in lines, flag


def test_worker_minutes_stop_the_worker_before_slurms_earliest_warning():
    startup = 60.0
    stop_at = startup + 60 * worker_minutes(60, startup)  # seconds into the job when training stops
    # the warning comes SIGNAL_DELAY_S before the limit, and up to 60 s earlier (Slurm's event resolution)
    assert stop_at < 60 * 60 - SIGNAL_DELAY_S - 60
    with pytest.raises(BadInput, match="ask 5 min or more"):
        worker_minutes(3, startup)


def test_torchrun_argv_meets_on_the_first_node():
    module = torchrun_argv(["/py", "-m", "convergence", "protocol", "--out", "/o"], nodes=2, nproc_per_node=8,
                           host="node-a", port=21234, run_id="77")
    assert module == ["/py", "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=8", "--rdzv-backend=c10d",
                      "--rdzv-endpoint=node-a:21234", "--rdzv-id=77", "-m", "convergence", "protocol", "--out", "/o"]
    script = torchrun_argv(["/py", "/x/train.py", "--a"], nodes=1, nproc_per_node=2, host="h", port=1, run_id="1")
    assert script[-2:] == ["/x/train.py", "--a"] and "-m" not in script[3:]


def test_rendezvous_port_differs_between_jobs_and_stays_below_the_ephemeral_range():
    ports = [rendezvous_port(j) for j in ("100", "101", "102", "9999999")]
    assert len(set(ports)) == 4 and all(20000 <= p < 32768 for p in ports)


def test_sacct_collapsed_array_tasks_expand():
    assert sl._expand("12_[1-3,5%2]") == ["12_1", "12_2", "12_3", "12_5"]
    assert sl._expand("12_4") == ["12_4"] and sl._expand("13") == ["13"]


def test_file_system_names_the_mount_holding_a_path():
    assert sl.file_system(Path("/proc/self")) == ("proc", "/proc")


def test_check_shared_folder_refuses_a_local_folder_only_where_jobs_may_run_elsewhere(tmp_path, monkeypatch):
    opts = SlurmOptions(partition="gpu")
    monkeypatch.setattr(sl, "file_system", lambda _p: ("ext4", "/"))
    monkeypatch.setattr(sl, "cluster_nodes", lambda _p: {"node-a", "node-b"})
    with pytest.raises(BadInput, match="local file system"):
        sl.check_shared_folder(tmp_path, opts)
    monkeypatch.setattr(sl, "file_system", lambda _p: ("nfs4", "/home"))  # controls: a network file system,
    sl.check_shared_folder(tmp_path, opts)
    monkeypatch.setattr(sl, "file_system", lambda _p: ("ext4", "/"))  # and a cluster of this one node
    monkeypatch.setattr(sl, "cluster_nodes", lambda _p: {sl.socket.gethostname().split(".")[0]})
    sl.check_shared_folder(tmp_path, opts)


def test_submit_without_sbatch_on_path_is_bad_input(tmp_path, monkeypatch):
    pytest.importorskip("submitit")
    monkeypatch.setenv("PATH", str(tmp_path))  # no Slurm command on it
    with pytest.raises(BadInput, match="sbatch is not on PATH"):
        sl.submit(tmp_path, [sl.SlurmRun("r", ("true",))], SlurmOptions())
    assert not (tmp_path / sl.STATE_DIR / sl.JOBS_FILE).exists()  # nothing recorded


def test_job_state_line_names_the_log_or_says_there_is_none(tmp_path):
    log = tmp_path / "1_0_log.out"
    failed = sl.JobState("r", "1", "failed", "FAILED", "1:0", "vm", log)
    assert "wrote no log" in failed.line() and str(log) in failed.line()
    log.write_text("Traceback ...")
    assert failed.line().endswith(f"; log {log}") and "exit 1:0" in failed.line()
    pending = sl.JobState("r", "2", "pending", "PENDING", "", "", tmp_path / "none", "Priority")
    assert pending.line() == "job 2 pending (Priority)"  # a pending job has no log yet: none is named


def _scontrol(tmp_path, monkeypatch) -> Path:
    """A stand-in ``scontrol`` first on PATH that records its arguments."""
    calls = tmp_path / "scontrol.calls"
    fake = tmp_path / "bin" / "scontrol"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    return calls


def _writer(marker: Path, done: Path | None = None) -> list[str]:
    code = f"open({str(marker)!r}, 'a').write('ran\\n')" + ("" if done is None else f"; open({str(done)!r}, 'w')")
    return [sys.executable, "-c", code]


def test_piece_requeues_its_job_when_the_worker_stopped_before_the_end(tmp_path, monkeypatch):
    calls = _scontrol(tmp_path, monkeypatch)
    done = tmp_path / "done"
    assert Piece(_writer(tmp_path / "ran"), done=done, max_requeues=3)() == "requeued"
    assert calls.read_text() == "requeue 41\n"
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")  # the cap: the job ends, the next submit continues the run
    assert Piece(_writer(tmp_path / "ran"), done=done, max_requeues=3)().startswith("stopped before its end")
    assert Piece(_writer(tmp_path / "ran", done), done=done, max_requeues=3)() == "finished"
    assert calls.read_text() == "requeue 41\n"  # neither the capped nor the finished piece requeued
    assert Piece(_writer(tmp_path / "ran"), done=done)() == "already done: " + str(done)  # a finished run: nothing
    assert (tmp_path / "ran").read_text().count("ran") == 3


def test_piece_does_not_requeue_a_job_that_got_sigterm(tmp_path, monkeypatch):
    """scancel and a preemption send SIGTERM to the job's processes: a worker that then stops cleanly is not
    requeued by its piece (the user stopped it; a preempted job is Slurm's to requeue). The control is the test
    above: the same worker without the signal is requeued."""
    calls, before = _scontrol(tmp_path, monkeypatch), signal.getsignal(signal.SIGTERM)
    term = "import os, signal; os.kill(os.getppid(), signal.SIGTERM)"  # the piece's process gets it, as in a job
    got = Piece([sys.executable, "-c", term], done=tmp_path / "done", max_requeues=3)()
    assert got.startswith("stopped by SIGTERM") and not calls.exists()
    assert signal.getsignal(signal.SIGTERM) == before  # the handler before it is restored


def test_piece_raises_when_its_worker_fails(tmp_path, monkeypatch):
    _scontrol(tmp_path, monkeypatch)
    with pytest.raises(PieceFailed, match="exited 3"):
        Piece([sys.executable, "-c", "raise SystemExit(3)"])()


def test_piece_pickles_without_its_process(tmp_path):
    piece = Piece(_writer(tmp_path / "ran"), done=tmp_path / "done", nodes=2, nproc_per_node=4)
    piece._proc = threading.Lock()  # as unpicklable as the worker's Popen
    again = pickle.loads(pickle.dumps(piece))  # what submitit's checkpoint hook hands back to be requeued
    assert again._proc is None and (again.argv, again.done, again.nodes, again.nproc_per_node) == (
        piece.argv, piece.done, 2, 4)
