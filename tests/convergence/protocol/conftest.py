"""Fixtures of the protocol's tests: small plans, one finished protocol folder made once per session and shared
by the xdist workers (tests copy it before changing it), a training stand-in for the scheduler's tests, pace
entries, and the command line's one-line refusals."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil

import pytest
import torch
from filelock import FileLock

from convergence.__main__ import main as convergence_main
from convergence.protocol.plan import ProtocolPlan

# The finished folder's plan: six tiny runs of 6 steps at batch 4 x seq 32, seconds each on 2 CPU cores, with
# probes every 2 steps. Design seed: the folder is judged, and judging refuses replicates that end as copies of
# their paired run (check_design); a rounding replicate this small (the batch rows permuted) can end bit-identical
# on a CPU whose fp32-accumulated sums round to the same bf16 (seen on AVX-512 BF16 at 6 steps), while a
# replicate at another seed starts from other weights on any machine. The recipe control (mxfp8-head), so that the
# folder holds a control's runs and probes; the planted control is judged from the same runs (test_declared).
FINISHED = ["--model", "tiny", "--steps", "6", "--replicates", "3", "--batch", "4", "--seq", "32", "--val-every", "2",
            "--val-batches", "3", "--probe-every", "2", "--mxfp8-kernel", "emulated", "--design", "seed",
            "--control", "mxfp8-head"]


def small(steps: int = 4, probe_every: int = 0, design: str = "rounding", **kw) -> ProtocolPlan:
    """Six tiny runs (of 4 steps unless told) on a small batch: seconds each on 2 CPU cores; the recipe control
    ``mxfp8-head`` unless told (the planted one has no runs of its own)."""
    over = (("batch", 4.0), ("seq", 32.0), ("val_every", 2.0), ("val_batches", 3.0),
            ("probe_every", float(probe_every)))
    return ProtocolPlan(model="tiny", steps=steps, replicates=3, design=design, mxfp8_kernel="emulated",
                        overrides=over, **({"control": "mxfp8-head"} | kw)).check()


@pytest.fixture
def small_plan():
    """``small_plan(steps=4, probe_every=0, design="rounding", **kw)``: a checked plan of six tiny runs."""
    return small


@pytest.fixture(scope="session")
def finished_protocol(tmp_path_factory) -> dict:
    """``{"out", "rc", "printed", "plan", "argv"}``: ``FINISHED`` run to its end by ``python -m convergence
    protocol`` once per session (read-only: a test that changes it works on ``copy_finished``'s copy)."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the session's directory
    out, record = root / "finished-protocol", root / "finished-protocol.json"
    with FileLock(str(root / "finished-protocol.lock")):
        if not record.exists():
            shutil.rmtree(out, ignore_errors=True)
            threads = torch.get_num_threads()
            torch.set_num_threads(1)  # two xdist workers share two cores
            printed = io.StringIO()
            try:
                with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
                    rc = convergence_main(["protocol", *FINISHED, "--out", str(out)])
            finally:
                torch.set_num_threads(threads)
            record.write_text(json.dumps({"rc": rc, "printed": printed.getvalue()}))
    return json.loads(record.read_text()) | {"out": out, "plan": small(steps=6, probe_every=2, design="seed"),
                                             "argv": [*FINISHED, "--out", str(out)]}


@pytest.fixture
def copy_finished(finished_protocol, tmp_path):
    """``copy_finished(name="p")``: a copy of the finished folder under ``tmp_path``, to change."""
    def copy(name: str = "p"):
        shutil.copytree(finished_protocol["out"], tmp_path / name)
        return tmp_path / name
    return copy


@pytest.fixture
def fake_training(monkeypatch):
    """Runs made in no time: ``schedule.run_piece`` writes a finished run's log (and compacts it) instead of
    training, and no token stream is loaded. For the scheduler's tests, whose property is which runs start and
    what their pieces record, not what training computes."""
    from convergence.protocol import folder, schedule

    def run_piece(plan, spec, out, *, stop_after_s, tokens=None, progress=True):
        log = folder.run_dir(out, spec) / "metrics.jsonl"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("".join(json.dumps({"step": s, "loss": 3.0}) + "\n" for s in range(1, plan.steps + 1)))
        folder.finish_run(log.parent)
        return True

    monkeypatch.setattr(schedule, "run_piece", run_piece)
    monkeypatch.setattr(schedule.data_mod, "load_tokens", lambda spec: None)


@pytest.fixture
def write_pace():
    """``write_pace(out, *entries)``: ``out/pace.jsonl`` holding these pace entries."""
    def write(out, *entries) -> None:
        (out / "pace.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    return write


@pytest.fixture
def refused(capsys):
    """``refused(*argv)``: ``python -m convergence protocol ARGV`` must exit 2 with one line on stderr; the line."""
    def run(*argv) -> str:
        capsys.readouterr()
        assert convergence_main(["protocol", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        return err
    return run
