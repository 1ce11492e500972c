"""Hypothesis strategies for the tensors a training run feeds an MX cast.

Every strategy is a keyword-only ``@st.composite``; every bound carries the reason it has that
value. A tensor is drawn block by block (32 values share one scale), each block from one family,
so Hypothesis shrinks a failure to the one block that shows it:

* ``normal``      activations: N(0, 1)-like values times a per-block power of two;
* ``outliers``    heavy tails: normal values with 1-3 outliers 2^4..2^16 larger (what MX scaling is for);
* ``gradients``   magnitudes log-uniform over many decades, down to fp32 subnormals (1e-30 and below);
* ``boundary``    values on and one float32 ulp either side of 448*2^k, 57344*2^k and 2^k;
* ``zeros``       all-zero blocks, with signed zeros;
* ``specials``    a normal block with NaN / +-Inf injected;
* ``bf16``        values exactly representable in bfloat16 (what a BF16 model hands the cast);
* ``fp32_bits``   arbitrary finite float32 bit patterns.

Public: ``FAMILIES``, ``mx_blocks``, ``mx_tensors``, ``block_shapes``, ``share_of_profile``.
"""

from __future__ import annotations

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st

BLOCK = 32
FAMILIES = ("normal", "outliers", "gradients", "boundary", "zeros", "specials", "bf16", "fp32_bits")
FINITE_FAMILIES = tuple(f for f in FAMILIES if f != "specials")

# Block exponents: fp32 spans 2^-149 .. 2^128; [-140, 100] covers blocks whose scale clamps at
# E8M0's 2^-127 floor (below ~2^-118) and blocks far above any activation, while keeping
# values * outlier factors (<= 2^16 * 8) finite in float32.
_BLOCK_EXP = st.integers(min_value=-140, max_value=100)
# Element base values: |N(0,1)| rarely exceeds 4; width=32 keeps them float32-exact.
_BASE = st.floats(min_value=-4.0, max_value=4.0, width=32, allow_subnormal=False)


def _ldexp32(values, k: int) -> np.ndarray:
    return np.ldexp(np.asarray(values, dtype=np.float32), k).astype(np.float32)


def _to_bf16(values: np.ndarray) -> np.ndarray:
    """Round float32 to the nearest bfloat16 (half to even), kept as float32; exact, bit-level."""
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    out = rounded.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(values), values, out).astype(np.float32)


@st.composite
def mx_blocks(draw, *, family: str | None = None, block: int = BLOCK) -> np.ndarray:
    """One block of ``block`` float32 values from ``family`` (drawn when None)."""
    fam = family or draw(st.sampled_from(FAMILIES))
    if fam == "zeros":
        signs = draw(st.lists(st.booleans(), min_size=block, max_size=block))
        return np.where(signs, np.float32(-0.0), np.float32(0.0)).astype(np.float32)
    if fam == "fp32_bits":
        vals = draw(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False),
                             min_size=block, max_size=block))
        return np.asarray(vals, dtype=np.float32)
    if fam == "boundary":
        # which anchor: E4M3 max, E5M2 max, or a power of two; which side: -1 ulp, on, +1 ulp
        anchors = np.array([448.0, 57344.0, 1.0], dtype=np.float32)
        k = draw(st.integers(min_value=-130, max_value=100))
        picks = draw(st.lists(st.tuples(st.integers(0, 2), st.integers(-1, 1), st.booleans()),
                              min_size=1, max_size=block))
        out = np.zeros(block, dtype=np.float32)
        for i, (a, side, neg) in enumerate(picks):
            v = _ldexp32(anchors[a], k)
            if side:
                v = np.nextafter(v, np.float32(np.inf) if side > 0 else np.float32(0), dtype=np.float32)
            out[i] = -v if neg else v
        return out
    base = np.asarray(draw(st.lists(_BASE, min_size=block, max_size=block)), dtype=np.float32)
    if fam in ("normal", "bf16", "specials"):
        out = _ldexp32(base, draw(_BLOCK_EXP))
    elif fam == "outliers":
        out = _ldexp32(base, draw(st.integers(min_value=-60, max_value=60)))  # activations' range
        n = draw(st.integers(min_value=1, max_value=3))
        idx = draw(st.lists(st.integers(0, block - 1), min_size=n, max_size=n, unique=True))
        factor = draw(st.integers(min_value=4, max_value=16))
        out[idx] = _ldexp32(out[idx], factor)
    elif fam == "gradients":
        exps = draw(st.lists(st.integers(min_value=-149, max_value=10), min_size=block, max_size=block))
        out = np.array([_ldexp32(b, e) for b, e in zip(base, exps)], dtype=np.float32)
    else:
        raise ValueError(f"unknown family {fam!r}; choose from {', '.join(FAMILIES)}")
    if fam == "bf16":
        out = _to_bf16(out)
    if fam == "specials":
        specials = draw(st.lists(st.tuples(st.integers(0, block - 1),
                                           st.sampled_from([np.nan, np.inf, -np.inf])),
                                 min_size=1, max_size=3))
        for i, v in specials:
            out[i] = v
    return out.astype(np.float32)


@st.composite
def block_shapes(draw, *, max_leading: int = 2, max_blocks: int = 4, block: int = BLOCK) -> tuple:
    """Shapes with up to ``max_leading`` leading (batch) dims and a last dim of 1..max_blocks blocks."""
    lead = draw(st.lists(st.integers(min_value=1, max_value=3), min_size=0, max_size=max_leading))
    return (*lead, block * draw(st.integers(min_value=1, max_value=max_blocks)))


@st.composite
def mx_tensors(draw, *, families=FAMILIES, shape: tuple | None = None, block: int = BLOCK) -> np.ndarray:
    """A float32 tensor whose blocks are each drawn from one of ``families``."""
    shp = shape or draw(block_shapes(block=block))
    nblocks = int(np.prod(shp)) // block
    blocks = [draw(mx_blocks(family=draw(st.sampled_from(families)), block=block)) for _ in range(nblocks)]
    return np.concatenate(blocks).reshape(shp).astype(np.float32)


def share_of_profile(share: float, at_least: int = 20) -> settings:
    """Settings that draw ``share`` of the loaded profile's examples (at least ``at_least``): for a property
    parametrised over many cases, so that all its cases together cost a few tests' worth. Read when called, so
    call it at import, after the profile is loaded (tests/conftest.py)."""
    return settings(max_examples=max(at_least, round(settings.default.max_examples * share)))
