"""golden.integrity: the committed golden/ is whole, and record() lists a new file on purpose."""

from __future__ import annotations

import json

from golden import integrity


def test_committed_golden_tree_is_whole():
    assert integrity.check() == []
    kinds = {e["kind"] for e in integrity.load_manifest(integrity.ROOT)}
    assert kinds == {"layer_stats", "tensor_vectors", "posthoc", "recorded"}


def test_every_sidecar_carries_the_checksum_of_its_file():
    for e in integrity.load_manifest(integrity.ROOT):
        meta = json.loads((integrity.ROOT / e["sidecar"]).read_text())
        assert meta["sha256"] == integrity.sha256(integrity.ROOT / e["data"]), e["data"]


def test_record_lists_a_new_file_once(small_golden):
    root = small_golden
    data, side = root / "layers" / "layer_stats_x__b200.json", root / "layers" / "layer_stats_x__b200.meta.json"
    data.write_text("{}")
    side.write_text(json.dumps({"sha256": integrity.sha256(data)}))
    assert len(integrity.check(root)) == 2  # both files unlisted: the control
    integrity.record(root, data, side, "layer_stats")
    integrity.record(root, data, side, "layer_stats")
    assert integrity.check(root) == []
    assert sum(e["data"] == "layers/layer_stats_x__b200.json" for e in integrity.load_manifest(root)) == 1


def test_a_gzip_jsonl_record_is_checked_as_the_lines_it_holds(small_golden):
    """golden keeps long curves as .jsonl.gz: a good one passes; one whose lines are not JSON, or whose gzip is
    cut short, is reported (its sidecar's checksum updated each time, so only the content check can catch it)."""
    import gzip

    root = small_golden
    data, side = root / "training" / "run_x__h200.jsonl.gz", root / "training" / "run_x__h200.jsonl.gz.meta.json"
    good = gzip.compress(b'{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.9}\n', mtime=0)
    for raw, problem in ((good, None), (gzip.compress(b'{"step": 1}\nnot json\n', mtime=0), ":2: "),
                         (good[:-10], "a damaged gzip file")):
        data.write_bytes(raw)
        side.write_text(json.dumps({"sha256": integrity.sha256(data)}))
        integrity.record(root, data, side, "recorded")
        found = integrity.check(root)
        assert found == [] if problem is None else len(found) == 1 and problem in found[0], found
