"""A protocol's folder (convergence.protocol.folder): the plan it holds, each run's state, compaction."""

from __future__ import annotations

import dataclasses
import gzip
import json

import pytest

from convergence.protocol import folder
from convergence.protocol.folder import (
    COMPACTED,
    compact_run,
    last_whole_level,
    load_plan,
    metrics_path,
    open_protocol,
    probes_path,
    resumable_status,
    run_dir,
    run_state,
    run_status,
)
from convergence.protocol.plan import ProtocolPlan
from convergence.protocol.schedule import run_piece
from convergence.train.checkpoint import JsonlLog
from numerics.errors import BadInput


def _finished(out, plan, spec, steps=None):
    """``spec``'s run with ``steps`` (default: all) steps logged, plain."""
    path = run_dir(out, spec) / "metrics.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, (steps or plan.steps) + 1)))
    return path


def test_folder_grows_its_replicates_and_keeps_the_runs_made(tmp_path):
    """More replicates (or candidate replicates), another control or result prefix continue a folder, each named
    in the line it returns; any other change is refused; a protocol.json without candidate_replicates reads as
    one candidate run."""
    plan = ProtocolPlan(model="tiny", control="mxfp8-head", steps=20, replicates=3).check()
    assert open_protocol(plan, tmp_path) is None
    old = json.loads((tmp_path / "protocol.json").read_text())
    del old["candidate_replicates"]
    (tmp_path / "protocol.json").write_text(json.dumps(old))
    assert open_protocol(plan, tmp_path) is None
    more = dataclasses.replace(plan, replicates=5, candidate_replicates=2)
    line = open_protocol(more, tmp_path)
    assert "replicates 3 -> 5" in line and "candidate_replicates 1 -> 2" in line
    assert load_plan(tmp_path) == more
    with pytest.raises(BadInput, match="lr"):
        open_protocol(dataclasses.replace(more, overrides=(("lr", 0.01),)), tmp_path)
    assert folder.changed_fields(more.as_dict(), dataclasses.replace(more, control="mxfp8-e2m1", name="k5").as_dict()) \
        == [("control", "mxfp8-head", "mxfp8-e2m1"), ("name", "(none)", "k5")]
    open_protocol(dataclasses.replace(more, control="mxfp8-e2m1", name="tiny_k5"), tmp_path)
    assert load_plan(tmp_path).prefix == "tiny_k5" and load_plan(tmp_path).control == "mxfp8-e2m1"


def test_folder_plan_rewrite_killed_mid_write_keeps_the_old_plan(tmp_path, interrupt_writes_in, monkeypatch):
    """Growing a folder's plan rewrites protocol.json; a kill during that write leaves the plan the runs were made
    under, whole (a truncated protocol.json would strand every run in the folder)."""
    plan = ProtocolPlan(model="tiny", control="mxfp8-head", steps=20, replicates=3).check()
    open_protocol(plan, tmp_path)
    before = (tmp_path / "protocol.json").read_bytes()
    interrupt_writes_in(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        open_protocol(dataclasses.replace(plan, replicates=5), tmp_path)
    monkeypatch.undo()
    assert (tmp_path / "protocol.json").read_bytes() == before and load_plan(tmp_path) == plan
    assert sorted(p.name for p in tmp_path.iterdir()) == ["protocol.json"]  # no temporary file left behind


def test_folder_force_deletes_the_protocols_own_files_and_nothing_else(tmp_path, small_plan, write_pace):
    plan = small_plan()
    open_protocol(plan, tmp_path)
    for sub in ("runs/bf16/bf16", "logs", "results"):
        (tmp_path / sub).mkdir(parents=True, exist_ok=True)
        (tmp_path / sub / "f").write_text("x")
    write_pace(tmp_path, {"run": "bf16", "recipe": "bf16", "from_step": 0, "to_step": 4, "wall_s": 1.0})
    (tmp_path / "mine.txt").write_text("a user's file")
    other = dataclasses.replace(plan, steps=6)
    with pytest.raises(BadInput, match="--force"):
        open_protocol(other, tmp_path)
    assert (tmp_path / "pace.jsonl").exists()
    open_protocol(other, tmp_path, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt", "protocol.json"]


def test_folder_run_states_and_the_last_whole_level(tmp_path):
    """A run is "done" at its last step, else the steps it logged; a run stopped without its checkpoint here is
    at 0 for scheduling (``resumable_status``); the last whole level is the largest level whose runs are all
    done (None before the first)."""
    plan = ProtocolPlan(model="tiny", control="mxfp8-head", steps=10,
                        overrides=(("val_every", 5),), replicates=3, candidate_replicates=4).check()
    levels = plan.levels()
    for spec in levels[0].runs():
        _finished(tmp_path, plan, spec)
    assert last_whole_level(plan, tmp_path) == levels[0]
    stopped, lost = levels[1].runs()[-2:]
    _finished(tmp_path, plan, stopped, steps=4)
    (run_dir(tmp_path, stopped) / folder.CHECKPOINT_FILE).write_bytes(b"a checkpoint")
    _finished(tmp_path, plan, lost, steps=3)  # no checkpoint: copied without it
    status = run_status(plan, tmp_path)
    assert (status[stopped.name], status[lost.name]) == (4, 3)
    assert sum(v == "done" for v in status.values()) == len(levels[0].runs())
    assert resumable_status(plan, tmp_path)[stopped.name] == 4 and resumable_status(plan, tmp_path)[lost.name] == 0
    assert last_whole_level(plan, tmp_path, status) == levels[0]
    for spec in levels[1].runs():
        _finished(tmp_path, plan, spec)
    assert last_whole_level(plan, tmp_path) == levels[1]
    assert last_whole_level(plan, tmp_path / "none") is None


def test_folder_refuses_a_compacted_log_that_ends_short_and_a_file_where_a_run_belongs(tmp_path):
    """A compacted log belongs to a finished run: one that ends short is damage, not a run to train again over
    it; a file where a run's folder belongs is not a run not started."""
    plan = ProtocolPlan(model="tiny", control="mxfp8-head", steps=10, overrides=(("val_every", 5),)).check()
    spec = plan.run("candidate")
    compact_run(_finished(tmp_path, plan, spec, steps=9).parent)
    with pytest.raises(BadInput, match="damaged"):
        run_state(plan, tmp_path, spec)
    spec = plan.run("control")
    run_dir(tmp_path, spec).parent.parent.mkdir(parents=True, exist_ok=True)
    run_dir(tmp_path, spec).parent.write_text("not a folder")
    with pytest.raises(BadInput, match="a file where the protocol keeps run"):
        run_state(plan, tmp_path, spec)


def test_folder_a_run_left_with_both_its_gzip_and_its_plain_log_is_read_from_the_gzip(tmp_path):
    """A crash between writing a log's gzip (atomically: it is whole) and removing the plain file leaves both:
    the gzip wins. Here the plain files are a step short, so the one read shows; with the gzip gone, the plain
    file is read (the control)."""
    plan = ProtocolPlan(model="tiny", control="mxfp8-head", steps=10, overrides=(("val_every", 5),)).check()
    spec = plan.run("candidate")
    run = run_dir(tmp_path, spec)
    run.mkdir(parents=True)

    def write(steps):
        for name in COMPACTED:
            (run / name).write_text("".join(json.dumps({"step": s, "loss": 1.0, "layers": {}}) + "\n"
                                            for s in range(1, steps + 1)))

    write(plan.steps)
    compact_run(run)
    write(plan.steps - 1)
    assert metrics_path(tmp_path, spec) == run / "metrics.jsonl.gz"
    assert probes_path(tmp_path, spec) == run / "probes.jsonl.gz"
    assert run_state(plan, tmp_path, spec) == "done"
    for name in COMPACTED:
        (run / f"{name}.gz").unlink()
    assert metrics_path(tmp_path, spec) == run / "metrics.jsonl"
    assert probes_path(tmp_path, spec) == run / "probes.jsonl"
    assert run_state(plan, tmp_path, spec) == plan.steps - 1


def test_folder_a_finished_run_keeps_its_logs_gzip_compressed_a_stopped_one_plain(tmp_path, monkeypatch, small_plan):
    """When a piece finishes a run, its metrics and probes are replaced by their gzip (mtime 0), holding exactly
    what training logged, and the run reads as done; a piece stopped part-way leaves them plain, for the next
    piece to append to (the control)."""
    plan = small_plan(probe_every=2)
    open_protocol(plan, tmp_path)
    spec = plan.run("candidate")  # MXFP8: it writes probes too
    run = run_dir(tmp_path, spec)
    assert run_piece(plan, spec, tmp_path, stop_after_s=0.0, progress=False) is False
    assert {"metrics.jsonl", "checkpoint.pt"} <= {p.name for p in run.iterdir()} and not list(run.glob("*.gz"))
    assert metrics_path(tmp_path, spec) == run / "metrics.jsonl"
    assert 0 < run_state(plan, tmp_path, spec) < plan.steps

    logged, compact = {}, folder.compact_run

    def spy(f):  # what training logged, read just before compaction
        logged.update({n: (f / n).read_bytes() for n in COMPACTED if (f / n).exists()})
        compact(f)

    monkeypatch.setattr(folder, "compact_run", spy)
    assert run_piece(plan, spec, tmp_path, stop_after_s=None, progress=False)
    assert sorted(p.name for p in run.iterdir()) == ["config.json", "metrics.jsonl.gz", "probes.jsonl.gz"]
    assert set(logged) == set(COMPACTED)
    for name, plain in logged.items():
        packed = (run / f"{name}.gz").read_bytes()
        assert packed == gzip.compress(plain, mtime=0)  # the same run, the same bytes
        assert JsonlLog(run / f"{name}.gz").records() == [json.loads(line) for line in plain.splitlines()]
    assert [r["step"] for r in JsonlLog(metrics_path(tmp_path, spec)).records()] == list(range(1, plan.steps + 1))
    assert probes_path(tmp_path, spec) == run / "probes.jsonl.gz"
    assert run_state(plan, tmp_path, spec) == "done"


def test_folder_records_a_change_made_after_runs_finished_and_its_verdicts_say_so(tmp_path, val_loss_protocol):
    """A plan's verdicts are declared before its runs: a change once some had finished (here fewer candidate runs,
    leaving the plan whole) is recorded with the runs finished then, carried by every verdict and printed; a change
    before any run finished, or of the name alone (the controls), is not recorded, and --force, deleting the runs,
    deletes the record."""
    from convergence.protocol import render
    from convergence.protocol.judge import judge

    plan, write = val_loss_protocol
    assert "after" not in open_protocol(dataclasses.replace(plan, name="early"), tmp_path)
    assert folder.amendments(tmp_path) == []
    done = plan.levels()[2].runs()  # k = m = 3
    for spec in done:
        write(spec)
    assert "after" not in open_protocol(dataclasses.replace(plan, name="late"), tmp_path)  # a name judges nothing
    assert folder.amendments(tmp_path) == []
    fewer = dataclasses.replace(plan, name="early", candidate_replicates=3)
    line = open_protocol(fewer, tmp_path)
    assert f"after {len(done)} of its runs had finished" in line
    [change] = folder.amendments(tmp_path)
    assert change == {"changed": {"candidate_replicates": [4, 3]}, "finished_runs": [s.name for s in plan.runs()
                                                                                     if s in done]}
    verdicts = judge(fewer, tmp_path)
    assert all(r["protocol"]["amendments"] == [change] for r in verdicts.values())
    assert render.amendment_lines(verdicts) == [f"amended: candidate_replicates 4 -> 3 after {len(done)} run(s) had "
                                                "finished (not declared before them)"]
    open_protocol(fewer, tmp_path, force=True)
    assert folder.amendments(tmp_path) == [] and not (tmp_path / folder.AMENDMENTS_FILE).exists()


def test_folder_verdicts_of_a_plan_never_changed_carry_no_amendments(tmp_path, val_loss_protocol):
    plan, write = val_loss_protocol
    whole = plan.levels()[2]
    for spec in whole.runs():
        write(spec)
    from convergence.protocol.judge import judge

    verdicts = judge(whole, tmp_path)
    assert all("amendments" not in r["protocol"] for r in verdicts.values())
    from convergence.protocol import render

    assert render.amendment_lines(verdicts) == []
