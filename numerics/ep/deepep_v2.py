"""``DeepEPV2Backend``: the subject, DeepEP main's V2 ``deep_ep.ElasticBuffer`` (NCCL Gin), intranode.

Written from DeepEP main's own README and ``tests/elastic/test_ep.py`` (at commit dd758ca), not
run here. The calls used, in V2's non-expanded layout:

* ``ElasticBuffer(group, num_max_tokens_per_rank=, hidden=, num_topk=, use_fp8_dispatch=,
  deterministic=True, allow_hybrid_mode=False, explicitly_destroy=True)``: sized for the largest
  case; ``deterministic=True`` makes V2 sort the received rows by source token (its
  ``EPHandle.deterministic_sort``), which is the contract's order (source rank, then token).
  Hybrid mode is for several hosts; one host uses direct mode.
* ``dispatch(x, topk_idx=, topk_weights=, num_experts=, num_max_tokens_per_rank=, expert_alignment=1,
  num_sms=, do_cpu_sync=True)`` -> ``(recv_x, recv_topk_idx, recv_topk_weights, handle, event)``;
  ``handle.num_recv_tokens_per_expert_list`` holds the per-expert counts (exact with alignment 1).
* ``dispatch(x, handle=handle, num_sms=)`` moves a new payload along the handle (cached).
* ``combine(y, handle=handle, num_sms=)`` -> ``(combined, None, event)``.

Where V2's contract is looser than ``numerics.ep.backend``'s, the adapter says so rather than hiding it:

* ``recv_topk_weights`` of slots whose expert is on another rank are unspecified in V2 (its own test
  masks them); the adapter writes +0.0 there, as V1 and the contract do. Kept slots pass bit for bit.
* V2 has no layout call (``get_dispatch_layout`` is V1's); ``has_layout = False`` and the check skips
  the layout rows for this backend.
* V2's combine reduces a token's rows in the order of the token's top-k slots (``deep_ep.utils.refs``),
  starting at +0.0; the contract adds them in ascending rank order. With two ranks at most two rows meet,
  and two float32 additions to +0.0 commute, so the two agree; with more ranks the check may report
  rounding differences that are this ordering, not an error.
* FP8 scales: V2 takes any 4-byte scale pack; the contract's float32 ``[T, H/128]`` is one.

On a host whose NICs offer no NCCL Gin (a single machine without RDMA), DeepEP main needs
``EP_DISABLE_GIN=1`` in the environment to initialise (DeepEP issue #629, fixed by PR #630 in main).
"""

from __future__ import annotations

import datetime
from typing import Any

import torch

from numerics.ep.backend import (
    DEFAULT_TIMEOUT,
    MAX_TOKENS,
    Dispatched,
    Layout,
    Limits,
    is_fp8,
    validate_dispatch,
    validate_payload,
)
from numerics.ep.deepep import DeepEPBase, no_uninitialized_fill

MAX_TOPK = 8  # DeepSeek-V3 routes top-8; V2 itself allows up to 32


class DeepEPV2Backend(DeepEPBase):
    """DeepEP V2 (``ElasticBuffer``) intranode dispatch / combine behind the ``EPBackend`` interface."""

    has_layout = False

    def __init__(self, group: Any = None, *, max_hidden: int = 7168, max_tokens: int = MAX_TOKENS,
                 max_topk: int = MAX_TOPK, num_sms: int | None = None, deterministic: bool = True,
                 timeout: datetime.timedelta = DEFAULT_TIMEOUT, guard_uninitialized_fill: bool = True,
                 validate: bool = True, device: torch.device | str | None = None):
        deep_ep = self._bind("ElasticBuffer", group, timeout, guard_uninitialized_fill, validate, device)
        self.max_tokens = max_tokens
        self.limits = Limits(max_tokens=max_tokens, max_hidden=max_hidden, max_topk=max_topk)
        self.num_sms = 0 if num_sms is None else num_sms  # 0: V2's own estimate (get_theoretical_num_sms)
        hint = deep_ep.ElasticBuffer.get_buffer_size_hint
        # the larger of a bf16 and an FP8 dispatch of the largest case (V2 sizes them differently)
        num_bytes = max(hint(self.group, max_tokens, max_hidden, num_topk=max_topk, use_fp8_dispatch=fp8,
                             allow_hybrid_mode=False) for fp8 in (False, True))
        self.buffer = deep_ep.ElasticBuffer(self.group, num_bytes=num_bytes, num_max_tokens_per_rank=max_tokens,
                                            deterministic=deterministic, allow_hybrid_mode=False,
                                            explicitly_destroy=True)

    def set_num_sms(self, num_sms: int) -> None:
        """Use ``num_sms`` SMs from the next call on (V2 takes the count per call)."""
        if num_sms % 2 or num_sms <= 0:
            raise ValueError(f"num_sms={num_sms} must be a positive even number")
        self.num_sms = num_sms

    def layout(self, topk_idx: torch.Tensor, num_experts: int) -> Layout:
        raise NotImplementedError("DeepEP V2 (ElasticBuffer) has no layout call; its dispatch computes it")

    def dispatch(self, x: Any, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                 num_experts: int) -> Dispatched:
        if self.validate:
            validate_dispatch(self, x, topk_idx, topk_weights, num_experts, self.device, self.limits)
        x = (x[0].contiguous(), x[1].contiguous()) if is_fp8(x) else x.contiguous()
        with no_uninitialized_fill(self.guard):
            recv_x, recv_idx, recv_w, handle, _ = self.buffer.dispatch(
                x, topk_idx=topk_idx.to(self.index_dtype).contiguous(), topk_weights=topk_weights.contiguous(),
                num_experts=num_experts, num_max_tokens_per_rank=self.max_tokens, expert_alignment=1,
                num_sms=self.num_sms, do_cpu_sync=True)
        recv_idx = recv_idx.to(torch.int64)
        # V2 leaves the weights of other ranks' slots unspecified; the contract has +0.0 there
        recv_w = torch.where(recv_idx >= 0, recv_w, torch.zeros_like(recv_w))
        return Dispatched(recv_x, recv_idx, recv_w, list(handle.num_recv_tokens_per_expert_list), handle)

    def dispatch_cached(self, x: Any, handle: Any) -> Any:
        if self.validate:
            validate_payload(self, x, int(handle.topk_idx.shape[0]), None, "x", self.device)
        x = (x[0].contiguous(), x[1].contiguous()) if is_fp8(x) else x.contiguous()
        with no_uninitialized_fill(self.guard):
            # num_experts from the handle: V2 estimates the SM count from it when num_sms is 0
            recv_x, *_ = self.buffer.dispatch(x, handle=handle, num_experts=handle.num_experts, num_sms=self.num_sms)
        return recv_x

    def combine(self, y: torch.Tensor, handle: Any) -> torch.Tensor:
        if self.validate:
            # one row per received token: V2 asserts it against the handle's source metadata
            validate_payload(self, y, int(handle.recv_src_metadata.shape[0]), None, "y", self.device,
                             bf16_only=True)
        with no_uninitialized_fill(self.guard):
            combined, _, _ = self.buffer.combine(y.contiguous(), handle=handle, num_sms=self.num_sms)
        return combined
