"""The model's DeepSeekMoE block under the MXFP8 recipes: floors, what gets converted, routing shared."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from torch import nn

from numerics.layer import harness
from numerics.layer.configs import suite, tiny
from numerics.layer.deepseek_v3 import MoE
from numerics.layer.recipes import apply_recipe, get_recipe
from numerics.layer.results import floor_violations

TOKENS = suite("tiny").tokens


@functools.cache
def _tiny_moe(seed: int):
    return harness.run_moe(tiny(), TOKENS, seed=seed)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_moe_block_meets_floors(seed):
    res = _tiny_moe(seed)
    assert floor_violations([res]) == []
    tensors = set(res.tensors())
    assert {"out", "dx", "dw:router.gate", "dw:experts.w1", "dw:shared_experts.w2"} <= tensors


def test_moe_block_wgrad_hp_improves_expert_weight_gradients():
    res = _tiny_moe(0)
    for t in ("dw:experts.w1", "dw:experts.w2", "dw:experts.w3"):
        assert res.stat("mxfp8-wgrad-hp", t).sqnr_vs_fp32 > res.stat("mxfp8", t).sqnr_vs_fp32
    # the forward is the same computation in both recipes
    assert res.stat("mxfp8-wgrad-hp", "out").sqnr_vs_fp32 == res.stat("mxfp8", "out").sqnr_vs_fp32


def test_moe_conversion_follows_torchtitans_selection():
    m = nn.ModuleDict({"moe": MoE(tiny())})
    apply_recipe(m, get_recipe("mxfp8"), "cpu")
    moe = m["moe"]
    assert moe.router.gate.mxfp8_op is None  # router.gate stays BF16 (torchtitan's include list omits it)
    for name in ("w1", "w2", "w3"):
        assert getattr(moe.shared_experts, name).mxfp8_op is not None
        assert getattr(moe.experts, name).mxfp8_op is not None  # routed experts' grouped GEMMs
    assert all(type(p.data) is torch.Tensor for p in moe.parameters())  # weights stay plain


def test_moe_block_mxfp8_changes_the_output():
    """Guard against a harness that silently runs BF16 for 'mxfp8': the numbers must differ."""
    res = harness.run_moe(tiny(), 64, recipes=("mxfp8",))
    assert res.stat("mxfp8", "out").sqnr_vs_bf16 < 40


def test_moe_forced_routing_sends_every_precision_to_the_same_experts():
    """The harness routes the FP32, BF16 and MXFP8 runs with the BF16 router's choice: with the routing
    forced, each run's expert counts equal the forced choice; left to their own routers, FP32 and BF16
    pick differently for some token on a near-tie input (so forcing is what makes the runs comparable)."""
    cfg = tiny()
    ref = harness.init_params(MoE(cfg), torch.Generator().manual_seed(0))
    x = torch.randn(TOKENS, cfg.dim, generator=torch.Generator().manual_seed(1))
    forced = copy.deepcopy(ref).to(torch.bfloat16).route(x.to(torch.bfloat16))
    want = torch.bincount(forced.reshape(-1), minlength=cfg.n_routed_experts).float()
    for module, inp in ((ref, x), (copy.deepcopy(ref).to(torch.bfloat16), x.to(torch.bfloat16))):
        module.tokens_per_expert.zero_()
        module(inp, forced)
        assert torch.equal(module.tokens_per_expert, want)
    # near ties: gate rows 1 and 2 are row 0 times (1 + 2^-13) and (1 + 2^-12), below BF16's resolution
    # (2^-9 relative) but not FP32's, and large enough to be every token's top candidates: FP32 ranks the
    # three by the tiny factors, BF16 sees three equal logits, so their top-2 differ on some token
    tied = copy.deepcopy(ref)
    with torch.no_grad():
        w = tied.router.gate.weight
        w[0] = 10 * w[0]
        w[1], w[2] = w[0] * (1 + 2**-13), w[0] * (1 + 2**-12)
    own = [tied.route(x), copy.deepcopy(tied).to(torch.bfloat16).route(x.to(torch.bfloat16))]
    assert not torch.equal(own[0].sort(-1).values, own[1].sort(-1).values)
