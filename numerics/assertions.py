"""The comparison helpers: bit-exact (``assert_bits_equal`` on raw bits, ``numerics.bits``) and statistical
(``assert_sqnr_at_least`` against a ``numerics.tolerances`` floor).

Failure messages name what was compared and where the first difference is, so a failing
property test reads as a bug report.

NaN-encoding policy for ``assert_bits_equal``: by default bits are compared as they are, so two
different NaN payloads differ (communication must carry bits unchanged). With
``canonical_nan=<dtype>``, every NaN code of that float dtype counts as equal (casts may pick any
NaN encoding; the MX spec defines no payload).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from numerics import metrics
from numerics.bits import bits_np
from numerics.tolerances import Tolerance


def first_mismatch(expected: Any, actual: Any, *, canonical_nan: Any = None) -> tuple[int, ...] | None:
    """Index of the first element whose bits differ, or None."""
    e, a = bits_np(expected), bits_np(actual)
    if e.shape != a.shape:
        raise AssertionError(f"shape mismatch: expected {e.shape}, got {a.shape}")
    differ = e.astype(np.int64) != a.astype(np.int64)
    if canonical_nan is not None:
        nan_e = np.isnan(np.asarray(expected, dtype=np.float64) if not isinstance(expected, torch.Tensor)
                         else expected.detach().cpu().double().numpy())
        nan_a = np.isnan(np.asarray(actual, dtype=np.float64) if not isinstance(actual, torch.Tensor)
                         else actual.detach().cpu().double().numpy())
        differ &= ~(nan_e & nan_a)
    if not differ.any():
        return None
    return tuple(int(i) for i in np.argwhere(differ)[0])


def assert_bits_equal(expected: Any, actual: Any, *, what: str, canonical_nan: Any = None,
                      context: str = "") -> None:
    idx = first_mismatch(expected, actual, canonical_nan=canonical_nan)
    if idx is None:
        return
    e, a = bits_np(expected), bits_np(actual)
    n = int((e.astype(np.int64) != a.astype(np.int64)).sum())
    raise AssertionError(
        f"{what}: {n} of {e.size} elements differ bitwise; first at index {idx}: "
        f"expected 0x{int(e[idx]) & ((1 << (8 * e.itemsize)) - 1):0{2 * e.itemsize}x}, "
        f"got 0x{int(a[idx]) & ((1 << (8 * a.itemsize)) - 1):0{2 * a.itemsize}x}"
        + (f"; {context}" if context else "")
    )


def assert_sqnr_at_least(ref: Any, x: Any, tol: Tolerance, *, what: str = "") -> float:
    measured = metrics.sqnr_db(ref, x)
    if math.isnan(measured) or measured < tol.floor:
        raise AssertionError((what + ": " if what else "") + tol.describe(measured))
    return measured
