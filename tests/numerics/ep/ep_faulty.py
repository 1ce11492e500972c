"""A deliberately wrong EPBackend, importable by spawned ranks, to prove the check can fail.

Rank 1 flips one payload bit of received row 2 (column 5), and every rank turns +0.0 combine
results into -0.0 — the kind of difference only a bit-exact check sees. (The opposite, -0.0 into
+0.0, is DeepEP's known finding E1, which the check reports on its own row.) ``DyingBackend`` loses a
rank mid-run instead.
"""

from __future__ import annotations

import os

import torch

from numerics.ep.reference import AllToAllReference


class FaultyBackend(AllToAllReference):
    def dispatch(self, x, topk_idx, topk_weights, num_experts):
        d = super().dispatch(x, topk_idx, topk_weights, num_experts)
        if self.rank == 1 and not isinstance(d.recv_x, tuple) and d.recv_x.shape[0] > 2:
            d.recv_x.view(torch.int16)[2, 5] ^= 1
        return d

    def combine(self, y, handle):
        out = super().combine(y, handle)
        positive_zero = (out == 0) & ~torch.signbit(out)
        return torch.where(positive_zero, -out, out)  # only the sign of zero changes


class DyingBackend(AllToAllReference):
    """Rank 1's process ends (``os._exit(1)``, as a crash or an OOM kill would) in its first dispatch."""

    def dispatch(self, x, topk_idx, topk_weights, num_experts):
        if self.rank == 1:
            os._exit(1)
        return super().dispatch(x, topk_idx, topk_weights, num_experts)


class SetUpFailsBackend(AllToAllReference):
    """Rank 1 cannot build its backend (a missing library, a buffer it cannot allocate)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.rank == 1:
            raise RuntimeError("no buffer on rank 1")
