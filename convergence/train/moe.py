"""DeepSeekMoE: router, token dispatch/combine, grouped-GEMM experts, shared experts.

The dispatch/combine step is a seam: ``MoE.dispatcher`` is any object with ``LocalDispatch.run``
(route, run the experts, combine; return the output and this rank's tokens per expert). ``LocalDispatch``
permutes this rank's tokens so each expert's tokens are contiguous and
computes every expert locally; an expert-parallel backend (numerics.ep's all-to-all or DeepEP) replaces
it by one that sends each token to the rank that owns its expert and brings the results back, with the
local experts still run as one grouped GEMM over the received, expert-sorted tokens
(``convergence.train.ep_dispatch.EPDispatch``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The active autocast dtype on x's device, else x's own dtype."""
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return x.dtype


def linear(x: torch.Tensor, w: torch.Tensor, op: Callable | None = None) -> torch.Tensor:
    """F.linear in the compute dtype, with the casts autocast would make written out (model.py says why).
    ``op(x, w)``, when given (a recipe's MXFP8 linear), replaces F.linear after the casts."""
    dt = compute_dtype(x)
    return (op or F.linear)(x.to(dt), w.to(dt))


def grouped_mm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, op: Callable | None = None) -> torch.Tensor:
    """x [T, in] (expert-sorted) times each expert's w [E, out, in]^T offs: cumulative ends.
    ``op(x, w_t, offs)``, when given (a recipe's MXFP8 grouped GEMM), replaces torch._grouped_mm."""
    dt = compute_dtype(x)
    x, w_t = x.to(dt), w.to(dt).transpose(-2, -1)
    return torch._grouped_mm(x, w_t, offs=offs) if op is None else op(x, w_t, offs)


@dataclass
class DispatchHandle:
    order: torch.Tensor  # [T*k] positions of the flattened (token, slot) pairs in expert-sorted order
    num_tokens: int
    top_k: int


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


def weighted_slot_sum(y: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum_k weights[t, k] * y[t, k] in float32, folded in ascending k: y [T, K, H], weights [T, K].

    One fixed order (not ``.sum(1)``, whose reduction order is the kernel's choice), shared by the
    local and the expert-parallel combine so both round identically."""
    acc = y[:, 0].float() * weights[:, 0:1]
    for k in range(1, y.shape[1]):
        acc = acc + y[:, k].float() * weights[:, k:k + 1]
    return acc


class GroupedExperts(nn.Module):
    """All routed experts as three [E, out, in] weights, run with torch._grouped_mm (SwiGLU)."""

    def __init__(self, n_experts: int, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(n_experts, hidden, dim))
        self.w2 = nn.Parameter(torch.empty(n_experts, dim, hidden))
        self.w3 = nn.Parameter(torch.empty(n_experts, hidden, dim))
        self.mxfp8_op: Callable | None = None  # set by convergence.train.recipes.apply_recipe

    def forward(self, x_sorted: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        offs, op = torch.cumsum(counts, 0).to(torch.int32), self.mxfp8_op
        h = F.silu(grouped_mm(x_sorted, self.w1, offs, op)) * grouped_mm(x_sorted, self.w3, offs, op)
        return grouped_mm(h, self.w2, offs, op)


class Router(nn.Module):
    """gate: a bias-free linear to one score per expert; scoring in FP32."""

    def __init__(self, dim: int, n_experts: int, gate_factory: Callable[[int, int], nn.Module]):
        super().__init__()
        self.gate = gate_factory(dim, n_experts)

    def forward(self, x: torch.Tensor, score_func: str) -> torch.Tensor:
        logits = self.gate(x).float()
        return logits.softmax(-1) if score_func == "softmax" else logits.sigmoid()


class MoE(nn.Module):
    def __init__(
        self, *, dim: int, hidden: int, n_experts: int, top_k: int, n_shared: int, score_func: str,
        route_norm: bool, route_scale: float,
        shared_factory: Callable[[int, int], nn.Module], gate_factory: Callable[[int, int], nn.Module],
    ):
        super().__init__()
        if score_func not in ("softmax", "sigmoid"):
            raise ValueError(f"score_func must be softmax or sigmoid, got {score_func!r}")
        self.n_experts, self.top_k = n_experts, top_k
        self.score_func, self.route_norm, self.route_scale = score_func, route_norm, route_scale
        self.router = Router(dim, n_experts, gate_factory)
        self.experts = GroupedExperts(n_experts, dim, hidden)
        self.shared_experts = shared_factory(dim, hidden * n_shared) if n_shared else None
        self.dispatcher = LocalDispatch()
        # auxiliary-loss-free balancing: a per-expert bias added to the scores for selection only
        self.register_buffer("expert_bias", torch.zeros(n_experts))
        # tokens routed to each expert since the last optimizer step (metrics and bias update)
        self.register_buffer("tokens_per_expert", torch.zeros(n_experts), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        xf = x.reshape(-1, shape[-1])
        scores = self.router(xf, self.score_func)
        topk_idx = torch.topk(scores + self.expert_bias, self.top_k, dim=-1).indices
        topk_w = scores.gather(-1, topk_idx)
        if self.route_norm:
            topk_w = topk_w / (topk_w.sum(-1, keepdim=True) + 1e-20)
        topk_w = topk_w * self.route_scale
        out, counts = self.dispatcher.run(xf, topk_idx, topk_w, self.experts, self.n_experts)
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
