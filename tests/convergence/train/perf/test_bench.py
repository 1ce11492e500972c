"""convergence bench's repeats: separate measurements taken round the variants, medians, ranges and ratios
computed from them (exactly, with a stand-in measurement), the tiny model's real run on the CPU, and the reader
that takes the recorded version-1 file."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch

from convergence.train.cli import bench_main
from convergence.train.perf import bench
from numerics.errors import BadInput

GOLDEN = Path(__file__).resolve().parents[4] / "golden" / "training" / "bench_proxy__h200.json"
CPU = torch.device("cpu")


class _StandIn:
    """A measurement that records each call and returns the next of its step times."""

    def __init__(self, times: dict[tuple, list[float]], fail: set[tuple] = frozenset()):
        self.times, self.fail, self.calls = {k: list(v) for k, v in times.items()}, fail, []

    def __call__(self, cfg, recipe, kernel, *, compile_, **_):
        self.calls.append((recipe, kernel, compile_))
        if (recipe, kernel, compile_) in self.fail:
            raise RuntimeError("planted failure")
        return {"step_s": self.times[(recipe, kernel, compile_)].pop(0), "build_s": 0.5, "warmup_s": 1.0,
                "max_mem_gib": None}


def _run(measure, repeats=3, kernels=("emulated",), after_round=None):
    return bench.bench("tiny", batch=1, seq=32, steps=1, warmup=0, device=CPU, compile_=False, kernels=kernels,
                       repeats=repeats, measure=measure, after_round=after_round)


def test_bench_repeats_are_separate_measurements_taken_round_the_variants():
    times = {("bf16", None, False): [1.0, 3.0, 2.0], ("mxfp8", "emulated", False): [1.5, 3.3, 4.0]}
    m = _StandIn(times)
    rows = _run(m)
    assert m.calls == [("bf16", None, False), ("mxfp8", "emulated", False)] * 3  # round the variants, 3 times
    bf16, mx = rows
    assert bf16["step_s_each"] == [1.0, 3.0, 2.0] and bf16["step_s"] == 2.0 and bf16["step_s_range"] == [1.0, 3.0]
    assert mx["repeats"] == 3 and mx["step_s"] == 3.3 and mx["step_s_range"] == [1.5, 4.0]
    assert mx["ratio_to_bf16"] == pytest.approx(3.3 / 2.0)  # the ratio of the medians
    assert mx["ratio_to_bf16_each"] == pytest.approx([1.5, 1.1, 2.0])  # repeat r over BF16's repeat r
    assert mx["ratio_to_bf16_range"] == pytest.approx([1.1, 2.0])
    assert mx["tokens_per_s"] == pytest.approx(32 / 3.3) and mx["warmup_s_each"] == [1.0] * 3


def test_a_compiled_row_says_when_its_step_was_not_one_dynamo_graph():
    """The row keeps the most graphs any repeat compiled, and the table says when that is not one (the control:
    a whole compiled step and an eager step, which has no count, say nothing)."""
    class Graphs(_StandIn):
        def __call__(self, cfg, recipe, kernel, *, compile_, **kw):
            return super().__call__(cfg, recipe, kernel, compile_=compile_, **kw) | {
                "graphs": None if not compile_ else 1 if recipe == "bf16" else len(self.calls) // 4 + 2}  # 3, then 4

    times = {(r, k, c): [1.0, 1.0] for r, k in (("bf16", None), ("mxfp8", "fast")) for c in (False, True)}
    rows = bench.bench("tiny", batch=1, seq=32, steps=1, warmup=0, device=CPU, compile_=True, kernels=("fast",),
                       repeats=2, measure=Graphs(times))
    assert [r["dynamo_graphs"] for r in rows] == [None, None, 1, 4]
    notes = [line for line in bench.format_rows(rows).splitlines() if line.startswith("note:")]
    assert notes == ["note: mxfp8 fast compiled ran as 4 dynamo graphs, not one: parts of its step run eagerly "
                     "(graph breaks or recompilations; TORCH_LOGS=graph_breaks,recompiles says where)"]


def test_bench_hands_over_the_rows_of_each_finished_round():
    times = {("bf16", None, False): [1.0, 3.0], ("mxfp8", "emulated", False): [1.5, 3.3]}
    seen = []
    _run(_StandIn(times), repeats=2, after_round=lambda rows, done: seen.append(
        (done, [r["step_s_each"] for r in rows], rows[1]["ratio_to_bf16_each"])))
    assert seen == [(1, [[1.0], [1.5]], [1.5]), (2, [[1.0, 3.0], [1.5, 3.3]], [1.5, 3.3 / 3.0])]


def test_bench_a_failing_variant_is_an_error_row_measured_once():
    m = _StandIn({("bf16", None, False): [1.0, 1.0]}, fail={("mxfp8", "emulated", False)})
    rows = _run(m, repeats=2)
    assert m.calls.count(("mxfp8", "emulated", False)) == 1
    assert rows[1]["error"] == "RuntimeError: planted failure" and rows[0]["step_s_each"] == [1.0, 1.0]
    assert "failed: RuntimeError" in bench.format_rows(rows)


def test_bench_tiny_cpu_run_writes_version_2_rows_of_independent_repeats(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert bench_main(["--model", "tiny", "--device", "cpu", "--batch", "1", "--seq", "32", "--steps", "1",
                       "--warmup", "0", "--no-compile", "--kernel", "emulated", "--repeats", "2",
                       "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["kind"] == bench.KIND and doc["version"] == 2 and doc["repeats"] == doc["repeats_done"] == 2
    for row in doc["rows"]:
        assert row["repeats"] == 2 and len(row["step_s_each"]) == len(row["build_s_each"]) == 2
        # two builds, two timings: wall-clock seconds of separate runs are never equal to the last bit
        assert row["step_s_each"][0] != row["step_s_each"][1]
        assert row["step_s"] == statistics.median(row["step_s_each"])
        assert row["step_s_range"] == [min(row["step_s_each"]), max(row["step_s_each"])]
    assert bench.load_report(out)["rows"] == doc["rows"]
    assert "per-repeat ratios" in capsys.readouterr().out


# A first-format (version 1) result as the bench wrote it before repeats: one measurement per row. Its rows (less
# the environment) are the first golden/training/bench_proxy__h200.json (one H200, torch 2.11.0, before the fast
# path's padding and casts were reworked).
FIRST_FORMAT = {
    "kind": "convergence-bench", "version": 1, "model": "proxy", "batch": 4, "seq": 2048, "device": "cuda",
    "flops_per_token": 3356706816.0, "copy_gbps": 3749.7268809821057, "cast_bytes_per_step": 36174299136,
    "cast_floor_ms": 9.647182390661328, "quantized_modules": 57,
    "rows": [
        {"recipe": "bf16", "kernel": None, "compiled": False, "step_s": 0.09817279815673828,
         "tokens_per_s": 83444.70315413666, "warmup_s": 0.8301470960000188, "mfu": 0.2830716562269704,
         "max_mem_gib": 22.8047456741333, "ratio_to_bf16": 1.0},
        {"recipe": "mxfp8", "kernel": "fast", "compiled": False, "step_s": 0.13601498413085938,
         "tokens_per_s": 60228.65827869755, "warmup_s": 0.879253747000007, "mfu": 0.20431525797133793,
         "max_mem_gib": 23.87137222290039, "ratio_to_bf16": 1.3854650848772179},
    ],
}


def test_bench_load_report_reads_the_first_format_as_one_repeat(tmp_path):
    (tmp_path / "v1.json").write_text(json.dumps(FIRST_FORMAT))
    doc = bench.load_report(tmp_path / "v1.json")
    assert doc["version"] == 2 and doc["read_from_version"] == 1
    fast = next(r for r in doc["rows"] if r["kernel"] == "fast" and not r["compiled"])
    raw = FIRST_FORMAT["rows"][1]
    assert fast["repeats"] == 1 and fast["step_s_each"] == [raw["step_s"]] == fast["step_s_range"][:1]
    assert fast["ratio_to_bf16_range"] == [raw["ratio_to_bf16"]] * 2
    assert "1.39 (1.39-1.39)" in bench.format_rows(doc["rows"])


def test_bench_load_report_reads_the_recorded_golden_file():
    """golden/training/bench_proxy__h200.json, whichever version it was recorded in: every row with its repeats."""
    doc = bench.load_report(GOLDEN)
    assert doc["version"] == 2 and {(r["recipe"], r["kernel"], r["compiled"]) for r in doc["rows"]} >= {
        ("bf16", None, False), ("mxfp8", "fast", False), ("bf16", None, True), ("mxfp8", "fast", True)}
    assert all(len(r["step_s_each"]) == r["repeats"] >= 1 and r["step_s"] > 0 for r in doc["rows"])


@pytest.mark.parametrize(("edit", "words"), [
    (lambda d: d | {"version": 3}, "version"),
    (lambda d: d | {"kind": "ep-bench"}, "not a convergence-bench"),
    (lambda d: d | {"rows": [{k: v for k, v in d["rows"][0].items() if k != "step_s"}]}, "lacks step_s"),
])
def test_bench_load_report_refuses_what_it_cannot_read(edit, words, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(edit(FIRST_FORMAT)))
    with pytest.raises(BadInput, match=words):
        bench.load_report(bad)
