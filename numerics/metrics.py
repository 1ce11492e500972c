"""Error statistics: SQNR, relative error, cosine, max abs error, ulp distance, per-block summaries.

Every function takes NumPy arrays or torch tensors (any device) and computes in float64 on the
input's device, so the same code serves CPU tests and 16B-shape GPU runs. Conventions:

* ``sqnr_db(ref, x) = 10 log10(sum ref^2 / sum (ref - x)^2)``; +inf when x == ref exactly,
  NaN when either side holds a NaN (a NaN is never "good").
* ``rel_err(ref, x) = ||ref - x||_2 / ||ref||_2``.
* ``ulp_distance`` counts representable values between two tensors of the same float dtype,
  using the sign-magnitude -> ordered-integer map, so -0.0 and +0.0 are 0 ulp apart.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

_INT_VIEW = {
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int64,
}


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


def _ordered(t: torch.Tensor) -> torch.Tensor:
    """Map float bits to integers whose order is the float order (+0 and -0 both map to 0)."""
    bits = t.contiguous().view(_INT_VIEW[t.dtype]).to(torch.int64)
    width = t.element_size() * 8
    sign = bits < 0
    magnitude = bits & ((1 << (width - 1)) - 1)
    return torch.where(sign, -magnitude, magnitude)


def ulp_distance(a: Any, b: Any) -> torch.Tensor:
    """Per-element distance in units in the last place; both inputs must share a float dtype."""
    ta, tb = as_tensor(a), as_tensor(b)
    if ta.dtype != tb.dtype or ta.dtype not in _INT_VIEW:
        raise ValueError(f"ulp_distance needs two tensors of one float dtype, got {ta.dtype} and {tb.dtype}")
    return (_ordered(ta) - _ordered(tb.to(ta.device))).abs()


def max_ulp_distance(a: Any, b: Any) -> int:
    d = ulp_distance(a, b)
    return int(d.max()) if d.numel() else 0


def block_summary(ref: Any, x: Any, block: int = 32) -> dict[str, float]:
    """Per-block error along the last dim: quantiles of block SQNR and of max error / block amax."""
    r, y = _pair64(ref, x)
    if r.shape[-1] % block:
        raise ValueError(f"last dim {r.shape[-1]} is not a multiple of block={block}")
    rb = r.reshape(-1, block)
    eb = (rb - y.reshape(-1, block))
    signal = (rb * rb).sum(-1)
    noise = (eb * eb).sum(-1)
    finite = torch.isfinite(rb).all(-1) & torch.isfinite(eb).all(-1) & (signal > 0)
    block_sqnr = 10 * torch.log10(signal[finite] / noise[finite].clamp_min(1e-300))
    amax = rb.abs().amax(-1)
    rel_max = (eb.abs().amax(-1)[finite] / amax[finite])
    if block_sqnr.numel() == 0:
        return {"blocks": 0}
    q = torch.tensor([0.0, 0.01, 0.5], dtype=torch.float64, device=block_sqnr.device)
    sq = torch.quantile(block_sqnr, q)
    return {
        "blocks": int(block_sqnr.numel()),
        "block_sqnr_min_db": float(sq[0]),
        "block_sqnr_p01_db": float(sq[1]),
        "block_sqnr_median_db": float(sq[2]),
        "max_err_over_amax": float(rel_max.max()),
    }


def summary(ref: Any, x: Any) -> dict[str, float]:
    """The four numbers every level reports for one tensor."""
    return {
        "sqnr_db": sqnr_db(ref, x),
        "rel_err": rel_err(ref, x),
        "max_abs_err": max_abs_err(ref, x),
        "cosine": cosine(ref, x),
    }
