"""The DeepSeek-V3 layers the layer level runs, written plainly in torch (no torchao inside).

Public: ``grouped_mm``, ``GroupedLinear``, ``SwiGLUExperts``, ``FeedForward``, ``MoE``, ``MLA``,
``route`` and ``init_params``.

The same module runs in FP32 (the reference), BF16, and MXFP8 after ``numerics.layer.harness`` converts
it. ``grouped_mm`` is where the precisions part: FP32 computes each expert's GEMM on its own slice
(an independent reference, not ``torch._grouped_mm``), BF16 calls ``torch._grouped_mm``, and MXFP8
calls the op that ``numerics.layer.harness.to_mxfp8`` puts in an expert module's ``grouped_mm_op`` seam
(``None``, the default, means plain precision).

Layouts follow torchtitan's ``deepseek_v3``: expert weights are (experts, out, in); the MoE router
scores with softmax in FP32 and picks top-k; shared experts are one SwiGLU FFN of hidden
``expert_hidden * shared_experts``; MLA has no q LoRA (the 16B flavour), a RMSNorm on the
compressed kv, and the rope part of k shared across heads. Rotary embedding itself is left out:
it is an elementwise rotation in BF16 that no MXFP8 GEMM sees.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from numerics.layer.configs import MLAShape, MoEShape


def grouped_mm(x: torch.Tensor, w_t: torch.Tensor, offs: torch.Tensor,
               op: Callable | None = None) -> torch.Tensor:
    """(tokens, K) @ (experts, K, N) -> (tokens, N); rows [offs[i-1], offs[i]) use expert i.
    ``op(x, w_t, offs)``, when given, replaces the plain-precision computation (MXFP8)."""
    if op is not None:
        return op(x, w_t, offs)
    if x.dtype == torch.float32:
        ends = offs.tolist()
        starts = [0] + ends[:-1]
        parts = [x[s:e] @ w_t[i] for i, (s, e) in enumerate(zip(starts, ends))]
        tail = x.new_zeros(x.shape[0] - (ends[-1] if ends else 0), w_t.shape[-1])
        return torch.cat(parts + [tail])
    return torch._grouped_mm(x, w_t, offs=offs)


class GroupedLinear(nn.Module):
    """One grouped GEMM: the expert forward (2D x 3D), its dX (2D x 3D) and dW (2D x 2D)."""

    def __init__(self, experts: int, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(experts, out_features, in_features))
        self.grouped_mm_op: Callable | None = None  # set by numerics.layer.harness.to_mxfp8

    def forward(self, x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        return grouped_mm(x, self.weight.transpose(-2, -1), offs, self.grouped_mm_op)


class SwiGLUExperts(nn.Module):
    def __init__(self, experts: int, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(experts, hidden, dim))
        self.w2 = nn.Parameter(torch.empty(experts, dim, hidden))
        self.w3 = nn.Parameter(torch.empty(experts, hidden, dim))
        self.grouped_mm_op: Callable | None = None  # set by numerics.layer.harness.to_mxfp8

    def forward(self, x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        def mm(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return grouped_mm(a, w.transpose(-2, -1), offs, self.grouped_mm_op)

        return mm(F.silu(mm(x, self.w1)) * mm(x, self.w3), self.w2)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class _Router(nn.Module):
    def __init__(self, dim: int, experts: int):
        super().__init__()
        self.gate = nn.Linear(dim, experts, bias=False)


def route(gate: nn.Linear, x: torch.Tensor, top_k: int) -> torch.Tensor:
    """Top-k expert indices (tokens, top_k) from softmax scores, as torchtitan's router picks them."""
    with torch.no_grad():
        return torch.topk(F.softmax(gate(x).float(), dim=-1), top_k, dim=-1).indices


class MoE(nn.Module):
    """DeepSeekMoE: softmax top-k router, routed SwiGLU experts through grouped GEMMs, shared experts.

    ``forward(x, topk_idx)`` takes the routing decision as an input so that the FP32, BF16 and
    MXFP8 runs send each token to the same experts (a near-tie flipped by rounding would otherwise
    dominate the comparison); the routing weights still come from each run's own gate, so the
    gate's gradient is compared too.
    """

    def __init__(self, shape: MoEShape):
        super().__init__()
        self.shape = shape
        self.router = _Router(shape.dim, shape.experts)
        self.experts = SwiGLUExperts(shape.experts, shape.dim, shape.expert_hidden)
        self.shared_experts = FeedForward(shape.dim, shape.expert_hidden * shape.shared_experts)

    def forward(self, x: torch.Tensor, topk_idx: torch.Tensor) -> torch.Tensor:
        scores = F.softmax(self.router.gate(x).float(), dim=-1)
        weights = scores.gather(1, topk_idx)  # (tokens, top_k), fp32 as in torchtitan
        flat = topk_idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        token_of = order // self.shape.top_k
        counts = torch.bincount(flat, minlength=self.shape.experts)
        offs = torch.cumsum(counts, 0).to(torch.int32)
        routed = self.experts(x[token_of], offs)
        routed = (routed.float() * weights.reshape(-1)[order, None]).to(x.dtype)
        out = torch.zeros_like(x).index_add(0, token_of, routed)
        return out + self.shared_experts(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class MLA(nn.Module):
    """Multi-head latent attention projections (wq, wkv_a, wkv_b, wo) around causal attention."""

    def __init__(self, s: MLAShape):
        super().__init__()
        self.s = s
        qk = s.qk_nope_head_dim + s.qk_rope_head_dim
        self.wq = nn.Linear(s.dim, s.heads * qk, bias=False)
        self.wkv_a = nn.Linear(s.dim, s.kv_lora_rank + s.qk_rope_head_dim, bias=False)
        self.kv_norm = RMSNorm(s.kv_lora_rank)
        self.wkv_b = nn.Linear(s.kv_lora_rank, s.heads * (s.qk_nope_head_dim + s.v_head_dim), bias=False)
        self.wo = nn.Linear(s.heads * s.v_head_dim, s.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s, t = self.s, x.shape[0]
        q = self.wq(x).view(t, s.heads, -1)
        c, k_pe = self.wkv_a(x).split([s.kv_lora_rank, s.qk_rope_head_dim], dim=-1)
        kv = self.wkv_b(self.kv_norm(c)).view(t, s.heads, -1)
        k_nope, v = kv.split([s.qk_nope_head_dim, s.v_head_dim], dim=-1)
        k = torch.cat([k_nope, k_pe[:, None, :].expand(t, s.heads, -1)], dim=-1)
        attn = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True,
            scale=1.0 / math.sqrt(s.qk_nope_head_dim + s.qk_rope_head_dim),
        )
        return self.wo(attn.transpose(0, 1).reshape(t, -1))


def init_params(module: nn.Module, gen: torch.Generator) -> nn.Module:
    """Deterministic init from ``gen`` (no global seed): N(0, 1/fan_in) weights, small biases."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("kv_norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen, device=p.device))
            elif p.ndim == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen, device=p.device))
            else:
                p.copy_(torch.randn(p.shape, generator=gen, device=p.device) / math.sqrt(p.shape[-1]))
    return module
