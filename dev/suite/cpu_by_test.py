"""Where the CPU suite's time goes, test by test: wall time, the test process's own CPU and its children's.

A pytest plugin and its report. On 2 cores the suite's wall time follows its CPU time: a test that waits on a
subprocess, a Slurm job or a lock lets the other xdist worker run, so the CPU a test spends (in-process, and in the
subprocesses it waits for) is the figure to shrink. Children's CPU counts processes the test waited for (torchrun
ranks through their agent, notebook kernels, training subprocesses); Slurm jobs are slurmd's children and are not
counted.

    PYTHONPATH=dev/suite python -m pytest -n 2 -p cpu_by_test     # one JSON line per test in $CPU_BY_TEST_DIR
    python dev/suite/cpu_by_test.py [DIR] [--top N]                # the totals, by file and the costliest tests

``CPU_BY_TEST_DIR`` defaults to ``/tmp/cpu_by_test``; each run's lines are appended to one file per worker, so
clear the folder between runs.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path

import pytest

DEFAULT_DIR = "/tmp/cpu_by_test"


def _folder() -> Path:
    return Path(os.environ.get("CPU_BY_TEST_DIR", DEFAULT_DIR))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Setup, call and teardown of one test, measured together (a shared fixture is paid by its first user)."""
    wall, cpu = time.monotonic(), os.times()
    yield
    end, after = time.monotonic(), os.times()
    record = {"test": item.nodeid, "wall_s": round(end - wall, 3),
              "self_s": round(after.user - cpu.user + after.system - cpu.system, 3),
              "children_s": round(after.children_user - cpu.children_user
                                  + after.children_system - cpu.children_system, 3)}
    folder = _folder()
    folder.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(folder / f"{worker}.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


def report(folder: Path, top: int) -> str:
    rows = [json.loads(line) for path in sorted(folder.glob("*.jsonl")) for line in path.read_text().splitlines()]
    if not rows:
        raise SystemExit(f"error: no measurements in {folder}: run the suite with -p cpu_by_test first")
    for r in rows:
        r["cpu_s"] = r["self_s"] + r["children_s"]
    total = {k: sum(r[k] for r in rows) for k in ("wall_s", "self_s", "children_s", "cpu_s")}
    by_file = collections.Counter()
    for r in rows:
        by_file[r["test"].split("::")[0]] += r["cpu_s"]
    lines = [f"{len(rows)} tests: {total['cpu_s']:.0f} s CPU ({total['self_s']:.0f} in the test processes, "
             f"{total['children_s']:.0f} in their children), {total['wall_s']:.0f} s of test wall time",
             "", "CPU s  file"]
    lines += [f"{cpu:6.1f} {name}" for name, cpu in by_file.most_common(top)]
    lines += ["", "CPU s   self  children  test"]
    lines += [f"{r['cpu_s']:6.1f} {r['self_s']:6.1f} {r['children_s']:9.1f}  {r['test']}"
              for r in sorted(rows, key=lambda r: -r["cpu_s"])[:top]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", type=Path, default=_folder())
    parser.add_argument("--top", type=int, default=30, help="how many files and tests to list (default 30)")
    args = parser.parse_args(argv)
    print(report(args.folder, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
