"""Recorded GPU results: files a CPU cannot reproduce, pinned by checksum with their provenance.

Files under ``golden/ep/``, ``golden/layers/`` (benchmarks), ``golden/training/`` and ``golden/suite/``
(whole GPU-tier and ``mxval validate`` runs) (names ``<name>__<hardware>.<ext>``), each with a
``<file>.meta.json`` sidecar: ``sha256`` of the data file, the ``command`` that produced it, the
``hardware``, the mxval ``commit`` whose tree ran, the library ``versions`` and a ``note`` saying
what the file shows. ``check(root)`` verifies that every sidecar has those fields (the checksums and
the list of files are ``golden.integrity``'s), and reads each benchmark whose format has versions with its
bench's own reader (``READERS``), which takes every version recorded: a format change that could no longer read
a recorded file fails here. ``regenerate(root)`` refuses: a GPU result is
re-recorded on its GPU by the command in its sidecar (``commands(root)`` lists them), then added on
purpose with

    python -m golden.recorded add FILE --command "..." --hardware h200x2 --commit HASH --note "..."

which copies nothing: FILE must already sit under golden/; the sidecar is written beside it and the
file is listed in golden/MANIFEST.json.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from numerics.errors import BadInput

NAME = "recorded"
ROOT = Path(__file__).resolve().parent
DIRS = ("ep", "layers", "training", "suite")
REQUIRED = ("sha256", "command", "hardware", "commit", "versions", "note")
# (folder, file-name prefix) -> the reader of those benchmarks (module:function), which raises BadInput
READERS = {("training", "bench_"): "convergence.train.perf.bench:load_report",
           ("layers", "fast_bench"): "numerics.layer.fast.bench:load_report"}


def _meta_path(data: Path) -> Path:
    return data.with_name(data.name + ".meta.json")


def _data_files(root: Path = ROOT) -> list[Path]:
    """Data files under DIRS that are recorded GPU results (golden/layers also holds other artifacts:
    a recorded file's sidecar is ``<file>.meta.json``)."""
    files = []
    for d in DIRS:
        files += [p for p in sorted((Path(root) / d).glob("*")) if p.is_file() and not p.name.endswith(".meta.json")
                  and (d != "layers" or _meta_path(p).exists())]
    return files


def check(root: Path = ROOT) -> list[str]:
    problems = []
    for data in _data_files(root):
        meta_path = _meta_path(data)
        if not meta_path.is_file():
            continue  # golden.integrity names it
        meta = json.loads(meta_path.read_text())
        missing = [k for k in REQUIRED if not meta.get(k)]
        if missing:
            problems.append(f"{data.relative_to(root)}: sidecar lacks {', '.join(missing)}")
        reader = _reader(data)
        if reader is not None:
            try:
                reader(data)
            except BadInput as exc:
                problems.append(f"{data.relative_to(root)}: its bench's reader refuses it: {exc}")
    return problems


def _reader(data: Path):
    """The reader of a recorded benchmark (``READERS``), or None for other files."""
    import importlib

    for (folder, prefix), target in READERS.items():
        if data.parent.name == folder and data.name.startswith(prefix):
            module, _, name = target.partition(":")
            return getattr(importlib.import_module(module), name)
    return None


def rederived(root: Path = ROOT) -> list[Path]:
    """None: a GPU result is re-recorded on its GPU, never derived again by ``check`` (checksummed only)."""
    return []


def commands(root: Path = ROOT) -> list[str]:
    """One line per recorded file: where it was made and the command that re-records it."""
    out = []
    for data in _data_files(root):
        meta_path = _meta_path(data)
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        out.append(f"{data.relative_to(root)} ({meta.get('hardware', '?')}): {meta.get('command', '?')}")
    return out


def regenerate(root: Path = ROOT) -> str:
    raise BadInput("recorded GPU results are not regenerated on this machine: run each file's command (listed "
                   "above, and in its sidecar) on its hardware, then record the new file with "
                   "python -m golden.recorded add")


def add(data: Path, *, command: str, hardware: str, commit: str, note: str, versions: dict | None = None,
        root: Path = ROOT) -> Path:
    """Write ``data``'s sidecar and list it in the manifest. Versions come from the file's own
    ``environment``/``header`` if not given."""
    from golden import integrity
    from numerics.files import atomic_write

    data = Path(data).resolve()
    root = Path(root).resolve()
    if root not in data.parents or data.parent.name not in DIRS or not data.is_file():
        raise BadInput(f"{data} is not a file under golden/{{{','.join(DIRS)}}}/")
    if versions is None and data.suffix == ".json":
        try:
            doc = json.loads(data.read_text())
        except ValueError as exc:
            raise BadInput(f"{data}: not valid JSON ({exc})") from None
        versions = (doc.get("environment") or (doc.get("header") or {}).get("versions")) if isinstance(doc, dict) \
            else None
    meta = {"sha256": integrity.sha256(data), "command": command, "hardware": hardware, "commit": commit,
            "versions": versions, "note": note}
    path = atomic_write(_meta_path(data), json.dumps(meta, indent=1) + "\n", force=True)
    integrity.record(root, data, path, NAME)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    from numerics.cli import ArgumentParser, run_main

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
            try:
                doc = json.loads(args.versions_from.read_text())
            except (OSError, ValueError) as exc:
                raise BadInput(f"--versions-from {args.versions_from}: {exc}") from None
            versions = doc.get("environment") or (doc.get("header") or {}).get("versions") or doc.get("versions")
        print(add(args.file, command=args.command, hardware=args.hardware, commit=args.commit,
                  note=args.note, versions=versions))
        return 0

    return run_main(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
