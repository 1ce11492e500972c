"""mxval validate: the whole ladder on this machine, and a report.

Runs, in order, every level this machine can run — tensor, layer, communication, training, curves
(``mxval.validate.levels``; sizes from ``mxval.validate.ladder.make_plan``) — and writes
``results/<timestamp>/`` with ``report.md``, a self-contained ``report.html`` (figures embedded),
``summary.json`` (per level: status, reason, how to enable what was skipped, key numbers; versions
and hardware), each level's full output under ``<level>/``, figures under ``figures/`` and each
level's log under ``logs/``. Exit code 0 when no level failed (inconclusive and skipped levels are
named in the report), 1 when one did, 2 on bad input (an existing or unwritable ``--out``).

Public: ``validate(plan, out, levels, console, progress_every_s=5.0) -> dict`` (the summary), ``main(argv)``.
"""

from __future__ import annotations

import datetime
import io
import json
import os
import re
import shutil
import sys
import time
import traceback
from collections.abc import Sequence
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import replace
from pathlib import Path

from mxval.validate import levels as lv
from mxval.validate.ladder import LEVELS, Check, LadderPlan, LevelResult, level_status, make_plan, skipped
from mxval.validate.report import MARK
from numerics.cli import ArgumentParser, CLIError, seed_arg
from numerics.files import atomic_write, writable_dir

RUNNERS = {"tensor": lv.run_tensor, "layer": lv.run_layer, "communication": lv.run_communication,
           "training": lv.run_training, "curves": lv.run_curves}
NEEDS = {"curves": "training"}  # a level that reads another level's output


class Display:
    """One line per level; the current step overwrites itself on a terminal, and is printed at most
    every ``every_s`` seconds otherwise (CI logs)."""

    def __init__(self, stream, every_s: float = 5.0):
        self.stream, self.every_s = stream, every_s
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.prefix, self.last = "", 0.0

    def _line(self, text: str) -> None:
        self.stream.write(("\r\033[K" if self.tty else "") + text + "\n")
        self.stream.flush()

    def level(self, i: int, n: int, name: str) -> None:
        self.prefix = f"[{i + 1}/{n} {name}]"
        self._line(f"{self.prefix} {LEVELS[name]}")
        self.last = time.monotonic()

    def step(self, text: str) -> None:
        text = " ".join(text.split())
        if not text:
            return
        if self.tty:
            self.stream.write(f"\r\033[K{self.prefix} {text}"[: os.get_terminal_size(self.stream.fileno()).columns])
            self.stream.flush()
        elif time.monotonic() - self.last >= self.every_s:
            self._line(f"{self.prefix}   {text}")
            self.last = time.monotonic()

    def done(self, res: LevelResult) -> None:
        self._line(f"{self.prefix} {MARK[res.status]} {res.summary} ({res.seconds:.0f} s)")

    def interrupted(self, report: Path) -> None:
        """The level's line when Ctrl-C stopped it (over its progress line on a terminal), and the report kept."""
        self._line(f"{self.prefix} INTERRUPTED (Ctrl-C); wrote a partial report of the levels that finished: {report}")


class _StepStream(io.TextIOBase):
    """A level's stderr: everything goes to its log; each line (or carriage-returned progress bar)
    becomes the current step of the display."""

    def __init__(self, log, step):
        self.log, self.step = log, step

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self.log.write(s)
        for seg in re.split(r"[\r\n]", s):
            if seg.strip():
                self.step(seg)
        return len(s)

    def flush(self) -> None:
        self.log.flush()


def hardware(plan: LadderPlan) -> dict:
    import torch

    from numerics import environment

    mem = None
    try:
        mem = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    hw = {"tag": environment.hardware_tag(), "device": plan.device, "cpu_count": os.cpu_count(), "memory_gib": mem,
          "gpus": [torch.cuda.get_device_name(i) for i in range(plan.gpus)]}
    if plan.gpus:
        hw["capability"] = list(torch.cuda.get_device_capability(0))
    return hw


def _run_level(name: str, plan: LadderPlan, out: Path, display: Display, done: dict[str, LevelResult]) -> LevelResult:
    need = NEEDS.get(name)
    if need and (need not in done or done[need].status == "fail" or done[need].status == "skipped"):
        outcome = ("were not run" if need not in done
                   else "failed" if done[need].status == "fail" else "were skipped")
        why = f"needs the {need} level's runs, which {outcome}"
        return skipped(name, why, f"run the {need} level too (it is in the default --levels)")
    t0 = time.monotonic()
    (out / "logs").mkdir(exist_ok=True)
    with open(out / "logs" / f"{name}.log", "w") as log, redirect_stdout(log), \
            redirect_stderr(_StepStream(log, display.step)):
        try:
            res = RUNNERS[name](plan, out, display.step)
        except Exception as exc:  # a level that crashes is a failed level; the ladder goes on
            traceback.print_exc(file=log)
            msg = f"stopped with {type(exc).__name__}: {exc}".splitlines()[0]
            res = LevelResult(name, "fail", msg, (Check(name, "fail", msg),),
                              enable=f"the full traceback is in logs/{name}.log")
    return replace(res, seconds=round(time.monotonic() - t0, 1))


def validate(plan: LadderPlan, out: Path, levels: Sequence[str], console, progress_every_s: float = 5.0) -> dict:
    """Run ``levels`` (in ladder order) into ``out`` (which exists and is empty); returns the summary.
    ``progress_every_s``: the most often a level's progress is printed where ``console`` is not a terminal."""
    from mxval.validate import report as validate_report
    from numerics.environment import describe

    started = datetime.datetime.now().astimezone()
    t0 = time.monotonic()
    display = Display(console, progress_every_s)
    chosen = [n for n in LEVELS if n in levels]
    done: dict[str, LevelResult] = {}
    interrupted = None
    try:
        for i, name in enumerate(chosen):
            display.level(i, len(chosen), name)
            done[name] = _run_level(name, plan, out, display, done)
            display.done(done[name])
    except KeyboardInterrupt:  # write what finished, marked as such, then stop as asked
        interrupted = next(n for n in chosen if n not in done)
    not_run = {n: skipped(n, "interrupted (Ctrl-C) before this level finished", "run it again")
               if interrupted and n in chosen
               else skipped(n, "not selected (--levels)", "leave it in --levels (the default runs all)")
               for n in LEVELS if n not in done}
    results = [done.get(n) or not_run[n] for n in LEVELS]
    overall = level_status([Check(r.level, r.status) for r in results])
    if interrupted and overall in ("pass", "skipped"):  # levels asked for were not judged: not a pass (a CI
        overall = "inconclusive"                        # reading summary.json's status took one for it)
    summary = {
        "tool": "mxval validate", "format": 1, "status": overall,
        "exit_code": 130 if interrupted else 1 if overall == "fail" else 0,  # 130: as the shell reports Ctrl-C
        "started": started.isoformat(timespec="seconds"), "seconds": round(time.monotonic() - t0, 1),
        "plan": plan.as_dict(), "environment": describe(), "hardware": hardware(plan),
        "levels": {r.level: r.record() for r in results},
        "interrupted": interrupted,  # the level that was running when Ctrl-C came, or None
    }
    atomic_write(out / "summary.json", json.dumps(summary, indent=1, default=str) + "\n", force=True)
    validate_report.write(summary, out)
    if interrupted:
        display.interrupted(out / "report.html")
        raise KeyboardInterrupt
    return summary


# written first into a results folder: one a kill left without summary.json is still validate's to --force
STARTED = ".mxval-validate"


def _default_out() -> Path:
    stamp = datetime.datetime.now().strftime("%Y-%m-%dT%H-%M-%S")
    out, n = Path("results") / stamp, 1
    while out.exists():  # two runs in one second: never reuse a folder
        n += 1
        out = Path("results") / f"{stamp}-{n}"
    return out


def prepare_out(out: Path | None, *, force: bool = False) -> Path:
    """Create the results folder; an existing non-empty one (unless ``force``: then it is emptied) or one
    that cannot be written is bad input."""
    out = _default_out() if out is None else out
    if out.exists() and not out.is_dir():
        raise CLIError(f"--out {out} is a file, not a folder")
    if out.exists() and any(out.iterdir()):
        if not force:
            raise CLIError(f"{out} already exists and is not empty; mxval never overwrites results: choose another "
                           "--out, or pass --force to replace what is there")
        if not (out / "summary.json").exists() and not (out / STARTED).exists():
            raise CLIError(f"--force: {out} holds no mxval validate results (no summary.json); refusing to empty it")
        shutil.rmtree(out)
    out = writable_dir(out, what="results folder")
    (out / STARTED).write_text("mxval validate wrote into this folder; summary.json says how it ended (none: killed)\n")
    return out


def _gpus_and_deep_ep() -> tuple[int, bool]:
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < 2:
        return gpus, False
    from numerics.ep.deepep import import_deep_ep

    try:
        import_deep_ep()
    except ImportError:
        return gpus, False
    return gpus, True


def _check_evaluations(plan) -> None:
    """The curves level compares validation losses at two evaluations at the least (``evaluation_steps``): a
    --steps that gives fewer is refused before anything runs, saying the fewest that work (the protocol refuses it
    too, naming its own flags)."""
    from convergence.protocol.plan import ProtocolPlan
    from convergence.train.loop import evaluation_steps

    every = ProtocolPlan(model=plan.train_model, steps=plan.train_steps).train_defaults()["val_every"]
    if len(evaluation_steps(plan.train_steps, every)) < 2:
        raise CLIError(f"--steps {plan.train_steps}: the {plan.train_model} model is evaluated every {every} steps "
                       f"and at the last, so a run gives one evaluation, and the curves level compares two at the "
                       f"least: --steps {every + 1} or more")


def main(argv: Sequence[str] | None = None) -> int:
    p = ArgumentParser(prog="mxval validate", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None,
                   help="results folder (default results/<timestamp>); must not exist")
    p.add_argument("--levels", action="append", default=None,
                   help=f"comma-separated subset of {','.join(LEVELS)} (repeatable; default all)")
    p.add_argument("--quick", action="store_true", help="smaller sizes at every level (a smoke test, ~1 min on CPU)")
    p.add_argument("--steps", type=int, default=None, help="training steps per run (default 200)")
    p.add_argument("--seed", type=seed_arg, default=0)
    p.add_argument("--strict", action="store_true", help="known findings (FINDINGS.md) fail their level")
    p.add_argument("--force", action="store_true", help="replace an existing results folder of an earlier run")
    p.add_argument("--progress-every", type=float, default=5.0, metavar="SECONDS",
                   help="where stderr is not a terminal (a CI log), print a level's progress at most this often "
                        "(default 5; 0: every step)")
    args = p.parse_args(argv)
    if not 0 <= args.progress_every < 1e6:  # NaN too
        raise CLIError(f"--progress-every {args.progress_every:g}: seconds >= 0")
    given = ",".join(args.levels or LEVELS)  # every --levels counts, not only the last one given
    levels = [v for v in given.split(",") if v]
    unknown = [v for v in levels if v not in LEVELS]
    if unknown or not levels:
        raise CLIError(f"--levels {given!r}: choose from {', '.join(LEVELS)}")
    if args.steps is not None and args.steps < 10:
        raise CLIError(f"--steps {args.steps}: at least 10 (a curve needs points to compare)")
    if args.steps is not None and not {"training", "curves"} & set(levels):  # summary.json had recorded them
        raise CLIError(f"--steps sizes the training and curves levels, and --levels {given} runs neither")
    gpus, deep_ep = _gpus_and_deep_ep()
    plan = make_plan(gpus=gpus, deep_ep=deep_ep, quick=args.quick, steps=args.steps, seed=args.seed,
                     strict=args.strict)
    if args.steps is not None and "curves" in levels:
        _check_evaluations(plan)
    out = prepare_out(args.out, force=args.force)
    console = sys.stderr
    console.write(f"mxval validate -> {out}  ({plan.device}, {gpus} GPU(s){', deep_ep' if deep_ep else ''})\n")
    summary = validate(plan, out, levels, console, args.progress_every)
    for name, rec in summary["levels"].items():
        print(f"{name:<14} {MARK[rec['status']]:<13} {rec['summary']}")
    from mxval.validate.report import counts

    print(f"{MARK[summary['status']]} ({counts(summary)}) in {summary['seconds']:.0f} s: report {out / 'report.html'} "
          f"({out / 'report.md'}, {out / 'summary.json'})")
    return summary["exit_code"]


if __name__ == "__main__":
    from numerics.cli import run_main

    sys.exit(run_main(main))
