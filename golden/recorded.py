"""Recorded GPU results: files a CPU cannot reproduce, pinned by checksum with their provenance.

Files under ``golden/ep/`` and ``golden/training/`` (names ``<name>__<hardware>.<ext>``), each with a
``<file>.meta.json`` sidecar: ``sha256`` of the data file, the ``command`` that produced it, the
``hardware``, the mxval ``commit`` whose tree ran, the library ``versions`` and a ``note`` saying
what the file shows. ``check()`` verifies every sidecar's checksum and required fields and that
no data file lacks a sidecar. ``regenerate()`` cannot re-run a GPU here: it says so and changes
nothing. New recordings are added on purpose with

    python -m golden.recorded add FILE --command "..." --hardware h200x2 --commit HASH --note "..."

which copies nothing: FILE must already sit under golden/; the sidecar is written beside it.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

NAME = "recorded"
ROOT = Path(__file__).resolve().parent
DIRS = ("ep", "training")
REQUIRED = ("sha256", "command", "hardware", "commit", "versions", "note")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _meta_path(data: Path) -> Path:
    return data.with_name(data.name + ".meta.json")


def _data_files() -> list[Path]:
    files = []
    for d in DIRS:
        files += [p for p in sorted((ROOT / d).glob("*")) if p.is_file() and not p.name.endswith(".meta.json")]
    return files


def check() -> list[str]:
    problems = []
    for data in _data_files():
        meta_path = _meta_path(data)
        where = data.relative_to(ROOT)
        if not meta_path.exists():
            problems.append(f"{where}: no sidecar {meta_path.name} (add it with python -m golden.recorded add)")
            continue
        meta = json.loads(meta_path.read_text())
        missing = [k for k in REQUIRED if not meta.get(k)]
        if missing:
            problems.append(f"{where}: sidecar lacks {', '.join(missing)}")
        if meta.get("sha256") != _sha256(data):
            problems.append(f"{where}: sha256 differs from its sidecar (edited after recording?)")
    for d in DIRS:
        for meta_path in sorted((ROOT / d).glob("*.meta.json")):
            if not meta_path.with_name(meta_path.name[: -len(".meta.json")]).exists():
                problems.append(f"{meta_path.relative_to(ROOT)}: sidecar without its data file")
    return problems


def regenerate() -> str:
    return ("recorded GPU results are not regenerated on this machine: re-run the command in each sidecar "
            "on its hardware and record the new file with `python -m golden.recorded add`; nothing changed")


def add(data: Path, *, command: str, hardware: str, commit: str, note: str, versions: dict | None = None) -> Path:
    """Write ``data``'s sidecar. Versions come from the file's own ``environment``/``header`` if not given."""
    data = Path(data).resolve()
    if ROOT not in data.parents or data.parent.name not in DIRS:
        raise ValueError(f"{data} is not under golden/{{{','.join(DIRS)}}}/")
    if versions is None and data.suffix == ".json":
        doc = json.loads(data.read_text())
        versions = doc.get("environment") or (doc.get("header") or {}).get("versions")
    meta = {"sha256": _sha256(data), "command": command, "hardware": hardware, "commit": commit,
            "versions": versions, "note": note}
    path = _meta_path(data)
    path.write_text(json.dumps(meta, indent=1) + "\n")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    from numerics.cli import ArgumentParser, CLIError, run_main

    def _main(args_in):
        p = ArgumentParser(prog="python -m golden.recorded", description="record a GPU result's provenance")
        sub = p.add_subparsers(dest="action", required=True)
        a = sub.add_parser("add")
        a.add_argument("file", type=Path)
        for flag in ("--command", "--hardware", "--commit", "--note"):
            a.add_argument(flag, required=True)
        a.add_argument("--versions-from", type=Path, help="a JSON file whose 'environment' holds the versions")
        args = p.parse_args(args_in)
        versions = None
        if args.versions_from:
            doc = json.loads(args.versions_from.read_text())
            versions = doc.get("environment") or (doc.get("header") or {}).get("versions") or doc.get("versions")
        try:
            print(add(args.file, command=args.command, hardware=args.hardware, commit=args.commit,
                      note=args.note, versions=versions))
        except ValueError as exc:
            raise CLIError(str(exc)) from None
        return 0

    return run_main(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
