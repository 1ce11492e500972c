"""The layer benchmark runs every layer of a config and reports a ratio per layer (no timed assertion)."""

from __future__ import annotations

from numerics.layer import bench as layer_bench
from numerics.layer.configs import small


def test_layer_bench_reports_every_layer_with_a_ratio(capsys):
    rows = layer_bench.run("small", "cpu", iters=1, warmup=0)
    cfg = small()
    assert len(rows) == len(cfg.linears) + len(cfg.grouped) + 2
    assert all(r["bf16_ms"] > 0 and r["mxfp8_ms"] > 0 and r["ratio"] == r["mxfp8_ms"] / r["bf16_ms"] for r in rows)
    assert "ratio" in layer_bench.format_rows(rows)
