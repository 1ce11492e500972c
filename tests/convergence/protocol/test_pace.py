"""A protocol's pace (convergence.protocol.schedule): what a whole run of a recipe takes, from the folder's
pace.jsonl, and --whole-runs, which starts a run only when its piece's seconds hold it. The runs themselves are
made by ``fake_training``: the property is which runs start and what their pieces record."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import sys

import pytest

from convergence.protocol import schedule
from convergence.protocol.folder import CHECKPOINT_FILE, open_protocol, resumable_status, run_dir, run_state
from convergence.protocol.schedule import PACE_MARGIN, STARTUP_S, LocalExecutor, execute, expected_wall_s
from numerics.errors import BadInput


def _whole(run: str, recipe: str, steps: int, wall_s: float) -> dict:
    return {"run": run, "recipe": recipe, "per_gpu": 1, "from_step": 0, "to_step": steps, "wall_s": wall_s}


def _bf16(status: dict) -> list[str]:
    return [n for n in status if n.startswith("bf16")]


def test_a_whole_runs_pace_comes_from_finished_runs_first_then_from_pieces(tmp_path, small_plan, write_pace):
    plan = dataclasses.replace(small_plan(), model="proxy", steps=1500)
    start = STARTUP_S["proxy"]  # each piece's start-up out, one whole run's in; --parallel 3's pace kept apart
    assert expected_wall_s(tmp_path, plan, "bf16") is None  # no pace file
    open_protocol(plan, tmp_path)
    write_pace(tmp_path, {"run": "bf16", "recipe": "bf16", "per_gpu": 1, "from_step": 0, "to_step": 500, "wall_s": 100},
               {"run": "x", "recipe": "bf16", "per_gpu": 3, "from_step": 0, "to_step": 1500, "wall_s": 900})
    need, how = expected_wall_s(tmp_path, plan, "bf16")  # no finished run: the pieces' pace per step
    assert need == pytest.approx(start + (100 - start) * 3) and "1 bf16 pieces" in how
    with open(tmp_path / "pace.jsonl", "a") as f:  # the run finished in a second piece
        f.write(json.dumps({"run": "bf16", "recipe": "bf16", "per_gpu": 1, "from_step": 500, "to_step": 1500,
                            "wall_s": 200}) + "\n")
    need, how = expected_wall_s(tmp_path, plan, "bf16")
    assert need == pytest.approx(start + (100 - start) + (200 - start)) and how == "the last 1 bf16 run"
    assert expected_wall_s(tmp_path, plan, "mxfp8") is None
    with open(tmp_path / "pace.jsonl", "a") as f:
        f.write(json.dumps(_whole("r1", "bf16", 1500, 270)) + "\n" + json.dumps(_whole("r2", "bf16", 1500, 280)) + "\n")
        f.write('{"run": "r3", "recipe": "bf16", "wall')  # cut short by a killed process
    need, how = expected_wall_s(tmp_path, plan, "bf16")
    assert need == pytest.approx((start + 40 + 140 + 270 + 280) / 3) and how == "the last 3 bf16 runs"
    assert expected_wall_s(tmp_path, plan, "bf16", slowest=True) == (280, "the slowest of the last 3 bf16 runs")
    # a damaged line other than the cut last one is refused, not skipped: it would decide which runs start
    whole = (tmp_path / "pace.jsonl").read_text()
    for damage, says in (("[1, 2]\n", "not a JSON record"), ("garbage\n", "not a JSON record"),
                         ('{"recipe": "bf16", "from_step": 0, "to_step": 1500, "wall_s": "x"}\n', "without numbers"),
                         ('{"recipe": "bf16", "from_step": 0, "to_step": 1500, "wall_s": NaN}\n', "without numbers"),
                         ('{"recipe": "bf16", "from_step": 0, "to_step": 1500, "wall_s": -5}\n', "without numbers"),
                         ('{"recipe": "bf16", "from_step": true, "to_step": 1500, "wall_s": 5}\n', "without numbers")):
        (tmp_path / "pace.jsonl").write_text(damage + whole)
        with pytest.raises(BadInput, match=says):
            expected_wall_s(tmp_path, plan, "bf16")


def test_a_run_restarted_at_step_0_is_paced_from_its_restart(tmp_path, small_plan, write_pace):
    """A run whose checkpoint was lost started again at step 0: its pace is the restart's, 420 s in one piece, not
    a mix with the lost start's steps and seconds (545 s)."""
    plan = dataclasses.replace(small_plan(), model="proxy", steps=1500)
    open_protocol(plan, tmp_path)
    write_pace(tmp_path, _whole("mxfp8-e2m1_rounding2", "mxfp8-e2m1", 1283, 600.0),
               _whole("mxfp8-e2m1_rounding2", "mxfp8-e2m1", 1500, 420.0))
    assert expected_wall_s(tmp_path, plan, "mxfp8-e2m1") == (420.0, "the last 1 mxfp8-e2m1 run")


def test_a_whole_runs_pace_is_its_recent_runs(tmp_path, small_plan, write_pace, fake_training):
    """The pace is the last RECENT_RUNS whole runs: after two slow whole BF16 runs (an older code), three fast
    ones let every BF16 run start, where the mean of all five would have kept them all from starting; the same
    five in the other order (the control) keep them from starting, and the hold names both figures."""
    plan = small_plan()
    assert schedule.RECENT_RUNS == 3
    for recent, other in ((1.0, 1e6), (1e6, 1.0)):
        out = tmp_path / str(recent)
        open_protocol(plan, out)
        walls = [other] * 2 + [recent] * 3
        write_pace(out, *(_whole(f"earlier{i}", "bf16", plan.steps, w) for i, w in enumerate(walls)))
        assert expected_wall_s(out, plan, "bf16") == (pytest.approx(recent), "the last 3 bf16 runs")
        executor = LocalExecutor(progress=False)
        status = execute(plan, out, executor, stop_after_s=600, whole_runs=True)
        if recent == 1.0:
            assert set(status.values()) == {"done"} and executor.holds == []
        else:
            assert all(status[n] == 0 for n in _bf16(status)) and len(_bf16(status)) > 1
            (hold,) = executor.holds
            assert (hold.recipe, hold.need_s, hold.how) == ("bf16", 1e6, "the slowest of the last 3 bf16 runs")
            assert hold.asked_s == pytest.approx(PACE_MARGIN * 1e6)


def test_whole_runs_ask_the_slowest_recent_run_counting_runs_made_in_pieces(tmp_path, small_plan, write_pace,
                                                                          fake_training):
    """Two fast whole BF16 runs and the last, slow one made in two pieces: --whole-runs starts no BF16 run (the
    slowest of the three does not fit), though their mean would, and holds the recipe once, not once a run; the
    control, the same pieces fast, starts them."""
    plan = small_plan()
    startup = STARTUP_S[plan.model]
    half = plan.steps // 2
    for slow in (True, False):
        out = tmp_path / str(slow)
        open_protocol(plan, out)
        piece_s = startup + (500 if slow else 0.5)  # each piece's training seconds; slow: 1,000 s a run
        write_pace(out, _whole("fast1", "bf16", plan.steps, 1.0), _whole("fast2", "bf16", plan.steps, 1.0),
                   {"run": "pieced", "recipe": "bf16", "per_gpu": 1, "from_step": 0, "to_step": half,
                    "wall_s": piece_s},
                   {"run": "pieced", "recipe": "bf16", "per_gpu": 1, "from_step": half, "to_step": plan.steps,
                    "wall_s": piece_s})
        mean, _ = expected_wall_s(out, plan, "bf16")
        assert PACE_MARGIN * mean < 600  # the mean of the three would have started them
        executor = LocalExecutor(progress=False)
        status = execute(plan, out, executor, stop_after_s=600, whole_runs=True)
        if slow:
            assert all(status[n] == 0 for n in _bf16(status)) and len(_bf16(status)) > 1
            assert [(h.recipe, h.need_s, h.how) for h in executor.holds] == [
                ("bf16", pytest.approx(startup + 1000), "the slowest of the last 3 bf16 runs")]
        else:
            assert set(status.values()) == {"done"}


def test_whole_runs_say_when_no_call_of_that_length_would_start_a_run(tmp_path, monkeypatch, small_plan, write_pace,
                                                                     fake_training):
    """A run that asks more than a piece of a call this long gets even at the call's start is never started by
    such calls: its hold gives the call length that would start it, rounded up to a tenth of a minute. The
    control: a run that does not fit what is left of this call, 300 s in, but would fit a fresh call of the same
    length, is held without one."""
    plan = small_plan()
    startup = STARTUP_S[plan.model]
    monkeypatch.setattr(schedule.time, "monotonic", lambda: next(clock))
    for wall, never in ((500.0, False), (600.0, True)):  # asked 550 s, 660 s; a fresh 600-s call gives 590 s
        out = tmp_path / str(wall)
        open_protocol(plan, out)
        write_pace(out, *(_whole(f"earlier_{recipe}", recipe, plan.steps, wall)
                          for recipe in {r.recipe for r in plan.runs()}))
        clock = iter([0.0] + [300.0] * 1000)  # the call's start, then every reading 300 s later
        executor = LocalExecutor(progress=False)
        status = execute(plan, out, executor, stop_after_s=600, whole_runs=True)
        assert set(status.values()) == {0}  # every recipe paced alike: nothing started
        need = math.ceil((PACE_MARGIN * wall + startup) / 6) / 10  # rounded up: 11.2 asks 670 s, a call 672
        assert {h.recipe: h.call_minutes for h in executor.holds} == dict.fromkeys(
            {r.recipe for r in plan.runs()}, need if never else None)
        assert not never or need == 11.2


def test_whole_runs_start_only_the_runs_that_end_by_the_deadline(tmp_path, small_plan, write_pace, fake_training):
    """With a pace that says a whole BF16 run takes longer than the time left, no BF16 run starts, while the
    recipes with no pace yet go on; without --whole-runs the same call starts the BF16 runs (the control that the
    skip is the option's doing). Each piece adds its pace and host CPU."""
    from numerics.environment import cpu_model

    plan = small_plan()
    for whole_runs in (True, False):
        out = tmp_path / str(whole_runs)
        open_protocol(plan, out)
        write_pace(out, _whole("earlier", "bf16", plan.steps, 1e6))
        status = execute(plan, out, LocalExecutor(progress=False), stop_after_s=600, whole_runs=whole_runs)
        bf16 = {s.name for s in plan.runs() if s.recipe == "bf16"}
        if whole_runs:
            assert all(status[n] == 0 for n in bf16) and all(status[n] == "done" for n in status if n not in bf16)
        else:
            assert set(status.values()) == {"done"}
        paced = [json.loads(line) for line in (out / "pace.jsonl").read_text().splitlines()[1:]]
        assert sorted(e["run"] for e in paced) == sorted(n for n in status if status[n] == "done")
        assert {e["cpu"] for e in paced} == {cpu_model()}  # the machine each piece ran on


def test_whole_runs_ask_what_the_piece_will_be_given_not_the_time_to_the_deadline(tmp_path, small_plan, write_pace,
                                                                                 fake_training):
    """A piece is told to stop a start-up before the deadline: a run whose pace is under the time to the deadline
    but over the piece's seconds would be cut short of its end, so it is not started; the control, a pace the
    piece's seconds hold with room to spare, starts them."""
    plan = small_plan()
    startup, call = STARTUP_S[plan.model], 600.0
    for fits in (False, True):
        out = tmp_path / str(fits)
        open_protocol(plan, out)
        given = call - startup  # the deadline's seconds less a start-up: what the piece is given
        wall = (given - 100.0 if fits else given + 0.5 * startup) / PACE_MARGIN
        assert PACE_MARGIN * wall < call  # both are under the time to the deadline
        write_pace(out, _whole("earlier", "bf16", plan.steps, wall))
        executor = LocalExecutor(progress=False)
        status = execute(plan, out, executor, stop_after_s=call, whole_runs=True)
        if fits:
            assert status[_bf16(status)[0]] == "done" and executor.holds == []
        else:
            assert all(status[n] == 0 for n in _bf16(status)) and len(_bf16(status)) > 1
            (hold,) = executor.holds
            assert hold.asked_s > hold.given_s and hold.given_s <= given


def test_a_started_run_without_its_checkpoint_is_scheduled_as_a_new_run(tmp_path, small_plan, write_pace,
                                                                       fake_training):
    """A folder copied without a stopped BF16 run's checkpoint: the run starts again at step 0, so with
    --whole-runs and a pace that says no whole BF16 run fits it is not started (as a run to continue it would be
    trained to the deadline and lose its checkpoint again), and a piece that makes it is paced from step 0. The
    control: the same folder with the checkpoint continues the run."""
    plan = small_plan()
    spec = next(s for s in plan.runs() if s.recipe == "bf16")
    made = tmp_path / "made"
    open_protocol(plan, made)
    log = run_dir(made, spec) / "metrics.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text("".join(json.dumps({"step": s, "loss": 3.0}) + "\n" for s in (1, 2)))
    (run_dir(made, spec) / CHECKPOINT_FILE).write_bytes(b"a checkpoint")
    for keep in (True, False):
        out = tmp_path / f"copy_{keep}"
        shutil.copytree(made, out)
        if not keep:
            (run_dir(out, spec) / CHECKPOINT_FILE).unlink()
        assert resumable_status(plan, out)[spec.name] == (2 if keep else 0)
        write_pace(out, _whole("earlier", "bf16", plan.steps, 1e6))
        status = execute(plan, out, LocalExecutor(progress=False), stop_after_s=600, whole_runs=True)
        assert status[spec.name] == ("done" if keep else 0)
        assert run_state(plan, out, spec) == ("done" if keep else 2)  # not started: its logs as copied
        assert LocalExecutor().states(plan, out)[spec.name].state == ("done" if keep else "restart")
    out = tmp_path / "copy_False"
    assert set(execute(plan, out, LocalExecutor(progress=False)).values()) == {"done"}
    entry = [json.loads(line) for line in (out / "pace.jsonl").read_text().splitlines() if spec.name in line][-1]
    assert (entry["from_step"], entry["to_step"]) == (0, plan.steps)


@pytest.mark.timeout(120)
def test_whole_runs_in_worker_processes_skip_what_does_not_fit(tmp_path, small_plan, write_pace):
    plan = small_plan()
    open_protocol(plan, tmp_path)
    write_pace(tmp_path, *(_whole("earlier", s.recipe, plan.steps, 1e6 if s.recipe == "bf16" else 1.0)
                           for s in plan.runs()))
    started = []

    def worker(name: str, minutes: float) -> list[str]:
        started.append(name)
        return [sys.executable, "-c", "pass"]  # a piece that adds no step

    execute(plan, tmp_path, LocalExecutor(slots=2, worker_argv=worker, progress=False), stop_after_s=600,
            whole_runs=True)
    assert sorted(started) == sorted(s.name for s in plan.runs() if s.recipe != "bf16")
