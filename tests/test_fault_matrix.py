"""The faults a user meets in the first hour, for every command line: Ctrl-C while it works (SIGINT to its whole
process group, as a terminal sends it), a stdout whose reader went away (``| head -1``), an output that cannot be
written, an output that exists, an input that is missing.

Each case asserts the documented exit code (the command's own with a closed stdout, 130 for Ctrl-C, 2 for bad
input), no traceback, one ``error:`` line where it is an error, and nothing half-made: a refused command leaves
every file and folder as it was, an interrupted one leaves no process behind. The bad-input matrix
(tests/test_bad_input_matrix.py) holds the many ways an input can be wrong; this one, every command once per
fault. Ctrl-C and the subprocess pipe run real processes; the other faults run each command's main in this
process, a closed pipe included (a real one: its reader closed).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pytest

from convergence.__main__ import main as convergence_main
from convergence.protocol.plan import ProtocolPlan
from golden.__main__ import main as golden_main
from mxval.__main__ import main as mxval_main
from numerics.__main__ import main as numerics_main

ROOT = Path(__file__).resolve().parents[1]
VERDICT = ROOT / "golden" / "training" / "proxy_long_verdict__h200x2.json"
PROBES = ROOT / "golden" / "training" / "16b_ep2_bf16_probes__h200x2.jsonl"
MAINS = {"mxval": mxval_main, "numerics": numerics_main, "convergence": convergence_main, "golden": golden_main}
SMALL_RUN = ["--batch", "2", "--seq", "16", "--val-batches", "1", "--probe-every", "0"]  # a training run in seconds



class Command(NamedTuple):
    """A command line as the matrix runs it: ``argv`` works as given (exit ``code``); ``{out}`` is the ``output``
    ("file" or "dir") it creates under ``{o}/``, a folder made for each test (``writes``: whether it does so from
    these inputs); ``{in}`` is the input ``reads`` names, which the missing-input case takes away."""

    id: str
    package: str
    argv: list[str]
    code: int
    output: str | None = None
    reads: str | None = None
    writes: bool = True


COMMANDS = [
    Command("validate", "mxval", ["validate", "--levels", "curves", "--out", "{out}"], 0, "dir"),
    Command("report", "numerics", ["report", "--size", "tiny", "--subject", "torchao", "--out", "{out}"], 0, "dir"),
    Command("layers", "numerics", ["layers", "--config", "tiny", "--json", "{out}"], 0, "file"),
    Command("bench", "numerics", ["bench", "cast", "--elements", "4096", "--repeat", "1"], 0),
    Command("ep-check", "numerics", ["ep", "check", "--world", "2", "--cases", "0", "--no-edge", "--no-bad-input",
                                     "--json", "{out}"], 0, "file"),
    Command("train", "convergence", ["train", "--model", "tiny", "--recipe", "bf16", "--steps", "1", *SMALL_RUN,
                                     "--ckpt-every", "0", "--data", "{in}", "--out", "{out}"], 0, "dir", "data"),
    Command("compare", "convergence", ["compare", "{in}", "{candidate}", "--json", "{out}"], 3, "file", "baseline"),
    Command("calibrate", "convergence", ["calibrate", "--pairs", "1"], 0),
    Command("power", "convergence", ["power", "{in}", "--json", "{out}"], 0, "file", "verdict"),
    Command("probes", "convergence", ["probes", "{in}", "--json", "{out}"], 0, "file", "probes"),
    # --status --plot draws the last whole level of verdicts, and a plan without runs has none yet
    Command("protocol", "convergence", ["protocol", "--status", "--out", "{in}", "--plot", "{out}"], 0, "file",
            "protocol", writes=False),
    Command("convergence-bench", "convergence", ["bench", "--model", "tiny", "--device", "cpu", "--batch", "1",
                                                 "--seq", "16", "--steps", "1", "--warmup", "0", "--no-compile",
                                                 "--repeats", "1", "--json", "{out}"], 0, "file"),
    Command("profile-step", "convergence", ["profile-step", "--model", "tiny", "--device", "cpu", "--batch", "1",
                                            "--seq", "16", "--steps", "1", "--warmup", "0", "--json", "{out}"], 0,
            "file"),
    Command("golden", "golden", ["check", "--only", "recorded", "--root", "{in}"], 0, None, "golden"),
]
WRITING = [c for c in COMMANDS if c.output]
READING = [c for c in COMMANDS if c.reads]


def _inputs(tmp: Path) -> dict[str, Path]:
    """What the commands read: a small text corpus, two runs' metrics, a verdict, probes, a protocol folder (its
    plan, no runs yet) and golden/ (read only)."""
    from convergence.curves.synthetic import SyntheticSpec, make_runs

    words = "alpha beta gamma delta loss curve expert token rank bits".split()
    data = tmp / "corpus.txt"
    data.write_text("\n\n".join(" ".join(words[(i * 7 + j * 3) % 10] for j in range(300)) for i in range(24)))
    (base,), cand = make_runs(SyntheticSpec(steps=2_000, noise=0.005), 11)
    runs = {}
    for name, curve in (("baseline", base), ("candidate", cand)):
        runs[name] = tmp / f"{name}.jsonl"
        runs[name].write_text("".join(json.dumps({"step": s, "loss": v}) + "\n"
                                      for s, v in zip(curve.steps.tolist(), curve.values.tolist())))
    protocol = tmp / "protocol"
    protocol.mkdir()
    (protocol / "protocol.json").write_text(json.dumps(ProtocolPlan(model="tiny", steps=20).as_dict()))
    return {"data": data, **runs, "verdict": VERDICT, "probes": PROBES, "protocol": protocol,
            "golden": ROOT / "golden"}


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and folder (None) under ``root``."""
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))}


def _argv(argv: list[str], values: dict[str, Path]) -> list[str]:
    return [a.format(**{k: str(v) for k, v in values.items()}) for a in argv]


def _call(package: str, argv: list[str]) -> int:
    try:
        return MAINS[package](argv)
    except SystemExit as exc:  # argparse's usage errors leave through SystemExit(2)
        return exc.code


def _setup(tmp_path, cmd: Command) -> dict[str, Path]:
    """The values of ``cmd.argv``'s placeholders, its inputs made under ``tmp_path``."""
    inputs = _inputs(tmp_path)
    (tmp_path / "o").mkdir()
    suffix = {"file": ".png" if cmd.id == "protocol" else ".json", "dir": ""}.get(cmd.output, "")
    return {**inputs, "out": tmp_path / "o" / f"result{suffix}", "o": tmp_path / "o",
            "in": inputs.get(cmd.reads, tmp_path)}


def _refused(capsys, tmp_path, package: str, argv: list[str]) -> str:
    """The command refused in one ``error:`` line, exit code 2, and changed nothing under ``tmp_path``."""
    before = _tree(tmp_path)
    code = _call(package, argv)
    cap = capsys.readouterr()
    assert code == 2, (argv, code, cap.err)
    assert cap.err.count("\n") == 1 and "error: " in cap.err and "Traceback" not in cap.err + cap.out, cap.err
    assert _tree(tmp_path) == before, argv
    return cap.err


# ---------------------------------------------------------------- faults of one process

def _closed_pipe():
    """A stdout whose reader is gone, as ``| head -1`` leaves it once head has its line (line-buffered: every
    line reaches the pipe at once)."""
    read, write = os.pipe()
    os.close(read)
    return open(write, "w", buffering=1)


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: c.id)
def test_a_closed_stdout_ends_the_output_not_the_command(cmd, tmp_path, capsys, monkeypatch):
    values = _setup(tmp_path, cmd)
    stdout = _closed_pipe()
    monkeypatch.setattr(sys, "stdout", stdout)
    code = _call(cmd.package, _argv(cmd.argv, values))
    stdout.close()
    err = capsys.readouterr().err
    assert code == cmd.code and "Traceback" not in err and "BrokenPipe" not in err, (code, err[-2000:])
    assert values["out"].exists() is (cmd.output is not None and cmd.writes)  # what it writes without the pipe


@pytest.mark.parametrize("cmd", WRITING, ids=lambda c: c.id)
def test_an_output_that_cannot_be_written_is_one_line_and_makes_nothing(cmd, tmp_path, capsys):
    values = _setup(tmp_path, cmd)
    (tmp_path / "o").rmdir()
    (tmp_path / "o").write_text("a file where the output's folder should be")
    _refused(capsys, tmp_path, cmd.package, _argv(cmd.argv, values))


@pytest.mark.parametrize("cmd", WRITING, ids=lambda c: c.id)
def test_an_existing_output_is_not_replaced_without_force(cmd, tmp_path, capsys):
    values = _setup(tmp_path, cmd)
    out = values["out"]
    if cmd.output == "file":
        out.write_text("a user's file\n")
    else:  # a folder holding what this command would write there
        (out / "bf16").mkdir(parents=True)
        for name in ("summary.json", "report.json", "bf16/metrics.jsonl"):
            (out / name).write_text("a user's file\n")
    err = _refused(capsys, tmp_path, cmd.package, _argv(cmd.argv, values))
    assert "--force" in err, err


@pytest.mark.parametrize("cmd", READING, ids=lambda c: c.id)
def test_a_missing_input_is_one_line_and_makes_nothing(cmd, tmp_path, capsys):
    values = _setup(tmp_path, cmd)
    values["in"] = tmp_path / "no_such_input"
    _refused(capsys, tmp_path, cmd.package, _argv(cmd.argv, values))


def test_train_resume_with_nothing_to_resume_is_one_line_and_makes_no_folder(tmp_path, capsys):
    """--resume over a folder with nothing to resume (a mistyped --out) is refused, not a run from step 1; and data
    found bad after --out was made leaves no empty --out behind."""
    argv = ["train", "--model", "tiny", "--recipe", "bf16", "--steps", "2", "--out", str(tmp_path / "typo" / "run")]
    err = _refused(capsys, tmp_path, "convergence", [*argv, "--resume"])
    assert "holds no run of bf16 to continue" in err
    (tmp_path / "empty.txt").write_text("")
    _refused(capsys, tmp_path, "convergence", [*argv, "--data", str(tmp_path / "empty.txt")])  # read after --out


def test_validate_interrupted_in_its_curves_level_writes_a_partial_report_and_says_so(tmp_path, capsys, monkeypatch):
    """The last level, in this process: a real SIGINT arrives while the curves level judges (its training level
    stands in, passed: the real one takes minutes here; the other levels get a real Ctrl-C below)."""
    from mxval.validate import run as validate
    from mxval.validate.ladder import Check, LevelResult

    def judged(*_):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the KeyboardInterrupt comes before this ends
        raise AssertionError("SIGINT did not interrupt the level")

    monkeypatch.setitem(validate.RUNNERS, "training", lambda *_: LevelResult("training", "pass", "stood in",
                                                                             (Check("runs", "pass"),)))
    monkeypatch.setattr("convergence.protocol.judge.judge", judged)
    out = tmp_path / "v"
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal (_sigint_as_at_a_terminal)
    try:
        assert mxval_main(["validate", "--quick", "--levels", "training,curves", "--out", str(out)]) == 130
    finally:
        signal.signal(signal.SIGINT, before)
    err = capsys.readouterr().err
    assert err.endswith("\ninterrupted\n") and "Traceback" not in err, err
    assert f"[2/2 curves] INTERRUPTED (Ctrl-C); wrote a partial report of the levels that finished: {out}" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] == "curves" and summary["levels"]["training"]["status"] == "pass"


# ---------------------------------------------------------------- faults of real processes

def _env() -> dict[str, str]:
    drop = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    return {k: v for k, v in os.environ.items() if k not in drop} | {"PYTHONPATH": str(ROOT)}


def _sigint_as_at_a_terminal() -> None:
    """SIGINT's default action, as a command started from a terminal has it: a shell ignores SIGINT in what it
    starts in the background, the ignoring is inherited, and Python then installs no KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt(argv: list[str], marker: str, timeout_s: float = 240.0) -> tuple[int, str]:
    """``python -m ARGV`` in a process group of its own, and SIGINT to the whole group once its stderr shows
    ``marker`` (a terminal's Ctrl-C reaches every process of the foreground group); its exit code and stderr,
    after checking that no process of the group outlives it."""
    proc = subprocess.Popen([sys.executable, "-m", *argv], cwd=ROOT, env=_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=_sigint_as_at_a_terminal)
    err, deadline = b"", time.monotonic() + timeout_s
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stderr, selectors.EVENT_READ)
            while marker.encode() not in err:
                assert time.monotonic() < deadline and proc.poll() is None, (marker, err.decode()[-3000:])
                if sel.select(timeout=0.5):
                    err += os.read(proc.stderr.fileno(), 1 << 16)
    except BaseException:  # the marker never came: nothing of it is left to a later test (its pipe, its group)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    os.killpg(proc.pid, signal.SIGINT)
    rest = proc.communicate(timeout=timeout_s)[1]
    text = (err + rest).decode()
    for _ in range(100):  # the ranks and workers it started end with it (ProcessLookupError: none is left)
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"processes of {argv} outlived it")
    return proc.returncode, text


def _interrupted_cleanly(code: int, err: str) -> None:
    assert code == 130 and "Traceback" not in err, err[-3000:]
    assert err.endswith("\ninterrupted\n") or err == "interrupted\n", err[-500:]  # a line of its own, the last


def test_ctrl_c_in_the_communication_check_is_rank_0s_one_line(tmp_path):
    """The spawned ranks get the terminal's SIGINT too: rank 0 alone answers it, and ends them."""
    code, err = _interrupt(["numerics.ep", "check", "--world", "2", "--cases", "400"], " cases, ")
    _interrupted_cleanly(code, err)


@pytest.mark.parametrize("level, marker, every", [
    ("tensor", "[1/1 tensor]", []), ("layer", "[1/1 layer]", []), ("training", "[1/1 training]", []),
    # a case count, its ranks running, with every step printed: the quick level can end within the default 5 s
    # between progress lines, before any is shown
    ("communication", " cases, ", ["--progress-every", "0"])])
def test_ctrl_c_in_each_level_of_validate_stops_it_with_a_partial_report(tmp_path, level, marker, every):
    out = tmp_path / "v"
    code, err = _interrupt(["mxval", "validate", "--quick", "--levels", level, "--out", str(out), *every], marker)
    _interrupted_cleanly(code, err)
    assert f"INTERRUPTED (Ctrl-C); wrote a partial report of the levels that finished: {out}" in err
    assert json.loads((out / "summary.json").read_text())["interrupted"] == level and (out / "report.html").is_file()


def test_ctrl_c_in_training_leaves_the_progress_bar_its_line(tmp_path):
    """"interrupted" starts a line of its own after the progress bar (which rewrites its line, no newline)."""
    data = _inputs(tmp_path)["data"]
    code, err = _interrupt(["convergence", "train", "--model", "tiny", "--recipe", "bf16", "--steps", "400",
                            *SMALL_RUN, "--data", str(data), "--out", str(tmp_path / "run")], "bf16 [")
    _interrupted_cleanly(code, err)


def test_ctrl_c_in_a_parallel_protocol_ends_its_workers_and_is_one_line(tmp_path):
    data = _inputs(tmp_path)["data"]
    code, err = _interrupt(["convergence", "protocol", "--model", "tiny", "--steps", "20", "--replicates", "2",
                            "--parallel", "2", "--data", str(data), "--out", str(tmp_path / "p")],
                           "piece started on worker 1")
    _interrupted_cleanly(code, err)


def test_compare_into_a_closed_pipe_keeps_its_verdicts_exit_code_and_writes_its_files(tmp_path):
    """``compare ... --json J --plot P | head -1``: the verdict's exit code (not 1, which reads as not_equivalent),
    both files written, no traceback. A real pipe whose reader closed, in a real process."""
    inputs = _inputs(tmp_path)
    runs = [str(inputs["baseline"]), str(inputs["candidate"])]
    verdict = convergence_main(["compare", *runs])  # the exit code with a reader
    read, write = os.pipe()
    os.close(read)
    try:
        closed = subprocess.run([sys.executable, "-m", "convergence", "compare", *runs, "--json", str(tmp_path / "J"),
                                 "--plot", str(tmp_path / "P.png")], cwd=ROOT, env=_env(), stdout=write,
                                stderr=subprocess.PIPE, text=True, timeout=240)
    finally:
        os.close(write)
    assert closed.returncode == verdict and "Traceback" not in closed.stderr, closed.stderr[-2000:]
    assert json.loads((tmp_path / "J").read_text())["verdict"] in ("equivalent", "not_equivalent", "inconclusive")
    assert (tmp_path / "P.png").read_bytes()[:4] == b"\x89PNG"
