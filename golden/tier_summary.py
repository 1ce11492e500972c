"""A GPU tier's pytest log as a recorded golden result, so that no tier summary is copied out of a log by hand.

    python -m golden.tier_summary LOG --hardware h200x2 --command "..." --note "..." [--environment-from F]

reads the log of ``pytest -m "gpu or multigpu" -rfEsx`` (its final counts line and its short summary),
writes ``golden/suite/gpu_tier__<hardware>.json`` (counts, every failure, xfail and skip reason, the
environment) and its sidecar through ``golden.recorded.add`` (the commit is the environment's
``mxval_commit``). The environment is the one of the machine the tier ran on: this machine's when it has a
GPU, else ``--environment-from`` a JSON file written there in the same call (``{"environment": ...}``, as
``numerics.environment.describe()`` gives it, or a training run's ``config.json``). An existing file is
replaced only with ``--force``; a red tier is recorded as red (its failures listed), never left out.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from numerics.environment import check_hardware_tag
from numerics.errors import BadInput

# pytest's last line, e.g. "87 passed, 14 skipped, 951 deselected, 3 xfailed in 101.09s (0:01:41)",
# possibly between "=" rules.
_COUNTS = re.compile(r"^=*\s*((?:\d+ [a-z]+(?:, )?)+) in ([\d.]+)s\b.*?=*\s*$")
_COUNT = re.compile(r"(\d+) ([a-z]+)")
# -rfEsx short summary lines: "SKIPPED [3] path:12: reason", "XFAIL node - reason", "FAILED node - message"
_SKIPPED = re.compile(r"^SKIPPED \[(\d+)\] (\S+?): (.*)$")
_OUTCOME = re.compile(r"^(FAILED|ERROR|XFAIL|XPASS) (\S+)(?: - (.*))?$")
_PLURAL = {"error": "errors", "warning": "warnings"}  # pytest writes "1 error", "2 errors"


def parse(text: str) -> dict:
    """The counts line and the short summary of a pytest log."""
    lines = text.replace("\r", "\n").splitlines()
    summary = next((ln.strip("= ").strip() for ln in reversed(lines) if _COUNTS.match(ln.strip())), None)
    if summary is None:
        raise BadInput("no pytest counts line (such as '87 passed, 3 xfailed in 101.09s') in the log: "
                       "was the tier cut short?")
    counts = {_PLURAL.get(word, word): int(n) for n, word in _COUNT.findall(summary.rsplit(" in ", 1)[0])}
    doc = {"summary": summary, "counts": counts, "failed": [], "errors": [], "xfailed": [], "xpassed": [],
           "skipped": []}
    for line in lines:
        if m := _SKIPPED.match(line):
            doc["skipped"].append({"count": int(m[1]), "where": m[2], "reason": m[3]})
        elif m := _OUTCOME.match(line):
            key = {"FAILED": "failed", "ERROR": "errors", "XFAIL": "xfailed", "XPASS": "xpassed"}[m[1]]
            doc[key].append({"test": m[2], "reason": m[3] or ""})
    return doc


def _environment(path: Path | None) -> dict:
    if path is None:
        from numerics.environment import describe

        env = describe()
        if not env.get("gpus"):
            raise BadInput("this machine has no GPU, so its environment is not the tier's: pass --environment-from "
                           "a JSON file written on the GPU machine in the same call")
        return env
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"--environment-from {path}: {exc}") from None
    env = doc.get("environment") if isinstance(doc, dict) else None
    if not isinstance(env, dict) or not env.get("mxval_commit"):
        raise BadInput(f"--environment-from {path}: no 'environment' with an 'mxval_commit' in it")
    return env


def record(log: Path, *, hardware: str, command: str, note: str, environment_from: Path | None = None,
           force: bool = False, root: Path | None = None) -> Path:
    """Write ``golden/suite/gpu_tier__<hardware>.json`` from ``log`` and its sidecar; returns the data file."""
    from golden import recorded
    from numerics.files import atomic_write

    root = Path(root or recorded.ROOT)
    check_hardware_tag(hardware)
    try:
        text = Path(log).read_text(errors="replace")
    except OSError as exc:
        raise BadInput(f"{log}: {exc.strerror or exc}") from None
    doc = parse(text)
    env = _environment(environment_from)
    out = root / "suite" / f"gpu_tier__{hardware}.json"
    data = {"kind": "gpu-tier", "command": command, "hardware": hardware, **doc, "note": note, "environment": env}
    if out.exists() and not force:
        raise BadInput(f"{out} exists: pass --force to replace it")
    atomic_write(out, json.dumps(data, indent=1) + "\n", force=True)
    recorded.add(out, command=command, hardware=hardware, commit=env["mxval_commit"], note=note, versions=env,
                 root=root)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from numerics.cli import ArgumentParser, run_main

    def _main(args_in):
        p = ArgumentParser(prog="python -m golden.tier_summary",
                           description="record a GPU tier's pytest log under golden/suite with its sidecar")
        p.add_argument("log", type=Path, help="the output of pytest -m 'gpu or multigpu' -rfEsx")
        for flag in ("--hardware", "--command", "--note"):
            p.add_argument(flag, required=True)
        p.add_argument("--environment-from", type=Path,
                       help="a JSON file with the GPU machine's 'environment' (default: this machine's, if a GPU one)")
        p.add_argument("--force", action="store_true", help="replace an existing record")
        args = p.parse_args(args_in)
        out = record(args.log, hardware=args.hardware, command=args.command, note=args.note,
                     environment_from=args.environment_from, force=args.force)
        print(f"{out}: {json.loads(out.read_text())['summary']}")
        return 0

    return run_main(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
