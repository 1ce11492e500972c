"""GPU tier: the DeepSeek-V3 16B shapes on one GPU (emulated MXFP8 on H200, real kernels on SM100).

Run on a GPU machine: ``python -m pytest -m gpu tests/numerics/layer/test_gpu.py``; add
``--hypothesis-profile thorough`` for more group splits.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numerics.layer import harness
from numerics.layer import strategies as ls
from numerics.layer.configs import GroupedShape, suite
from numerics.layer.mxfp8 import default_kernel, torchao_grouped_mm
from numerics.layer.results import floor_violations

pytestmark = pytest.mark.gpu
SUITE = suite("16b")


@pytest.mark.parametrize("shape", SUITE.linears, ids=lambda s: s.name)
def test_gpu_16b_linear_meets_floors(shape):
    assert floor_violations([harness.run_linear(shape, device="cuda")]) == []


@pytest.mark.parametrize("shape", SUITE.grouped, ids=lambda s: s.name)
def test_gpu_16b_grouped_mm_meets_floors(shape):
    res = harness.run_grouped_mm(shape, device="cuda")
    assert floor_violations([res]) == []


def test_gpu_16b_moe_block_meets_floors():
    assert floor_violations([harness.run_moe(SUITE.model, SUITE.tokens, device="cuda")]) == []


def test_gpu_16b_mla_meets_floors():
    assert floor_violations([harness.run_mla(SUITE.model, SUITE.tokens, device="cuda")]) == []


@settings(max_examples=10, deadline=None)
@given(sizes=ls.group_sizes(max_experts=8, max_tokens=8192), recipe=ls.mx_recipes(), seed=st.integers(0, 2**16))
def test_gpu_grouped_mm_16b_dims_over_group_splits(sizes, recipe, seed):
    res = harness.run_grouped_mm(GroupedShape("h", 2048, 1408, sizes), recipes=(recipe,), seed=seed, device="cuda")
    assert floor_violations([res]) == []


@settings(max_examples=10, deadline=None)
@given(sizes=ls.group_sizes(max_experts=8, max_tokens=4096))
def test_gpu_grouped_mm_empty_groups_have_exactly_zero_weight_gradients(sizes):
    import torch

    x = torch.randn(sum(sizes), 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(len(sizes), 1408, 2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    offs = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
    y = torchao_grouped_mm(x, w.transpose(-2, -1), offs, kernel=default_kernel("cuda"))
    y.backward(torch.randn_like(y))
    for i, n in enumerate(sizes):
        if n == 0:
            assert torch.count_nonzero(w.grad[i]) == 0, f"expert {i} is empty but its dW is not zero"
