"""Token groups padded to multiples of 32 rows on the device, with no host synchronisation, in torchao 0.18's
layout (``pad_token_groups`` / ``unpad_token_groups`` with ``KernelPreference.EMULATED``, whose torch fallback
is ``torch_pad_token_groups`` / ``torch_unpad_token_groups`` in ``prototype/moe_training/kernels/mxfp8/quant.py``).

torchao's fallback reads the group sizes back to the host (``.tolist()``, a wait for the device each time) and
copies group by group. Here each routed row's destination row is computed on the device instead, so a pad is one
scatter into a zeroed buffer and an unpad one gather; the grouped GEMM computes the destinations once in forward
and reuses them for the gradients. The padded tensor (rows, zeros, shape, dtype) and the padded start and end
offsets equal torchao's bit for bit, so the GEMMs after a pad see the same operands.

The layout: group e (``sizes[e] = offs[e] - offs[e-1]`` rows) is rounded up to a multiple of 32 rows;
``ends = cumsum(padded sizes)`` (int32) and ``starts = ends - padded sizes``; the group's rows keep their order
from row ``starts[e]`` on, and every other row of the buffer is zero. The buffer has ``padded_rows(M, E)`` rows,
an upper bound known from the shapes alone (each group gains fewer than 32 rows).

Public: ``padded_rows``, ``destinations``, ``pad``, ``unpad``.
"""

from __future__ import annotations

import torch

BLOCK = 32  # the MX block, which the grouped GEMM's token groups are padded to


def padded_rows(tokens: int, groups: int, block: int = BLOCK) -> int:
    """Rows of the padded buffer: ``tokens + groups * block`` rounded up to ``block``, as torchao allocates."""
    return -(-(tokens + groups * block) // block) * block


def destinations(offs: torch.Tensor, tokens: int,
                 block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dest, starts, ends)``: the row of the padded layout each of the ``tokens`` routed rows goes to (int64),
    and the padded groups' start and end rows as torchao returns them (``ends`` int32, ``starts`` in the type
    ``offs`` promotes with int32), all on ``offs``'s device.

    ``offs`` are the groups' end rows: non-decreasing, the last one ``tokens``, as torchao requires; checking
    that would read them on the host, so it is not checked (a row past the last end indexes out of range).
    A row's group is the first whose end lies after it (``searchsorted``), which needs no group size on the host.
    """
    sizes = torch.diff(offs, prepend=offs.new_zeros(1))
    padded = (sizes + block - 1) // block * block
    ends = torch.cumsum(padded, 0, dtype=torch.int32)
    starts = ends - padded
    rows = torch.arange(tokens, device=offs.device)
    group = torch.searchsorted(offs, rows, right=True)
    shift = starts - (offs - sizes)  # how far each group's rows move: padded start less unpadded start
    return rows + shift.index_select(0, group), starts, ends


def pad(x: torch.Tensor, dest: torch.Tensor, rows: int) -> torch.Tensor:
    """A zeroed ``[rows, ...]`` buffer of ``x``'s dtype with ``x``'s rows at ``dest``: one scatter."""
    return x.new_zeros(rows, *x.shape[1:]).index_copy_(0, dest, x)


def unpad(padded: torch.Tensor, dest: torch.Tensor) -> torch.Tensor:
    """The rows of ``padded`` at ``dest``, in routed order: one gather."""
    return padded.index_select(0, dest)
