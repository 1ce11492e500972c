"""Bit-for-bit comparison of backend outputs, with the first difference told as a location.

Everything is compared as integer views (bf16 as int16, float32 as int32, FP8 as uint8), so NaN
payloads and -0.0 are compared by their bits. The one exception is the combine output, where any NaN
matches any NaN (``nan_any=True``; see ``numerics.ep.backend`` for why); its other bits, -0.0
included, must match.

``diff(...)`` returns ``None`` or a one-line description such as
``rank 1, row 4031, col 17 (from rank 0 token 17): expected 0x3f80, got 0x3f81 [3 of 917504 differ]``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    return t.view(_INT[t.element_size()])


def _hex(v: int, width: int) -> str:
    return f"0x{v & ((1 << (8 * width)) - 1):0{2 * width}x}"


def negative_zero_lost(expected: torch.Tensor, actual: torch.Tensor) -> torch.Tensor:
    """Elements where ``expected`` is -0.0 and ``actual`` is +0.0: DeepEP's combine, finding E1 in FINDINGS.md."""
    actual = actual.to(expected.device)
    return ((expected == 0) & torch.signbit(expected)) & ((actual == 0) & ~torch.signbit(actual))


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
    differ = e != a
    if nan_any:
        differ &= ~(torch.isnan(expected) & torch.isnan(actual.to(expected.device)))
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
