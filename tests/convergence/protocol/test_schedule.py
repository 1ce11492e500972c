"""Making a protocol's runs (convergence.protocol.schedule): the executor seam, pieces that resume bit for bit,
worker processes, failures."""

from __future__ import annotations

import gzip
import json
import shutil
import sys

import pytest
import torch

from convergence.__main__ import main as convergence_main
from convergence.protocol import schedule
from convergence.protocol.folder import CHECKPOINT_FILE, metrics_path, open_protocol, run_dir, run_state, run_status
from convergence.protocol.render import status_lines
from convergence.protocol.schedule import LocalExecutor, RunFailed, RunState, execute, run_piece
from convergence.protocol.status import progress
from convergence.train import data as data_mod
from convergence.train.loop import computed
from numerics.errors import BadInput
from numerics.files import file_bytes


@pytest.fixture
def one_thread():
    """Training on one CPU thread, as the shared finished folder was made: runs compared bit for bit with it are
    computed the same way."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _curves(root, plan) -> dict[str, list[dict]]:
    """Each run's logged records less what depends on the clock (``computed``)."""
    return {s.name: [computed(json.loads(line)) for line in file_bytes(metrics_path(root, s)).splitlines()]
            for s in plan.runs()}


class Recording:
    """An executor that makes nothing and records what it was handed."""

    def __init__(self):
        self.handed = None

    def run(self, plan, out, runs, *, stop_after_s, whole_runs):
        self.handed = ([s.name for s in runs], stop_after_s, whole_runs)

    def states(self, plan, out):
        return {}


def test_execute_hands_the_executor_the_runs_still_to_make_started_ones_first(tmp_path, small_plan):
    """The seam: an executor gets the runs not done, those that continue from a checkpoint first, then the
    plan's order; a finished run is tidied first (its checkpoint and plain log gone) and not handed on."""
    plan = small_plan()
    open_protocol(plan, tmp_path)
    runs = plan.runs()
    done, stopped, lost = runs[1], runs[4], runs[2]
    for spec, steps in ((done, plan.steps), (stopped, 2), (lost, 1)):
        log = run_dir(tmp_path, spec) / "metrics.jsonl"
        log.parent.mkdir(parents=True)
        log.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, steps + 1)))
    (run_dir(tmp_path, stopped) / CHECKPOINT_FILE).write_bytes(b"a checkpoint")
    (run_dir(tmp_path, done) / CHECKPOINT_FILE).write_bytes(b"left by a kill after its last step")
    executor = Recording()
    status = execute(plan, tmp_path, executor, stop_after_s=60.0, whole_runs=True)
    assert executor.handed == ([stopped.name] + [s.name for s in runs if s not in (done, stopped)], 60.0, True)
    assert status == {s.name: "done" if s == done else 2 if s == stopped else 0 for s in runs}  # lost: from 0
    assert sorted(p.name for p in run_dir(tmp_path, done).iterdir()) == ["metrics.jsonl.gz"]


def test_local_executor_states_say_where_each_run_stands(tmp_path, small_plan):
    plan = small_plan()
    runs = plan.runs()
    for spec, steps in ((runs[0], plan.steps), (runs[1], 2), (runs[2], 3)):
        log = run_dir(tmp_path, spec) / "metrics.jsonl"
        log.parent.mkdir(parents=True)
        log.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, steps + 1)))
    (run_dir(tmp_path, runs[1]) / CHECKPOINT_FILE).write_bytes(b"a checkpoint")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / f"{runs[2].name}.log").write_text("its output")
    states = LocalExecutor().states(plan, tmp_path)
    assert states[runs[0].name] == RunState("done", plan.steps)
    assert states[runs[1].name] == RunState("stopped", 2)
    assert states[runs[2].name] == RunState("restart", 3, tmp_path / "logs" / f"{runs[2].name}.log")
    assert {states[s.name] for s in runs[3:]} == {RunState("pending", 0)}
    shown = "\n".join(status_lines(progress(plan, tmp_path, states=states)))
    assert f"{runs[1].name} 2/{plan.steps}, {runs[2].name} 3/{plan.steps} (no checkpoint here: starts again" in shown


@pytest.mark.timeout(120)
def test_schedule_stops_starting_runs_after_a_worker_fails_and_never_hangs(tmp_path, small_plan):
    """A failed worker (here: every worker exits 3) ends the schedule with RunFailed once the running pieces end,
    naming the log; no run starts after the failure."""
    plan = small_plan()
    open_protocol(plan, tmp_path)
    started = []

    def worker(name: str, minutes: float) -> list[str]:
        started.append(name)
        return [sys.executable, "-c", "import sys; sys.exit(3)"]

    with pytest.raises(RunFailed, match="exited 3"):
        execute(plan, tmp_path, LocalExecutor(slots=2, worker_argv=worker, progress=False))
    assert 1 <= len(started) <= 2  # the two first slots at most
    assert (tmp_path / "logs" / f"{started[0]}.log").exists()


def test_a_run_that_raises_in_process_is_exit_1_with_its_traceback_logged(tmp_path, monkeypatch, capsys):
    """A run in the protocol's own process that raises fails as a worker does: one line, exit 1, the traceback
    in OUT/logs/. Bad input raised there stays one line and exit 2 (the control)."""
    def boom(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access\nmore lines of the error")

    monkeypatch.setattr(schedule, "run_piece", boom)
    argv = ["protocol", "--model", "tiny", "--steps", "20", "--replicates", "2", "--out", str(tmp_path / "p")]
    assert convergence_main(argv) == 1
    err = capsys.readouterr().err
    log = tmp_path / "p" / "logs" / "bf16.log"
    assert err.count("\n") == 1 and "bf16 raised RuntimeError" in err and str(log) in err, err
    assert "Traceback" in log.read_text() and "more lines of the error" in log.read_text()

    def bad(*args, **kwargs):
        raise BadInput("a damaged checkpoint")

    monkeypatch.setattr(schedule, "run_piece", bad)
    assert convergence_main(argv) == 2


def test_schedule_resumes_a_stopped_run_bit_identically(copy_finished, finished_protocol, one_thread):
    """A run stopped by its deadline and continued ends with the curve of one that ran through: pieces are
    checkpoints, not restarts. The candidate (it writes probes too) is made again in two pieces beside the
    finished folder's other runs."""
    plan, out = finished_protocol["plan"], copy_finished()
    spec = plan.run("candidate")
    shutil.rmtree(run_dir(out, spec))
    assert run_piece(plan, spec, out, stop_after_s=0.0, progress=False) is False  # stops after its first step
    assert 0 < run_status(plan, out)[spec.name] < plan.steps
    assert set(execute(plan, out, LocalExecutor(progress=False)).values()) == {"done"}
    assert _curves(out, plan) == _curves(finished_protocol["out"], plan)
    assert not list(out.rglob("checkpoint.pt"))  # a finished run's checkpoint is deleted


def test_a_finished_piece_writes_no_checkpoint_a_stopped_one_does(tmp_path, monkeypatch, small_plan):
    """The protocol deletes a finished run's checkpoint, so its last step writes none (the proxy's is 11 GB of
    weights and moments); a piece stopped by its deadline still writes one. The control: training called as the
    train command calls it checkpoints its last step."""
    from convergence.train import placement
    from convergence.train.loop import train_recipe

    saved = []
    real_save = placement.Single.save

    def counting_save(self, run_dir, model, opt, sched, meta):
        saved.append((run_dir.parent.name, meta["step"]))
        real_save(self, run_dir, model, opt, sched, meta)

    monkeypatch.setattr(placement.Single, "save", counting_save)
    plan = small_plan()
    open_protocol(plan, tmp_path)
    spec = plan.runs()[0]
    tokens = data_mod.load_tokens(plan.train_config(spec).data)
    assert run_piece(plan, spec, tmp_path, stop_after_s=0.0, tokens=tokens, progress=False) is False
    assert saved == [(spec.name, 1)] and (run_dir(tmp_path, spec) / CHECKPOINT_FILE).exists()
    assert run_piece(plan, spec, tmp_path, stop_after_s=None, tokens=tokens, progress=False)
    assert saved == [(spec.name, 1)] and not list(tmp_path.rglob("checkpoint.pt"))
    cfg = plan.train_config(spec)
    train_recipe(cfg, spec.recipe, tmp_path / "train" / spec.recipe, tokens, resume=False, progress=False)
    assert saved[-1] == ("train", plan.steps)


def test_a_folder_is_continued_only_on_the_tokens_its_runs_trained_on(tmp_path, small_plan):
    """Its runs are compared with each other: a run made on another Python's standard library (another corpus
    under the same command) must not be joined; on the same tokens the next run starts (the control)."""
    plan = small_plan()
    open_protocol(plan, tmp_path)
    first, second = plan.runs()[:2]
    tokens = data_mod.load_tokens(plan.train_config(first).data)
    assert run_piece(plan, first, tmp_path, stop_after_s=0.0, tokens=tokens, progress=False) is False
    path = run_dir(tmp_path, first) / "config.json"
    config = json.loads(path.read_text())
    real = dict(config["data"])
    config["data"].update(python="3.99.0", digest={"train": "0" * 16, "val": "1" * 16})
    path.write_text(json.dumps(config))
    with pytest.raises(BadInput, match="Python 3.99.0"):
        run_piece(plan, second, tmp_path, stop_after_s=0.0, tokens=tokens, progress=False)
    assert run_status(plan, tmp_path)[second.name] == 0
    config["data"] = real
    path.write_text(json.dumps(config))
    run_piece(plan, second, tmp_path, stop_after_s=0.0, tokens=tokens, progress=False)
    assert run_status(plan, tmp_path)[second.name] > 0


def test_a_kill_after_a_runs_last_step_leaves_nothing_behind_once_the_protocol_goes_on(copy_finished,
                                                                                      finished_protocol):
    """A kill between a run's last step and its tidying leaves an earlier checkpoint, a half-written
    checkpoint.pt.tmp and plain logs; the run counts as done, so the protocol tidies every finished run before it
    goes on. What the runs logged is unchanged and nothing is trained again."""
    plan, out = finished_protocol["plan"], copy_finished()
    spec = plan.run("candidate")
    run = run_dir(out, spec)
    packed = (run / "metrics.jsonl.gz").read_bytes()
    (run / "metrics.jsonl").write_bytes(gzip.decompress(packed))  # as before compaction
    (run / "metrics.jsonl.gz").unlink()
    (run / "checkpoint.pt").write_bytes(b"an earlier checkpoint")
    (run / "checkpoint.pt.tmp").write_bytes(b"half of one")
    pace = (out / "pace.jsonl").read_bytes()
    assert set(execute(plan, out, LocalExecutor(progress=False)).values()) == {"done"}
    assert sorted(p.name for p in run.iterdir() if "checkpoint" in p.name or p.name.startswith("metrics")) == [
        "metrics.jsonl.gz"]
    assert gzip.decompress((run / "metrics.jsonl.gz").read_bytes()) == gzip.decompress(packed)
    assert (out / "pace.jsonl").read_bytes() == pace  # nothing trained again


@pytest.mark.timeout(300)
def test_schedule_in_worker_processes_matches_one_process(copy_finished, finished_protocol):
    """Two slots run the pieces as ``convergence protocol --piece`` workers (the path of one run per GPU): the
    same curves as the finished folder's, made in one process. The workers make one BF16 and one MXFP8 run side
    by side, on one thread each as the folder's were; the other runs are the folder's."""
    plan, out = finished_protocol["plan"], copy_finished()
    for name in ("bf16", "mxfp8"):
        shutil.rmtree(out / "runs" / name)
    assert {n for n, state in run_status(plan, out).items() if state != "done"} == {"bf16", "mxfp8"}
    executor = LocalExecutor(slots=2, worker_argv=schedule.protocol_worker(out, threads=1), progress=False)
    assert set(execute(plan, out, executor).values()) == {"done"}
    assert not list(out.rglob("metrics.jsonl")) and len(list(out.rglob("metrics.jsonl.gz"))) == len(plan.runs())
    assert _curves(out, plan) == _curves(finished_protocol["out"], plan)
    assert run_state(plan, out, plan.run("candidate")) == "done"


def test_protocol_worker_command_is_the_piece_entry_point(tmp_path):
    argv = schedule.protocol_worker(tmp_path, threads=3)
    assert argv("bf16", None) == [sys.executable, "-m", "convergence", "protocol", "--out", str(tmp_path),
                                  "--piece", "bf16", "--threads", "3"]
    assert argv("mxfp8", 1.5)[-4:] == ["--stop-after-minutes", "1.5000", "--threads", "3"]
    assert "--threads" not in schedule.protocol_worker(tmp_path)("bf16", None)
    assert "--gpu-share" not in argv("bf16", None)
    assert schedule.protocol_worker(tmp_path, gpu_share=3)("bf16", None)[-2:] == ["--gpu-share", "3"]


def test_runs_per_gpu_spread_over_the_visible_gpus_first(monkeypatch):
    """N runs per GPU: the first pieces on different GPUs, only visible GPUs used."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert schedule.gpus_of_slots(2) == ["0", "1"]
    assert schedule.gpus_of_slots(6, per_gpu=3) == ["0", "1", "0", "1", "0", "1"]
    assert schedule.gpus_of_slots(3, per_gpu=3) == ["0", "0", "0"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    assert schedule.gpus_of_slots(4, per_gpu=2) == ["5", "7", "5", "7"]
