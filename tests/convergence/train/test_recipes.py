"""Recipes in a training model: torchtitan's module selection, what apply_recipe records, kernels by hardware.

The equality of the functional ops with torchao's ``quantize_`` API lives at the layer level
(tests/numerics/layer/test_quantize_api.py), on the same modules.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from convergence.train.model import Transformer
from numerics.errors import BadInput
from numerics.layer.configs import tiny
from numerics.layer.deepseek_v3 import GroupedLinear, Linear
from numerics.layer.mxfp8 import default_kernel, kernel_problem
from numerics.layer.op_recipe import OpRecipe
from numerics.layer.recipes import RECIPES, apply_recipe, get_recipe, quantized_fqns


def _model():
    m = Transformer(tiny())
    m.init_weights(torch.Generator().manual_seed(0))
    return m


def test_mxfp8_selects_torchtitans_layers_and_keeps_gate_and_head_bf16():
    m = _model()
    q = set(quantized_fqns(m, get_recipe("mxfp8")))
    linears = {n for n, mod in m.named_modules() if isinstance(mod, Linear)}
    kept = linears - q
    assert kept == {"output"} | {f"layers.{i}.moe.router.gate" for i in (1, 2)}
    assert {f"layers.{i}.moe.experts.w{j}" for i in (1, 2) for j in (1, 2, 3)} <= q
    assert "layers.0.feed_forward.w2" in q and "layers.1.moe.shared_experts.w1" in q


def test_bf16_quantizes_nothing():
    m = _model()
    assert apply_recipe(m, get_recipe("bf16"), "cpu") == {"quantized": [], "kernel": None, "torchao_config": None}
    assert all(getattr(mod, "mxfp8_op", None) is None for mod in m.modules())


def test_apply_recipe_sets_the_op_on_exactly_the_selected_modules():
    m = _model()
    done = apply_recipe(m, get_recipe("mxfp8"), "cpu")
    with_op = {n for n, mod in m.named_modules() if getattr(mod, "mxfp8_op", None) is not None}
    assert with_op == set(done["quantized"])
    kinds = {type(mod) for n, mod in m.named_modules() if n in with_op}
    assert kinds == {Linear, GroupedLinear}
    assert all(type(p) is torch.nn.Parameter and type(p.data) is torch.Tensor for p in m.parameters())
    assert done["kernel"] == "emulated" and done["torchao_config"]["kernel_preference"] == "EMULATED"
    assert done["torchao_api"] == "functional" and set(done["torchao_ops"]) == {"linear", "grouped"}


def test_apply_recipe_selects_only_modules_with_the_seam():
    m = nn.ModuleDict({"attention": nn.Linear(32, 32, bias=False)})  # a plain nn.Linear: no mxfp8_op seam
    assert apply_recipe(m, get_recipe("mxfp8"), "cpu")["quantized"] == []


def test_apply_recipe_refuses_a_weight_that_is_not_block_aligned():
    m = nn.ModuleDict({"attention": Linear(48, 32)})
    with pytest.raises(ValueError, match="multiple of 32"):
        apply_recipe(m, get_recipe("mxfp8"), "cpu")


def test_op_recipe_takes_only_the_scale_modes_both_kernels_compute():
    """RCEIL (torchao's recipes) and FLOOR (the OCP rule), which the fast ops are held bit-identical to torchao's
    with; any other mode is refused where the op recipe is made, before a module is touched. A scale mode is one
    field: FLOOR on mxfp8's op reaches torchao's config."""
    with pytest.raises(BadInput, match="CEIL"):
        OpRecipe(scale_calculation_mode="CEIL")
    floor = dataclasses.replace(get_recipe("mxfp8"), op=OpRecipe(scale_calculation_mode="FLOOR"))
    info = apply_recipe(_model(), floor, "cpu")
    assert info["torchao_config"]["scale_calculation_mode"] == "FLOOR"


def test_recipe_records_its_op_in_config_jsons_field_order():
    """config.json's recipe: the op's fields in the order config.json files have them (runs on disk are read by
    name and compared as written); ``cast``, the null control's field, last of them."""
    assert list(get_recipe("mxfp8-e5m2").as_dict()) == ["name", "mxfp8", "linear_fqns", "grouped_experts",
                                                        "wgrad_with_hp", "scale_calculation_mode", "elements",
                                                        "cast", "description", "control"]
    assert {k: get_recipe("mxfp8-floor").as_dict()[k] for k in ("wgrad_with_hp", "scale_calculation_mode",
                                                                 "elements")} == {
        "wgrad_with_hp": False, "scale_calculation_mode": "FLOOR", "elements": "e4m3"}


def test_a_fast_only_op_names_its_elements_and_runs_on_fast_alone():
    """An op torchao has no training op for (E5M2 or E2M1 elements) runs on kernel fast only: it is the default
    kernel for it, and another is refused naming the recipe; an E4M3 op runs on every kernel (the control)."""
    e5m2 = get_recipe("mxfp8-e5m2")
    assert e5m2.op.kernels == ("fast",) and default_kernel("cpu", e5m2.op) == "fast"
    with pytest.raises(ValueError, match="mxfp8-e5m2 has E5M2 elements.*kernel 'fast' only, not 'emulated'"):
        apply_recipe(_model(), e5m2, "cpu", kernel="emulated")
    assert get_recipe("mxfp8").op.kernels == ("emulated", "fast", "real") and default_kernel("cpu") == "emulated"


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
        grads.append(m.layers[1].moe.experts.w1.weight.grad)
    assert torch.isfinite(grads[1]).all() and not torch.equal(grads[0], grads[1])


def test_wgrad_hp_recipe_differs_from_mxfp8_only_in_wgrad():
    a, b = get_recipe("mxfp8").as_dict(), get_recipe("mxfp8-wgrad-hp").as_dict()
    diff = {k for k in a if a[k] != b[k]}
    assert diff == {"name", "wgrad_with_hp", "description"}
    assert apply_recipe(_model(), get_recipe("mxfp8-wgrad-hp"), "cpu")["torchao_config"]["wgrad_with_hp"]


def test_kernels_off_sm100():
    assert default_kernel("cpu") == "emulated"
    assert "SM100" in kernel_problem("real", "cpu") and "emulated" in kernel_problem("real", "cpu")
    with pytest.raises(ValueError, match="SM100"):
        apply_recipe(_model(), get_recipe("mxfp8"), "cpu", kernel="real")


def test_unknown_recipe_lists_the_valid_ones():
    with pytest.raises(KeyError, match="|".join(RECIPES)):
        get_recipe("fp4")


@pytest.mark.gpu
def test_default_kernel_matches_the_gpu():
    want = "real" if torch.cuda.get_device_capability()[0] == 10 else "emulated"
    assert default_kernel("cuda") == want


def test_a_fast_model_casts_each_input_of_two_projections_once_and_keeps_its_bits(monkeypatch):
    """On the fast kernel, an input two projections take (attention's wq and wkv_a, w1 and w3 of the dense FFN, the
    shared and the routed experts) is cast once for both: one cast fewer per pair and forward, 8 in the tiny model,
    with the loss and every gradient unchanged bit for bit. The control: the same model whose w3 and wkv_a modules
    hold their own op object (equal, not the same) casts each input twice."""
    pytest.importorskip("triton", reason="the fast kernels run on CPU in Triton's interpreter: pip install '.[fast]'")
    from numerics.layer import mxfp8
    from numerics.layer.fast import ops

    tokens = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(4))
    calls = []
    for name in ("_cast", "_cast_both"):
        real = getattr(ops, name)
        monkeypatch.setattr(ops, name, lambda *a, real=real, **k: calls.append(1) or real(*a, **k))

    def step(own_ops: bool):
        m = _model()
        apply_recipe(m, get_recipe("mxfp8"), "cpu", kernel="fast")
        if own_ops:
            for fqn, mod in m.named_modules():
                if fqn.endswith((".w3", ".wkv_a")):
                    kind = mxfp8.FastGroupedMM if isinstance(mod, GroupedLinear) else mxfp8.FastLinear
                    mod.mxfp8_op = kind(mod.mxfp8_op.op)
        calls.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = m(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in m.named_parameters()}, len(calls)

    loss_own, grads_own, casts_own = step(own_ops=True)
    loss, grads, casts = step(own_ops=False)
    assert casts_own - casts == 8  # 3 layers' attention, 1 dense FFN, 2 MoE layers' shared and routed experts
    assert torch.equal(loss, loss_own)
    assert all(torch.equal(grads[n], grads_own[n]) for n in grads), [n for n in grads
                                                                        if not torch.equal(grads[n], grads_own[n])]
