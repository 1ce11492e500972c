"""Recipes as data: torchtitan's module selection, torchao configuration, kernels by hardware."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from torch import nn

from convergence.train.checkpoint import plain
from convergence.train.model import Linear, Transformer, tiny
from convergence.train.moe import GroupedExperts
from convergence.train.recipes import (
    RECIPES,
    apply_recipe,
    get_recipe,
    kernel_preference_for,
    quantized_fqns,
    torchao_config,
)
from numerics.assertions import assert_bits_equal


def _model():
    m = Transformer(tiny())
    m.init_weights(torch.Generator().manual_seed(0))
    return m


def test_mxfp8_selects_torchtitans_layers_and_keeps_gate_and_head_bf16():
    m = _model()
    q = set(quantized_fqns(m, get_recipe("mxfp8")))
    linears = {n for n, mod in m.named_modules() if isinstance(mod, torch.nn.Linear)}
    kept = linears - q
    assert kept == {"output"} | {f"layers.{i}.moe.router.gate" for i in (1, 2)}
    assert {f"layers.{i}.moe.experts" for i in (1, 2)} <= q
    assert "layers.0.feed_forward.w2" in q and "layers.1.moe.shared_experts.w1" in q


def test_bf16_quantizes_nothing():
    m = _model()
    assert apply_recipe(m, get_recipe("bf16"), "cpu") == {"quantized": [], "torchao_config": None}
    assert all(type(p) is torch.nn.Parameter and type(p.data) is torch.Tensor for p in m.parameters())


def test_apply_recipe_sets_the_op_on_exactly_the_selected_modules():
    m = _model()
    done = apply_recipe(m, get_recipe("mxfp8"), "cpu")
    with_op = {n for n, mod in m.named_modules() if getattr(mod, "mxfp8_op", None) is not None}
    assert with_op == set(done["quantized"])
    ops = {type(mod).__name__: mod.mxfp8_op.func.__name__ for n, mod in m.named_modules() if n in with_op}
    assert ops == {"Linear": "torchao_linear", "GroupedExperts": "torchao_grouped_mm"}
    assert all(type(p) is torch.nn.Parameter and type(p.data) is torch.Tensor for p in m.parameters())
    assert done["torchao_config"]["kernel_preference"] == "EMULATED"
    assert done["torchao_api"] == "functional" and set(done["torchao_ops"]) == {"linear", "grouped_experts"}


def test_apply_recipe_rejects_a_selected_module_without_the_op_seam():
    m = nn.ModuleDict({"attention": nn.Linear(32, 32, bias=False)})  # a plain nn.Linear: no mxfp8_op
    with pytest.raises(TypeError, match="mxfp8_op"):
        apply_recipe(m, get_recipe("mxfp8"), "cpu")


def test_recipe_scale_mode_must_be_torchaos():
    floor_recipe = dataclasses.replace(get_recipe("mxfp8"), scale_calculation_mode="FLOOR")
    with pytest.raises(ValueError, match="FLOOR"):
        torchao_config(floor_recipe, "cpu")


def test_apply_recipe_trains_where_quantize_api_is_refused(torch_without_mxfp8_dtensor_apis):
    """torch 2.11's case (FINDINGS.md C1): the recipe's ops run and change the numbers."""
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 256, (1, 32), generator=gen)
    grads = []
    for name in ("bf16", "mxfp8"):
        m = _model()
        apply_recipe(m, get_recipe(name), "cpu")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            m(tokens).float().square().mean().backward()
        grads.append(plain(m.layers[1].moe.experts.w1.grad))
    assert torch.isfinite(grads[1]).all() and not torch.equal(grads[0], grads[1])


def _fwd_bwd(module: nn.Module, args: tuple, grad: torch.Tensor) -> list[torch.Tensor]:
    """Under BF16 autocast with FP32 master weights, as training runs: output, dX, dW."""
    x = args[0].clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = module(x, *args[1:])
    y.backward(grad.to(y.dtype))
    return [y.detach(), x.grad] + [plain(p.grad) for p in module.parameters()]


@pytest.mark.torchao_quantize_api
@pytest.mark.parametrize("recipe", ["mxfp8", "mxfp8-wgrad-hp"])
@pytest.mark.parametrize("kind", ["linear", "grouped_experts"])
def test_apply_recipe_functional_ops_equal_quantize_api(recipe, kind):
    """The recipe's functional ops give the bits that quantize_(torchao_config(...)) gives, forward and
    backward, with the F-T1 casts; quantize_ is what the recipes used before torch 2.11 refused it."""
    from torchao.quantization import quantize_

    gen = torch.Generator().manual_seed(0)
    if kind == "linear":
        mod = Linear(64, 96)
        args = (torch.randn(2, 32, 64, generator=gen),)
        grad = torch.randn(2, 32, 96, generator=gen)
    else:
        mod = GroupedExperts(4, 64, 96)
        args = (torch.randn(128, 64, generator=gen), torch.tensor([5, 27, 0, 96]))  # empty, unaligned groups
        grad = torch.randn(128, 64, generator=gen)
    with torch.no_grad():
        for p in mod.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    functional, via_quantize = (nn.ModuleDict({"attention": copy.deepcopy(mod)}) for _ in range(2))
    apply_recipe(functional, get_recipe(recipe), "cpu")
    quantize_(via_quantize, torchao_config(get_recipe(recipe), "cpu"), filter_fn=lambda m, fqn: fqn == "attention")
    got = _fwd_bwd(functional["attention"], args, grad)
    want = _fwd_bwd(via_quantize["attention"], args, grad)
    for name, a, b in zip(["out", "dx", "dw1", "dw2", "dw3"], want, got):
        assert_bits_equal(a, b, what=f"{kind} {recipe} {name}: quantize_ vs functional")


def test_wgrad_hp_recipe_differs_from_mxfp8_only_in_wgrad():
    a, b = get_recipe("mxfp8").as_dict(), get_recipe("mxfp8-wgrad-hp").as_dict()
    diff = {k for k in a if a[k] != b[k]}
    assert diff == {"name", "wgrad_with_hp", "description"}
    assert torchao_config(get_recipe("mxfp8-wgrad-hp"), "cpu").wgrad_with_hp


def test_kernel_preference_is_emulated_off_sm100():
    assert kernel_preference_for("cpu") == "EMULATED"


def test_unknown_recipe_lists_the_valid_ones():
    with pytest.raises(KeyError, match="|".join(RECIPES)):
        get_recipe("fp4")


@pytest.mark.gpu
def test_kernel_preference_matches_the_gpu():
    want = "AUTO" if torch.cuda.get_device_capability()[0] == 10 else "EMULATED"
    assert kernel_preference_for("cuda") == want
