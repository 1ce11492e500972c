"""Token groups padded to multiples of 32 rows on the device, with no host synchronisation, in torchao 0.18's
layout (``pad_token_groups`` / ``unpad_token_groups`` with ``KernelPreference.EMULATED``, whose torch fallback
is ``torch_pad_token_groups`` / ``torch_unpad_token_groups`` in ``prototype/moe_training/kernels/mxfp8/quant.py``).

torchao's fallback reads the group sizes back to the host (``.tolist()``, a wait for the device each time) and
copies group by group. Here each routed row's destination row is computed on the device instead, and from it the
source row of each padded row and the rows left zero, so a pad is one gather with its zero rows filled after it
(torch's gather kernel moves rows vectorised, its scatter kernel element by element into a buffer zeroed first,
so every row written twice) and an unpad one gather; the grouped GEMM computes these maps once in forward and
reuses them for the gradients. The padded tensor (rows, zeros, shape, dtype) and the padded start and end offsets
equal torchao's bit for bit, so the GEMMs after a pad see the same operands.

The layout: group e (``sizes[e] = offs[e] - offs[e-1]`` rows) is rounded up to a multiple of 32 rows;
``ends = cumsum(padded sizes)`` (int32) and ``starts = ends - padded sizes``; the group's rows keep their order
from row ``starts[e]`` on, and every other row of the buffer is zero. The buffer has ``padded_rows(M, E)`` rows,
an upper bound known from the shapes alone (each group gains fewer than 32 rows).

A cast of a padded operand need not have the padded copy: ``row_map`` gives the rows it holds as one map (a
negative row: zeros), which the fast cast gathers by in its loads (``numerics.layer.fast.cast``, ``rows``).

``layout`` gives all of them for a grouped GEMM's ``offs``, computed once for every grouped GEMM given the same
``offs`` in eager mode: an MoE layer's three (w1, w3, w2) share one routing, so two of the three skip the ~19 small
ops the maps take.

Public: ``padded_rows``, ``destinations``, ``sources``, ``row_map``, ``Layout``, ``layout``, ``pad``, ``unpad``.
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

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
    padded = (sizes + block - 1) & -block  # rounded up to a multiple of block (a power of two)
    ends = torch.cumsum(padded, 0, dtype=torch.int32)
    starts = ends - padded
    rows = torch.arange(tokens, device=offs.device)
    group = torch.searchsorted(offs, rows, right=True)
    shift = starts - (offs - sizes)  # how far each group's rows move: padded start less unpadded start
    return rows + shift.index_select(0, group), starts, ends


def sources(offs: torch.Tensor, dest: torch.Tensor, ends: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(src, blank)`` for a padded layout of ``rows`` rows (``padded_rows``) whose routed rows go to ``dest`` and
    whose groups end at ``ends`` (both from ``destinations``): the routed row each padded row holds (0 where it
    holds none), and the ``rows - len(dest)`` rows that hold none, in increasing order (int64, on ``offs``'s
    device, no host read; 9 small ops, for a pad that is then one gather).

    The blank rows are group e's last ``gaps[e]`` rows (its rounding up), then the buffer's tail. With ``cum =
    ends - offs`` the running sum of the gaps, the k-th blank row lies in the first group whose ``cum`` exceeds k
    and is row ``offs[e] + k``: the group's padded end is ``offs[e] + cum[e]``, and its blank rows are the
    ``gaps[e]`` rows before it. Past the last group (none exceeds k) it is row ``tokens + k``, which is
    ``offs[-1] + k`` as ``offs[-1] == tokens``: so the group index is clamped to the last."""
    tokens = dest.numel()
    src = torch.zeros(rows, dtype=torch.int64, device=dest.device).index_copy_(
        0, dest, torch.arange(tokens, device=dest.device))
    k = torch.arange(rows - tokens, device=offs.device)
    group = torch.searchsorted(ends - offs, k, right=True).clamp_(max=offs.numel() - 1)
    return src, offs.index_select(0, group) + k


def row_map(src: torch.Tensor, blank: torch.Tensor) -> torch.Tensor:
    """The padded layout as one map (``sources``'s two): each padded row's routed row, -1 where it holds none."""
    return src.index_fill(0, blank, -1)


class Layout(NamedTuple):
    """A padded layout's maps (``destinations``, ``sources``, ``row_map``) and its groups' padded end rows."""
    dest: torch.Tensor
    ends: torch.Tensor
    src: torch.Tensor
    blank: torch.Tensor
    rows: torch.Tensor


# id(offs) -> (a weak reference to offs, (tokens, offs' version), its Layout). Keyed by id: a tensor compared with
# == gives a tensor, so tensors cannot be a dict's keys (nor a WeakKeyDictionary's); the entry is removed when offs
# is freed (the reference's callback runs before its id can be taken by another object).
_LAYOUTS: dict[int, tuple] = {}


def layout(offs: torch.Tensor, tokens: int) -> Layout:
    """The padded layout of ``tokens`` routed rows grouped by ``offs``. In eager mode it is kept with ``offs`` and
    given again for the same ``offs`` object (unchanged since: its version counter) and ``tokens``; a compiled
    graph computes it where it is used (dynamo does not trace the cache)."""
    # not kept while compiling (reading offs' version there would trace a data-dependent value), nor for an inference
    # tensor (it has no version counter)
    if torch.compiler.is_compiling() or offs.is_inference():
        return _made(offs, tokens)
    key, ident = (tokens, offs._version), id(offs)
    kept = _LAYOUTS.get(ident)
    if kept is not None and kept[0]() is offs and kept[1] == key:
        return kept[2]
    made = _made(offs, tokens)
    _LAYOUTS[ident] = (weakref.ref(offs, lambda _ref: _LAYOUTS.pop(ident, None)), key, made)
    return made


def _made(offs: torch.Tensor, tokens: int) -> Layout:
    dest, _, ends = destinations(offs, tokens)
    src, blank = sources(offs, dest, ends, padded_rows(tokens, offs.shape[0]))
    return Layout(dest, ends, src, blank, row_map(src, blank))


def pad(x: torch.Tensor, src: torch.Tensor, blank: torch.Tensor) -> torch.Tensor:
    """``x``'s rows in the padded layout (``sources``), every other row zero: one gather, then the blank rows
    zeroed."""
    if x.shape[0] == 0:  # nothing to gather from: every row is blank
        return x.new_zeros(src.shape[0], *x.shape[1:])
    return x.index_select(0, src).index_fill_(0, blank, 0)


def unpad(padded: torch.Tensor, dest: torch.Tensor) -> torch.Tensor:
    """The rows of ``padded`` at ``dest``, in routed order: one gather."""
    return padded.index_select(0, dest)
