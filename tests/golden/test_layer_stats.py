"""Golden layer statistics: the committed CPU file holds on this machine; a change of >1 dB either way is flagged."""

from __future__ import annotations

import json

from golden import layer_stats


def _golden_tiny_cpu() -> list[dict]:
    return json.loads((layer_stats.DIR / "layer_stats_tiny__cpu.json").read_text())["records"]


def test_layer_stats_committed_cpu_file_has_provenance():
    golden = _golden_tiny_cpu()
    meta = json.loads((layer_stats.DIR / "layer_stats_tiny__cpu.meta.json").read_text())
    assert meta["versions"]["torchao"] and meta["versions"]["torch"] and meta["config"]["name"] == "tiny"
    assert {r["recipe"] for r in golden} == {"bf16", "mxfp8"}
    assert {r["layer"] for r in golden} == {"linear", "grouped_mm", "moe", "mla"}


def test_layer_stats_check_passes_on_this_machine():
    assert layer_stats.check() == []


def test_layer_stats_compare_flags_a_drop_of_more_than_one_db():
    golden = _golden_tiny_cpu()
    measured = [dict(r) for r in golden]
    measured[3]["sqnr_vs_fp32"] -= 1.01
    measured[5]["sqnr_vs_fp32"] -= 0.99  # within the 1 dB allowance
    problems = layer_stats.compare(golden, measured)
    assert len(problems) == 1 and layer_stats._key(golden[3]) in problems[0] and "drop" in problems[0]


def test_layer_stats_compare_flags_a_rise_of_more_than_one_db():
    # a golden figure lowered from 28.46 to 20.0 is a rise of the measurement: flagged as drops are
    golden = [dict(r) for r in _golden_tiny_cpu()]
    measured = [dict(r) for r in golden]
    golden[3]["sqnr_vs_fp32"] = 20.0
    measured[4]["sqnr_vs_fp32"] += 0.99  # within the allowance
    problems = layer_stats.compare(golden, measured)
    assert len(problems) == 1 and "rise of" in problems[0] and "the subject changed" in problems[0]


def test_layer_stats_compare_flags_a_record_missing_from_the_golden_file():
    golden = _golden_tiny_cpu()
    problems = layer_stats.compare(golden[1:], golden)
    assert problems == [f"{layer_stats._key(golden[0])}: measured, not in the golden file"]


def test_layer_stats_compare_flags_missing_and_nan():
    golden = _golden_tiny_cpu()[:3]
    measured = [dict(golden[0], sqnr_vs_fp32=float("nan")), dict(golden[1])]
    problems = layer_stats.compare(golden, measured)
    assert len(problems) == 2 and "not measured" in problems[1]
