"""Golden layer statistics: per layer, SQNR against FP32 of out / dX / dW for BF16 and MXFP8.

Files: ``golden/layers/layer_stats_<config>__<hardware>.json`` (the records) with a
``.meta.json`` sidecar (sha256 of the records file, versions, device, config, seed, commit).
``check(root)`` reruns the config on this machine for every file whose hardware tag matches it
(``cpu`` here, ``h200`` on an H200) and compares both ways: a figure more than ``MAX_CHANGE_DB``
below *or above* its golden value means the subject changed, and so does a record in only one of
the two; files for other hardware are only checked for form (their checksums are
``golden.integrity``'s). ``regenerate(root)`` rewrites this hardware's file(s); ``from_json(path)``
turns the output of ``python -m numerics layers --json`` into a golden file (how the 16B H200 file
is made):

    python -m golden.layer_stats from-json results/layers_16b_h200.json
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

NAME = "layer_stats"
ROOT = Path(__file__).resolve().parent
DIR = ROOT / "layers"
# a change of more than 1 dB against the committed figure, down or up, means the subject changed: measured
# reruns on the same machine and versions agree to ~1e-12 dB, and 1 dB is ~3 % of an MXFP8 GEMM's 28.5 dB
MAX_CHANGE_DB = 1.0
RECIPES = ("bf16", "mxfp8")  # the two columns the golden file pins (wgrad_hp is in the CLI table)
CONFIG_FOR_HARDWARE = {"cpu": "tiny"}  # GPUs: 16b (the GPU tier's shapes)


def _key(r: dict) -> str:
    return f"{r['layer']}/{r['case']}/{r['recipe']}/{r['tensor']}"


def _path(config: str, hardware: str, root: Path = ROOT) -> Path:
    return root / "layers" / f"layer_stats_{config}__{hardware}.json"


def _golden_records(records: list[dict]) -> list[dict]:
    keep = ("layer", "case", "recipe", "tensor", "sqnr_vs_fp32")
    return [{k: r[k] for k in keep} for r in records if r["recipe"] in RECIPES]


def _write(config: str, hardware: str, records: list[dict], header: dict, root: Path = ROOT) -> str:
    from golden import integrity
    from numerics.files import atomic_write

    (root / "layers").mkdir(parents=True, exist_ok=True)
    path = _path(config, hardware, root)
    old = {_key(r): r["sqnr_vs_fp32"] for r in json.loads(path.read_text())["records"]} if path.exists() else {}
    new = _golden_records(records)
    atomic_write(path, json.dumps({"config": config, "hardware": hardware, "records": new}, indent=1) + "\n",
                 force=True)
    meta = {"sha256": integrity.sha256(path)}
    meta |= {k: header[k] for k in ("device", "kernel", "fp32_matmul_precision") if k in header}
    meta |= {"versions": header.get("versions"), "config": header.get("config"),
             "seed": (header.get("config") or {}).get("seed"),
             "commit": (header.get("versions") or {}).get("mxval_commit")}
    atomic_write(path.with_suffix(".meta.json"), json.dumps(meta, indent=1) + "\n", force=True)
    integrity.record(root, path, path.with_suffix(".meta.json"), NAME)
    if not old:
        return f"{path.name}: {len(new)} records; new file"
    changed = sum(1 for r in new if _key(r) not in old or old[_key(r)] != r["sqnr_vs_fp32"])
    return f"{path.name}: {len(new)} records, {changed} changed"


def _measure(config: str, device: str) -> tuple[list[dict], dict]:
    from numerics.layer import harness
    from numerics.layer.configs import suite

    results = harness.run_suite(suite(config), device=device, recipes=RECIPES)
    return [rec for r in results for rec in r.records()], harness.header(config, device)


def _this_hardware() -> tuple[str, str]:
    from numerics import environment

    hw = environment.hardware_tag()
    return hw, ("cpu" if hw == "cpu" else "cuda")


def compare(golden: list[dict], measured: list[dict], max_change_db: float = MAX_CHANGE_DB) -> list[str]:
    """Problems, both ways: a figure more than ``max_change_db`` lower or higher than golden (or NaN), a
    golden record not measured, a measured record (of the pinned recipes) not in the golden file."""
    got = {_key(r): r["sqnr_vs_fp32"] for r in measured}
    want_keys = {_key(r) for r in golden}
    problems = []
    for r in golden:
        k, want = _key(r), float(r["sqnr_vs_fp32"])
        if k not in got:
            problems.append(f"{k}: in the golden file, not measured")
            continue
        v = float(got[k])
        if math.isnan(v) or abs(v - want) > max_change_db:
            what = "drop" if math.isnan(v) or v < want else "rise"
            problems.append(f"{k}: SQNR vs FP32 {v:.2f} dB, golden {want:.2f} dB "
                            f"({what} of {abs(want - v):.2f} dB > {max_change_db} dB: the subject changed)")
    for r in measured:
        if r["recipe"] in RECIPES and _key(r) not in want_keys:
            problems.append(f"{_key(r)}: measured, not in the golden file")
    return problems


def _files(root: Path) -> list[Path]:
    return [f for f in sorted((root / "layers").glob("layer_stats_*__*.json")) if not f.name.endswith(".meta.json")]


def check(root: Path = ROOT) -> list[str]:
    files = _files(Path(root))
    if not files:
        return [f"no golden layer statistics under {Path(root) / 'layers'}"]
    hw, device = _this_hardware()
    problems = []
    for f in files:
        data = json.loads(f.read_text())
        if not isinstance(data, dict) or not isinstance(data.get("records"), list) or "config" not in data:
            problems.append(f"{f.name}: not a layer-statistics file (config, hardware, records)")
            continue
        if data.get("hardware") != hw:
            continue  # checked on its own hardware
        measured, _ = _measure(data["config"], device)
        problems += [f"{f.name}: {p}" for p in compare(data["records"], measured)]
    return problems


def rederived(root: Path = ROOT) -> list[Path]:
    """The files ``check`` measures again on this machine (its hardware's); the others are checksummed only."""
    hw, _ = _this_hardware()
    mine = []
    for f in _files(Path(root)):
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("hardware") == hw:
            mine.append(f)
    return mine


def regenerate(root: Path = ROOT) -> str:
    hw, device = _this_hardware()
    config = CONFIG_FOR_HARDWARE.get(hw, "16b")
    measured, head = _measure(config, device)
    return _write(config, hw, measured, head, Path(root))


def from_json(path: str) -> str:
    """Write the golden file from ``python -m numerics layers --json`` output (its header names the
    config and hardware)."""
    from numerics.errors import BadInput

    try:
        data = json.loads(Path(path).read_text())
        head = data["header"]
        config, hardware, records = head["config"]["name"], head["hardware"], data["records"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BadInput(f"{path}: not the output of python -m numerics layers --json ({exc})") from None
    return _write(config, hardware, records, head)


def main(argv: list[str] | None = None) -> int:
    from numerics.cli import CLIError, run_main

    def _main(args):
        args = list(args or [])
        if len(args) != 2 or args[0] != "from-json":
            raise CLIError("usage: python -m golden.layer_stats from-json LAYERS.json")
        print(from_json(args[1]))
        return 0

    return run_main(_main, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
