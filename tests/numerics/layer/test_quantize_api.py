"""torchao's two MXFP8 training APIs give the same bits: the functional ops the seam puts into the model's
modules (``numerics.layer.mxfp8``) and ``quantize_(MXFP8TrainingOpConfig)``, whose weight wrapper dispatches
to the same ops.

The suite uses the functional ops because torchao 0.18.0 refuses ``quantize_`` on torch 2.11
(FINDINGS.md C1); these tests keep the ``quantize_`` API under test wherever torchao takes it and
skip, with torchao's own message, where it does not. Both run as training runs them: FP32 master weights
under BF16 autocast (the modules cast explicitly, FINDINGS.md T1).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from numerics.assertions import assert_bits_equal
from numerics.layer import harness
from numerics.layer.deepseek_v3 import GroupedExperts, GroupedLinear, Linear
from numerics.layer.mxfp8 import op_config
from numerics.layer.recipes import MX_RECIPES, apply_recipe, get_recipe

pytestmark = pytest.mark.torchao_quantize_api


def _runs(module: nn.Module, args: tuple, grad: torch.Tensor, recipe: str) -> tuple[dict, dict]:
    from torchao.quantization import quantize_

    functional = nn.ModuleDict({"attention": copy.deepcopy(module)})  # a name torchtitan's recipe selects
    apply_recipe(functional, get_recipe(recipe), "cpu")
    via_quantize = copy.deepcopy(module)
    quantize_(via_quantize, op_config(get_recipe(recipe).op),
              filter_fn=lambda m, fqn: isinstance(m, (Linear, GroupedLinear)))
    return (harness.run_once(functional["attention"], args[0], args[1:], grad, autocast=True),
            harness.run_once(via_quantize, args[0], args[1:], grad, autocast=True))


@pytest.mark.parametrize("recipe", MX_RECIPES)
def test_quantize_api_equals_functional_linear(recipe):
    """Forward, dX and dW of the model's bias-free projection (the bias case is FINDINGS.md L2)."""
    gen = torch.Generator().manual_seed(0)
    lin = harness.init_params(Linear(64, 96), gen)
    functional, via_quantize = _runs(lin, (torch.randn(2, 32, 64, generator=gen),),
                                     torch.randn(2, 32, 96, generator=gen), recipe)
    assert functional.keys() == via_quantize.keys()
    for name, got in functional.items():
        assert_bits_equal(via_quantize[name].float(), got.float(), what=f"linear {recipe} {name}")


@pytest.mark.parametrize("recipe", MX_RECIPES)
@pytest.mark.parametrize("sizes", [(32, 0, 64, 32), (5, 27, 0, 96)], ids=["aligned", "unaligned-padded"])
def test_quantize_api_equals_functional_grouped_experts(recipe, sizes):
    """The model's routed experts (three grouped GEMMs) with an empty group; groups padded to 32 by both."""
    gen = torch.Generator().manual_seed(1)
    experts = harness.init_params(GroupedExperts(len(sizes), 64, 96), gen)
    x, grad = torch.randn(sum(sizes), 64, generator=gen), torch.randn(sum(sizes), 64, generator=gen)
    functional, via_quantize = _runs(experts, (x, torch.tensor(sizes)), grad, recipe)
    for name, got in functional.items():
        assert_bits_equal(via_quantize[name].float(), got.float(), what=f"experts {recipe} {name}")


def test_quantize_api_comparison_detects_a_different_recipe():
    """Control: the same comparison tells mxfp8 from mxfp8-wgrad-hp (their weight gradients differ)."""
    gen = torch.Generator().manual_seed(2)
    lin = harness.init_params(Linear(64, 96), gen)
    args, grad = (torch.randn(64, 64, generator=gen),), torch.randn(64, 96, generator=gen)
    a, _ = _runs(lin, args, grad, "mxfp8")
    b, _ = _runs(lin, args, grad, "mxfp8-wgrad-hp")
    assert torch.equal(a["out"], b["out"]) and not torch.equal(a["dw:weight"], b["dw:weight"])
