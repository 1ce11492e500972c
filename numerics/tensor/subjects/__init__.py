"""The tensor level's subjects: MX casts from other libraries, each adapted to the oracle's byte interface.

Every adapter module here builds one ``Subject``; ``SUBJECTS`` lists them by name. A subject gives
``quantize(x, elem, mode, block=32) -> (scale_bits, elem_bits)`` (uint8 NumPy arrays in the layout
``numerics.tensor.mx.quantize`` returns) and ``roundtrip(x, elem, mode, block=32)`` (the float32 values
a model sees), for the scale modes it implements. Its library is imported lazily: ``unavailable()``
says why it cannot be imported and how to install it, so tests skip with that hint and reports leave
the subject out. Adapters add no logic of their own beyond unpacking the subject's result into bytes.

Public: ``Subject``, ``SUBJECTS``, ``get(name)``, ``available()``.
"""

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


def _registry() -> dict[str, Subject]:
    from numerics.tensor.subjects import microxcaling, torchao

    return {s.name: s for s in (torchao.SUBJECT, microxcaling.SUBJECT)}


SUBJECTS: dict[str, Subject] = _registry()


def get(name: str) -> Subject:
    if name not in SUBJECTS:
        raise ValueError(f"unknown subject {name!r}; choose one of {', '.join(SUBJECTS)}")
    return SUBJECTS[name]


def available() -> list[Subject]:
    """The subjects importable here, in registry order."""
    return [s for s in SUBJECTS.values() if s.unavailable() is None]
