"""Error statistics: SQNR, relative error, cosine, max abs error.

Every function takes NumPy arrays or torch tensors (any device) and computes in float64 on the
input's device, so the same code serves CPU tests and 16B-shape GPU runs. Conventions:

* ``sqnr_db(ref, x) = 10 log10(sum ref^2 / sum (ref - x)^2)``; +inf when x == ref exactly,
  NaN when either side holds a NaN (a NaN is never "good").
* ``rel_err(ref, x) = ||ref - x||_2 / ||ref||_2``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch


def as_tensor(a: Any) -> torch.Tensor:
    if isinstance(a, torch.Tensor):
        return a
    return torch.from_numpy(np.ascontiguousarray(a))


def _pair64(ref: Any, x: Any) -> tuple[torch.Tensor, torch.Tensor]:
    r, y = as_tensor(ref), as_tensor(x)
    if r.shape != y.shape:
        raise ValueError(f"shape mismatch: ref {tuple(r.shape)} vs x {tuple(y.shape)}")
    return r.to(torch.float64), y.to(device=r.device, dtype=torch.float64)


def sqnr_db(ref: Any, x: Any) -> float:
    r, y = _pair64(ref, x)
    if torch.isnan(r).any() or torch.isnan(y).any():
        return math.nan
    signal = float((r * r).sum())
    noise = float(((r - y) ** 2).sum())
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def rel_err(ref: Any, x: Any) -> float:
    r, y = _pair64(ref, x)
    denom = float(torch.linalg.vector_norm(r))
    num = float(torch.linalg.vector_norm(r - y))
    if denom == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / denom


def max_abs_err(ref: Any, x: Any) -> float:
    r, y = _pair64(ref, x)
    if r.numel() == 0:
        return 0.0
    return float((r - y).abs().max())


def cosine(ref: Any, x: Any) -> float:
    r, y = _pair64(ref, x)
    nr, ny = float(torch.linalg.vector_norm(r)), float(torch.linalg.vector_norm(y))
    if nr == 0.0 or ny == 0.0:
        return 1.0 if nr == ny else 0.0
    return float((r * y).sum()) / (nr * ny)


def summary(ref: Any, x: Any) -> dict[str, float]:
    """The four numbers every level reports for one tensor."""
    return {
        "sqnr_db": sqnr_db(ref, x),
        "rel_err": rel_err(ref, x),
        "max_abs_err": max_abs_err(ref, x),
        "cosine": cosine(ref, x),
    }
