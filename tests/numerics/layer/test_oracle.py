"""The emulation is exactly "quantize with the MX rules, then a BF16 GEMM".

torchao's emulated MXFP8 output, input gradient and weight gradient are compared bit for bit with
a BF16 GEMM of operands quantized and dequantized by the independent oracle ``numerics.tensor.mx``
(E4M3, RCEIL, blocks of 32 along the axis torchao quantizes for that GEMM). The GEMM call is the
one torchao makes (``torch.mm`` / ``torch._grouped_mm`` on BF16), so the accumulation order is the
same and bit-exactness is the claim; should a platform reorder it, the fallback bar is 80 dB.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from numerics import metrics
from numerics.assertions import assert_bits_equal
from numerics.layer import harness
from numerics.layer import strategies as ls
from numerics.layer.mxfp8 import default_kernel, torchao_grouped_mm, torchao_linear
from numerics.tensor import mx


def oracle(t: torch.Tensor) -> torch.Tensor:
    """MX round trip along the last dim by the oracle, as BF16 (exact: E4M3 x 2^k fits BF16)."""
    a = t.detach().float().contiguous().numpy()
    scale_bits, elem_bits = mx.quantize(a, "e4m3", "rceil")
    return torch.from_numpy(mx.dequantize(scale_bits, elem_bits, "e4m3")).to(torch.bfloat16)


def _data(shape, gen, family):
    return harness.make_input(family, shape, gen, "cpu").to(torch.bfloat16)


@settings(max_examples=25)
@given(dims=ls.gemm_dims(max_blocks=4), family=ls.input_families(), seed=st.integers(0, 2**16))
def test_linear_emulation_is_bf16_gemm_of_oracle_operands(dims, family, seed):
    m, k, n = dims
    g = torch.Generator().manual_seed(seed)
    x, w, grad = _data((m, k), g, family), _data((n, k), g, family), _data((m, n), g, "normal")
    xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    y = torchao_linear(xr, wr)
    y.backward(grad)
    assert_bits_equal(torch.mm(oracle(x), oracle(w).t()), y, what="linear out")
    assert_bits_equal(torch.mm(oracle(grad), oracle(w.t().contiguous()).t()), xr.grad, what="linear dX")
    assert_bits_equal(torch.mm(oracle(grad.t().contiguous()), oracle(x.t().contiguous()).t()), wr.grad,
                      what="linear dW")


@settings(max_examples=25)
@given(sizes=ls.group_sizes(aligned=True, max_experts=4, max_tokens=256), dims=ls.gemm_dims(max_blocks=3),
       family=ls.input_families(), seed=st.integers(0, 2**16))
def test_grouped_mm_emulation_is_bf16_grouped_gemm_of_oracle_operands(sizes, dims, family, seed):
    _, k, n = dims
    m, e = sum(sizes), len(sizes)
    g = torch.Generator().manual_seed(seed)
    x, w, grad = _data((m, k), g, family), _data((e, n, k), g, family), _data((m, n), g, "normal")
    offs = torch.tensor(sizes).cumsum(0).to(torch.int32)
    xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    y = torchao_grouped_mm(xr, wr.transpose(-2, -1), offs)
    y.backward(grad)
    out = torch._grouped_mm(oracle(x), oracle(w).transpose(-2, -1), offs=offs)
    w_along_n = oracle(w.transpose(-2, -1).contiguous()).transpose(-2, -1)  # (E, N, K), blocks along N
    dx = torch._grouped_mm(oracle(grad), w_along_n, offs=offs)
    dw = torch._grouped_mm(oracle(grad.t().contiguous()), oracle(x.t().contiguous()).t(), offs=offs)
    assert_bits_equal(out, y, what="grouped out")
    assert_bits_equal(dx, xr.grad, what="grouped dX")
    assert_bits_equal(dw, wr.grad, what="grouped dW")


@pytest.mark.gpu
def test_grouped_mm_emulation_matches_oracle_on_gpu_to_80_db():
    from numerics.tolerances import floor

    g = torch.Generator().manual_seed(0)
    sizes = (512, 0, 1024, 512)
    x, w = _data((2048, 2048), g, "normal"), _data((4, 1408, 2048), g, "normal")
    offs = torch.tensor(sizes).cumsum(0).to(torch.int32)
    y = torchao_grouped_mm(x.cuda(), w.cuda().transpose(-2, -1), offs.cuda(), kernel=default_kernel("cuda"))
    ref = torch._grouped_mm(oracle(x).cuda(), oracle(w).cuda().transpose(-2, -1), offs=offs.cuda())
    tol = floor("layer", "mxfp8", "emulation_identity", "sqnr_db")
    got = metrics.sqnr_db(ref, y)
    assert got >= tol.floor, tol.describe(got)
