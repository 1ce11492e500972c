"""A small golden tree for the tests that damage, extend or regenerate one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from golden import integrity

# One committed file of each artifact kind and each layout the checks read (a JSON table, a JSONL curve, a gzip
# JSONL curve, a GPU tier summary, the two benches their readers check), with their sidecars. The whole tree's check
# decompresses and parses its 115 gzip curves line by line (about a second a call); on these eight every check runs
# the same code in a tenth of that. The committed tree itself is checked whole by test_integrity.py and,
# installed, by tests/test_wheel.py.
SMALL_TREE = ("ep/check__v1.2.1__h200x2.json", "layers/layer_stats_tiny__cpu.json", "tensor/mx_vectors__any.json",
              "training/proxy_bf16_seed0__h200.jsonl", "training/proxy_long_bf16_rounding1__h200x2.jsonl.gz",
              "suite/gpu_tier__h200.json", "training/bench_proxy__h200.json", "layers/fast_bench__h200.json")


@pytest.fixture
def small_golden(tmp_path) -> Path:
    """A whole golden tree in ``tmp_path/golden``: the files of ``SMALL_TREE`` and a manifest listing exactly them."""
    root = tmp_path / "golden"
    entries = [e for e in integrity.load_manifest(integrity.ROOT) if e["data"] in SMALL_TREE]
    assert sorted(e["data"] for e in entries) == sorted(SMALL_TREE)  # each still committed
    for e in entries:
        for rel in (e["data"], e["sidecar"]):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(integrity.ROOT / rel, root / rel)
    (root / integrity.MANIFEST).write_text(json.dumps({"format": integrity.FORMAT, "files": entries}, indent=1))
    assert integrity.check(root) == []
    return root
