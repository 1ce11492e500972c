"""Expert parallelism for the MoE seam: tokens go to the rank that owns their expert through a
``numerics.ep`` backend (all-to-all reference or DeepEP) and come back combined.

Public: ``EPDispatch`` (plugs into ``MoE.dispatcher``), ``shard_experts(model, rank, world)``,
``expert_params(model)``, ``split_exact`` / ``join_exact`` (float32 <-> three bf16 pieces), ``CommTimer``.

One MoE layer on rank ``j`` of ``W`` (``E`` experts, ``L = E / W`` local ones, experts ``jL..jL+L-1``):

1. dispatch (``EPBackend.dispatch``): each token's bf16 row goes once to every rank that owns one of
   its top-k experts, with its top-k weights (float32, bit-exact) and local expert indices;
2. the receiving rank expands the received rows to one row per local (token, slot), sorts them by local
   expert (stable: within an expert, rows stay in (source rank, token) order, which is global token
   order because rank ``r`` holds the ``r``-th slice of the global batch), runs its ``L`` experts as one
   grouped GEMM, and folds each received row's slots into ``sum_k w_k * y_k`` in float32, ascending k
   (``deepseek_v3.weighted_slot_sum``, the local combine's own fold), rounded once to bf16;
3. combine (``EPBackend.combine``): rows go back and are summed per token in float32, ascending rank.

Autograd: the backward of combine is a cached dispatch of the output gradient; the backward of
dispatch is a combine of the received rows' gradients. The router weights' gradients (float32, one per
slot, each nonzero on exactly one rank) travel in the same combine as extra columns: each value is
split into three bf16 pieces whose float32 sum is the value exactly (``split_exact``); a combine adds
only +-0.0 to each piece, so ``join_exact`` restores the float32 gradient bit for bit (up to the sign
of a zero, and values below 2**-102 lose bits under 2**-126; pieces that small are flushed to zero
before sending so no subnormal ever travels). Routed-expert gradients are summed over all ranks'
tokens by the backward itself, so the trainer scales them by 1/W to match FSDP's gradient average.

With W = 1 this computes exactly what ``deepseek_v3.LocalDispatch`` computes (same sort order, same fold).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from numerics.ep.backend import EPBackend
from numerics.layer.deepseek_v3 import MoE, weighted_slot_sum

PIECES = 3  # bf16 pieces per float32 value: 8 + 8 + 8 significand bits cover float32's 24
# Combine rows (the forward's hidden rows, the backward's hidden + router-gradient pieces) are padded to a
# multiple of 256 columns: DeepEP v1.2.1's intranode combine returns wrong, nondeterministic sums for bf16
# rows whose width is not a multiple of 256 (2112 and 2176 fail, 2048, 2304 and 2560 pass on 2 x H200;
# FINDINGS.md E3, fixed upstream after v1.2.1 by DeepEP PR #413). Zero columns add exact zeros and are dropped.
ROW_WIDTH_ALIGN = 256


def _padded_combine(backend, y: torch.Tensor, handle) -> torch.Tensor:
    """``backend.combine`` of bf16 rows padded with zero columns to a multiple of ``ROW_WIDTH_ALIGN``."""
    pad = -y.shape[1] % ROW_WIDTH_ALIGN
    if not pad:
        return backend.combine(y, handle)
    return backend.combine(torch.cat([y, y.new_zeros(y.shape[0], pad)], dim=1), handle)[:, :y.shape[1]]


def combine_width(hidden: int, top_k: int) -> int:
    """Columns of the backward combine: hidden, 3 bf16 pieces per router weight, zero padding."""
    width = hidden + PIECES * top_k
    return width + (-width) % ROW_WIDTH_ALIGN
# torchao's emulated MXFP8 grouped GEMM quantizes the weight-gradient operands along the token
# dimension in blocks of 32 and asserts the row count is a multiple of 32; a rank receives any number
# of rows, so they are padded with zero rows. Zeros change no block's amax (so no real element's
# quantization), add exact zeros to every sum, and their outputs are dropped (gradient 0). A
# single-process run (T * top_k rows) is never padded in the shipped configs.
ROW_ALIGN = 32
_TINY = 2.0 ** -126  # smallest normal float32 / bf16: smaller pieces are flushed before sending


def _truncate_to_bf16(v: torch.Tensor) -> torch.Tensor:
    """float32 -> bf16 toward zero: the top 16 bits, exactly (never overflows to inf)."""
    return (v.view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)


def split_exact(v: torch.Tensor) -> torch.Tensor:
    """float32 [...] -> bf16 [..., 3] with ``(a + b) + c == v`` in float32 for finite ``|v| >= 2**-102``.

    ``a`` is ``v`` truncated to bf16 (its top 16 bits); ``v - a`` is exact and has at most 16
    significant bits, ``b`` is that truncated to bf16, and ``c = v - a - b`` has at most 8 significant
    bits, so it is a bf16 value. Pieces below 2**-126 are flushed (no subnormal travels); non-finite
    values go as (v, 0, 0)."""
    v = v.float().contiguous()
    finite = torch.isfinite(v)
    v0 = torch.where(finite, v, torch.zeros_like(v))
    a = _truncate_to_bf16(v0)
    r1 = v0 - a.float()
    b = _truncate_to_bf16(r1)
    c = (r1 - b.float()).to(torch.bfloat16)
    a = torch.where(finite, a, v.to(torch.bfloat16))
    pieces = torch.stack([a, b, c], dim=-1)
    return torch.where(pieces.float().abs() < _TINY, torch.zeros_like(pieces), pieces)


def join_exact(pieces: torch.Tensor) -> torch.Tensor:
    """bf16 [..., 3] -> float32 [...]: ``(a + b) + c`` (both additions exact for split pieces)."""
    p = pieces.float()
    return (p[..., 0] + p[..., 1]) + p[..., 2]


class CommTimer:
    """Time spent in backend calls: CUDA events on GPUs (read once per step), wall clock on CPUs."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.pending: list[tuple[Any, Any]] = []
        self.seconds = 0.0

    def __call__(self, fn, *args):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn(*args)
            end.record()
            self.pending.append((start, end))
            return out
        t0 = time.perf_counter()
        out = fn(*args)
        self.seconds += time.perf_counter() - t0
        return out

    def take(self) -> float:
        """Seconds since the last ``take`` (synchronizes the device when events are pending)."""
        if self.pending:
            self.pending[-1][1].synchronize()
            self.seconds += sum(s.elapsed_time(e) for s, e in self.pending) / 1000.0
            self.pending.clear()
        out, self.seconds = self.seconds, 0.0
        return out


class _Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, topk_weights, topk_idx, backend, num_experts, timer, box):
        d = timer(backend.dispatch, x.detach(), topk_idx, topk_weights.detach().float(), num_experts)
        ctx.backend, ctx.timer, ctx.handle = backend, timer, d.handle
        ctx.shape = (x.shape[0], x.shape[1], topk_idx.shape[1])
        box.extend([d.recv_topk_idx, d.handle])  # not differentiable: returned through the box
        return d.recv_x, d.recv_topk_weights

    @staticmethod
    def backward(ctx, grad_x, grad_w):
        tokens, hidden, k = ctx.shape
        rows = grad_x.shape[0] if grad_x is not None else grad_w.shape[0]
        if grad_x is None:
            grad_x = torch.zeros(rows, hidden, dtype=torch.bfloat16, device=grad_w.device)
        if grad_w is None:
            grad_w = torch.zeros(rows, k, dtype=torch.float32, device=grad_x.device)
        extra = PIECES * k
        pad = combine_width(hidden, k) - hidden - extra
        packed = torch.cat([grad_x.to(torch.bfloat16), split_exact(grad_w).reshape(rows, extra),
                            grad_x.new_zeros(rows, pad, dtype=torch.bfloat16)], dim=1)
        back = ctx.timer(ctx.backend.combine, packed, ctx.handle)
        w = join_exact(back[:, hidden:hidden + extra].reshape(tokens, k, PIECES))
        return back[:, :hidden], w, None, None, None, None, None


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, backend, handle, timer):
        ctx.backend, ctx.handle, ctx.timer = backend, handle, timer
        return timer(_padded_combine, backend, y.detach().to(torch.bfloat16).contiguous(), handle)

    @staticmethod
    def backward(ctx, grad):
        return ctx.timer(ctx.backend.dispatch_cached, grad.to(torch.bfloat16).contiguous(), ctx.handle), \
            None, None, None


class EPDispatch:
    """``MoE.dispatcher`` for expert parallelism over an ``EPBackend`` (module docstring)."""

    def __init__(self, backend: EPBackend, timer: CommTimer | None = None):
        self.backend = backend
        self.timer = timer or CommTimer(getattr(backend, "device", torch.device("cpu")))

    def run(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
            experts: nn.Module, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
        if x.dtype != torch.bfloat16:
            raise ValueError(f"expert-parallel dispatch moves bf16 rows; got {x.dtype} (train under autocast)")
        world = self.backend.world_size
        local = num_experts // world
        e = torch.arange(num_experts, device=topk_idx.device)
        # comparison rather than bincount: bincount has no deterministic CUDA kernel
        counts = (topk_idx[:, :, None] == e).sum(dim=(0, 1))
        box: list[torch.Tensor] = []
        recv_x, recv_w = _Dispatch.apply(x, topk_weights, topk_idx, self.backend, num_experts, self.timer, box)
        recv_idx, handle = box
        rows, k = recv_idx.shape
        flat = recv_idx.reshape(-1)
        slots = (flat >= 0).nonzero().flatten()  # (row, slot) pairs this rank computes, row-major
        order = torch.argsort(flat[slots], stable=True)
        pos = slots[order]  # expert-sorted positions in the [rows * k] slot grid
        local_counts = (flat[pos][:, None] == torch.arange(local, device=flat.device)).sum(0)
        x_in, n = recv_x[pos // k], pos.numel()
        pad = -n % ROW_ALIGN or (ROW_ALIGN if n == 0 else 0)
        if pad:  # zero rows in the last local expert's group: exact (see ROW_ALIGN), sliced off after
            x_in = torch.cat([x_in, x_in.new_zeros(pad, x_in.shape[1])])
            local_counts = local_counts + torch.nn.functional.one_hot(
                torch.tensor(local - 1, device=flat.device), local) * pad
        y_sorted = experts(x_in, local_counts)[:n]
        grid = y_sorted.new_zeros(rows * k, y_sorted.shape[-1]).index_put((pos,), y_sorted)
        y = weighted_slot_sum(grid.view(rows, k, grid.shape[-1]), recv_w).to(torch.bfloat16)
        return _Combine.apply(y, self.backend, handle, self.timer), counts

    def close(self) -> None:
        self.backend.close()


def expert_params(model: nn.Module) -> list[nn.Parameter]:
    return [p for m in model.modules() if isinstance(m, MoE) for p in m.experts.parameters()]


@torch.no_grad()
def shard_experts(model: nn.Module, rank: int, world: int) -> None:
    """Keep only this rank's slice ``[rank * L, (rank + 1) * L)`` of every routed-expert weight."""
    for m in model.modules():
        if isinstance(m, MoE):
            if m.n_experts % world:
                raise ValueError(f"{m.n_experts} routed experts cannot be split over {world} ranks")
            local = m.n_experts // world
            for gl in m.experts.children():  # w1, w2, w3: GroupedLinear, weight [E, out, in]
                gl.weight = nn.Parameter(gl.weight[rank * local:(rank + 1) * local].clone())
