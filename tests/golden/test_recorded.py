"""Recorded GPU results: the checksum pins each file, and an edit or a missing sidecar is caught."""

from __future__ import annotations

import json
import shutil

import pytest

from golden import recorded


def test_recorded_files_all_match_their_sidecars():
    assert recorded.check() == []
    assert recorded._data_files(), "the GPU recordings should be committed under golden/ep and golden/training"


@pytest.fixture()
def scratch_root(tmp_path, monkeypatch):
    for d in recorded.DIRS:
        shutil.copytree(recorded.ROOT / d, tmp_path / d)
    monkeypatch.setattr(recorded, "ROOT", tmp_path)
    return tmp_path


def test_recorded_check_catches_an_edited_file(scratch_root):
    data = recorded._data_files()[0]
    data.write_bytes(data.read_bytes() + b"\n")
    assert any("sha256 differs" in p for p in recorded.check())


def test_recorded_check_catches_a_missing_sidecar_and_missing_fields(scratch_root):
    extra = scratch_root / "ep" / "new__h200.json"
    extra.write_text("{}")
    assert any("no sidecar" in p for p in recorded.check())
    recorded.add(extra, command="c", hardware="h200", commit="abc", note="n", versions={"torch": "x"})
    assert recorded.check() == []
    meta = json.loads(recorded._meta_path(extra).read_text())
    meta["note"] = ""
    recorded._meta_path(extra).write_text(json.dumps(meta))
    assert any("lacks note" in p for p in recorded.check())


def test_recorded_regenerate_changes_nothing():
    before = {p: p.read_bytes() for p in recorded._data_files()}
    assert "nothing changed" in recorded.regenerate()
    assert {p: p.read_bytes() for p in recorded._data_files()} == before


def test_recorded_add_refuses_files_outside_golden(tmp_path):
    f = tmp_path / "x.json"
    f.write_text("{}")
    with pytest.raises(ValueError, match="not under golden"):
        recorded.add(f, command="c", hardware="h", commit="c", note="n")
