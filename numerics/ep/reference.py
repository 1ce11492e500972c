"""``AllToAllReference``: DeepEP V1 dispatch / combine semantics built from ``all_to_all_single``.

It runs on any torch.distributed backend that has all-to-all: NCCL on GPUs, gloo on CPUs (so CI
exercises it with 2 and 4 processes). The semantics it implements are stated in
``numerics.ep.backend``; here is how:

dispatch
    1. check the inputs on every rank, then agree (one all-gather) that all ranks are fine;
    2. layout: ``is_token_in_rank[t, j] = any_k(topk_idx[t, k] // L == j)`` over unmasked slots;
    3. counts first: one all-to-all of the per-rank token counts, one of the per-expert counts;
    4. payload: the rows for rank 0, then rank 1, ..., each in ascending token order, moved as raw
       bytes (uint8 views), so no transport ever interprets a float: NaN payloads and -0.0 arrive as sent;
    5. metadata (local expert index or -1, the weight or +0.0, the source token index) in a second
       byte all-to-all.
combine
    the received rows travel back along the same counts (the reverse all-to-all), so row ``i`` that
    comes back from rank ``j`` belongs to the ``i``-th token this rank sent to ``j``. For each token,
    contributions are added in ascending ``j`` to a float32 accumulator that starts at +0.0
    (``combine_start="zero"``, the contract) or at the first row (``"first-row"``, the other
    convention, see ``numerics.ep.backend``), and ``acc`` is rounded to bf16 once (torch's float32 ->
    bfloat16 conversion is round-to-nearest-even). Tokens sent nowhere give +0.0.

Every wait goes through ``backend.finish``: bounded by the timeout on gloo, stream-ordered on NCCL.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from numerics.ep.backend import (
    COMBINE_START,
    COMBINE_STARTS,
    DEFAULT_TIMEOUT,
    FP8_BLOCK,
    Dispatched,
    EPBackend,
    Layout,
    finish,
    is_fp8,
    payload_hidden,
    validate_dispatch,
    validate_payload,
)


@dataclass
class RefHandle:
    """Routing of one dispatch, enough to move new payloads along it and to combine."""

    num_tokens: int
    send_index: torch.Tensor  # int64 [S]: local token of each sent row, rank-major then token order
    send_counts: list[int]  # rows sent to each rank
    recv_counts: list[int]  # rows received from each rank
    recv_src_idx: torch.Tensor  # int64 [R]: source token index of each received row
    is_token_in_rank: torch.Tensor  # bool [T, W]


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """[N, ...] tensor -> [N, bytes per row] uint8 view (copies only if not contiguous)."""
    t = t.contiguous()
    width = math.prod(t.shape[1:]) * t.element_size()
    return t.view(torch.uint8).reshape(t.shape[0], width)


def _pack_payload(x: Any) -> torch.Tensor:
    if is_fp8(x):
        return torch.cat([_as_bytes(x[0]), _as_bytes(x[1])], dim=1)
    return _as_bytes(x)


def _unpack_payload(rows: torch.Tensor, hidden: int, fp8: bool) -> Any:
    if fp8:
        data = rows[:, :hidden].contiguous().view(torch.float8_e4m3fn)
        scales = rows[:, hidden:].contiguous().view(torch.float32)
        return data, scales.reshape(rows.shape[0], hidden // FP8_BLOCK)
    return rows.contiguous().view(torch.bfloat16).reshape(rows.shape[0], hidden)


class AllToAllReference(EPBackend):
    """DeepEP V1 semantics over ``torch.distributed.all_to_all_single`` (NCCL or gloo)."""

    def __init__(self, group: Any = None, *, device: torch.device | str | None = None,
                 timeout: datetime.timedelta = DEFAULT_TIMEOUT, combine_start: str = COMBINE_START,
                 validate: bool = True):
        if combine_start not in COMBINE_STARTS:
            raise ValueError(f"combine_start={combine_start!r}: choose from {', '.join(COMBINE_STARTS)}")
        self.group = group if group is not None else dist.group.WORLD
        self.timeout = timeout
        self.combine_start = combine_start
        self.validate = validate
        if device is None:
            nccl = "nccl" in str(dist.get_backend(self.group)).lower()
            device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
        self.device = torch.device(device)

    # -- collectives, each with a timeout ---------------------------------------------------------
    def _all_to_all(self, send: torch.Tensor, send_counts: list[int], recv_counts: list[int]) -> torch.Tensor:
        out = torch.empty((sum(recv_counts), *send.shape[1:]), dtype=send.dtype, device=send.device)
        work = dist.all_to_all_single(out, send.contiguous(), recv_counts, send_counts, group=self.group,
                                      async_op=True)
        finish(work, self.timeout, self.device)
        return out

    # -- the interface ---------------------------------------------------------------------------
    def layout(self, topk_idx: torch.Tensor, num_experts: int) -> Layout:
        world = self.world_size
        local = num_experts // world
        rank_of = torch.where(topk_idx >= 0, topk_idx // local, torch.full_like(topk_idx, -1))
        is_token_in_rank = torch.stack([(rank_of == j).any(dim=1) for j in range(world)], dim=1)
        experts = torch.arange(num_experts, device=topk_idx.device)
        # comparison rather than bincount: bincount has no deterministic CUDA kernel
        per_expert = (topk_idx[:, :, None] == experts).sum(dim=(0, 1), dtype=torch.int64).to(torch.int32)
        return Layout(is_token_in_rank.sum(dim=0).to(torch.int32), per_expert, is_token_in_rank)

    def dispatch(self, x: Any, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                 num_experts: int) -> Dispatched:
        if self.validate:
            validate_dispatch(self, x, topk_idx, topk_weights, num_experts, self.device)
        world = self.world_size
        local = num_experts // world
        lay = self.layout(topk_idx, num_experts)
        per_dest = [lay.is_token_in_rank[:, j].nonzero().flatten() for j in range(world)]
        send_index = torch.cat(per_dest)
        send_counts = [int(t.numel()) for t in per_dest]
        ones = [1] * world

        # counts first: tokens per destination rank, tokens per destination expert
        counts = self._all_to_all(torch.tensor(send_counts, dtype=torch.int64, device=self.device)
                                  .reshape(world, 1), ones, ones)
        recv_counts = counts.flatten().tolist()
        experts = self._all_to_all(lay.num_tokens_per_expert.to(torch.int64).reshape(world, local), ones, ones)
        num_recv_tokens_per_expert = experts.sum(dim=0).tolist()

        # payload, as bytes
        hidden, fp8 = payload_hidden(x), is_fp8(x)
        recv_rows = self._all_to_all(_pack_payload(x)[send_index], send_counts, recv_counts)
        recv_x = _unpack_payload(recv_rows, hidden, fp8)

        # metadata: local expert index or -1, weight or +0.0, source token index
        dest = torch.repeat_interleave(torch.arange(world, device=self.device),
                                       torch.tensor(send_counts, device=self.device))
        sent_idx = topk_idx[send_index]
        keep = (sent_idx >= 0) & (sent_idx // local == dest[:, None])
        local_idx = torch.where(keep, sent_idx - dest[:, None] * local, torch.full_like(sent_idx, -1))
        weights = torch.where(keep, topk_weights[send_index], torch.zeros_like(topk_weights[send_index]))
        meta = torch.cat([_as_bytes(local_idx), _as_bytes(weights), _as_bytes(send_index[:, None])], dim=1)
        recv_meta = self._all_to_all(meta, send_counts, recv_counts)
        k = topk_idx.shape[1]
        recv_topk_idx = recv_meta[:, : 8 * k].contiguous().view(torch.int64).reshape(recv_meta.shape[0], k)
        recv_topk_weights = recv_meta[:, 8 * k: 12 * k].contiguous().view(torch.float32).reshape(recv_meta.shape[0], k)
        recv_src_idx = recv_meta[:, 12 * k:].contiguous().view(torch.int64).flatten()

        handle = RefHandle(topk_idx.shape[0], send_index, send_counts, recv_counts, recv_src_idx,
                           lay.is_token_in_rank)
        return Dispatched(recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert, handle)

    def dispatch_cached(self, x: Any, handle: RefHandle) -> Any:
        if self.validate:
            validate_payload(self, x, handle.num_tokens, None, "x", self.device)
        rows = self._all_to_all(_pack_payload(x)[handle.send_index], handle.send_counts, handle.recv_counts)
        return _unpack_payload(rows, payload_hidden(x), is_fp8(x))

    def combine(self, y: torch.Tensor, handle: RefHandle) -> torch.Tensor:
        if self.validate:
            validate_payload(self, y, sum(handle.recv_counts), None, "y", self.device, bf16_only=True)
        hidden = y.shape[1]
        back = self._all_to_all(_as_bytes(y), handle.recv_counts, handle.send_counts)
        values = back.view(torch.bfloat16).reshape(-1, hidden).float()  # bf16 -> fp32 is exact
        acc = torch.zeros(handle.num_tokens, hidden, dtype=torch.float32, device=y.device)  # +0.0
        seen = torch.zeros(handle.num_tokens, dtype=torch.bool, device=y.device)
        first_row = self.combine_start == "first-row"
        start = 0
        for count in handle.send_counts:  # ascending rank order
            tokens = handle.send_index[start:start + count]
            v = values[start:start + count]
            added = acc[tokens] + v
            acc[tokens] = torch.where(seen[tokens, None], added, v) if first_row else added
            seen[tokens] = True
            start += count
        return acc.to(torch.bfloat16)
