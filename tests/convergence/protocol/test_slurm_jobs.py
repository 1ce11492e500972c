"""The Slurm executor against a real Slurm (``.ci/slurm.sh start`` runs one on this machine): jobs and arrays,
their record, resubmission, cancellation, failures, sbatch's refusals, requeue, and torchrun under srun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from convergence.protocol.slurm import jobs as sl
from convergence.protocol.slurm.options import SlurmOptions
from numerics.errors import BadInput

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[3]
OPTS = SlurmOptions(time_minutes=10, cpus=1)
WAIT_S = 180  # a job here starts and ends in ~1-5 s; two xdist workers share the node's 2 cores. A hang must fail


def _run(name: str, code: str, done: Path | None = None) -> sl.SlurmRun:
    return sl.SlurmRun(name, (sys.executable, "-c", code), done)


def _blocked_until(flag: Path, started: Path | None = None) -> str:
    """A worker that says it started (when asked) and waits for ``flag``."""
    say = "" if started is None else f"open({str(started)!r}, 'w')\n"
    return f"import os, time\n{say}while not os.path.exists({str(flag)!r}):\n    time.sleep(0.1)\n"


def _wait(folder: Path, names) -> dict[str, sl.JobState]:
    states = sl.wait(folder, list(names), poll_s=0.2, timeout_s=WAIT_S)
    assert not any(s.state in sl.ACTIVE for s in states.values()), {n: s.line() for n, s in states.items()}
    return states


def _until(what, test, timeout_s: float = WAIT_S):
    t0 = time.monotonic()
    while not (got := test()):
        assert time.monotonic() - t0 < timeout_s, f"{what}: not within {timeout_s} s"
        time.sleep(0.2)
    return got


def _start_now(job: str) -> None:
    """Start a requeued job now, not after the ~2 minutes Slurm makes it wait (its credentials' lifetime), which
    is not what is under test. Not within the second of its requeue: slurmd refuses a credential issued in the
    second it revoked the job's last one ("Killing non-startable batch job: Job credential revoked", seen here
    under load), and the job then ends FAILED."""
    # the requeue (its BeginTime is seen after it) is then two seconds back: one for the second it fell in, one for
    # slurmd's revocation, which may trail the controller's requeue under load
    time.sleep(2.0)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True)


def _records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / sl.STATE_DIR / sl.JOBS_FILE).read_text().splitlines()]


def test_submit_sends_one_run_as_a_job_and_several_as_an_array_and_records_them(tmp_path):
    write = "import os\nopen({!r}, 'w').write(os.environ.get('SLURM_ARRAY_TASK_ID', 'none'))"
    solo = sl.submit(tmp_path, [_run("solo", write.format(str(tmp_path / "solo.out")))], OPTS)
    runs = [_run(f"a{i}", write.format(str(tmp_path / f"a{i}.out"))) for i in range(3)]
    array = sl.submit(tmp_path, runs, OPTS)
    (solo_id,) = solo.submitted.values()
    base = array.submitted["a0"].split("_")[0]
    assert "_" not in solo_id and array.submitted == {f"a{i}": f"{base}_{i}" for i in range(3)}
    states = _wait(tmp_path, ["solo", "a0", "a1", "a2"])
    assert {n: s.state for n, s in states.items()} == dict.fromkeys(states, "completed")
    assert [(tmp_path / f"{n}.out").read_text() for n in ("solo", "a0", "a1", "a2")] == ["none", "0", "1", "2"]
    recs = _records(tmp_path)  # each submission: its intent, then its job ids in the runs' order
    assert [r.get("runs") or r.get("job_ids") for r in recs] == [["solo"], [solo_id], ["a0", "a1", "a2"],
                                                                   list(array.submitted.values())]
    assert recs[0]["submit"] == recs[1]["submitted"] and recs[2]["submit"] == recs[3]["submitted"]
    assert all(s.log.is_file() for s in states.values())


def test_submit_leaves_active_and_finished_runs_and_submits_a_failed_one_again(tmp_path):
    flag = tmp_path / "flag"
    runs = [_run("slow", _blocked_until(flag)), _run("bad", "raise SystemExit(3)"),
            _run("good", f"open({str(tmp_path / 'good.done')!r}, 'w')", done=tmp_path / "good.done")]
    first = sl.submit(tmp_path, runs, OPTS)
    try:
        states = _wait(tmp_path, ["bad", "good"])
        assert (states["bad"].state, states["good"].state) == ("failed", "completed")
        again = sl.submit(tmp_path, runs, OPTS)
        assert list(again.active) == ["slow"] and again.active["slow"].job_id == first.submitted["slow"]
        assert again.finished == ["good"] and list(again.submitted) == ["bad"]
        assert again.submitted["bad"] != first.submitted["bad"]
        assert sl.job_states(tmp_path)["bad"].job_id == again.submitted["bad"]  # the latest job is the run's
    finally:
        flag.touch()
    assert _wait(tmp_path, ["slow", "bad"])["slow"].state == "completed"


def test_scancel_mid_run_reads_cancelled_and_the_run_is_submitted_again(tmp_path):
    flag, started = tmp_path / "flag", tmp_path / "started"
    run = _run("long", _blocked_until(flag, started))
    first = sl.submit(tmp_path, [run], OPTS).submitted["long"]
    _until("the worker starts", started.exists)
    subprocess.run(["scancel", first], check=True)
    state = _wait(tmp_path, ["long"])["long"]
    assert state.state == "cancelled", state.line()
    again = sl.submit(tmp_path, [run], OPTS).submitted["long"]
    assert again != first
    flag.touch()
    assert _wait(tmp_path, ["long"])["long"].state == "completed"


def test_a_failing_job_reports_its_log(tmp_path):
    sl.submit(tmp_path, [_run("bad", "import sys\nprint('boom-7f3', file=sys.stderr)\nraise SystemExit(3)")], OPTS)
    state = _wait(tmp_path, ["bad"])["bad"]
    assert state.state == "failed" and state.log.is_file()
    log = state.log.read_text()
    assert "boom-7f3" in log and "the worker exited 3" in log
    assert f"log {state.log}" in state.line()


def test_a_job_that_never_started_says_it_wrote_no_log(tmp_path):
    """As a node that cannot see the folder leaves it: the job's log folder is gone when it starts."""
    held = SlurmOptions(time_minutes=10, cpus=1, sbatch_flags=("--hold",))
    job = sl.submit(tmp_path, [_run("lost", "pass")], held).submitted["lost"]
    logs = tmp_path / sl.STATE_DIR / sl.LOGS_DIR
    for f in logs.iterdir():
        f.unlink()
    logs.rmdir()
    subprocess.run(["scontrol", "release", job], check=True)
    state = _wait(tmp_path, ["lost"])["lost"]
    assert state.state == "failed" and not state.log.exists()
    assert "it wrote no log" in state.line()


@pytest.mark.parametrize("field", ["partition", "account", "qos"])
def test_sbatch_refusing_an_unknown_name_is_bad_input_and_submits_nothing(tmp_path, field):
    opts = SlurmOptions(time_minutes=10, **{field: "no-such-" + field})
    with pytest.raises(BadInput, match="sbatch refused the jobs: .*[Ii]nvalid") as exc:
        sl.submit(tmp_path, [_run("r", "pass")], opts)
    assert "\n" not in str(exc.value)
    assert "refused" in _records(tmp_path)[-1] and sl.job_states(tmp_path) == {}  # the intent is closed, no job


def test_a_worker_stopped_before_its_end_is_requeued_and_continues(tmp_path):
    count, done = tmp_path / "pieces", tmp_path / "done"
    code = (f"from pathlib import Path\np = Path({str(count)!r})\nn = int(p.read_text()) + 1 if p.exists() else 1\n"
            f"p.write_text(str(n))\nif n == 2:\n    Path({str(done)!r}).touch()\n")
    job = sl.submit(tmp_path, [_run("r", code, done=done)], OPTS).submitted["r"]
    _until("the job is requeued", lambda: sl.job_states(tmp_path)["r"].reason == "BeginTime")
    _start_now(job)
    state = _wait(tmp_path, ["r"])["r"]
    assert state.state == "completed" and state.job_id == job  # the same job, come back
    assert count.read_text() == "2" and done.exists()


def test_a_two_process_run_under_srun_and_torchrun_equals_a_standalone_launch(tmp_path, stdlib_corpus):
    """torchrun started by the job (c10d rendezvous on the job's first node) trains what a torchrun --standalone
    of the same command trains, bit for bit (--deterministic): the multi-node launch, as far as one node runs it."""
    corpus = stdlib_corpus(tmp_path / "corpus.txt")
    args = ["--model", "tiny", "--steps", "4", "--val-every", "2", "--ckpt-every", "2", "--threads", "1",
            "--recipe", "bf16", "--data", str(corpus), "--ep", "2", "--deterministic"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    run = sl.SlurmRun("ep2", (sys.executable, "-m", "convergence", "train", *args, "--out", str(tmp_path / "job")))
    sl.submit(tmp_path, [run], SlurmOptions(time_minutes=10, cpus=2), nproc_per_node=2)  # runs meanwhile
    local = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                            "-m", "convergence", "train", *args, "--out", str(tmp_path / "local")],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=WAIT_S)
    assert local.returncode == 0, local.stderr[-2000:]
    state = _wait(tmp_path, ["ep2"])["ep2"]
    log = state.log.read_text()
    assert state.state == "completed", log[-3000:]
    assert "--rdzv-backend=c10d --rdzv-endpoint=" in log  # launched through the rendezvous, not --standalone

    def losses(out):
        return [(r["step"], r["loss"], r.get("val_loss")) for r in map(json.loads, (out / "bf16" / "metrics.jsonl")
                                                                      .read_text().splitlines())]
    assert losses(tmp_path / "job") == losses(tmp_path / "local")


def test_a_submitter_killed_after_sbatch_leaves_a_job_that_is_found_not_submitted_twice(tmp_path):
    """The intent is written before sbatch and the job ids after it; a submitter killed in between leaves an
    intent whose job carries its token in its name. The control: an intent with no such job (killed before sbatch)
    is closed and its run submitted."""
    (tmp_path / sl.STATE_DIR).mkdir()
    (tmp_path / sl.STATE_DIR / sl.JOBS_FILE).write_text(
        json.dumps({"submit": "0123456789ab", "runs": ["r"]}) + "\n" + json.dumps({"submit": "ba9876543210",
                                                                                  "runs": ["s"]}) + "\n")
    job = subprocess.run(["sbatch", "--parsable", "--hold", "--job-name=mxval-0123456789ab", "-o", "/dev/null",
                          "--wrap", "true"], capture_output=True, text=True, check=True).stdout.strip()
    try:
        assert {n: (s.job_id, s.state) for n, s in sl.job_states(tmp_path).items()} == {"r": (job, "pending")}
        again = sl.submit(tmp_path, [_run("r", "pass"), _run("s", "pass")], OPTS)
        assert list(again.active) == ["r"] and list(again.submitted) == ["s"]
        recs = _records(tmp_path)
        assert {"submitted": "0123456789ab", "job_ids": [job], "recovered": True} in recs
        assert any(r.get("refused") == "ba9876543210" for r in recs)
    finally:
        subprocess.run(["scancel", job], check=True)
    assert _wait(tmp_path, ["r", "s"])["s"].state == "completed"


def test_slurms_warning_signal_stops_the_worker_and_the_job_comes_back_to_finish(tmp_path):
    """The time-limit warning (SIGUSR2, as submitit asks Slurm for it; sent here with scancel --signal): the worker,
    inside stop_on_signals, stops; Piece.checkpoint waits for it and submitit requeues the job, which finishes the
    run when it comes back (the same job id)."""
    starts, armed, stopped, done = (tmp_path / n for n in ("starts", "armed", "stopped", "done"))
    code = (f"import signal, time\nfrom pathlib import Path\nfrom convergence.train.stopping import stop_on_signals, "
            f"stop_requested\np = Path({str(starts)!r})\nn = int(p.read_text()) + 1 if p.exists() else 1\n"
            f"p.write_text(str(n))\nif n == 2:\n    Path({str(done)!r}).touch()\n    raise SystemExit(0)\n"
            "with stop_on_signals(signal.SIGUSR2, signal.SIGTERM):\n"
            f"    Path({str(armed)!r}).touch()\n    while not stop_requested():\n"
            f"        time.sleep(0.05)\n    Path({str(stopped)!r}).write_text(stop_requested())\n")
    job = sl.submit(tmp_path, [_run("r", code, done=done)], OPTS).submitted["r"]
    # the signal is sent once the worker's own handler is in place (submitit's is installed before the worker
    # starts): a fixed pause raced a loaded machine, where the signal came before the handler and the job failed
    _until("the worker's handler is installed", armed.exists)
    subprocess.run(["scancel", "--signal=USR2", job], check=True)
    _until("the job is requeued", lambda: sl.job_states(tmp_path)["r"].reason == "BeginTime")
    _start_now(job)
    state = _wait(tmp_path, ["r"])["r"]
    assert state.state == "completed" and state.job_id == job and done.exists()
    log = state.log.read_text()
    assert "this job is timed-out" in log or "this job is preempted" in log  # submitit's handler took the signal
    assert starts.read_text() == "2" and stopped.read_text() == "SIGUSR2"  # the worker stopped, not killed
