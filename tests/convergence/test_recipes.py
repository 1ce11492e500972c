"""Recipes as data: torchtitan's module selection, torchao configuration, kernels by hardware."""

from __future__ import annotations

import pytest
import torch

from convergence.model import Transformer, tiny
from convergence.recipes import (
    RECIPES,
    apply_recipe,
    get_recipe,
    kernel_preference_for,
    quantized_fqns,
    torchao_config,
)


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


def test_apply_recipe_wraps_exactly_the_selected_weights():
    m = _model()
    done = apply_recipe(m, get_recipe("mxfp8"), "cpu")
    wrapped = {n.rsplit(".", 1)[0] for n, p in m.named_parameters() if type(p.data) is not torch.Tensor}
    assert wrapped == set(done["quantized"])
    assert done["torchao_config"]["kernel_preference"] == "EMULATED"


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
