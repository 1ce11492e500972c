"""Bit-for-bit comparison of backend outputs, with the first difference told as a location.

Everything is compared as integer views (bf16 as int16, float32 as int32, FP8 as uint8), so NaN
payloads and -0.0 are compared by their bits. The one exception is the combine output, where any NaN
matches any NaN (``nan_any=True``; see ``numerics.ep.backend`` for why); its other bits, -0.0
included, must match.

``diff(...)`` returns ``None`` or a one-line description such as
``rank 1, row 4031, col 17 (from rank 0 token 17): expected 0x3f80, got 0x3f81 [3 of 917504 differ]``.
``split_known(...)`` does the same for the differences no known finding explains, and counts, per
finding (``numerics.ep.known``), the values it explains.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from numerics.bits import bits


def _hex(v: int, width: int) -> str:
    return f"0x{v & ((1 << (8 * width)) - 1):0{2 * width}x}"


def negative_zero_lost(expected: torch.Tensor, actual: torch.Tensor) -> torch.Tensor:
    """Elements where ``expected`` is -0.0 and ``actual`` is +0.0 (FINDINGS.md E1: a zero-initialised sum)."""
    actual = actual.to(expected.device)
    return ((expected == 0) & torch.signbit(expected)) & ((actual == 0) & ~torch.signbit(actual))


def differing(expected: torch.Tensor, actual: torch.Tensor, *, nan_any: bool = False) -> torch.Tensor:
    """Bool mask of the elements whose bits differ (any NaN matching any NaN when ``nan_any``)."""
    actual = actual.to(expected.device)
    differ = bits(expected) != bits(actual)
    if nan_any:
        differ &= ~(torch.isnan(expected) & torch.isnan(actual))
    return differ


def diff(expected: Any, actual: Any, *, rank: int, where: Callable[[tuple[int, ...]], str] | None = None,
         nan_any: bool = False, ignore: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
         ) -> str | None:
    """None when bit-identical; else where the first difference is and how many there are.

    ``ignore(expected, actual)`` masks differences a known finding explains; they are reported
    separately (numerics.ep.check), never silently dropped."""
    head = f"rank {rank}"
    if isinstance(expected, list) or isinstance(actual, list):
        if list(expected) != list(actual):
            return f"{head}: expected {list(expected)}, got {actual}"
        return None
    if not isinstance(actual, torch.Tensor):
        return f"{head}: expected a {expected.dtype} tensor, got {type(actual).__name__}"
    if actual.dtype != expected.dtype:
        return f"{head}: expected dtype {expected.dtype}, got {actual.dtype}"
    if tuple(actual.shape) != tuple(expected.shape):
        return f"{head}: expected shape {tuple(expected.shape)}, got {tuple(actual.shape)}"
    e, a = bits(expected), bits(actual.to(expected.device))
    differ = differing(expected, actual, nan_any=nan_any)
    if ignore is not None:
        differ &= ~ignore(expected, actual)
    n = int(differ.sum())
    if n == 0:
        return None
    idx = tuple(int(i) for i in differ.nonzero()[0])
    loc = where(idx) if where else f"index {idx}"
    width = e.element_size()
    return (f"{head}, {loc}: expected {_hex(int(e[idx]), width)}, got {_hex(int(a[idx]), width)} "
            f"[{n} of {e.numel()} differ]")


def recv_row_locator(src_rank: torch.Tensor, src_idx: torch.Tensor) -> Callable[[tuple[int, ...]], str]:
    """Describe a received row by where it came from."""
    def where(idx: tuple[int, ...]) -> str:
        row = idx[0]
        col = f", col {idx[1]}" if len(idx) > 1 else ""
        return f"row {row}{col} (from rank {int(src_rank[row])} token {int(src_idx[row])})"
    return where


def combine_locator(is_token_in_rank: torch.Tensor) -> Callable[[tuple[int, ...]], str]:
    def where(idx: tuple[int, ...]) -> str:
        ranks = is_token_in_rank[idx[0]].nonzero().flatten().tolist()
        return f"token {idx[0]}, col {idx[1]} (sum of the rows back from ranks {ranks})"
    return where


def layout_locator(idx: tuple[int, ...]) -> str:
    return f"token {idx[0]}, destination rank {idx[1]}" if len(idx) == 2 else f"entry {idx[0]}"


def split_known(expected: torch.Tensor, actual: Any, *, rank: int, known: Sequence[Any],
                where: Callable[[tuple[int, ...]], str] | None = None, nan_any: bool = False
                ) -> tuple[str | None, dict[str, dict[str, Any]]]:
    """(first unexplained difference or None, {finding id: {"values": n, "first": message}}).

    ``known`` are ``numerics.ep.known.Known`` entries; each explains the differing values its
    predicate picks. A value two findings could explain is counted for the first."""
    if not known or not isinstance(actual, torch.Tensor) or actual.dtype != expected.dtype \
            or tuple(actual.shape) != tuple(expected.shape):
        return diff(expected, actual, rank=rank, where=where, nan_any=nan_any), {}
    differ = differing(expected, actual, nan_any=nan_any)
    masks = [k.explains(expected, actual) & differ for k in known]

    def any_of(e: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(masks[0])
        for m in masks:
            out |= m
        return out

    unexplained = diff(expected, actual, rank=rank, where=where, nan_any=nan_any, ignore=any_of)
    counts: dict[str, dict[str, Any]] = {}
    taken = torch.zeros_like(masks[0])
    for k, mask in zip(known, masks):
        mine = mask & ~taken
        taken |= mask
        if bool(mine.any()):
            first = diff(expected, actual, rank=rank, where=where, nan_any=nan_any,
                         ignore=lambda e, a, m=mine: ~m)
            counts[k.id] = {"values": int(mine.sum()), "first": first}
    return unexplained, counts
