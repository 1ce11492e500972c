"""The fork design in the protocol: its runs and their dependencies (``RunSpec.after``), the trunk's checkpoint
kept while a continuation needs it and released after, a lost trunk made again bit-identically, the executor's
workers waiting for a trunk, and the pilot (a trunk and its BF16 continuations, their spread) end to end on the
tiny model."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import shutil
import sys
from collections.abc import Callable

import numpy as np
import pytest
import torch
from filelock import FileLock

from convergence.__main__ import main as convergence_main
from convergence.protocol import forks
from convergence.protocol.folder import can_continue, gzipped, metrics_path, open_protocol, run_dir, run_status
from convergence.protocol.plan import ProtocolPlan
from convergence.protocol.schedule import LocalExecutor, execute, run_piece
from convergence.train.checkpoint import JsonlLog
from convergence.train.cli import config_from_args, train_parser
from convergence.train.loop import computed
from convergence.train.placement import CHECKPOINT_FILE

# The pilot's plan: one trunk to step 4 and three BF16 continuations to step 8 (batch 4 x seq 32, an evaluation
# every 2 steps): seconds each on 2 CPU cores. The continuations differ by their data order (--fork-change data):
# on a CPU whose sums of four rows round alike, rows permuted leave a run this small unchanged (judging refuses
# continuations that end as copies).
PILOT = ["--model", "tiny", "--steps", "8", "--design", "fork", "--pilot", "3", "--fork-step", "4", "--fork-change",
         "data", "--batch", "4", "--seq", "32", "--val-every", "2", "--val-batches", "3"]


def fork_plan(**kw) -> ProtocolPlan:
    return ProtocolPlan(model="tiny", steps=8, design="fork", fork_step=4, replicates=2, candidate_replicates=2,
                        overrides=(("batch", 4.0), ("seq", 32.0), ("val_every", 2.0), ("val_batches", 3.0)),
                        **({"trunks": 2} | kw)).check()


def test_fork_plan_continues_each_trunk_with_paired_runs_after_it():
    plan = fork_plan(null_control=True)
    runs = plan.runs()
    names = [r.name for r in runs]
    for t in (1, 2):  # a trunk before every run that continues it, and all of trunk 1's before trunk 2
        after = [r for r in runs if r.after == f"trunk{t}"]
        assert {re.search(r"_t\d+([rh])\d+$", r.name).group(1) for r in after} == {"r", "h"} and all(
            names.index(f"trunk{t}") < names.index(r.name) for r in after)
        trunk = runs[names.index(f"trunk{t}")]
        assert (trunk.stop_at, trunk.deterministic, trunk.seed) == (4, True, t - 1)
        assert all(r.seed == trunk.seed for r in after)
    assert max(names.index(r.name) for r in runs if r.after == "trunk1") < names.index("trunk2")
    by = {r.name: r for r in runs}
    assert by["mxfp8-null_t1r1"].deterministic and by["bf16_t1r1"].deterministic
    assert (by["bf16_t1r2"].row_order, by["mxfp8_t1r2"].row_order, by["bf16_t1h1"].row_order) == (2, 2, 3)
    assert [r.name for r in plan.baselines()] == ["bf16_t1r1", "bf16_t1r2", "bf16_t2r1", "bf16_t2r2"]
    assert plan.blocks(plan.judged("verdict")) == ["trunk1", "trunk1", "trunk2", "trunk2"]
    first = {r.name for r in plan.levels()[0].runs()}  # the levels are whole trunks, a prefix of the schedule
    assert set(names[:len(first)]) == first and plan.levels()[-1] == plan


def test_fork_train_commands_reproduce_the_runs_with_their_trunk(tmp_path):
    """The command in each run's sidecar, parsed by convergence train, is the configuration its piece ran: a
    trunk stops at the fork step (deterministic), a continuation forks from its trunk's folder."""
    plan, out = fork_plan(trunks=1), tmp_path.resolve()
    trunk = run_dir(out, plan.runs()[0])
    trunk.mkdir(parents=True)
    (trunk / "config.json").write_text(json.dumps({"train": {"steps": 8, "data_seed": 0, "row_order": None}}))
    for spec in plan.runs():
        argv = shlex.split(plan.train_command(spec, str(out)))
        args = train_parser().parse_args(argv[4:])
        want = forks.train_config(plan, spec, out)
        assert config_from_args(args) == want, spec.name
        assert args.stop_at_step == spec.stop_at


def _log(path, steps, start=1):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(start, steps + 1)))


def test_a_trunks_checkpoint_stays_while_a_continuation_needs_it(tmp_path):
    """A continuation may start once its trunk's checkpoint is here (or from its own); the trunk's checkpoint goes
    once every run after it is finished or holds its own, and a finished trunk without it while one still needs it
    is lost (made again)."""
    plan = fork_plan(trunks=1)
    open_protocol(plan, tmp_path)
    trunk, *after = [r for r in plan.runs()]
    assert not forks.ready(plan, tmp_path, after[0])
    _log(run_dir(tmp_path, trunk) / "metrics.jsonl", 4)
    (run_dir(tmp_path, trunk) / CHECKPOINT_FILE).write_bytes(b"the trunk at step 4")
    assert all(forks.ready(plan, tmp_path, r) for r in after)
    for r in after[:-1]:  # every run after it finished but the last
        _log(run_dir(tmp_path, r) / "metrics.jsonl", 8)
    assert forks.release(plan, tmp_path, run_status(plan, tmp_path)) == []
    assert can_continue(tmp_path, trunk)
    (run_dir(tmp_path, after[-1]) / CHECKPOINT_FILE).parent.mkdir(parents=True)
    (run_dir(tmp_path, after[-1]) / CHECKPOINT_FILE).write_bytes(b"its own, at step 6")
    assert forks.release(plan, tmp_path, run_status(plan, tmp_path)) == ["trunk1"]
    assert not can_continue(tmp_path, trunk) and metrics_path(tmp_path, trunk).name == "metrics.jsonl.gz"
    assert forks.lost_trunks(plan, tmp_path, run_status(plan, tmp_path)) == []
    (run_dir(tmp_path, after[-1]) / CHECKPOINT_FILE).unlink()  # its disk ended: it needs the trunk again
    assert forks.lost_trunks(plan, tmp_path, run_status(plan, tmp_path)) == [trunk]


def test_the_time_left_counts_a_lost_trunk_made_again(tmp_path, write_pace):
    """``--status``'s time left: a finished trunk whose checkpoint is gone while a continuation needs it is made
    again, all its steps (a third of a run here); the control: with its checkpoint here it costs nothing."""
    from convergence.protocol.status import time_left

    plan = fork_plan(trunks=1)
    open_protocol(plan, tmp_path)
    trunk = plan.runs()[0]
    _log(run_dir(tmp_path, trunk) / "metrics.jsonl", 4)
    write_pace(tmp_path, {"run": "x", "recipe": "bf16", "per_gpu": 1, "from_step": 0, "to_step": 8, "wall_s": 80.0})
    states = LocalExecutor(progress=False).states(plan, tmp_path)
    lost = time_left(plan, tmp_path, states)
    (run_dir(tmp_path, trunk) / CHECKPOINT_FILE).write_bytes(b"the trunk at step 4")
    kept = time_left(plan, tmp_path, LocalExecutor(progress=False).states(plan, tmp_path))
    assert lost.seconds - kept.seconds == pytest.approx(80.0 * 4 / 8)


# a worker piece that makes a run in no time: a trunk its log to the fork step and a checkpoint, after a pause; a
# continuation its whole log, failing (exit 3) if its trunk's checkpoint is not there when it starts (forks.ready of
# a continuation without a checkpoint of its own, as each is here). Plain Python, its paths worked out by the test
# (_piece_argv): a piece importing the protocol's modules would spend seconds importing torch, for nothing the
# schedule is tested on
FAKE_PIECE = r"""
import json, pathlib, sys, time
d, trunk_checkpoint, end, is_trunk = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
d.mkdir(parents=True, exist_ok=True)
if trunk_checkpoint and not pathlib.Path(trunk_checkpoint).is_file():
    sys.exit(3)
if is_trunk:
    time.sleep(1.0)
(d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, end + 1)))
if is_trunk:
    (d / "checkpoint.pt").write_bytes(b"the trunk")
"""


def _piece_argv(plan: ProtocolPlan, out, script) -> Callable[[str, float | None], list[str]]:
    """``worker_argv`` for FAKE_PIECE: the run's folder, its trunk's checkpoint ('' for none), its last step and
    whether it is a trunk."""
    by = {r.name: r for r in plan.runs()}

    def argv(name: str, _minutes) -> list[str]:
        spec = by[name]
        trunk = str(run_dir(out, by[spec.after]) / CHECKPOINT_FILE) if spec.after else ""
        return [sys.executable, str(script), str(run_dir(out, spec)), trunk, str(spec.stop_at or plan.steps),
                "1" if spec.stop_at else "0"]
    return argv


def test_worker_slots_start_a_continuation_only_once_its_trunk_is_there(tmp_path):
    """Two worker slots and a plan of one trunk: the continuations wait for the trunk's piece (one started beside
    it would find no checkpoint and fail), then run, and the trunk's checkpoint is released at the end."""
    plan = fork_plan(trunks=1)
    open_protocol(plan, tmp_path)
    script = tmp_path / "piece.py"
    script.write_text(FAKE_PIECE)
    executor = LocalExecutor(slots=2, progress=False, worker_argv=_piece_argv(plan, tmp_path, script))
    status = execute(plan, tmp_path, executor)
    assert set(status.values()) == {"done"}
    assert not (run_dir(tmp_path, plan.runs()[0]) / CHECKPOINT_FILE).exists()


@pytest.fixture(scope="session")
def pilot(tmp_path_factory) -> dict:
    """``PILOT`` made once per session: its trunk stopped after its first step (a piece out of time), then the
    command to its end (the trunk resumed from its checkpoint, the continuations forked from it)."""
    import os

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out, record = root / "pilot-protocol", root / "pilot-protocol.json"
    with FileLock(str(root / "pilot-protocol.lock")):
        if not record.exists():
            shutil.rmtree(out, ignore_errors=True)
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            printed = io.StringIO()
            try:
                with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
                    plan = _pilot_plan()
                    open_protocol(plan, out)
                    assert run_piece(plan, plan.runs()[0], out, stop_after_s=0.0, progress=False) is False
                    stopped = run_status(plan, out)["trunk1"]
                    rc = convergence_main(["protocol", *PILOT, "--out", str(out)])
            finally:
                torch.set_num_threads(threads)
            record.write_text(json.dumps({"rc": rc, "printed": printed.getvalue(), "stopped": stopped}))
    return json.loads(record.read_text()) | {"out": out, "plan": _pilot_plan()}


def _pilot_plan() -> ProtocolPlan:
    from convergence.protocol import cli

    return cli._plan_of(cli._protocol_parser().parse_args([*PILOT, "--out", "/nonexistent"]))


def test_pilot_runs_a_trunk_and_its_continuations_and_reports_their_spread(pilot):
    """The trunk stopped at step 1 and was continued; each continuation's log holds the trunk's records to the fork
    step; the result's spread at each evaluation after it is the continuations' relative standard deviation there;
    nothing of the trunk's checkpoint is left."""
    out, plan = pilot["out"], pilot["plan"]
    assert pilot["rc"] == 0 and pilot["stopped"] == 1
    path = out / "results" / "tiny_long_pilot__cpu.json"
    r = json.loads(path.read_text())
    trunk = [computed(x) for x in JsonlLog(metrics_path(out, plan.runs()[0])).records()]
    conts = [r_ for r_ in plan.runs() if r_.after]
    assert len(trunk) == 4 and not list(out.rglob(CHECKPOINT_FILE))
    vals = {}
    for spec in conts:
        recs = JsonlLog(metrics_path(out, spec)).records()
        assert [computed(x) for x in recs[:4]] == trunk
        vals[spec.name] = {x["step"]: x["val_loss"] for x in recs if "val_loss" in x}
    assert r["horizons"] == [6, 8] and [c["name"] for c in r["continuations"]] == [s.name for s in conts]
    for h in (6, 8):
        v = np.array([vals[s.name][h] for s in conts])
        assert r["spread_at_step"][str(h)]["spread"] == pytest.approx(np.std(v / v.mean() - 1, ddof=1), rel=1e-9)
    assert r["fork_spread"] == r["final_window"]["spread"] > 0 and r["final_window"]["dof"] == 2
    assert r["independent"] is None  # the k16 reference is the proxy's: not compared with the tiny model's
    assert r["gpu_hours"]["total"] > 0 and "fork pilot: 3 BF16 continuations" in pilot["printed"]
    rate = [x["tokens_per_s"] for s in conts for x in JsonlLog(metrics_path(out, s)).records() if x["step"] > 4]
    # the trunk's step 1 was made by run_piece outside an executor (the fixture), which records no pace
    trunk_rate = [x["tokens_per_s"] for x in JsonlLog(metrics_path(out, plan.runs()[0])).records() if x["step"] > 1]
    assert r["deterministic_pace"] == pytest.approx(np.median(rate) / np.median(trunk_rate), rel=1e-12)


def test_the_deterministic_pace_counts_only_pieces_that_had_their_gpu_alone(pilot, tmp_path):
    """A continuation made beside others (``per_gpu`` 3 in pace.jsonl) logs a fraction of the tokens a second it
    makes alone: its steps are left out of the pace; with no trunk piece alone there is no pace. By hand."""
    from convergence.protocol.pilot import _deterministic_pace

    out = tmp_path / "p"
    shutil.copytree(pilot["out"], out)
    plan = pilot["plan"]
    trunk, conts = plan.runs()[0], plan.runs()[1:]
    pace = [json.loads(x) for x in (out / "pace.jsonl").read_text().splitlines()]
    shared = conts[0].name
    (out / "pace.jsonl").write_text("".join(json.dumps(e | ({"per_gpu": 3} if e["run"] == shared else {})) + "\n"
                                            for e in pace))
    log = metrics_path(out, conts[0])  # what it logs: a fraction of the rate (a hundredth, below every other
    slow = [r | {"tokens_per_s": r["tokens_per_s"] / 100} if r.get("tokens_per_s") else r  # run's: the control
            for r in JsonlLog(log).records()]                                             # below cannot tie)
    text = "".join(json.dumps(r) + "\n" for r in slow).encode()
    log.write_bytes(gzipped(text) if log.name.endswith(".gz") else text)
    rate = [x["tokens_per_s"] for s in conts[1:] for x in JsonlLog(metrics_path(out, s)).records() if x["step"] > 4]
    trunk_rate = [x["tokens_per_s"] for x in JsonlLog(metrics_path(out, trunk)).records() if x["step"] > 1]
    got = _deterministic_pace(out, conts, [trunk], plan.fork_step)
    assert got == pytest.approx(np.median(rate) / np.median(trunk_rate), rel=1e-12)
    everything = [x["tokens_per_s"] for s in conts for x in JsonlLog(metrics_path(out, s)).records() if x["step"] > 4]
    assert np.median(everything) != np.median(rate)  # the control: leaving the shared run out changes the figure
    (out / "pace.jsonl").write_text("".join(json.dumps(e | {"per_gpu": 2}) + "\n" for e in pace))
    assert _deterministic_pace(out, conts, [trunk], plan.fork_step) is None


def test_a_lost_trunk_is_made_again_bit_identically_and_checked(pilot, tmp_path):
    """A continuation whose run is gone needs its trunk again, whose checkpoint was released: the trunk is made
    again from step 0 (straight through, where the first was stopped and resumed), its pace recorded from step 0,
    and must log what it did and what the continuations copied. The control: held to records one gradient norm
    apart, the check refuses."""
    out = tmp_path / "p"
    shutil.copytree(pilot["out"], out)
    plan = pilot["plan"]
    trunk, gone = plan.runs()[0], plan.runs()[-1]
    before = JsonlLog(metrics_path(out, trunk)).records()
    shutil.rmtree(run_dir(out, gone).parent)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert set(execute(plan, out, LocalExecutor(progress=False)).values()) == {"done"}
    finally:
        torch.set_num_threads(threads)
    again = JsonlLog(metrics_path(out, trunk)).records()
    assert [computed(x) for x in again] == [computed(x) for x in before]
    remake = [e for e in JsonlLog(out / "pace.jsonl").records() if e["run"] == trunk.name][-1]
    assert (remake["from_step"], remake["to_step"]) == (0, plan.fork_step)  # paced as the steps it trained
    assert [computed(x) for x in JsonlLog(metrics_path(out, gone)).records()] == [
        computed(x) for x in JsonlLog(metrics_path(pilot["out"], gone)).records()]
    tampered = [dict(x) for x in before]
    tampered[2]["grad_norm"] *= 1 + 1e-7
    with pytest.raises(forks.TrunkChanged, match="step 3"):
        forks.check_remade(plan, out, trunk, tampered)


def _record(out, spec) -> dict[str, bytes]:
    folder = run_dir(out, spec)
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name != CHECKPOINT_FILE}


def _one_thread(fn):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn()
    finally:
        torch.set_num_threads(threads)


def test_a_worker_makes_a_lost_trunk_again_and_its_first_record_stays(pilot, tmp_path):
    """A worker piece (``--piece``, what each slot of ``--parallel N`` and each Slurm job runs) given a lost trunk
    makes it again, where a finished run is nothing to do: its checkpoint is there after, for the continuation that
    needs it. The trunk's logs and config.json stay the bytes first made (the remake's timing is in pace.jsonl),
    and the plan then ends as before."""
    out = tmp_path / "p"
    shutil.copytree(pilot["out"], out)
    plan = pilot["plan"]
    trunk, gone = plan.runs()[0], plan.runs()[-1]
    first = _record(out, trunk)
    shutil.rmtree(run_dir(out, gone).parent)
    assert forks.remaking(plan, out, trunk) and not forks.remaking(plan, out, plan.runs()[1])
    with contextlib.redirect_stderr(io.StringIO()):
        assert _one_thread(lambda: convergence_main(["protocol", "--out", str(out), "--piece", trunk.name])) == 0
    assert can_continue(out, trunk) and _record(out, trunk) == first
    assert not (run_dir(out, trunk) / forks.EARLIER).exists() and not forks.remaking(plan, out, trunk)
    assert set(_one_thread(lambda: execute(plan, out, LocalExecutor(progress=False))).values()) == {"done"}
    assert [computed(x) for x in JsonlLog(metrics_path(out, gone)).records()] == [
        computed(x) for x in JsonlLog(metrics_path(pilot["out"], gone)).records()]


def test_a_trunk_made_again_that_differs_leaves_no_checkpoint_to_continue(pilot, tmp_path):
    """A lost trunk whose earlier log says another thing than the remake (one gradient norm changed at step 3)
    is refused, and after the refusal holds its earlier record and no checkpoint: a second try is refused again,
    where a checkpoint left behind would have had the continuation go on from a trunk not the others'."""
    import gzip

    out = tmp_path / "p"
    shutil.copytree(pilot["out"], out)
    plan = pilot["plan"]
    trunk, gone = plan.runs()[0], plan.runs()[-1]
    log = metrics_path(out, trunk)
    recs = JsonlLog(log).records()
    recs[2]["grad_norm"] *= 1 + 1e-7
    text = "".join(json.dumps(r) + "\n" for r in recs).encode()
    log.write_bytes(gzip.compress(text) if log.suffix == ".gz" else text)
    first = _record(out, trunk)
    shutil.rmtree(run_dir(out, gone).parent)
    for _ in range(2):
        with pytest.raises(forks.TrunkChanged, match="step 3"):
            _one_thread(lambda: execute(plan, out, LocalExecutor(progress=False)))
        assert not can_continue(out, trunk) and _record(out, trunk) == first
        assert not (run_dir(out, gone) / CHECKPOINT_FILE).exists()


@pytest.mark.slurm
def test_through_slurm_a_lost_trunk_is_made_again_in_a_job_and_its_continuation_after_it(pilot, tmp_path):
    """The pilot with a continuation gone and its trunk's checkpoint released, made whole again through a real
    Slurm (``--slurm-wait``): the trunk's job makes it again from step 0 (its worker records that piece from step
    0, with its job), its record is the first one byte for byte, then the continuation's job continues it to the
    same curve as the local executor's; nothing of the trunk's checkpoint is left."""
    out = tmp_path / "p"
    shutil.copytree(pilot["out"], out)
    plan = pilot["plan"]
    trunk, gone = plan.runs()[0], plan.runs()[-1]
    first = _record(out, trunk)
    shutil.rmtree(run_dir(out, gone).parent)
    argv = ["protocol", *PILOT, "--out", str(out), "--executor", "slurm", "--slurm-time", "10", "--slurm-cpus", "1",
            "--threads", "1", "--slurm-wait"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        rc = _one_thread(lambda: convergence_main(argv))
    assert rc == 0 and _record(out, trunk) == first and not list(out.rglob(CHECKPOINT_FILE))
    remake = [e for e in JsonlLog(out / "pace.jsonl").records() if e["run"] == trunk.name and "slurm_job" in e]
    assert [(e["from_step"], e["to_step"]) for e in remake] == [(0, plan.fork_step)]
    assert [computed(x) for x in JsonlLog(metrics_path(out, gone)).records()] == [
        computed(x) for x in JsonlLog(metrics_path(pilot["out"], gone)).records()]


@pytest.mark.slurm
def test_through_slurm_a_trunks_job_ends_at_its_fork_step_without_requeueing_itself(tmp_path):
    """A fork plan made through a real Slurm: the trunk's job ends once the trunk reaches its fork step (its
    compacted log is the sign a job has nothing left to do), where a job whose run looks unfinished requeues itself
    (up to ``MAX_REQUEUES`` starts that each found nothing to do); one job per run, and the pilot judged."""
    out = tmp_path / "p"
    pilot = [*PILOT]
    pilot[pilot.index("--pilot") + 1] = "2"
    argv = ["protocol", *pilot, "--out", str(out), "--executor", "slurm", "--slurm-time", "10", "--slurm-cpus", "1",
            "--threads", "1", "--slurm-wait"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        rc = _one_thread(lambda: convergence_main(argv))
    logs = sorted((out / "slurm" / "logs").glob("*_log.out"))
    assert rc == 0 and (out / "results" / "tiny_long_pilot__cpu.json").is_file()
    assert len(logs) == 3 and not any("requeueing" in p.read_text() for p in logs)


def test_a_remade_trunk_whose_check_fails_otherwise_leaves_no_checkpoint_either(pilot, tmp_path, monkeypatch):
    """The check itself failing (here an OSError reading a log) is no pass: the trunk keeps its first record and
    no checkpoint, as when it is refused."""
    out = tmp_path / "p"
    shutil.copytree(pilot["out"], out)
    plan = pilot["plan"]
    trunk, gone = plan.runs()[0], plan.runs()[-1]
    first = _record(out, trunk)
    shutil.rmtree(run_dir(out, gone).parent)

    def unreadable(*_args):
        raise OSError("a log could not be read")

    monkeypatch.setattr(forks, "check_remade", unreadable)
    with pytest.raises(OSError):
        _one_thread(lambda: run_piece(plan, trunk, out, stop_after_s=None, progress=False))
    assert not can_continue(out, trunk) and _record(out, trunk) == first
    assert not (run_dir(out, trunk) / forks.EARLIER).exists()


def test_a_trunk_trains_with_deterministic_algorithms_and_a_plain_run_without(tmp_path, monkeypatch):
    """``RunSpec.deterministic`` reaches torch while the piece trains (``deterministic_mode``) and is put back after
    it; the trunk's config.json records it. The control: a continuation, not deterministic, trains without."""
    from convergence.protocol import schedule

    seen = {}

    def train_recipe(cfg, recipe, folder, tokens, **kw):
        seen[folder.parent.name] = (torch.are_deterministic_algorithms_enabled(), cfg.deterministic,
                                    kw.get("stop_at_step"))
        return False

    monkeypatch.setattr(schedule, "train_recipe", train_recipe)
    plan = fork_plan(trunks=1)
    open_protocol(plan, tmp_path)
    trunk, cont = plan.runs()[0], plan.runs()[1]
    for spec in (trunk, cont):
        run_piece(plan, spec, tmp_path, stop_after_s=None, tokens=object(), progress=False)
    assert seen == {"trunk1": (True, True, 4), "bf16_t1r1": (False, False, None)}
    assert not torch.are_deterministic_algorithms_enabled()


def _proxy_pilot() -> ProtocolPlan:
    """A fork pilot of the k16 plan's model, length, learning rate, evaluations and held-out split: the plan the k16
    reference is read for."""
    return ProtocolPlan(model="proxy", steps=1500, device="cuda", val_percent=20, design="fork", pilot=True,
                        fork_step=500, replicates=8,
                        overrides=(("lr", 3e-4), ("val_every", 250.0), ("val_batches", 290.0))).check()


def test_pilot_names_its_gpu_model_and_says_when_the_reference_was_made_on_another(pilot):
    """The pilot's result names the GPU model of its runs (here cpu), the k16 reference the one its golden sidecar
    names (h200, read for the proxy pilot's plan); the lines add a caution when the two differ, none when they
    match (the control)."""
    from convergence.protocol.pilot import K16, _reference, pilot_lines

    r = json.loads((pilot["out"] / "results" / "tiny_long_pilot__cpu.json").read_text())
    assert r["hardware"] == "cpu"
    ref = _reference(str(K16), _proxy_pilot())
    assert ref is not None and ref["hardware"] == "h200" and ref["runs"] == 32
    fake = r | {"independent": ref | {"at_step": {str(k): v for k, v in ref["at_step"].items()}}, "explained": 0.5}
    on_h100 = pilot_lines(fake | {"hardware": "h100"})
    assert any("32 BF16 runs on h200" in line for line in on_h100)
    assert any("different GPU models" in line for line in on_h100)
    assert not any("different GPU models" in line for line in pilot_lines(fake | {"hardware": "h200"}))


def test_pilot_sidecar_notes_the_spread_and_names_its_reference_inside_the_repository(pilot):
    """A pilot's golden sidecar says its spread in words (a verdict's note would say "None: None"), and the k16
    reference it read is named relative to the repository, not by the judging machine's checkout."""
    from convergence.protocol.pilot import K16, _reference, pilot_note

    res = pilot["out"] / "results"
    r = json.loads((res / "tiny_long_pilot__cpu.json").read_text())
    note = json.loads((res / "tiny_long_pilot__cpu.json.meta.json").read_text())["note"]
    assert note == pilot_note(r) and note.startswith("fork pilot: ") and "within-trunk spread" in note
    assert "None" not in note
    ref = _reference(str(K16), _proxy_pilot())
    assert ref["source"] == ["golden/training/proxy_long_lr3e-4_k16_verdict__h200.json",
                             "golden/training/proxy_long_lr3e-4_k16_negative_control__h200.json"]
    fake = r | {"independent": ref, "explained": 0.5}
    assert "independent runs on h200" in pilot_note(fake) and "removes 50% of the variance" in pilot_note(fake)
