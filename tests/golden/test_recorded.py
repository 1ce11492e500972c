"""Recorded GPU results: every sidecar names its provenance; regenerate refuses and says how to re-record."""

from __future__ import annotations

import json

import pytest

from golden import integrity, recorded
from numerics.errors import BadInput


def test_recorded_files_all_have_complete_sidecars():
    assert recorded.check() == []
    assert recorded._data_files(), "the GPU recordings should be committed under golden/ep and golden/training"


@pytest.fixture()
def scratch_root(small_golden):
    return small_golden


def test_recorded_check_catches_missing_provenance_fields(scratch_root):
    data = recorded._data_files(scratch_root)[0]
    meta = json.loads(recorded._meta_path(data).read_text())
    meta["note"] = ""
    recorded._meta_path(data).write_text(json.dumps(meta))
    assert any("lacks note" in p for p in recorded.check(scratch_root))


def test_recorded_add_writes_a_sidecar_and_lists_the_file(scratch_root):
    extra = scratch_root / "ep" / "new__h200.json"
    extra.write_text("{}")
    assert any("new__h200.json: not in MANIFEST.json" in p for p in integrity.check(scratch_root))
    recorded.add(extra, command="c", hardware="h200", commit="abc", note="n", versions={"torch": "x"},
                 root=scratch_root)
    assert integrity.check(scratch_root) == [] and recorded.check(scratch_root) == []


def test_recorded_regenerate_refuses_and_commands_name_every_file():
    lines = recorded.commands()
    assert len(lines) == len(recorded._data_files()) and not any("?" in x.split(": ")[0] for x in lines)
    with pytest.raises(BadInput, match="not regenerated on this machine"):
        recorded.regenerate()


def test_recorded_add_refuses_files_outside_golden(tmp_path):
    f = tmp_path / "x.json"
    f.write_text("{}")
    with pytest.raises(BadInput, match="not a file under golden"):
        recorded.add(f, command="c", hardware="h", commit="c", note="n")


def test_recorded_benchmarks_are_read_by_their_benches_readers(scratch_root):
    """The recorded benchmarks (first formats included) pass their readers; one the reader refuses is named."""
    benches = [p for p in recorded._data_files(scratch_root) if recorded._reader(p) is not None]
    assert {p.name for p in benches} >= {"bench_proxy__h200.json", "fast_bench__h200.json"}
    target = scratch_root / "training" / "bench_proxy__h200.json"
    doc = json.loads(target.read_text())
    target.write_text(json.dumps(doc | {"version": 99}))
    assert [p for p in recorded.check(scratch_root) if "reader refuses" in p] == [
        "training/bench_proxy__h200.json: its bench's reader refuses it: "
        f"{target}: not a convergence-bench file of version 1 or 2"]
