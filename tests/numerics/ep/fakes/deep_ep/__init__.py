"""A stand-in ``deep_ep`` for CPU tests of the DeepEP adapters: the call signatures of DeepEP main's
legacy ``Buffer`` and V2 ``ElasticBuffer`` (as read from DeepEP's ``deep_ep/buffers/*.py`` at commit
dd758ca), with the data moved by mxval's own all-to-all reference on gloo.

It checks what the adapters must get right and cannot see on a CPU otherwise: keyword names, tuple
layouts, the top-k index dtype (``FAKE_DEEP_EP_TOPK_BITS=32`` builds it with 32-bit indices, as
``EP_NUM_TOPK_IDX_BITS=32`` does), the handle's fields, the deterministic/fill assertion DeepEP main
makes, and V2's looser promises: unless ``deterministic=True`` received rows come in another order, and
the weights of other ranks' slots are garbage (NaN). ``FAKE_DEEP_EP_V2_IGNORE_DETERMINISTIC=1``
permutes the rows even then, for a control that the check sees the order.
Nothing here is DeepEP's code.
"""

from __future__ import annotations

import os

import torch

from numerics.ep.reference import AllToAllReference

__version__ = "2.1.0+fake"
topk_idx_t = torch.int32 if os.environ.get("FAKE_DEEP_EP_TOPK_BITS") == "32" else torch.int64


def _check_deterministic():  # DeepEP main's check_torch_deterministic
    assert not (torch.are_deterministic_algorithms_enabled() and torch.utils.deterministic.fill_uninitialized_memory)


class Config:
    def __init__(self, num_sms, *args):
        self.num_sms = num_sms

    def get_nvl_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        return hidden_bytes * num_ranks * 1024


class Buffer:
    num_sms: int = 20

    def __init__(self, group, num_nvl_bytes: int = 0, num_rdma_bytes: int = 0, low_latency_mode: bool = False,
                 num_qps_per_rank: int = 24, allow_nvlink_for_low_latency_mode: bool = True, allow_mnnvl: bool = False,
                 explicitly_destroy: bool = False, enable_shrink: bool = False, comm=None):
        assert num_nvl_bytes > 0 and num_rdma_bytes == 0 and not low_latency_mode
        self.group, self.explicitly_destroy = group, explicitly_destroy
        self.ref = AllToAllReference(group, device="cpu", validate=False)

    @staticmethod
    def set_num_sms(new_num_sms: int) -> None:
        assert new_num_sms % 2 == 0, "The SM count must be even"
        Buffer.num_sms = new_num_sms

    @staticmethod
    def get_dispatch_config(num_ranks: int) -> Config:
        return Config(Buffer.num_sms, 24, 256, 6, 128)

    @staticmethod
    def get_combine_config(num_ranks: int) -> Config:
        return Config(Buffer.num_sms, 10, 256, 6, 128)

    def get_dispatch_layout(self, topk_idx, num_experts, previous_event=None, async_finish=False,
                            allocate_on_comm_stream=False):
        assert topk_idx.dtype == topk_idx_t and topk_idx.is_contiguous()
        lay = self.ref.layout(topk_idx.long(), num_experts)
        return lay.num_tokens_per_rank, None, lay.num_tokens_per_expert, lay.is_token_in_rank, None

    def dispatch(self, x, handle=None, num_tokens_per_rank=None, num_tokens_per_rdma_rank=None, is_token_in_rank=None,
                 num_tokens_per_expert=None, topk_idx=None, topk_weights=None, expert_alignment=1, num_worst_tokens=0,
                 config=None, previous_event=None, async_finish=False, allocate_on_comm_stream=False):
        _check_deterministic()
        if handle is not None:
            assert topk_idx is None and topk_weights is None
            return self.ref.dispatch_cached(x, handle[5]), None, None, None, None, None
        assert num_tokens_per_rank is not None and is_token_in_rank is not None and num_tokens_per_expert is not None
        assert topk_idx.dtype == topk_idx_t and topk_weights.dtype == torch.float32
        num_experts = int(num_tokens_per_expert.numel())
        d = self.ref.dispatch(x, topk_idx.long(), topk_weights, num_experts)
        recv_src_idx = torch.empty(sum(d.handle.recv_counts), dtype=torch.int32)
        handle = (None, None, None, recv_src_idx, is_token_in_rank, d.handle)
        return d.recv_x, d.recv_topk_idx.to(topk_idx_t), d.recv_topk_weights, d.num_recv_tokens_per_expert, handle, None

    def combine(self, x, handle, topk_weights=None, bias=None, config=None, previous_event=None, async_finish=False,
                allocate_on_comm_stream=False):
        _check_deterministic()
        assert x.dtype == torch.bfloat16 and x.shape[0] == handle[3].shape[0]
        return self.ref.combine(x, handle[5]), None, None

    def destroy(self):
        assert self.explicitly_destroy, "`explicitly_destroy` flag must be set"


class EPHandle:
    def __init__(self, **fields):
        self.__dict__.update(fields)


class ElasticBuffer:
    def __init__(self, group, num_bytes=None, num_cpu_bytes=0, num_max_tokens_per_rank=0, hidden=0, num_topk=0,
                 use_fp8_dispatch=False, deterministic=False, allow_hybrid_mode=True, allow_multiple_reduction=True,
                 prefer_overlap_with_compute=True, sl_idx=3, num_allocated_qps=0, num_cpu_timeout_secs=300,
                 num_gpu_timeout_secs=100, explicitly_destroy=False):
        assert num_bytes is None or num_bytes % (2 << 20) == 0
        self.group, self.deterministic, self.explicitly_destroy = group, deterministic, explicitly_destroy
        self.num_max_tokens_per_rank = num_max_tokens_per_rank
        self.permute = not deterministic or os.environ.get("FAKE_DEEP_EP_V2_IGNORE_DETERMINISTIC") == "1"
        self.ref = AllToAllReference(group, device="cpu", validate=False)

    @staticmethod
    def get_buffer_size_hint(group, num_max_tokens_per_rank, hidden, num_topk=0, use_fp8_dispatch=False,
                             allow_hybrid_mode=True, allow_multiple_reduction=True) -> int:
        rows = num_max_tokens_per_rank * group.size()
        row = hidden * (1 if use_fp8_dispatch else 2) + 16 * max(num_topk, 1)
        return -(-(rows * row) // (2 << 20)) * (2 << 20)

    def _order(self, n: int) -> torch.Tensor:
        return torch.arange(n - 1, -1, -1) if self.permute else torch.arange(n)  # V2 promises no order

    def dispatch(self, x, topk_idx=None, topk_weights=None, cumulative_local_expert_recv_stats=None, num_experts=None,
                 num_max_tokens_per_rank=None, expert_alignment=None, num_sms=0, num_qps=0, previous_event=None,
                 previous_event_before_epilogue=None, async_with_compute_stream=False, allocate_on_comm_stream=False,
                 handle=None, do_handle_copy=True, do_cpu_sync=None, do_expand=False, do_zero_padding=False,
                 use_tma_aligned_col_major_sf=False):
        _check_deterministic()
        assert not do_expand and not async_with_compute_stream and num_sms >= 0
        tokens = (x[0] if isinstance(x, tuple) else x).shape[0]
        if handle is not None:
            assert topk_idx is None and do_cpu_sync in (None, False)
            assert num_experts in (None, handle.num_experts), "Should be aligned with the handle context"
            assert num_experts is not None or num_sms != 0, "V2 estimates the SM count from num_experts"
            rows = self.ref.dispatch_cached(x, handle.ref)
            order = handle.order
            recv_x = (rows[0][order], rows[1][order]) if isinstance(rows, tuple) else rows[order]
            return recv_x, None, None, handle, None
        limit = num_max_tokens_per_rank or self.num_max_tokens_per_rank
        assert tokens <= limit and topk_idx.dtype == topk_idx_t and expert_alignment in (None, 1)
        assert num_experts is not None and do_cpu_sync in (None, True)
        d = self.ref.dispatch(x, topk_idx.long(), topk_weights, num_experts)
        order = self._order(int(d.recv_topk_idx.shape[0]))
        recv_x = (d.recv_x[0][order], d.recv_x[1][order]) if isinstance(d.recv_x, tuple) else d.recv_x[order]
        idx, weights = d.recv_topk_idx[order], d.recv_topk_weights[order].clone()
        weights[idx < 0] = float("nan")  # unspecified in V2 for other ranks' slots
        metadata = torch.zeros(idx.shape[0], idx.shape[1] + 2, dtype=torch.int32)
        handle = EPHandle(ref=d.handle, order=order, topk_idx=topk_idx.clone(), num_experts=num_experts,
                          num_recv_tokens_per_expert_list=d.num_recv_tokens_per_expert, recv_src_metadata=metadata,
                          num_sms=num_sms, num_recv_tokens=int(idx.shape[0]), do_expand=False)
        return recv_x, idx.to(topk_idx_t), weights, handle, None

    def combine(self, x, handle, topk_weights=None, bias=None, num_sms=0, num_qps=0, previous_event=None,
                previous_event_before_epilogue=None, async_with_compute_stream=False, allocate_on_comm_stream=False):
        _check_deterministic()
        assert x.dtype == torch.bfloat16 and x.shape[0] == handle.recv_src_metadata.shape[0]
        back = torch.empty_like(x)
        back[handle.order] = x  # rows in the reference's order again
        return self.ref.combine(back, handle.ref), None, None

    def destroy(self):
        assert self.explicitly_destroy
