"""DeepSeekMoE block with torchtitan's MXFP8 filter: floors, what gets converted, routing shared."""

from __future__ import annotations

import copy
import dataclasses
import functools

import pytest
import torch
from torch import nn

from numerics.layer import harness as layers
from numerics.layer.configs import small
from numerics.layer.modules import MoE


def _emulated():
    from torchao.quantization.quantize_.common import KernelPreference

    return KernelPreference.EMULATED


@functools.cache
def _small_moe(seed: int):
    return layers.run_moe(small().moe, seed=seed)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_moe_block_meets_floors(seed):
    res = _small_moe(seed)
    assert layers.floor_violations([res]) == []
    tensors = set(res.tensors())
    assert {"out", "dx", "dw:router.gate.weight", "dw:experts.w1", "dw:shared_experts.w2.weight"} <= tensors


def test_moe_block_wgrad_hp_improves_expert_weight_gradients():
    res = _small_moe(0)
    for t in ("dw:experts.w1", "dw:experts.w2", "dw:experts.w3"):
        assert res.stat("mxfp8_wgrad_hp", t).sqnr_vs_fp32 > res.stat("mxfp8", t).sqnr_vs_fp32
    # the forward is the same computation in both recipes
    assert res.stat("mxfp8_wgrad_hp", "out").sqnr_vs_fp32 == res.stat("mxfp8", "out").sqnr_vs_fp32


def test_moe_conversion_follows_torchtitan_filter():
    from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear

    m = layers.to_mxfp8(MoE(small().moe).to(torch.bfloat16), "mxfp8", _emulated())
    assert type(m.router.gate) is nn.Linear  # router.gate stays BF16 (torchtitan filter_fqns)
    for name in ("w1", "w2", "w3"):
        assert isinstance(getattr(m.shared_experts, name), MXFP8Linear)
    assert m.experts.grouped_mm_op.func is layers.torchao_grouped_mm  # routed experts' grouped GEMMs
    assert all(type(p.data) is torch.Tensor for p in m.parameters())  # weights stay plain


def test_moe_conversion_without_seam_is_a_typeerror():
    class Experts(nn.Module):  # 3-D expert weights, but no grouped_mm_op for the MXFP8 op
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(2, 32, 32, dtype=torch.bfloat16))

    with pytest.raises(TypeError, match="grouped_mm_op"):
        layers.to_mxfp8(nn.ModuleDict({"experts": Experts()}), "mxfp8", _emulated())


def test_moe_block_mxfp8_changes_the_output():
    """Guard against a harness that silently runs BF16 for 'mxfp8': the numbers must differ."""
    res = layers.run_moe(dataclasses.replace(small().moe, tokens=64), recipes=("mxfp8",))
    assert res.stat("mxfp8", "out").sqnr_vs_bf16 < 40


def test_moe_routing_is_shared_across_precisions():
    s = dataclasses.replace(small().moe, tokens=64)
    ref = layers.init_params(MoE(s), torch.Generator().manual_seed(0))
    x = torch.randn(64, s.dim)
    topk = layers.route(copy.deepcopy(ref.router.gate).to(torch.bfloat16), x.to(torch.bfloat16), s.top_k)
    assert topk.shape == (64, s.top_k)
    assert (topk >= 0).all() and (topk < s.experts).all()
    # each token's experts are distinct
    assert all(len(set(row)) == s.top_k for row in topk.tolist())
