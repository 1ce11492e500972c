"""The DeepSeek-V3 layers, once: what the model trains with and what the layer level measures.

Public: ``RMSNorm``, ``Linear``, ``rope_frequencies``, ``apply_rope``, ``Attention`` (MLA), ``FeedForward``,
``GroupedLinear``, ``GroupedExperts``, ``Router``, ``LocalDispatch``, ``MoE``, and the functions they compute
with: ``compute_dtype``, ``linear``, ``grouped_mm``, ``weighted_slot_sum``; ``SharedInputOp`` and
``shared_input_casts`` (below).

Module names follow torchtitan's DeepSeek-V3 (``attention.wq``, ``feed_forward.w1``, ``moe.router.gate``,
``moe.shared_experts.w1``, ``moe.experts.w1``) so a recipe's fully-qualified-name filter reads the same here
and there.

Precision: every matmul casts its weight and input to the *compute dtype* (the active autocast dtype,
else the input's dtype), the FSDP ``param_dtype=bf16`` convention. For plain tensors this is exactly
what ``torch.autocast`` does; it is written out because torchao's MXFP8 ops are autograd functions that
run above autocast and would otherwise see a BF16 input and an FP32 weight (FINDINGS.md T1). So one
module runs as the FP32 reference (FP32 weights and input), in BF16 (BF16 weights, or FP32 masters under
autocast), and in MXFP8.

The MXFP8 seam: ``Linear`` and ``GroupedLinear`` have an ``mxfp8_op`` attribute, ``None`` for plain
precision; ``numerics.layer.recipes.apply_recipe`` puts the op of ``numerics.layer.mxfp8`` there. In FP32
a grouped GEMM computes each expert's slice on its own (an independent reference, not
``torch._grouped_mm``). Where two modules project one input (a SwiGLU's w1 and w3, attention's first two
projections) and hold the same op that is a ``SharedInputOp`` (the fast kernel's), the input's casts are made once
and given to both (``shared_input_casts``); every other op casts inside each call.

The MoE's dispatch/combine is a second seam: ``MoE.dispatcher`` is any object with ``LocalDispatch.run``'s
signature; expert parallelism puts ``convergence.train.ep_dispatch.EPDispatch`` there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from numerics.layer.configs import ModelConfig


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The active autocast dtype on x's device, else x's own dtype."""
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return x.dtype


def linear(x: torch.Tensor, w: torch.Tensor, op: Callable | None = None, x_casts=None) -> torch.Tensor:
    """``x @ w.T`` in the compute dtype; ``op(x, w)``, when given (MXFP8), replaces F.linear after the casts
    (``op(x, w, x_casts=...)`` with the input's casts from ``shared_input_casts``)."""
    dt = compute_dtype(x)
    # ``is None``, not ``op or F.linear``: dynamo (torch 2.11) cannot take the truth value of a functools.partial,
    # which the MXFP8 recipes pass as ``op``, and the graph break there leaves a compiled model's forward eager
    if op is None:
        return F.linear(x.to(dt), w.to(dt))
    return op(x.to(dt), w.to(dt)) if x_casts is None else op(x.to(dt), w.to(dt), x_casts=x_casts)


def grouped_mm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, op: Callable | None = None,
               x_casts=None) -> torch.Tensor:
    """x [T, in] (rows sorted by expert) times each expert's w [E, out, in]^T; ``offs``: cumulative row ends.

    ``op(x, w_t, offs)``, when given (MXFP8), replaces ``torch._grouped_mm`` (``x_casts=`` as in ``linear``);
    FP32 runs expert by expert."""
    dt = compute_dtype(x)
    x, w_t = x.to(dt), w.to(dt).transpose(-2, -1)
    if op is not None:
        return op(x, w_t, offs) if x_casts is None else op(x, w_t, offs, x_casts=x_casts)
    if dt != torch.float32:
        return torch._grouped_mm(x, w_t, offs=offs)
    ends = offs.tolist()
    starts = [0] + ends[:-1]
    parts = [x[s:e] @ w_t[i] for i, (s, e) in enumerate(zip(starts, ends))]
    tail = x.new_zeros(x.shape[0] - (ends[-1] if ends else 0), w_t.shape[-1])
    return torch.cat(parts + [tail])


class SharedInputOp:
    """An ``mxfp8_op`` that can cast an input once for several modules that take it: ``input_casts(x, *more,
    want_dw=)`` (``more``: a grouped GEMM's ``offs``) returns what each module's call then takes as ``x_casts``."""

    def input_casts(self, x: torch.Tensor, *more, want_dw: bool):
        raise NotImplementedError


def shared_input_casts(x: torch.Tensor, modules: tuple[nn.Module, ...], *more):
    """The casts of ``x`` for ``modules`` (each a ``Linear`` or each a ``GroupedLinear`` on x, called with
    ``*more``), made once where all of them hold one ``SharedInputOp``; None where each casts for itself. They are
    the tensors each module's op would make, so the modules' results and gradients keep their bits."""
    op = modules[0].mxfp8_op
    if not isinstance(op, SharedInputOp) or any(m.mxfp8_op is not op for m in modules[1:]):
        return None
    want_dw = torch.is_grad_enabled() and any(m.weight.requires_grad for m in modules)
    return op.input_casts(x.to(compute_dtype(x)), *more, want_dw=want_dw)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        return y.to(compute_dtype(x))


class Linear(nn.Linear):
    """A bias-free projection whose matmul runs in the compute dtype, with the MXFP8 seam ``mxfp8_op``."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)
        self.mxfp8_op: Callable | None = None

    def forward(self, x: torch.Tensor, x_casts=None) -> torch.Tensor:
        return linear(x, self.weight, self.mxfp8_op, x_casts)


def _yarn_correction_dim(num_rot: float, dim: int, base: float, max_seq: int) -> float:
    return dim * math.log(max_seq / (num_rot * 2 * math.pi)) / (2 * math.log(base))


def rope_frequencies(cfg: ModelConfig, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [seq_len, rope_dim/2], with DeepSeek's YaRN frequency interpolation."""
    dim, base = cfg.qk_rope_head_dim, cfg.rope_theta
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    if cfg.max_seq_len > cfg.original_seq_len:
        low = max(math.floor(_yarn_correction_dim(cfg.beta_fast, dim, base, cfg.original_seq_len)), 0)
        high = min(math.ceil(_yarn_correction_dim(cfg.beta_slow, dim, base, cfg.original_seq_len)), dim - 1)
        ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / max(high - low, 1e-3)).clamp(0, 1)
        smooth = 1 - ramp
        freqs = freqs / cfg.rope_factor * (1 - smooth) + freqs * smooth
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), freqs)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate consecutive pairs (x[2i], x[2i+1]) as DeepSeek's complex-number RoPE does. x: [b, s, h, d]."""
    xf = x.float().unflatten(-1, (-1, 2))
    a, b = xf[..., 0], xf[..., 1]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2).to(x.dtype)


class Attention(nn.Module):
    """Multi-head Latent Attention: low-rank joint KV (kv_lora_rank) with a shared decoupled RoPE key.

    ``forward(x [b, s, dim], cos, sin)`` with ``cos, sin = rope_frequencies(cfg, s)``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        h = cfg.n_heads
        if cfg.q_lora_rank:
            self.wq_a = Linear(cfg.dim, cfg.q_lora_rank)
            self.q_norm = RMSNorm(cfg.q_lora_rank, cfg.norm_eps)
            self.wq_b = Linear(cfg.q_lora_rank, h * cfg.qk_head_dim)
        else:
            self.wq = Linear(cfg.dim, h * cfg.qk_head_dim)
        self.wkv_a = Linear(cfg.dim, cfg.kv_lora_rank + cfg.qk_rope_head_dim)
        self.kv_norm = RMSNorm(cfg.kv_lora_rank, cfg.norm_eps)
        self.wkv_b = Linear(cfg.kv_lora_rank, h * (cfg.qk_nope_head_dim + cfg.v_head_dim))
        self.wo = Linear(h * cfg.v_head_dim, cfg.dim)
        self.softmax_scale = cfg.qk_head_dim**-0.5
        if cfg.max_seq_len > cfg.original_seq_len:  # YaRN attention temperature, as DeepSeek-V3
            m = 0.1 * cfg.mscale * math.log(cfg.rope_factor) + 1.0
            self.softmax_scale *= m * m

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        cfg, (b, s, _) = self.cfg, x.shape
        casts = shared_input_casts(x, (self.wq_a if cfg.q_lora_rank else self.wq, self.wkv_a))
        q = self.wq_b(self.q_norm(self.wq_a(x, x_casts=casts))) if cfg.q_lora_rank else self.wq(x, x_casts=casts)
        q = q.view(b, s, cfg.n_heads, cfg.qk_head_dim)
        q_nope, q_pe = q.split([cfg.qk_nope_head_dim, cfg.qk_rope_head_dim], dim=-1)
        q = torch.cat([q_nope, apply_rope(q_pe, cos, sin)], dim=-1)
        kv, k_pe = self.wkv_a(x, x_casts=casts).split([cfg.kv_lora_rank, cfg.qk_rope_head_dim], dim=-1)
        del casts  # the first layout only served the two forward GEMMs
        k_pe = apply_rope(k_pe.unsqueeze(2), cos, sin)
        kv = self.wkv_b(self.kv_norm(kv)).view(b, s, cfg.n_heads, cfg.qk_nope_head_dim + cfg.v_head_dim)
        k_nope, v = kv.split([cfg.qk_nope_head_dim, cfg.v_head_dim], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(-1, -1, cfg.n_heads, -1)], dim=-1)
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2).to(q.dtype),
            is_causal=True, scale=self.softmax_scale,
        )
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x). The dense FFN and the shared experts."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1, self.w2, self.w3 = Linear(dim, hidden), Linear(hidden, dim), Linear(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        casts = shared_input_casts(x, (self.w1, self.w3))
        h = F.silu(self.w1(x, x_casts=casts)) * self.w3(x, x_casts=casts)
        del casts  # the first layout only served the two forward GEMMs
        return self.w2(h)


class GroupedLinear(nn.Module):
    """One grouped GEMM, every expert's [out, in] weight in one [E, out, in] parameter, with the MXFP8 seam."""

    def __init__(self, n_experts: int, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_experts, out_features, in_features))
        self.mxfp8_op: Callable | None = None

    def forward(self, x_sorted: torch.Tensor, offs: torch.Tensor, x_casts=None) -> torch.Tensor:
        return grouped_mm(x_sorted, self.weight, offs, self.mxfp8_op, x_casts)


class GroupedExperts(nn.Module):
    """All routed experts as SwiGLU over grouped GEMMs: w2(silu(w1 x) * w3 x), expert by expert."""

    def __init__(self, n_experts: int, dim: int, hidden: int):
        super().__init__()
        self.w1 = GroupedLinear(n_experts, dim, hidden)
        self.w2 = GroupedLinear(n_experts, hidden, dim)
        self.w3 = GroupedLinear(n_experts, dim, hidden)

    def forward(self, x_sorted: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        offs = torch.cumsum(counts, 0).to(torch.int32)
        casts = shared_input_casts(x_sorted, (self.w1, self.w3), offs)
        h = F.silu(self.w1(x_sorted, offs, x_casts=casts)) * self.w3(x_sorted, offs, x_casts=casts)
        del casts  # the first layout only served the two forward GEMMs
        return self.w2(h, offs)


class Router(nn.Module):
    """gate: a bias-free linear to one score per expert; scoring in FP32."""

    def __init__(self, dim: int, n_experts: int):
        super().__init__()
        self.gate = Linear(dim, n_experts)

    def forward(self, x: torch.Tensor, score_func: str) -> torch.Tensor:
        logits = self.gate(x).float()
        return logits.softmax(-1) if score_func == "softmax" else logits.sigmoid()


@dataclass
class DispatchHandle:
    order: torch.Tensor  # [T*k] positions of the flattened (token, slot) pairs in expert-sorted order
    num_tokens: int
    top_k: int


def weighted_slot_sum(y: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum_k weights[t, k] * y[t, k] in float32, folded in ascending k: y [T, K, H], weights [T, K].

    One fixed order (not ``.sum(1)``, whose reduction order is the kernel's choice), shared by the
    local and the expert-parallel combine so both round identically."""
    acc = y[:, 0].float() * weights[:, 0:1]
    for k in range(1, y.shape[1]):
        acc = acc + y[:, k].float() * weights[:, k:k + 1]
    return acc


class LocalDispatch:
    """Single-rank dispatch: sort (token, slot) pairs by expert; combine: unsort and sum the k slots."""

    def dispatch(
        self, x: torch.Tensor, topk_idx: torch.Tensor, num_experts: int
    ) -> tuple[torch.Tensor, torch.Tensor, DispatchHandle]:
        flat = topk_idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.zeros(num_experts, dtype=torch.int64, device=x.device)
        counts.scatter_add_(0, flat, torch.ones_like(flat))
        x_sorted = x[order // topk_idx.shape[1]]
        return x_sorted, counts, DispatchHandle(order, x.shape[0], topk_idx.shape[1])

    def combine(self, y_sorted: torch.Tensor, topk_weights: torch.Tensor, h: DispatchHandle) -> torch.Tensor:
        # Unpermute then reduce over the k slots in a fixed order: deterministic on every device
        # (an index_add_ scatter would use atomics on CUDA).
        y = torch.empty_like(y_sorted)
        y[h.order] = y_sorted
        return weighted_slot_sum(y.view(h.num_tokens, h.top_k, -1), topk_weights).to(y_sorted.dtype)

    def run(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
            experts: GroupedExperts, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Route, run the experts, combine: (output [T, H], tokens per expert [E] of this rank's tokens)."""
        x_sorted, counts, handle = self.dispatch(x, topk_idx, num_experts)
        return self.combine(experts(x_sorted, counts), topk_weights, handle), counts


class MoE(nn.Module):
    """DeepSeekMoE: router (softmax or sigmoid scores, auxiliary-loss-free balancing bias), routed
    SwiGLU experts through grouped GEMMs, shared experts."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.score_func not in ("softmax", "sigmoid"):
            raise ValueError(f"score_func must be softmax or sigmoid, got {cfg.score_func!r}")
        self.n_experts, self.top_k = cfg.n_routed_experts, cfg.top_k
        self.score_func, self.route_norm, self.route_scale = cfg.score_func, cfg.route_norm, cfg.route_scale
        self.router = Router(cfg.dim, cfg.n_routed_experts)
        self.experts = GroupedExperts(cfg.n_routed_experts, cfg.dim, cfg.moe_hidden)
        hidden = cfg.moe_hidden * cfg.n_shared_experts
        self.shared_experts = FeedForward(cfg.dim, hidden) if cfg.n_shared_experts else None
        self.dispatcher = LocalDispatch()
        # auxiliary-loss-free balancing: a per-expert bias added to the scores for selection only
        self.register_buffer("expert_bias", torch.zeros(cfg.n_routed_experts))
        # tokens routed to each expert since the last optimizer step (metrics and bias update); not counted
        # while ``count_tokens`` is False (activation checkpointing's recompute of a forward already counted)
        self.register_buffer("tokens_per_expert", torch.zeros(cfg.n_routed_experts), persistent=False)
        self.count_tokens = True

    @torch.no_grad()
    def route(self, x: torch.Tensor) -> torch.Tensor:
        """The top-k expert indices [tokens, k] this router picks for x [..., dim]."""
        scores = self.router(x.reshape(-1, x.shape[-1]), self.score_func)
        return torch.topk(scores + self.expert_bias, self.top_k, dim=-1).indices

    def forward(self, x: torch.Tensor, topk_idx: torch.Tensor | None = None) -> torch.Tensor:
        """``topk_idx``, when given, fixes which experts each token goes to (the layer level sends the
        FP32, BF16 and MXFP8 runs to the same experts, so a near-tie flipped by rounding cannot dominate
        the comparison); the routing weights always come from this module's own gate."""
        shape = x.shape
        xf = x.reshape(-1, shape[-1])
        scores = self.router(xf, self.score_func)
        if topk_idx is None:
            topk_idx = torch.topk(scores.detach() + self.expert_bias, self.top_k, dim=-1).indices
        topk_w = scores.gather(-1, topk_idx)
        if self.route_norm:
            topk_w = topk_w / (topk_w.sum(-1, keepdim=True) + 1e-20)
        topk_w = topk_w * self.route_scale
        out, counts = self.dispatcher.run(xf, topk_idx, topk_w, self.experts, self.n_experts)
        if self.count_tokens:
            with torch.no_grad():
                self.tokens_per_expert.add_(counts.to(self.tokens_per_expert.dtype))
        if self.shared_experts is not None:
            out = out + self.shared_experts(xf)
        return out.reshape(shape)

    @torch.no_grad()
    def end_step(self, load_balance_coeff: float | None) -> float:
        """After an optimizer step: move the expert bias toward balance, reset the counts, and return
        the max share of routed (token, slot) pairs that one expert received in this step."""
        counts = self.tokens_per_expert
        total = float(counts.sum())
        share = float(counts.max()) / total if total else 0.0
        if load_balance_coeff:
            delta = load_balance_coeff * torch.sign(counts.mean() - counts)
            self.expert_bias.add_(delta - delta.mean())
        counts.zero_()
        return share
