"""``DeepEPBackend``: the subject, DeepEP's V1 ``deep_ep.Buffer`` in intranode normal mode.

Written against DeepEP v1.2.1's public API, which DeepEP's main (2.x, July 2026) keeps as its "legacy"
``Buffer`` (``deep_ep/buffers/legacy.py``; the kernels moved to ``csrc/kernels/legacy/``) with the same
calls: ``Buffer(group, num_nvl_bytes, 0, explicitly_destroy=True)`` sized with
``Config.get_nvl_buffer_size_hint`` for the dispatch and combine configs; ``get_dispatch_layout(topk_idx,
num_experts)``; ``dispatch(x, num_tokens_per_rank=, is_token_in_rank=, num_tokens_per_expert=, topk_idx=,
topk_weights=)`` and, with a handle from an earlier dispatch, ``dispatch(x, handle=handle)`` (cached
layout); ``combine(y, handle)``. ``x`` may be the FP8 pair; DeepEP carries it as is. Calls are
synchronous (``async_finish=False``), so results are ready on the current stream when a method returns.
Both versions are detected at run time (``describe_deep_ep``): main has ``deep_ep.__version__`` and
``ElasticBuffer``, v1.2.x has neither. Main may be built with 32-bit top-k indices
(``EP_NUM_TOPK_IDX_BITS``); the indices are converted to ``deep_ep.topk_idx_t`` and back.

Inputs are checked by the same collective rules as the reference (``numerics.ep.backend``), plus the
buffer's hidden-size limit, before DeepEP sees them, so bad input is a ValueError on its rank and a
clean stop on the others rather than a device-side assert that strands the peers.

``torch.use_deterministic_algorithms(True)`` with ``torch.utils.deterministic.fill_uninitialized_memory``
(its default) makes every ``torch::empty`` launch a NaN fill on the compute stream, which DeepEP's
kernels on its communication stream do not wait for (DeepEP issue #589: combine output intermittently
NaN; DeepEP's main asserts that the two are not both on). With ``guard_uninitialized_fill=True``
(default) each call runs with that fill switched off and restores it afterwards; see FINDINGS E2.

deep_ep is imported lazily: constructing the backend without it raises ImportError saying how to get it.
"""

from __future__ import annotations

import contextlib
import datetime
from typing import Any

import torch
import torch.distributed as dist

from numerics.ep.backend import (
    DEFAULT_TIMEOUT,
    Dispatched,
    EPBackend,
    Layout,
    Limits,
    finish,
    validate_dispatch,
    validate_payload,
)

HOW_TO_GET = (
    "build DeepEP (github.com/deepseek-ai/DeepEP: tag v1.2.1, or main for the legacy Buffer and the V2 "
    "ElasticBuffer) per its own README on a machine with NVLink-connected GPUs, and put the built "
    "package on PYTHONPATH"
)


def import_deep_ep(api: str = "Buffer"):
    """deep_ep, or ImportError saying how to get it; ``api`` is the class the caller needs."""
    try:
        import deep_ep
    except (ImportError, AssertionError, OSError, RuntimeError) as exc:
        # DeepEP main asserts at import that torch and DeepEP load the same libnccl (check_nccl_so)
        raise ImportError(f"deep_ep is not importable ({type(exc).__name__}: {exc}); {HOW_TO_GET}") from exc
    if not hasattr(deep_ep, api):
        raise ImportError(f"this deep_ep ({describe_deep_ep(deep_ep)['version']}) has no {api} API; {HOW_TO_GET}")
    return deep_ep


def describe_deep_ep(deep_ep: Any = None) -> dict[str, Any]:
    """Which DeepEP this is: its version (main sets ``__version__``; 1.x does not), path and APIs."""
    if deep_ep is None:
        try:
            import deep_ep
        except (ImportError, AssertionError, OSError, RuntimeError) as exc:
            return {"version": None, "error": f"{type(exc).__name__}: {exc}"}
    version = getattr(deep_ep, "__version__", None)
    apis = [name for name in ("Buffer", "ElasticBuffer") if hasattr(deep_ep, name)]
    if version is None:
        version = "1.x (no __version__; v1.2.x layout)" if "ElasticBuffer" not in apis else "unknown"
    return {"version": version, "file": getattr(deep_ep, "__file__", None), "apis": apis}


def topk_idx_dtype(deep_ep: Any) -> torch.dtype:
    """The dtype DeepEP wants for top-k indices (main: ``deep_ep.topk_idx_t``; v1.2.x: int64)."""
    return getattr(deep_ep, "topk_idx_t", torch.int64)


@contextlib.contextmanager
def no_uninitialized_fill(enabled: bool = True):
    """Switch off torch's NaN fill of fresh allocations for the duration (DeepEP issue #589)."""
    fill = getattr(torch.utils, "deterministic", None)
    if not (enabled and fill is not None and torch.are_deterministic_algorithms_enabled()
            and fill.fill_uninitialized_memory):
        yield
        return
    fill.fill_uninitialized_memory = False
    try:
        yield
    finally:
        fill.fill_uninitialized_memory = True


class DeepEPBase(EPBackend):
    """What DeepEP's V1 and V2 backends share: the group, timeouts, checks and device they run with."""

    def _bind(self, api: str, group: Any, timeout: datetime.timedelta, guard_uninitialized_fill: bool,
              validate: bool, device: torch.device | str | None):
        """Import DeepEP's ``api``, set the shared attributes, and return the ``deep_ep`` module."""
        deep_ep = import_deep_ep(api)
        self.group = group if group is not None else dist.group.WORLD
        self.timeout = timeout
        self.guard = guard_uninitialized_fill
        self.validate = validate
        self.index_dtype = topk_idx_dtype(deep_ep)
        # DeepEP runs on the current CUDA device; ``device`` exists for the CPU tests' stand-in deep_ep
        self.device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        return deep_ep

    def close(self) -> None:
        """Wait for every peer, then free the buffer; a second call does nothing."""
        if getattr(self, "buffer", None) is None:
            return
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize()
        finish(dist.barrier(group=self.group, async_op=True), self.timeout, self.device)
        if cuda:
            torch.cuda.synchronize()  # the barrier is stream-ordered on NCCL: every peer is done before destroy
        self.buffer.destroy()
        self.buffer = None


class DeepEPBackend(DeepEPBase):
    """DeepEP V1 intranode dispatch / combine behind the ``EPBackend`` interface."""

    def __init__(self, group: Any = None, *, max_hidden: int = 7168, num_sms: int | None = None,
                 timeout: datetime.timedelta = DEFAULT_TIMEOUT, guard_uninitialized_fill: bool = True,
                 validate: bool = True, device: torch.device | str | None = None):
        deep_ep = self._bind("Buffer", group, timeout, guard_uninitialized_fill, validate, device)
        self._deep_ep = deep_ep
        if num_sms is not None:
            deep_ep.Buffer.set_num_sms(num_sms)  # class-wide in DeepEP; must be even
        self.max_num_sms = deep_ep.Buffer.num_sms  # the buffer is sized for this many channels
        world = dist.get_world_size(self.group)
        hidden_bytes = 2 * max_hidden  # a bf16 row is the widest (an FP8 row's scales have their own room)
        configs = (deep_ep.Buffer.get_dispatch_config(world), deep_ep.Buffer.get_combine_config(world))
        num_nvl_bytes = max(cfg.get_nvl_buffer_size_hint(hidden_bytes, world) for cfg in configs)
        self.max_hidden = max_hidden
        self.limits = Limits(max_hidden=max_hidden)
        self.buffer = deep_ep.Buffer(self.group, num_nvl_bytes, 0, explicitly_destroy=True)

    def set_num_sms(self, num_sms: int) -> None:
        """Use ``num_sms`` SMs from the next call on (at most the number the buffer was sized for)."""
        if num_sms % 2 or not 0 < num_sms <= self.max_num_sms:
            raise ValueError(f"num_sms={num_sms} must be even and in (0, {self.max_num_sms}], the number "
                             "this buffer was sized for")
        self._deep_ep.Buffer.set_num_sms(num_sms)

    def layout(self, topk_idx: torch.Tensor, num_experts: int) -> Layout:
        with no_uninitialized_fill(self.guard):
            per_rank, _, per_expert, in_rank, _ = self.buffer.get_dispatch_layout(
                topk_idx.to(self.index_dtype).contiguous(), num_experts)
        return Layout(per_rank, per_expert, in_rank)

    def dispatch(self, x: Any, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                 num_experts: int) -> Dispatched:
        if self.validate:
            validate_dispatch(self, x, topk_idx, topk_weights, num_experts, self.device, self.limits)
        x = (x[0].contiguous(), x[1]) if isinstance(x, tuple) else x.contiguous()
        topk_idx, topk_weights = topk_idx.to(self.index_dtype).contiguous(), topk_weights.contiguous()
        lay = self.layout(topk_idx, num_experts)
        with no_uninitialized_fill(self.guard):
            recv_x, recv_idx, recv_w, per_expert, handle, _ = self.buffer.dispatch(
                x, num_tokens_per_rank=lay.num_tokens_per_rank, is_token_in_rank=lay.is_token_in_rank,
                num_tokens_per_expert=lay.num_tokens_per_expert, topk_idx=topk_idx, topk_weights=topk_weights)
        return Dispatched(recv_x, recv_idx.to(torch.int64), recv_w, list(per_expert), handle)

    def dispatch_cached(self, x: Any, handle: Any) -> Any:
        is_token_in_rank = handle[4]  # (rank_prefix, channel_prefix, recv_channel_prefix, src_idx, in_rank, send_head)
        if self.validate:
            validate_payload(self, x, int(is_token_in_rank.shape[0]), None, "x", self.device)
        x = (x[0].contiguous(), x[1]) if isinstance(x, tuple) else x.contiguous()
        with no_uninitialized_fill(self.guard):
            recv_x, *_ = self.buffer.dispatch(x, handle=handle)
        return recv_x

    def combine(self, y: torch.Tensor, handle: Any) -> torch.Tensor:
        recv_src_idx = handle[3]
        if self.validate:
            validate_payload(self, y, int(recv_src_idx.shape[0]), None, "y", self.device, bf16_only=True)
        with no_uninitialized_fill(self.guard):
            combined, _, _ = self.buffer.combine(y.contiguous(), handle)
        return combined
