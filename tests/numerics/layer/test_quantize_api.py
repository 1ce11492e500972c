"""torchao's two MXFP8 training APIs give the same bits: the functional ops the layer harness calls
(``MXFP8Linear`` / ``_to_mxfp8_then_scaled_grouped_mm`` in the ``grouped_mm_op`` seam) and
``quantize_(MXFP8TrainingOpConfig)``, whose weight wrapper dispatches to the same ops.

The harness uses the functional ops because torchao 0.18.0 refuses ``quantize_`` on torch 2.11
(FINDINGS.md C1); these tests keep the ``quantize_`` API under test wherever torchao takes it and
skip, with torchao's own message, where it does not.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from numerics.assertions import assert_bits_equal
from numerics.layer import harness as layers
from numerics.layer.modules import SwiGLUExperts, init_params

pytestmark = pytest.mark.torchao_quantize_api


def _emulated():
    from torchao.quantization.quantize_.common import KernelPreference

    return KernelPreference.EMULATED


def _quantize_api(module: nn.Module, config, filter_fn) -> nn.Module:
    from torchao.quantization import quantize_

    quantize_(module, config, filter_fn=filter_fn)
    return module


def _assert_runs_equal(functional: dict, via_quantize: dict, what: str) -> None:
    assert functional.keys() == via_quantize.keys()
    for name, got in functional.items():
        assert_bits_equal(via_quantize[name], got, what=f"{what} {name}: functional vs quantize_")


@pytest.mark.parametrize("recipe", layers.MX_RECIPES)
def test_layers_functional_linear_equals_quantize_api_without_bias(recipe):
    """Forward, dX and dW of a bias-free linear (the bias case is FINDINGS.md L2)."""
    gen = torch.Generator().manual_seed(0)
    lin = init_params(nn.Linear(64, 96, bias=False), gen).to(torch.bfloat16)
    x, grad = torch.randn(64, 64, generator=gen), torch.randn(64, 96, generator=gen)
    functional = layers.to_mxfp8(nn.Sequential(copy.deepcopy(lin)), recipe, _emulated(), keep_bf16=())
    via_quantize = _quantize_api(nn.Sequential(copy.deepcopy(lin)), layers.op_config(recipe, _emulated()),
                                 lambda mod, fqn: isinstance(mod, nn.Linear))
    args = (x.to(torch.bfloat16), (), grad)
    _assert_runs_equal(layers.run_once(functional, *args), layers.run_once(via_quantize, *args), "linear")


@pytest.mark.parametrize("recipe", layers.MX_RECIPES)
@pytest.mark.parametrize("sizes", [(32, 0, 64, 32), (5, 27, 0, 96)], ids=["aligned", "unaligned-padded"])
def test_layers_functional_grouped_experts_equal_quantize_api(recipe, sizes):
    """SwiGLU experts (three grouped GEMMs) with an empty group; unaligned groups are padded, as the
    harness pads them."""
    pad = any(n % layers.BLOCK for n in sizes)
    gen = torch.Generator().manual_seed(1)
    experts = init_params(SwiGLUExperts(len(sizes), 64, 96), gen).to(torch.bfloat16)
    x, grad = torch.randn(sum(sizes), 64, generator=gen), torch.randn(sum(sizes), 64, generator=gen)
    offs = torch.tensor(sizes).cumsum(0).to(torch.int32)
    functional = layers.to_mxfp8(copy.deepcopy(experts), recipe, _emulated(), pad_groups=pad)
    assert functional.grouped_mm_op is not None
    via_quantize = _quantize_api(copy.deepcopy(experts), layers.op_config(recipe, _emulated(), pad_groups=pad),
                                 lambda mod, fqn: isinstance(mod, SwiGLUExperts))
    args = (x.to(torch.bfloat16), (offs,), grad)
    _assert_runs_equal(layers.run_once(functional, *args), layers.run_once(via_quantize, *args), "experts")
