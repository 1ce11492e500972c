"""``Subject``: what a tensor-level subject adapter gives (see ``numerics.tensor.subjects``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Subject:
    """One MX cast under test."""

    name: str
    what: str  # the function under test, as its library names it
    modes: tuple[str, ...]  # scale modes it implements, in the oracle's names
    inf: str  # the oracle's Inf reading ("nan" / "saturate") its bytes are held against
    quantize: Callable[..., tuple[np.ndarray, np.ndarray]]  # (x, elem, mode, block=32, *, device=None)
    roundtrip: Callable  # (x, elem, mode, block=32) -> float32 torch.Tensor
    version: Callable[[], str]
    unavailable: Callable[[], str | None]  # None when importable; else the reason and the install hint
    devices: tuple[str, ...] = ("cpu",)  # where ``quantize(..., device=)`` can run the cast
    elems: tuple[str, ...] = ("e4m3", "e5m2")  # element formats it casts to (e2m1: MXFP4's, one code a byte)
