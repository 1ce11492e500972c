"""Golden tensor-level vectors: inputs and the oracle's MX bytes for every (element, mode).

Files: ``golden/tensor/mx_vectors__any.json`` (hardware ``any``: the bytes are exact, so one file
holds on every machine) and its ``.meta.json`` sidecar (versions, seed, generator, sha256 of the
data file, this format's description).

Data format (JSON): ``{"format": FORMAT, "block": 32, "inputs": [...], "expected": {...}}`` where
each input is one 32-value block ``{"source": "<family>[i]" | "case:<name>", "bits": "<256 hex>"}``
(the float32 bit patterns, big-endian hex, 8 digits per value) and ``expected["<elem>/<mode>"]``
is ``{"scales": "<2 hex per block>", "elements": ["<64 hex per block>", ...]}``: E8M0 scale bytes
and E4M3/E5M2/E2M1 element bytes (E2M1: one code a byte), OCP bit layouts, as ``numerics.tensor.mx.quantize``
(default readings) gives.

``check(root)``: the oracle re-derives every byte exactly; torchao's cast matches every block except
those a known finding claims (``numerics.tensor.findings``), which are counted and listed; element
bytes of NaN-scale blocks are not compared for torchao (as in tests/numerics/tensor/test_subjects.py).
The checksum against the sidecar is ``golden.integrity``'s, checked before. ``regenerate(root)``
rewrites both files (atomically) and says how many bytes changed per (element, mode).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

NAME = "tensor_vectors"
ROOT = Path(__file__).resolve().parent
DIR = ROOT / "tensor"
FILE = "mx_vectors__any.json"
SEED = 20261129
BLOCKS_PER_FAMILY = 4
FORMAT = "mxval-mx-vectors-v1"
ELEMS = ("e4m3", "e5m2", "e2m1")  # e2m1: MXFP4's element, which torchao's FP4 cast and the e2m1 control use
FORMAT_DOC = __doc__.split("Data format (JSON): ")[1].split("\n\n")[0].replace("\n", " ")


def _inputs() -> list[tuple[str, np.ndarray]]:
    from numerics.tensor import cases, families

    out = []
    for family in families.FAMILIES:
        x = families.generate(family, (BLOCKS_PER_FAMILY, 32), SEED)
        out += [(f"{family}[{i}]", x[i]) for i in range(BLOCKS_PER_FAMILY)]
    seen = set()
    for case in cases.CASES:  # one block per distinct named input (several cases share one)
        blk = case.block()[0]
        key = blk.tobytes()
        if key not in seen:
            seen.add(key)
            out.append((f"case:{case.name}", blk))
    return out


def _hex(a: np.ndarray) -> str:
    return a.astype(">u4").tobytes().hex() if a.dtype == np.uint32 else a.astype(np.uint8).tobytes().hex()


def build() -> dict:
    from numerics.tensor import mx

    inputs = _inputs()
    x = np.stack([v for _, v in inputs]).astype(np.float32)
    expected = {}
    for elem in ELEMS:
        for mode in mx.MODES:
            s, e = mx.quantize(x, elem, mode)
            expected[f"{elem}/{mode}"] = {"scales": _hex(s[:, 0]), "elements": [_hex(row) for row in e]}
    return {"format": FORMAT, "block": 32,
            "inputs": [{"source": src, "bits": _hex(v.view(np.uint32))} for src, v in inputs],
            "expected": expected}


def decode_inputs(data: dict) -> np.ndarray:
    rows = [np.frombuffer(bytes.fromhex(i["bits"]), dtype=">u4").astype(np.uint32) for i in data["inputs"]]
    return np.stack(rows).view(np.float32)


def _expected(data: dict, key: str) -> tuple[np.ndarray, np.ndarray]:
    exp = data["expected"][key]
    scales = np.frombuffer(bytes.fromhex(exp["scales"]), dtype=np.uint8).reshape(-1, 1)
    elems = np.stack([np.frombuffer(bytes.fromhex(h), dtype=np.uint8) for h in exp["elements"]])
    return scales, elems


def check_dir(directory: Path) -> tuple[list[str], dict[str, list[str]]]:
    """Problems, and the torchao blocks each known finding claims (``"<elem>/<mode> <source>"``)."""
    from numerics.tensor import findings, mx
    from numerics.tensor.subjects import torchao

    path = directory / FILE
    if not path.is_file():
        return [f"{path} is missing; run python -m golden regenerate --only {NAME}"], {}
    data = json.loads(path.read_text())
    x = decode_inputs(data)
    sources = [i["source"] for i in data["inputs"]]
    problems, claimed = [], {}
    for key in data["expected"]:
        elem, mode = key.split("/")
        want_s, want_e = _expected(data, key)
        got_s, got_e = mx.quantize(x, elem, mode)
        for i in np.flatnonzero((got_s[:, 0] != want_s[:, 0]) | (got_e != want_e).any(axis=1)):
            problems.append(f"{key} {sources[i]}: the oracle gives scale 0x{got_s[i, 0]:02x} elements "
                            f"{_hex(got_e[i])}, the file 0x{want_s[i, 0]:02x} {_hex(want_e[i])}")
        if elem not in torchao.SUBJECT.elems:
            continue
        ts, te = torchao.quantize(x, elem, mode)
        bad = (ts[:, 0] != want_s[:, 0]) | ((te != want_e).any(axis=1) & (want_s[:, 0] != 0xFF))
        known = findings.known_blocks(x, elem, mode, want_s, subject="torchao")
        for i in np.flatnonzero(bad):
            fid = next((f for f, m in known.items() if m[i, 0]), None)
            if fid:
                claimed.setdefault(fid, []).append(f"{key} {sources[i]}")
            else:  # the file's bytes, which the oracle re-derived above (a tampered file is named there)
                problems.append(f"{key} {sources[i]}: torchao gives scale 0x{ts[i, 0]:02x} elements "
                                f"{_hex(te[i])}, the golden file 0x{want_s[i, 0]:02x} {_hex(want_e[i])}")
    return problems, claimed


def check(root: Path = ROOT) -> list[str]:
    problems, claimed = check_dir(Path(root) / "tensor")
    if claimed:
        counts = ", ".join(f"{f} {len(v)}" for f, v in sorted(claimed.items()))
        print(f"{NAME}: torchao differs only in blocks known findings claim ({counts}):")
        for fid, where in sorted(claimed.items()):
            print(f"    {fid}: {'; '.join(where)}")
    return problems


def rederived(root: Path = ROOT) -> list[Path]:
    """The files ``check`` derives again on any machine: every byte of the vectors, from the oracle."""
    path = Path(root) / "tensor" / FILE
    return [path] if path.is_file() else []


def write(directory: Path, *, tree: bool = False) -> str:
    """Write the vectors into ``directory`` and list them in the manifest of the golden tree above it when there is
    one, or when ``tree`` (``regenerate``: the folder above is a golden tree, new or not)."""
    from golden import integrity
    from numerics import environment
    from numerics.files import atomic_write

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / FILE
    new = build()
    summary = []
    if path.exists():
        old = json.loads(path.read_text())
        for key in new["expected"]:
            if key not in old.get("expected", {}) or len(old["inputs"]) != len(new["inputs"]):
                summary.append(f"{key} new")
                continue
            (os_, oe), (ns, ne) = _expected(old, key), _expected(new, key)
            changed = int((os_ != ns).sum() + (oe != ne).sum())
            if changed:
                summary.append(f"{key} {changed} bytes")
        inputs_changed = old.get("inputs") != new["inputs"]
    else:
        summary.append("new file")
        inputs_changed = True
    atomic_write(path, json.dumps(new, indent=1, sort_keys=True) + "\n", force=True)
    meta = {"format": FORMAT, "format_doc": FORMAT_DOC, "seed": SEED, "blocks_per_family": BLOCKS_PER_FAMILY,
            "generator": "golden.tensor_vectors.build: numerics.tensor.families.generate(family, (4, 32), seed) "
                         "for each family, then every distinct numerics.tensor.cases block; "
                         "bytes from numerics.tensor.mx",
            "blocks": len(new["inputs"]), "sha256": integrity.sha256(path), "versions": environment.describe()}
    meta_path = path.with_name(FILE.replace(".json", ".meta.json"))
    atomic_write(meta_path, json.dumps(meta, indent=1) + "\n", force=True)
    if tree or (directory.parent / integrity.MANIFEST).exists():
        integrity.record(directory.parent, path, meta_path, NAME)
    what = "; ".join(summary) if summary else "no byte changed"
    return f"{FILE}: {len(new['inputs'])} blocks{', inputs changed' if inputs_changed else ''}; {what}"


def regenerate(root: Path = ROOT) -> str:
    return write(Path(root) / "tensor", tree=True)
