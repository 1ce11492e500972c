"""The tensor level's subjects: MX casts from other libraries, each adapted to the oracle's byte interface.

Every adapter module here builds one ``Subject``; ``SUBJECTS`` lists them by name. A subject gives
``quantize(x, elem, mode, block=32) -> (scale_bits, elem_bits)`` (uint8 NumPy arrays in the layout
``numerics.tensor.mx.quantize`` returns: one code a byte, FP4 too) and ``roundtrip(x, elem, mode, block=32)``
(the float32 values a model sees), for the scale modes and element formats it implements. Its library is
imported lazily: ``unavailable()`` says why it cannot be imported and how to install it, so tests skip
with that hint and reports leave the subject out. Adapters add no logic of their own beyond unpacking
the subject's result into bytes.

Public: ``Subject`` (from ``subject.py``, where the adapters import it: no import cycle), ``SUBJECTS``,
``get(name)``, ``available()``.
"""

from __future__ import annotations

from numerics.tensor.subjects.subject import Subject


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
