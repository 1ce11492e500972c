"""Is golden/ whole? A manifest of every expected file, each data file pinned by the checksum in its sidecar.

``golden/MANIFEST.json`` lists every data file, its sidecar and the artifact kind that owns it
(``{"format": FORMAT, "files": [{"data": "layers/x.json", "sidecar": "layers/x.meta.json", "kind":
"layer_stats"}, ...]}``; paths relative to golden/). ``check(root) -> list[str]`` reports, one line
each: a manifest that is missing or not valid JSON; a listed file or sidecar that is missing or not a
file; a sidecar that is not a JSON object or has no ``sha256``; a data file whose SHA-256 differs from
its sidecar's; a ``.json`` data file that is not valid JSON (``.jsonl``, also gzip-compressed as
``.jsonl.gz``: a line that is not); a file under the data folders that the manifest does not list.
``python -m golden check`` runs this first and stops with exit code 2 when it finds anything: content
checks on a broken set mean nothing.

``record(root, data, sidecar, kind)`` adds or keeps an entry (atomically); the writers of golden files
(``regenerate``, ``python -m golden.recorded add``) call it, so a new file is listed on purpose.

What the checksums protect, and what not: they catch accidents, a file truncated, damaged or edited while its
sidecar was left as it was. They do not catch a deliberate edit made together with its sidecar's SHA-256: the
checksum says the file is the one recorded, not that its content is right. Content is checked only where
``python -m golden check`` derives it again on this machine (its output names those files): the tensor vectors
everywhere (every byte, from the oracle), the layer statistics of this machine's hardware (measured again,
within ``golden.layer_stats.MAX_CHANGE_DB``, so an edit smaller than that passes too). The GPU recordings
(``golden.recorded``) are checksummed only here; their sidecars name the command that records each again, on
its hardware, and a change to one shows in review as a change to golden/.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from numerics.errors import BadInput
from numerics.files import atomic_write, file_bytes

ROOT = Path(__file__).resolve().parent
MANIFEST = "MANIFEST.json"
FORMAT = "mxval-golden-manifest-v1"
DATA_DIRS = ("ep", "layers", "suite", "tensor", "training")
PROTECTS = ("their checksums catch accidents (a file truncated, damaged or edited while its sidecar was left), not "
            "an edit made on purpose with its sidecar's SHA-256 updated")


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _json_problem(path: Path, text: str) -> str | None:
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        return f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    except RecursionError:
        return "not valid JSON (nested too deeply)"
    return None


def _read_text(path: Path) -> tuple[str | None, str | None]:
    """(text, None) or (None, what is wrong) for a file that should be UTF-8 text."""
    if not path.exists():
        return None, "missing"
    if not path.is_file():
        return None, "not a file"
    try:
        return file_bytes(path).decode("utf-8"), None  # a .jsonl.gz is checked as the lines it holds
    except BadInput as exc:  # a damaged gzip file
        return None, str(exc).removeprefix(f"{path}: ")
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"


def load_manifest(root: Path) -> list[dict]:
    """The manifest's entries, or ``BadInput`` in one line."""
    path = Path(root) / MANIFEST
    text, why = _read_text(path)
    if why:
        raise BadInput(f"{path}: {why}")
    problem = _json_problem(path, text)
    if problem:
        raise BadInput(f"{path}: {problem}")
    doc = json.loads(text)
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(files, list) or not all(
            isinstance(e, dict) and all(isinstance(e.get(k), str) and e[k] for k in ("data", "sidecar", "kind"))
            for e in files):  # each a non-empty path or name: a number there raised TypeError in golden check
        raise BadInput(f"{path}: not a {FORMAT} manifest (format, files[data, sidecar, kind])")
    return files


def _check_entry(root: Path, e: dict) -> list[str]:
    data, side = root / e["data"], root / e["sidecar"]
    problems = []
    side_text, why = _read_text(side)
    if why:
        return [f"{e['sidecar']}: {why} (the sidecar of {e['data']})"]
    problem = _json_problem(side, side_text)
    meta = json.loads(side_text) if problem is None else None
    if problem or not isinstance(meta, dict):
        return [f"{e['sidecar']}: {problem or 'not a JSON object'}"]
    if not data.is_file():
        return [f"{e['data']}: {'missing' if not data.exists() else 'not a file'}"]
    if not meta.get("sha256"):
        problems.append(f"{e['sidecar']}: no sha256 of {e['data']}")
    elif meta["sha256"] != sha256(data):
        problems.append(f"{e['data']}: SHA-256 {sha256(data)[:12]}... differs from its sidecar's "
                        f"{str(meta['sha256'])[:12]}... (edited, truncated or damaged since it was recorded)")
    text, why = _read_text(data)
    if why:
        problems.append(f"{e['data']}: {why}")
    elif data.suffix == ".json":
        problem = _json_problem(data, text)
        if problem:
            problems.append(f"{e['data']}: {problem}")
    elif data.name.endswith((".jsonl", ".jsonl.gz")):
        for n, line in enumerate(text.splitlines(), start=1):
            problem = _json_problem(data, line) if line.strip() else None
            if problem:
                problems.append(f"{e['data']}:{n}: {problem}")
                break
    return problems


def check(root: Path = ROOT) -> list[str]:
    root = Path(root)
    try:
        entries = load_manifest(root)
    except BadInput as exc:
        return [str(exc)]
    problems = []
    for e in entries:
        problems += _check_entry(root, e)
    listed = {e["data"] for e in entries} | {e["sidecar"] for e in entries}
    for d in DATA_DIRS:
        for p in sorted((root / d).rglob("*")) if (root / d).is_dir() else []:
            rel = p.relative_to(root).as_posix()
            if p.is_file() and rel not in listed and "__pycache__" not in rel:
                problems.append(f"{rel}: not in {MANIFEST} (record it on purpose, or remove it)")
    return problems


def record(root: Path, data: Path, sidecar: Path, kind: str) -> None:
    """List ``data`` (and its sidecar) in the manifest, if it is not already."""
    root = Path(root)
    path = root / MANIFEST
    entries = load_manifest(root) if path.exists() else []
    entry = {"data": Path(data).resolve().relative_to(root.resolve()).as_posix(),
             "sidecar": Path(sidecar).resolve().relative_to(root.resolve()).as_posix(), "kind": kind}
    if entry in entries:
        return
    entries = [e for e in entries if e["data"] != entry["data"]] + [entry]
    doc = {"format": FORMAT, "files": sorted(entries, key=lambda e: e["data"])}
    atomic_write(path, json.dumps(doc, indent=1) + "\n", force=True)
