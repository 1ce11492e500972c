"""python -m golden check | regenerate [--only NAME] — verify or rewrite the versioned reference artifacts.

Each artifact kind is a module listed in ARTIFACTS exposing
``NAME`` (str), ``check() -> list[str]`` (problems found; empty means OK) and
``regenerate() -> str`` (rewrites the files and returns a diff summary). ``regenerate`` only runs
when asked, and only for the kinds named with ``--only`` or all of them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from numerics.cli import ArgumentParser, CLIError, run_main

ARTIFACTS: list[str] = ["golden.layer_stats", "golden.tensor_vectors", "golden.recorded"]


def _modules(only: list[str] | None):
    mods = [importlib.import_module(name) for name in ARTIFACTS]
    if only:
        known = {m.NAME for m in mods}
        unknown = sorted(set(only) - known)
        if unknown:
            raise CLIError(f"unknown golden artifact {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        mods = [m for m in mods if m.NAME in only]
    return mods


def _main(argv: Sequence[str] | None) -> int:
    parser = ArgumentParser(prog="python -m golden", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["check", "regenerate"])
    parser.add_argument("--only", action="append", help="artifact name (repeatable); default: all")
    args = parser.parse_args(argv)
    failed = 0
    for mod in _modules(args.only):
        if args.action == "check":
            problems = mod.check()
            status = "OK" if not problems else f"FAIL ({len(problems)} problems)"
            print(f"{mod.NAME:<24} {status}")
            for p in problems[:20]:
                print(f"    {p}")
            failed += bool(problems)
        else:
            print(f"{mod.NAME:<24} regenerated: {mod.regenerate()}")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
