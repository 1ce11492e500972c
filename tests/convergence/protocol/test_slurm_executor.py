"""``python -m convergence protocol --executor slurm``: a plan's runs as Slurm jobs, equal bit for bit to the local
executor's, resumed after a scancel, their states in --status, and the refusals. The tests marked ``slurm`` run
against a real Slurm (``.ci/slurm.sh start`` runs one on this machine)."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
import time

import pytest
import torch

from convergence.__main__ import main as convergence_main
from convergence.protocol.folder import CHECKPOINT_FILE, metrics_path, probes_path, run_dir
from convergence.protocol.schedule import RunState
from convergence.protocol.slurm import jobs as sl
from convergence.protocol.slurm.executor import run_states
from convergence.protocol.slurm.options import SlurmOptions
from convergence.train.loop import computed
from numerics.files import file_bytes

# each run a job of one CPU, training on one thread as the shared local folder did (finished_protocol)
SLURM = ["--executor", "slurm", "--slurm-time", "10", "--slurm-cpus", "1", "--threads", "1"]
WAIT_S = 300  # a tiny run's job takes ~20-30 s here; six share 2 cores with the other pytest worker. A hang fails


def _protocol(*argv) -> tuple[int, str, str]:
    """``python -m convergence protocol ARGV`` in this process: (exit code, stdout, stderr); torch's threads kept."""
    from numerics.cli import run_main

    threads, out, err = torch.get_num_threads(), io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = run_main(convergence_main, ["protocol", *argv])
    finally:
        torch.set_num_threads(threads)
    return rc, out.getvalue(), err.getvalue()


def _until(what: str, test, timeout_s: float = WAIT_S):
    t0 = time.monotonic()
    while not (got := test()):
        assert time.monotonic() - t0 < timeout_s, f"{what}: not within {timeout_s} s"
        time.sleep(0.1)
    return got


def _records(out) -> list[dict]:
    return [json.loads(line) for line in (out / sl.STATE_DIR / sl.JOBS_FILE).read_text().splitlines()]


def _curves(out, plan) -> dict[str, tuple[list[dict], bytes | None]]:
    """Each run's metrics less what the clock measures (``computed``), and its probes as written."""
    return {s.name: ([computed(json.loads(line)) for line in file_bytes(metrics_path(out, s)).splitlines()],
                     file_bytes(probes_path(out, s)) if probes_path(out, s).exists() else None)
            for s in plan.runs()}


def _verdicts(out) -> dict[str, dict]:
    """The verdict files, their folder's path replaced and the judging machine's environment left out."""
    def strip(v):
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if k != "environment"}
        return [strip(x) for x in v] if isinstance(v, list) else v

    return {p.name: strip(json.loads(p.read_text().replace(str(out), "OUT")))
            for p in sorted((out / "results").glob("*.json")) if not p.name.endswith(".meta.json")}


def _one_run_left(copy_finished, finished_protocol, name: str = "p"):
    """A copy of the finished folder without its candidate run: (folder, the plan's command for it, the run)."""
    out = copy_finished(name)
    spec = finished_protocol["plan"].run("candidate")
    shutil.rmtree(run_dir(out, spec).parent)
    return out, [*finished_protocol["argv"][:-1], str(out)], spec


# ------------------------------------------------------------------ without Slurm


def test_run_states_show_each_runs_job_beside_the_folders_state(tmp_path):
    log = tmp_path / "9_0_log.out"
    log.write_text("Traceback ...")
    folder = {"done": RunState("done", 6), "queued": RunState("pending", 0), "going": RunState("stopped", 2),
              "broke": RunState("stopped", 2), "cut": RunState("stopped", 3), "lost": RunState("restart", 3),
              "capped": RunState("stopped", 4), "never": RunState("pending", 0)}
    jobs = {name: sl.JobState(name, f"9_{i}", state, state.upper(), "", "vm", log if state == "failed" else None)
            for i, (name, state) in enumerate([("done", "running"), ("queued", "pending"), ("going", "running"),
                                               ("broke", "failed"), ("cut", "cancelled"), ("lost", "preempted"),
                                               ("capped", "completed")])}
    got = run_states(folder, jobs)
    assert {n: s.state for n, s in got.items()} == {
        "done": "done", "queued": "pending", "going": "running", "broke": "failed", "cut": "cancelled",
        "lost": "restart",  # no checkpoint to continue from: what the folder says matters more than how it ended
        "capped": "stopped", "never": "pending"}
    assert got["broke"].log == log and got["broke"].where == "job 9_3 on vm"
    assert got["lost"].where == "job 9_5 preempted on vm"  # the job's word, where the state is the folder's
    assert got["never"] is folder["never"] and got["done"] is folder["done"]  # no job, or finished: the folder's


def test_a_forks_continuations_are_submitted_only_once_their_trunks_checkpoint_is_there(tmp_path, monkeypatch):
    """Submitted with its trunk, a continuation's job would start from no checkpoint (or from step 0); it waits for
    a later call. Slurm's submission is stood in for: what is submitted is the property, not how."""
    from convergence.protocol.folder import open_protocol
    from convergence.protocol.plan import ProtocolPlan
    from convergence.protocol.slurm.executor import SlurmExecutor

    plan = ProtocolPlan(model="tiny", steps=20, design="fork", fork_step=10, replicates=2, trunks=2).check()
    out = tmp_path / "p"
    open_protocol(plan, out)
    calls = []
    monkeypatch.setattr(sl, "submit", lambda folder, runs, options, **kw: calls.append([r.name for r in runs])
                        or sl.Submission())
    ex = SlurmExecutor(SlurmOptions(time_minutes=10), progress=False)
    ex.run(plan, out, plan.runs(), stop_after_s=None, whole_runs=False)
    assert calls == [["trunk1", "trunk2"]]
    trunk1 = run_dir(out, next(r for r in plan.runs() if r.name == "trunk1"))
    trunk1.mkdir(parents=True, exist_ok=True)
    (trunk1 / CHECKPOINT_FILE).write_bytes(b"")  # trunk 1 reached its fork step: its continuations may go
    ex.run(plan, out, plan.runs(), stop_after_s=None, whole_runs=False)
    after1 = [r.name for r in plan.runs() if r.after == "trunk1"]
    assert len(after1) == 4 and sorted(calls[1]) == sorted(["trunk1", "trunk2", *after1])


@pytest.mark.parametrize("argv, says", [
    (["--slurm-time", "30"], "--slurm-time goes with --executor slurm"),
    (["--sbatch-flag=--exclusive"], "--sbatch-flag goes with --executor slurm"),
    ([*SLURM, "--stop-after-minutes", "5"], "--stop-after-minutes goes with the local executor"),
    ([*SLURM, "--parallel", "2"], "--parallel goes with the local executor"),
    ([*SLURM, "--slurm-gpus", "2"], "not supported yet"),
    ([*SLURM, "--slurm-nodes", "2"], "not supported yet"),
    ([*SLURM, "--slurm-time", "0"], "time_minutes 0"),
    ([*SLURM, "--slurm-time", "3"], "ask 5 min or more"),  # no training time left after start-up and margin
    ([*SLURM, "--sbatch-flag=--time=5"], "set by the executor"),
])
def test_slurm_executor_bad_flags_are_one_line_and_leave_no_folder(tmp_path, refused, argv, says):
    assert says in refused("--model", "tiny", "--steps", "20", "--out", str(tmp_path / "p"), *argv)
    assert not (tmp_path / "p").exists()


def test_slurm_executor_without_submitit_is_one_line_and_leaves_no_folder(tmp_path, refused, monkeypatch):
    monkeypatch.setitem(sys.modules, "submitit", None)  # its import fails, as where the slurm extra is not installed
    assert "pip install 'mxval[slurm]'" in refused("--model", "tiny", "--steps", "20", "--out", str(tmp_path / "p"),
                                                   *SLURM)
    assert not (tmp_path / "p").exists()


def test_slurm_executor_without_sbatch_on_path_is_one_line_and_leaves_no_folder(tmp_path, refused, monkeypatch):
    pytest.importorskip("submitit", reason="the slurm extra: pip install -e '.[slurm]'")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no Slurm command
    assert "sbatch is not on PATH" in refused("--model", "tiny", "--steps", "20", "--out", str(tmp_path / "p"), *SLURM)
    assert not (tmp_path / "p").exists()


def test_a_worker_on_a_finished_run_changes_nothing(finished_protocol, copy_finished):
    """A job requeued after its run finished starts its worker again: it must not train the run again from step
    0 (the control, a worker on an unfinished run training it, is the Slurm plan's own test below)."""
    out = copy_finished()
    spec = finished_protocol["plan"].run("candidate")
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    rc, _, err = _protocol("--out", str(out), "--piece", spec.name, "--batch-job")
    assert rc == 0 and "finished already" in err
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before


# ------------------------------------------------------------------ against a real Slurm


# the runs the Slurm plan makes as jobs; the shared folder's other four stay as the local executor made them. A
# BF16 replicate and the candidate: both recipes' arithmetic, a run that ends in its first job and one that is
# cancelled and resumed in a second, in one array (all six as jobs cost ~25 s more CPU and test nothing more)
MADE_BY_SLURM = ("bf16_seed1", "mxfp8")


@pytest.fixture(scope="module")
def slurm_plan(finished_protocol, tmp_path_factory) -> dict:
    """The shared local folder's plan with two of its runs made again through Slurm, the candidate's job cancelled
    mid-run: both runs submitted (one array), the candidate's job ``scancel``-ed once it has logged its first step
    (it stops at its next step, with its checkpoint), then the same command run again with --slurm-wait (it submits
    the candidate again, leaves the other to its job, waits and judges)."""
    out = tmp_path_factory.mktemp("slurm") / "p"
    shutil.copytree(finished_protocol["out"], out)
    for spec in finished_protocol["plan"].runs():
        if spec.name in MADE_BY_SLURM:
            shutil.rmtree(run_dir(out, spec).parent)
    argv = [*finished_protocol["argv"][:-1], str(out), *SLURM]
    first = _protocol(*argv)
    intent, ids = _records(out)[:2]
    task = ids["job_ids"][intent["runs"].index("mxfp8")]
    # once it trains: what is left before its checkpoint is then a step, well within Slurm's KillWait (30 s), and
    # it stops at step 2 or 3 of 6 here (the cancel takes ~0.3 s, a step of it ~0.3 s or more)
    metrics = run_dir(out, finished_protocol["plan"].run("candidate")) / "metrics.jsonl"
    _until("the candidate's first step", lambda: metrics.exists() and metrics.read_bytes().count(b"\n") >= 1)
    subprocess.run(["scancel", task], check=True)
    cancelled = sl.wait(out, ["mxfp8"], poll_s=0.5, timeout_s=WAIT_S)["mxfp8"]
    status = _protocol("--out", str(out), "--status")
    again = _protocol(*argv, "--slurm-wait")
    return {"out": out, "first": first, "cancelled": cancelled, "status": status, "again": again,
            "task": task, "records": _records(out)}


@pytest.mark.slurm
def test_a_plan_made_through_slurm_equals_the_local_one_bit_for_bit(slurm_plan, finished_protocol):
    """Curves, probes and verdicts of the plan made as Slurm jobs (one of them cancelled and resumed) are the
    local executor's, and its exit code is the candidate's verdict as theirs was."""
    out, plan = slurm_plan["out"], finished_protocol["plan"]
    assert slurm_plan["first"][0] == 4 and slurm_plan["again"][0] == finished_protocol["rc"], slurm_plan["again"]
    assert _curves(out, plan) == _curves(finished_protocol["out"], plan)
    assert _verdicts(out) == _verdicts(finished_protocol["out"])
    assert not list(out.rglob(CHECKPOINT_FILE))  # finished runs keep none


@pytest.mark.slurm
def test_a_scancelled_run_resumes_from_its_checkpoint_in_a_new_job(slurm_plan):
    """The cancelled job's worker stopped at a step with its checkpoint; --status said so; the command run again
    submitted that run alone, whose new job continued it from that step."""
    cancelled, (_, status, _) = slurm_plan["cancelled"], slurm_plan["status"]
    assert cancelled.state == "cancelled", cancelled.line()
    pieces = [json.loads(line) for line in (slurm_plan["out"] / "pace.jsonl").read_text().splitlines()]
    mine = [(p["from_step"], p["to_step"], p["slurm_job"]) for p in pieces if p["run"] == "mxfp8" and "slurm_job" in p]
    (start, stop, first), (resumed, end, second) = mine
    assert start == 0 and 0 < stop == resumed < end == 6 and first == slurm_plan["task"] != second
    assert f"mxfp8 {stop}/6 (cancelled) [job {first}" in status
    submitted = [r["runs"] for r in slurm_plan["records"] if "submit" in r]
    assert submitted[1:] == [["mxfp8"]] and sorted(submitted[0]) == sorted(MADE_BY_SLURM)  # the other left to its job
    assert f"mxfp8: its job {first} cancelled" in slurm_plan["again"][2]


@pytest.mark.slurm
@pytest.mark.parametrize("field", ["partition", "account"])
def test_an_unknown_partition_or_account_is_one_line_and_submits_nothing(tmp_path, field):
    out = tmp_path / "p"
    rc, _, err = _protocol("--model", "tiny", "--steps", "20", "--out", str(out), *SLURM, f"--slurm-{field}=nosuch")
    assert rc == 2 and err.count("\n") == 1 and "sbatch refused the jobs" in err
    assert sl.job_states(out) == {} and "refused" in _records(out)[-1]


@pytest.mark.slurm
def test_a_folder_other_nodes_cannot_see_is_one_line_unless_said_to_be_shared(copy_finished, finished_protocol,
                                                                             monkeypatch):
    out, argv, _ = _one_run_left(copy_finished, finished_protocol)
    monkeypatch.setattr(sl, "cluster_nodes", lambda partition: {"vm", "vm2"})  # a cluster of two nodes
    rc, _, err = _protocol(*argv, *SLURM)
    assert rc == 2 and err.count("\n") == 1 and "a local file system" in err and not sl.has_jobs(out)
    rc, _, _ = _protocol(*argv, *SLURM, "--slurm-shared-folder", "--sbatch-flag=--hold")  # the control
    job = sl.job_states(out)["mxfp8"]
    subprocess.run(["scancel", job.job_id], check=True)
    assert rc == 4 and job.state == "pending"


@pytest.mark.slurm
def test_a_run_with_a_job_is_not_submitted_twice_nor_forced_nor_made_here(copy_finished, finished_protocol):
    """While a run's job is pending (held), the command submits nothing more, --status names the job, and
    --force or the local executor, which would race it, are refused in one line, deleting nothing."""
    out, argv, spec = _one_run_left(copy_finished, finished_protocol)
    rc, _, _ = _protocol(*argv, *SLURM, "--sbatch-flag=--hold")
    job = sl.job_states(out)["mxfp8"]
    try:
        rc_again, _, err = _protocol(*argv, *SLURM)
        assert (rc, rc_again) == (4, 4) and f"left to their jobs: mxfp8 (job {job.job_id} pending" in err
        assert [r["runs"] for r in _records(out) if "submit" in r] == [["mxfp8"]]
        assert f"mxfp8 0/6 (pending) [job {job.job_id} (JobHeldUser)]" in _protocol("--out", str(out), "--status")[1]
        for extra in (["--force"], []):
            rc, _, err = _protocol(*argv, *extra)
            assert rc == 2 and err.count("\n") == 1 and "Slurm jobs pending or running" in err
        assert metrics_path(out, finished_protocol["plan"].run("baseline")).exists()
    finally:
        subprocess.run(["scancel", job.job_id], check=True)


@pytest.mark.slurm
def test_a_job_its_node_refuses_fails_the_command_with_its_log(copy_finished, finished_protocol):
    """The environment check runs on the job's node: a run made so far with another torch (planted) makes the
    candidate's job refuse to train; --slurm-wait then exits 1 naming the job's log, which holds the refusal,
    and --status shows the run failed with it."""
    out, argv, spec = _one_run_left(copy_finished, finished_protocol)
    config = run_dir(out, finished_protocol["plan"].run("baseline")) / "config.json"
    planted = json.loads(config.read_text())
    planted["environment"]["torch"] = "0.0-planted"
    config.write_text(json.dumps(planted))
    rc, _, err = _protocol(*argv, *SLURM, "--slurm-wait")
    log = sl.job_states(out)["mxfp8"].log
    assert rc == 1 and f"log {log}" in err and "computes runs differently" in log.read_text()
    assert f"(failed) [job {sl.job_states(out)['mxfp8'].job_id}" in _protocol("--out", str(out), "--status")[1]
    assert not run_dir(out, spec).exists()  # it trained nothing
