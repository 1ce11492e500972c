"""Golden MX vectors: the committed file checks out; a tampered byte or checksum is caught."""

from __future__ import annotations

import json
import shutil

import pytest

from golden import tensor_vectors as tv


@pytest.fixture(scope="module")
def committed():
    return tv.check_dir(tv.DIR)


def test_tensor_vectors_check_passes(committed):
    problems, claimed = committed
    assert problems == []
    # the committed vectors hold the F1 and F2 minimal blocks: torchao's known disagreements show up
    assert set(claimed) == {"F1", "F2"}


def _copy(tmp_path):
    shutil.copytree(tv.DIR, tmp_path, dirs_exist_ok=True)
    return tmp_path / tv.FILE, tmp_path / tv.FILE.replace(".json", ".meta.json")


def _tamper(path):
    data = json.loads(path.read_text())
    row = data["expected"]["e4m3/rceil"]["elements"][0]
    data["expected"]["e4m3/rceil"]["elements"][0] = ("0" if row[0] != "0" else "1") + row[1:]
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def test_tensor_vectors_detects_a_changed_byte_with_a_matching_checksum(tmp_path):
    # the checksum is golden.integrity's (tests/golden/test_integrity.py); this is the oracle re-deriving bytes
    from golden import integrity

    path, meta_path = _copy(tmp_path)
    _tamper(path)
    meta = json.loads(meta_path.read_text())
    meta["sha256"] = integrity.sha256(path)
    meta_path.write_text(json.dumps(meta))
    problems, _ = tv.check_dir(tmp_path)
    assert any("e4m3/rceil" in p and "the oracle gives" in p for p in problems), problems


def test_tensor_vectors_names_a_tampered_value_the_golden_files_not_the_oracles(tmp_path):
    """torchao's disagreement with a tampered byte names that byte the golden file's: the oracle gives another one,
    and says so on a line of its own."""
    path, _ = _copy(tmp_path)
    _tamper(path)
    problems, _ = tv.check_dir(tmp_path)
    torchao = [p for p in problems if p.startswith("e4m3/rceil") and "torchao gives" in p]
    assert torchao and all("the golden file" in p and "the oracle" not in p for p in torchao), problems


def test_tensor_vectors_regenerate_reports_changed_bytes(tmp_path):
    path, _ = _copy(tmp_path)
    assert tv.write(tmp_path).endswith("no byte changed")
    _tamper(path)
    assert "e4m3/rceil 1 bytes" in tv.write(tmp_path)
    assert tv.check_dir(tmp_path)[0] == []
