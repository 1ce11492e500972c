"""``simulate``: every rank's expected dispatch / combine results, computed in one process.

The oracle for the communication level. Given every rank's inputs it returns, per rank, the layout,
the ``Dispatched`` fields, and where each received row came from (source rank, source token); the
combine expectation follows from every rank's ``y``. It uses plain boolean-mask indexing on integer
views (so bits are copied, never interpreted) and no torch.distributed at all. The semantics are
those stated in ``numerics.ep.backend``; this module is written from them, independently of both the
reference backend and DeepEP.

    sim = simulate(xs, topk_idxs, topk_weights, num_experts)   # lists indexed by rank
    sim.ranks[r].dispatched.recv_x, sim.ranks[r].recv_src_rank, sim.ranks[r].recv_src_idx
    sim.combine(ys)                                            # list of bf16 tensors, per rank
    sim.combine(ys, start="first-row")                         # the other combine convention
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from numerics.bits import bits
from numerics.ep.backend import COMBINE_START, COMBINE_STARTS, Dispatched, Layout, is_fp8


@dataclass
class RankExpectation:
    layout: Layout  # of this rank's own tokens
    dispatched: Dispatched  # what this rank receives; handle is None
    recv_src_rank: torch.Tensor  # int64 [R]: the rank each received row came from
    recv_src_idx: torch.Tensor  # int64 [R]: its token index on that rank


def _take(t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Rows of ``t`` where ``mask`` holds, copied as integers so every bit survives."""
    return bits(t.contiguous())[mask].view(t.dtype)


def _layout(topk_idx: torch.Tensor, num_experts: int, world: int) -> Layout:
    local = num_experts // world
    tokens = topk_idx.shape[0]
    masked = topk_idx < 0
    # one-hot over ranks with an extra "nowhere" column for masked slots
    owner = torch.where(masked, torch.full_like(topk_idx, world), topk_idx // local)
    # one-hot by comparison (no scatter: it has no deterministic CUDA kernel in every torch)
    is_token_in_rank = (owner[:, :, None] == torch.arange(world, device=topk_idx.device)).any(dim=1)
    is_token_in_rank = is_token_in_rank.reshape(tokens, world)
    experts = torch.arange(num_experts, device=topk_idx.device)[:, None]
    per_expert = (topk_idx.flatten()[None, :] == experts).sum(dim=1)
    return Layout(is_token_in_rank.sum(dim=0, dtype=torch.int64).to(torch.int32),
                  per_expert.to(torch.int32), is_token_in_rank)


class Simulation:
    """Expected results of one dispatch (and, given ``ys``, one combine) on every rank."""

    def __init__(self, xs: list[Any], topk_idxs: list[torch.Tensor], topk_weights: list[torch.Tensor],
                 num_experts: int):
        self.world = world = len(xs)
        self.num_experts = num_experts
        local = num_experts // world
        self.layouts = [_layout(idx, num_experts, world) for idx in topk_idxs]
        self.ranks: list[RankExpectation] = []
        for dest in range(world):
            lo, hi = dest * local, (dest + 1) * local
            xs_parts, idx_parts, w_parts, src_rank, src_idx = [], [], [], [], []
            for src in range(world):
                mask = self.layouts[src].is_token_in_rank[:, dest]
                x = xs[src]
                xs_parts.append((_take(x[0], mask), _take(x[1], mask)) if is_fp8(x) else _take(x, mask))
                idx = topk_idxs[src][mask]
                on_dest = (idx >= lo) & (idx < hi)
                idx_parts.append((idx - lo).masked_fill(~on_dest, -1))
                w_parts.append(bits(topk_weights[src][mask]).masked_fill(~on_dest, 0).view(torch.float32))
                picked = torch.arange(mask.shape[0], device=mask.device)[mask]
                src_idx.append(picked)
                src_rank.append(torch.full_like(picked, src))
            if is_fp8(xs[0]):
                recv_x = (torch.cat([p[0] for p in xs_parts]), torch.cat([p[1] for p in xs_parts]))
            else:
                recv_x = torch.cat(xs_parts)
            recv_idx = torch.cat(idx_parts)
            per_expert = [int((recv_idx == e).any(dim=1).sum()) for e in range(local)]
            dispatched = Dispatched(recv_x, recv_idx, torch.cat(w_parts), per_expert, None)
            self.ranks.append(RankExpectation(self.layouts[dest], dispatched, torch.cat(src_rank),
                                              torch.cat(src_idx)))

    def num_recv(self, rank: int) -> int:
        return int(self.ranks[rank].recv_src_idx.numel())

    def combine(self, ys: list[torch.Tensor], start: str = COMBINE_START) -> list[torch.Tensor]:
        """Each rank's combine output, given every rank's ``y`` (bf16, one row per received row).

        ``start``: the float32 sum starts at +0.0 (``"zero"``, the contract) or at the first row that
        comes back (``"first-row"``); see ``numerics.ep.backend``."""
        if start not in COMBINE_STARTS:
            raise ValueError(f"start={start!r}: choose from {', '.join(COMBINE_STARTS)}")
        hidden = ys[0].shape[1]
        out = []
        for src in range(self.world):
            tokens = self.layouts[src].is_token_in_rank.shape[0]
            acc = torch.zeros(tokens, hidden, dtype=torch.float32, device=ys[0].device)
            count = torch.zeros(tokens, dtype=torch.int64, device=ys[0].device)  # rows added so far
            for dest in range(self.world):  # ascending rank: the order of the float32 additions
                exp = self.ranks[dest]
                from_src = exp.recv_src_rank == src
                token = exp.recv_src_idx[from_src]
                rows = ys[dest][from_src].float()  # bf16 -> float32 is exact
                first = (count[token] == 0)[:, None] & (start == "first-row")
                acc[token] = torch.where(first, rows, acc[token] + rows)  # tokens are distinct per rank
                count[token] = count[token] + 1
            out.append(acc.to(torch.bfloat16))
        return out


def simulate(xs: list[Any], topk_idxs: list[torch.Tensor], topk_weights: list[torch.Tensor],
             num_experts: int) -> Simulation:
    """Every rank's expected layout and dispatch results; ``.combine(ys)`` for the combine."""
    if not (len(xs) == len(topk_idxs) == len(topk_weights)) or not xs:
        raise ValueError("simulate needs one x, topk_idx and topk_weights per rank (equal-length lists)")
    if num_experts % len(xs):
        raise ValueError(f"num_experts={num_experts} is not divisible by the world size {len(xs)}")
    return Simulation(xs, topk_idxs, topk_weights, num_experts)
