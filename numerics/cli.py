"""Shared plumbing for the suite's command lines: one clear line and exit code 2 on bad input."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from numerics.errors import SEED_MAX, BadInput, RankFailed
from numerics.rank_exit import exit_rank

EXIT_BAD_INPUT = 2


class CLIError(BadInput):
    """Bad input found by a command line itself (an option, a path): printed as one line, exit code 2."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (with a hint) instead of usage + message."""

    def error(self, message: str):  # noqa: D401 - argparse API
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(EXIT_BAD_INPUT)


def seed_arg(text: str) -> int:
    """argparse ``type`` of a seed: an integer from 0 to ``SEED_MAX``, refused while the command line is parsed
    (a larger one would crash inside torch after the command has written its output folder)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"must be from 0 to {SEED_MAX}, got {value}")
    return value


def run_labels(names: Sequence[str], runs: Sequence) -> list[str]:
    """A command's ``--name`` labels: given once per run, in order, or not at all (each run then labelled by its
    path)."""
    if names and len(names) != len(runs):
        raise CLIError(f"--name given {len(names)} times for {len(runs)} runs: one per run, or none")
    labels = list(names) or [str(r) for r in runs]
    twice = next((n for i, n in enumerate(labels) if n in labels[:i]), None)
    if twice is not None:  # one label would stand for two runs in the report, the figure and the JSON
        raise CLIError(f"two runs named {twice!r}: pass --name for each, each its own")
    return labels


def run_report_parser(prog: str, description: str, *, reads: str, plot: str, json: str) -> ArgumentParser:
    """The command line of a report over runs (``convergence probes``, ``convergence profile``): RUN paths, one
    ``--name`` per run, ``--plot``, ``--json`` and ``--force``; ``reads`` names the file a run folder holds."""
    p = ArgumentParser(prog=prog, description=description)
    p.add_argument("runs", nargs="+", type=Path, help=f"a {reads}, or a run folder (<out>/<recipe>) holding one")
    p.add_argument("--name", action="append", default=[], help="a label per run, in order (default: its path)")
    p.add_argument("--plot", type=Path, metavar="OUT.png", help=plot)
    p.add_argument("--json", type=Path, metavar="OUT", help=json)
    p.add_argument("--force", action="store_true", help="overwrite an existing --plot or --json file")
    return p


def parse_run_report(parser: ArgumentParser, argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """(arguments, one label per run) of a ``run_report_parser`` command line, its --plot and --json checked
    writable before any run is read: bad input is one line before the work."""
    from numerics.files import check_distinct, check_writable

    args = parser.parse_args(argv)
    names = run_labels(args.name, args.runs)
    check_distinct(plot=args.plot, json=args.json, inputs=args.runs)
    for out in (args.plot, args.json):
        if out:
            check_writable(out, force=args.force)
    return args, names


class KnownBenignLogs(logging.Filter):
    """Drops exactly two log records every command would otherwise print before its own output:

    * torchao's ``Failed to load .../torchao/_C_mxfp8...so`` (and the other ``_C*.so``): its compiled
      MX / CUTLASS kernels for SM100, which the emulated and fast paths never call, do not load on this
      machine. Kept visible on an SM100 GPU, where the ``real`` kernels need them.
    * torch's ``<enum 'KernelPreference'> is an Enum subclass and is now natively supported by
      torch.compile ...``: torchao 0.18 registers its config enums as pytree constants, which torch 2.11+
      deprecates; nothing to do on our side.
    Every other record of those loggers passes.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if record.name == "torchao" and msg.startswith("Failed to load ") and "/torchao/_C" in msg:
            return _on_sm100()
        if record.name == "torch.utils._pytree" and "is an Enum subclass and is now natively supported" in msg:
            return not any(f"<enum '{e}'>" in msg for e in ("KernelPreference", "ScaleCalculationMode"))
        return True


def _on_sm100() -> bool:
    """Whether this process's current GPU is SM100 (asked only when torchao reports a library it could
    not load, so no CUDA context is created for it)."""
    try:
        import torch

        return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 10
    except Exception:  # no driver: no real kernels to miss
        return False


def quiet_known_benign_logs() -> None:
    """Install ``KnownBenignLogs`` on torchao's and torch's pytree loggers (once; entry points only)."""
    for name in ("torchao", "torch.utils._pytree"):
        log = logging.getLogger(name)
        if not any(isinstance(f, KnownBenignLogs) for f in log.filters):
            log.addFilter(KnownBenignLogs())


class _Output:
    """``sys.stdout`` or ``sys.stderr`` while a command runs (``run_main``), with two things the stream itself
    does not know:

    * a reader that went away (``| head -1`` closed the pipe) ends the output, not the command: the first write
      that fails with EPIPE points the descriptor at /dev/null (what was buffered goes there too) and every write
      after it succeeds, so the command finishes, writes its files and exits with its own code (Python's own
      BrokenPipeError would end it with a traceback and exit code 1, compare's "not_equivalent", or 120 at exit).
    * whether its last line is still open (a progress bar rewriting itself with ``\\r``), so that the command's last
      word (an error, "interrupted") starts on a line of its own.
    """

    def __init__(self, stream):
        self._stream, self.gone, self.open_line = stream, False, False

    def _went_away(self) -> None:
        self.gone = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
            self._stream.flush()  # what was buffered, to /dev/null
        except (OSError, ValueError):  # no descriptor (an in-memory stream): nothing is written there any more
            pass

    def write(self, text: str) -> int:
        if text:
            self.open_line = not text.endswith("\n")
        if not self.gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._went_away()
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._went_away()

    def end_line(self) -> None:
        """A newline when the last line written is still open."""
        if self.open_line:
            self.write("\n")

    def __getattr__(self, name):  # isatty, fileno, encoding, buffer...: the stream's own
        return getattr(self._stream, name)


def say(line: str) -> None:
    """One line on stderr, on a line of its own (after a progress bar that is still open)."""
    if isinstance(sys.stderr, _Output):
        sys.stderr.end_line()
    sys.stderr.write(line + "\n")


def _unmark_ctrl_c() -> None:
    """Let the process end with the code returned for a Ctrl-C that was handled. CPython 3.11-3.13 mark the
    process as killed by Ctrl-C when a KeyboardInterrupt leaves an ``exec`` or ``eval`` of source text (dataclasses
    and namedtuples build their methods that way, so a Ctrl-C during an import can), even once it is caught; under
    ``python -m`` the mark then overrides ``sys.exit(130)`` and the process kills itself with SIGINT. Running any
    source text clears the mark in those versions; later ones set it only for an uncaught KeyboardInterrupt
    (FINDINGS.md, C2)."""
    exec("")


def run_main(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Run a CLI ``main``; user errors become one stderr line and exit code 2, never a traceback; Ctrl-C is the
    line "interrupted" and exit code 130; a closed stdout ends the output, not the command (``_Output``)."""
    quiet_known_benign_logs()
    outer = not isinstance(sys.stdout, _Output)  # run_main inside run_main (a subcommand): the outer one guards
    if outer:
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Output(sys.stdout), _Output(sys.stderr)
    try:
        return int(main(argv) or 0)
    except BadInput as exc:  # CLIError and every library error for bad input
        say(f"error: {exc}")
        return EXIT_BAD_INPUT
    except (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError) as exc:
        say(f"error: {exc.strerror or exc}: {exc.filename}")
        return EXIT_BAD_INPUT
    except RankFailed as exc:  # a rank of a distributed run died: a failed run, not bad input
        say(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        say("interrupted")
        _unmark_ctrl_c()
        return 130
    finally:
        if outer:
            for guarded in (sys.stdout, sys.stderr):
                if isinstance(guarded, _Output):
                    guarded.flush()  # a reader gone since the last write: found here, not at the interpreter's exit
            sys.stdout, sys.stderr = saved


def exit_process(code: int) -> NoReturn:
    """``sys.exit(code)``, or ``exit_rank(code)`` in a torchrun rank (``WORLD_SIZE`` set, as
    ``convergence train --ep`` reads it): the end of every command that torchrun can launch."""
    if "WORLD_SIZE" in os.environ:
        exit_rank(code)
    sys.exit(code)


_OWN_PACKAGES = frozenset({"numerics", "convergence", "golden", "mxval"})


def _importing(target: str) -> Callable[[Sequence[str] | None], int]:
    """The ``main`` of ``module`` or ``module:function``, imported when called: inside ``run_main``, so a Ctrl-C
    while its libraries load is "interrupted" too, and an error there one line."""

    def command(argv: Sequence[str] | None) -> int:
        module, _, function = target.partition(":")
        try:
            loaded = importlib.import_module(module)
        except ModuleNotFoundError as exc:  # a library it needs, not one of ours: say so, not a traceback
            missing = (exc.name or "").partition(".")[0]
            if not missing or missing in _OWN_PACKAGES:
                raise
            raise CLIError(f"{missing} is not installed, and {module} needs it: pip install -e . in the "
                           f"repository (README's quickstart)") from exc
        return getattr(loaded, function or "main")(argv)

    return command


def run_command(target: str, argv: Sequence[str] | None = None) -> int:
    """``run_main`` of the ``main`` of ``module`` or ``module:function``, imported inside it."""
    return run_main(_importing(target), argv)


def print_usage(usage: str, entries: dict[str, str], *, asked: bool) -> int:
    """A command's list of subcommands: on stdout with exit code 0 when asked for (``--help``), else (no
    subcommand given) on stderr with exit code 2, as argparse does for a missing argument."""
    width = max(map(len, entries)) + 2
    text = f"{usage}\n\n" + "".join(f"  {name:<{width}} {help_}\n" for name, help_ in entries.items())
    (sys.stdout if asked else sys.stderr).write(text)
    return 0 if asked else EXIT_BAD_INPUT


def dispatch(prog: str, subcommands: dict[str, tuple[str, str]], argv: Sequence[str] | None = None) -> int:
    """``prog SUBCOMMAND ARGS``: import the subcommand's module lazily and run its ``main(ARGS)``.

    ``subcommands`` maps a name to (``module`` or ``module:function``, one-line help); the function is
    ``main`` unless named. ``prog --help`` lists them (stdout, exit 0), bare ``prog`` too (stderr, exit 2).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        return print_usage(f"usage: {prog} {{{','.join(subcommands)}}} ...",
                           {name: text for name, (_, text) in subcommands.items()}, asked=bool(args))
    name, rest = args[0], args[1:]
    if name not in subcommands:
        sys.stderr.write(f"error: unknown subcommand {name!r}; choose from {', '.join(subcommands)}\n")
        return EXIT_BAD_INPUT
    return run_command(subcommands[name][0], rest)
