"""MLA attention projections (wq, wkv_a, wkv_b, wo) in MXFP8: floors and conversion."""

from __future__ import annotations

import functools

import pytest
import torch

from numerics.layer import harness as layers
from numerics.layer.configs import small
from numerics.layer.modules import MLA


def _emulated():
    from torchao.quantization.quantize_.common import KernelPreference

    return KernelPreference.EMULATED


@functools.cache
def _small_mla(seed: int):
    return layers.run_mla(small().mla, seed=seed)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mla_projections_meet_floors(seed):
    res = _small_mla(seed)
    assert layers.floor_violations([res]) == []
    assert {"out", "dx", "dw:wq", "dw:wkv_a", "dw:wkv_b", "dw:wo"} <= set(res.tensors())


def test_mla_converts_all_four_projections():
    from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear

    m = layers.to_mxfp8(MLA(small().mla).to(torch.bfloat16), "mxfp8", _emulated())
    assert all(isinstance(getattr(m, n), MXFP8Linear) for n in ("wq", "wkv_a", "wkv_b", "wo"))


def test_mla_bf16_is_much_closer_to_fp32_than_mxfp8():
    res = _small_mla(0)
    for t in ("out", "dx", "dw:wq"):
        assert res.stat("bf16", t).sqnr_vs_fp32 > res.stat("mxfp8", t).sqnr_vs_fp32 + 10
