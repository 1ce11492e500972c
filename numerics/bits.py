"""A tensor's raw bits, the one helper every bit-exact comparison and bit-preserving copy goes through.

``bits(t)`` is ``t`` viewed as the signed integer type of its element width (bool as uint8), same
shape, so equality, indexing and copying act on the stored bits: NaN payloads, -0.0 and subnormals are
compared and moved exactly, never interpreted as floats. ``bits_np(a)`` does the same for NumPy arrays
(unsigned, as NumPy prints them).
"""

from __future__ import annotations

import numpy as np
import torch

_TORCH_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_NUMPY_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bits of ``t`` as an integer tensor of the same shape (a view where ``t`` is contiguous)."""
    t = t.contiguous()
    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    return t.view(_TORCH_INT[t.element_size()])


def bits_np(a) -> np.ndarray:
    """The bits of a torch tensor (any device) or NumPy array as an unsigned NumPy array."""
    if isinstance(a, torch.Tensor):
        return bits(a.detach().cpu()).numpy().view(_NUMPY_UINT[a.element_size()])
    arr = np.ascontiguousarray(a)
    return arr.view(_NUMPY_UINT[arr.dtype.itemsize])
