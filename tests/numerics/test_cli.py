"""numerics.cli's process ends: a torchrun rank skips the interpreter's finalization, anything else does not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# an atexit handler stands for everything finalization runs (torch's destructors among them): it must not run in a
# rank, and the rank's last output must still arrive, with its exit code
SCRIPT = """
import atexit, sys
from numerics.cli import exit_process
atexit.register(lambda: print("finalized", flush=True))
print("last line of output", end="")
sys.stderr.write("and of errors")
exit_process(3)
"""


@pytest.mark.parametrize("rank", [True, False], ids=["torchrun-rank", "one-process"])
def test_exit_process_skips_finalization_only_in_a_torchrun_rank(rank):
    env = {k: v for k, v in os.environ.items() if k != "WORLD_SIZE"} | {"PYTHONPATH": str(ROOT)}
    if rank:
        env["WORLD_SIZE"] = "2"
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 3
    assert r.stdout.startswith("last line of output") and r.stderr.endswith("and of errors")
    assert ("finalized" in r.stdout) is not rank


# A Ctrl-C that arrives while source text runs (dataclasses and namedtuples build their methods with exec), caught,
# and the process's own exit code; both modules run as ``python -m``, where the interpreter's Ctrl-C mark decides
HANDLED_IN_PYTHON = """
import sys
try:
    exec("raise KeyboardInterrupt")
except KeyboardInterrupt:
    sys.exit(130)
"""
HANDLED_BY_RUN_MAIN = """
import sys
from numerics.cli import run_main
sys.exit(run_main(lambda argv: exec("raise KeyboardInterrupt"), []))
"""


def _as_module(tmp_path, name: str, text: str) -> subprocess.CompletedProcess:
    (tmp_path / f"{name}.py").write_text(text)
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", name], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.xfail(sys.version_info < (3, 14), strict=True,
                   reason="FINDINGS.md C2: CPython 3.11-3.13 end the process by SIGINT (-2) instead")
def test_python_exits_with_its_code_after_a_ctrl_c_caught_from_exec(tmp_path):
    """The interpreter's behaviour that run_main works around; the control for the test below."""
    assert _as_module(tmp_path, "handled_in_python", HANDLED_IN_PYTHON).returncode == 130


def test_a_ctrl_c_caught_from_exec_is_still_interrupted_and_exit_130(tmp_path):
    r = _as_module(tmp_path, "handled_by_run_main", HANDLED_BY_RUN_MAIN)
    assert (r.returncode, r.stderr) == (130, "interrupted\n")


def _closed_pipe():
    """A writable end whose reader is gone, as ``| head -1`` leaves stdout once head has its line."""
    read, write = os.pipe()
    os.close(read)
    return open(write, "w", buffering=1)  # line-buffered, as a terminal's: every print reaches the pipe


def test_a_command_whose_stdout_reader_went_away_finishes_with_its_own_exit_code(monkeypatch, tmp_path):
    """A reader that went away ends the output only: the command writes what it writes after its prints and exits
    with its own code (a BrokenPipeError would be a traceback and exit code 1, compare's not_equivalent)."""
    from numerics.cli import run_main

    def command(argv):
        print("verdict: EQUIVALENT")
        print("more lines nobody reads")
        (tmp_path / "result.json").write_text("{}")  # the work after the output
        return 3

    pipe = _closed_pipe()
    monkeypatch.setattr(sys, "stdout", pipe)
    assert run_main(command, []) == 3
    assert (tmp_path / "result.json").exists()
    print("and after it: no error either")  # the descriptor now goes to /dev/null
    monkeypatch.undo()
    pipe.close()  # left to the garbage collector, its ResourceWarning would fail whichever test runs then


def test_interrupted_starts_a_line_of_its_own_after_a_progress_bar(capsys):
    """A progress bar rewrites its line with carriage returns and no newline: "interrupted" starts a line of its
    own after it."""
    from numerics.cli import run_main

    def command(argv):
        sys.stderr.write("\r  bf16 [####......] 12/40 loss 4.1")
        raise KeyboardInterrupt

    assert run_main(command, []) == 130
    assert capsys.readouterr().err.endswith("12/40 loss 4.1\ninterrupted\n")

    def clean(argv):  # the control: after a whole line, no blank one
        sys.stderr.write("a whole line\n")
        raise KeyboardInterrupt

    assert run_main(clean, []) == 130
    assert capsys.readouterr().err == "a whole line\ninterrupted\n"


@pytest.mark.parametrize("argv, code, stream", [([], 2, "err"), (["--help"], 0, "out")])
def test_a_command_without_its_subcommand_prints_usage_to_stderr_and_exits_2(capsys, argv, code, stream):
    """A command without its subcommand is a usage error: the usage goes to stderr, not to the output a script
    reads; the control: --help is output, exit 0."""
    from convergence.__main__ import main as convergence_main
    from mxval.__main__ import main as mxval_main

    for main in (mxval_main, convergence_main):
        assert main(argv) == code
        cap = capsys.readouterr()
        assert getattr(cap, stream).startswith("usage: ") and not getattr(cap, "out" if stream == "err" else "err")


def test_a_subcommand_whose_library_is_missing_says_which_in_one_line(tmp_path, monkeypatch, capsys):
    """A subcommand whose module imports a library that is not installed: one line naming the library, exit 2;
    the control: a missing module of mxval's own packages is a bug in mxval and keeps its traceback."""
    from numerics.cli import run_command

    (tmp_path / "needs_missing_lib.py").write_text("import a_library_nobody_installed\n")
    (tmp_path / "numerics_broken_probe.py").write_text("import numerics.no_such_module\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert run_command("needs_missing_lib", []) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a_library_nobody_installed is not installed" in err
    with pytest.raises(ModuleNotFoundError, match="numerics.no_such_module"):
        run_command("numerics_broken_probe", [])
