"""The layer harness on a torch that torchao 0.18 refuses ``quantize_`` on (torch 2.11, simulated on
CPU by the ``torch_without_mxfp8_dtensor_apis`` fixture): the refusal itself (FINDINGS.md C1),
and the harness's functional route running regardless."""

from __future__ import annotations

import pytest
import torch

from numerics.layer import harness
from numerics.layer.configs import tiny
from numerics.layer.mxfp8 import quantize_api_refusal
from numerics.layer.results import floor_violations


@pytest.mark.xfail(strict=True, reason="C1: torchao 0.18 refuses quantize_(MXFP8TrainingOpConfig) without two "
                   "DTensor APIs that torch 2.11 lacks, asking for a nightly (FINDINGS.md C1)")
def test_quantize_api_accepts_a_torch_without_dtensor_scaled_mm_support(torch_without_mxfp8_dtensor_apis):
    assert quantize_api_refusal() is None  # minimal case: one bias-free 32x32 nn.Linear


def test_layers_moe_block_runs_where_quantize_api_is_refused(torch_without_mxfp8_dtensor_apis):
    assert "nightly" in quantize_api_refusal()  # the simulation reproduces the GPU machines' torch
    res = harness.run_moe(tiny(), 64, recipes=("mxfp8",))
    assert floor_violations([res]) == []
    assert res.stat("mxfp8", "out").sqnr_vs_bf16 < 40  # MXFP8 really ran (BF16 vs BF16 would be inf)
    assert torch.isfinite(torch.tensor(res.stat("mxfp8", "dw:experts.w1").sqnr_vs_bf16))
