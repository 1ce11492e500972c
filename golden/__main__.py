"""python -m golden check | regenerate [--only NAME] [--root DIR] — verify or rewrite the versioned reference artifacts.

``check`` first verifies that golden/ is whole (``golden.integrity``: the manifest of every expected
file, the checksum in each sidecar, valid JSON); anything wrong there is listed on stdout and the
command stops with one line on stderr and exit code 2. Then each artifact kind checks its content
(exit 1 when a subject changed, 0 when all agree).

Each artifact kind is a module listed in ARTIFACTS exposing ``NAME`` (str), ``check(root) -> list[str]``
(problems found; empty means OK), ``rederived(root) -> list[Path]`` (the files ``check`` derives again on this
machine, which the output names; every other file is checksummed only: ``golden.integrity`` says what that
protects) and ``regenerate(root) -> str`` (rewrites the files and returns a diff summary). ``regenerate`` only
runs when asked, and only for the kinds named with ``--only`` or all of them; GPU recordings (``recorded``) are
never regenerated here: their commands are listed, and asking for them alone (``--only recorded``) is refused
with exit code 2.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

from numerics.cli import ArgumentParser, CLIError, run_main
from numerics.errors import BadInput

ARTIFACTS: list[str] = ["golden.layer_stats", "golden.tensor_vectors", "golden.posthoc", "golden.recorded"]
ROOT = Path(__file__).resolve().parent


def _modules(only: list[str] | None):
    mods = [importlib.import_module(name) for name in ARTIFACTS]
    if only:
        known = {m.NAME for m in mods}
        unknown = sorted(set(only) - known)
        if unknown:
            raise CLIError(f"unknown golden artifact {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        mods = [m for m in mods if m.NAME in only]
    return mods


def _root(path: Path) -> Path:
    if not path.exists():
        raise CLIError(f"--root {path}: no such directory")
    if not path.is_dir():
        raise CLIError(f"--root {path}: not a directory")
    return path


def _check(root: Path, mods) -> int:
    from golden import integrity

    problems = integrity.check(root)
    if problems:
        print(f"{'integrity':<24} FAIL ({len(problems)} problems)")
        for p in problems:
            print(f"    {p}")
        raise BadInput(f"golden/ is not whole: {len(problems)} problem(s), the first: {problems[0]}")
    listed = integrity.load_manifest(root)
    print(f"{'integrity':<24} OK ({len(listed)} files, each the SHA-256 its sidecar records)")
    failed, again = 0, set()
    for mod in mods:
        problems = mod.check(root)
        mine = [p.relative_to(root).as_posix() for p in mod.rederived(root)]
        again.update(mine)
        how = f"re-derived here: {', '.join(mine)}" if mine else "checksummed only here"
        print(f"{mod.NAME:<24} {'OK' if not problems else f'FAIL ({len(problems)} problems)'} ({how})")
        for p in problems[:20]:
            print(f"    {p}")
        failed += bool(problems)
    only = sum(e["data"] not in again for e in listed)
    print(f"{'checksummed only':<24} {only} of {len(listed)} files: {integrity.PROTECTS}")
    return 1 if failed else 0


def _regenerate(root: Path, mods, only: list[str] | None) -> int:
    from golden import integrity

    if not (root / integrity.MANIFEST).exists():  # a user pointing --root at the wrong folder should see it
        print(f"{'root':<24} {root} has no {integrity.MANIFEST}: writing a new golden tree there")
    for mod in mods:
        if mod.NAME == "recorded":
            print(f"{mod.NAME:<24} not regenerated here (GPU recordings); the command that re-records each:")
            for line in mod.commands(root):
                print(f"    {line}")
            if only:
                mod.regenerate(root)  # refuses, in one line
            continue
        print(f"{mod.NAME:<24} regenerated: {mod.regenerate(root)}")
    return 0


def _main(argv: Sequence[str] | None) -> int:
    parser = ArgumentParser(prog="python -m golden", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["check", "regenerate"])
    parser.add_argument("--only", action="append", help="artifact name (repeatable); default: all")
    parser.add_argument("--root", type=Path, default=ROOT, help="the golden tree (default: this package's)")
    args = parser.parse_args(argv)
    root = _root(args.root)
    mods = _modules(args.only)
    return _check(root, mods) if args.action == "check" else _regenerate(root, mods, args.only)


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
