"""The layer benchmark runs every layer of a config and reports a ratio per layer (no timed assertion)."""

from __future__ import annotations

from numerics.layer import bench as layer_bench
from numerics.layer.configs import suite


def test_layer_bench_reports_every_layer_with_a_ratio_per_kernel(capsys):
    rows = layer_bench.run("tiny", "cpu", iters=1, warmup=0, kernels=["emulated"])
    s = suite("tiny")
    assert len(rows) == len(s.linears) + len(s.grouped) + 2
    assert all(r["bf16_ms"] > 0 and r["emulated_ms"] > 0 and r["emulated_ratio"] == r["emulated_ms"] / r["bf16_ms"]
               for r in rows)
    assert "emulated ms" in layer_bench.format_rows(rows)


def test_layer_bench_kernels_here_on_cpu_are_emulated_and_maybe_fast():
    kernels = layer_bench.kernels_here("cpu")
    assert kernels[0] == "emulated" and "real" not in kernels
