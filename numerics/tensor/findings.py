"""Known disagreements between a subject's MX cast and the MX rules, as narrow block predicates.

Each entry matches one section of FINDINGS.md (same id) and names its subject
(``numerics.tensor.subjects``). Comparisons (``numerics.tensor.compare``) check every block *except*
those a finding claims, so the known defect does not hide new ones, and a strict xfail test pins
each finding's minimal input: when the subject fixes it, that test starts passing and fails the
run, and the entry here must go. The report counts blocks per finding.

A finding claims blocks one of two ways. ``affects`` takes float32 blocks shaped (..., nblocks,
block), the element name, the mode and the oracle's scale bytes (..., nblocks), and returns a
boolean mask (..., nblocks). ``rewrite`` (for element-level findings) maps the blocks, the oracle's scale
bytes and its element bytes (..., nblocks, block) to what the subject is known to write instead; a block is claimed when
it matches only after that rewrite, so every other byte of it is still compared.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from numerics.tensor.elements import ELEMENTS

# F2's window above max_elem * 2^k: measured at most 40 float32 ulps over every normal exponent
# (torchao 0.18.0, CPU, torch 2.13); 64 ulps keeps the mask narrow (relative width 2^-17) with margin.
F2_WINDOW_ULPS = 64


# X1's window below 2^k: measured at most 88 * 2^-24 relative (44 ulps for a normal amax, more ulps for a
# float32-subnormal one) exhaustively over every positive float32 (torch 2.13 CPU log2); 2^-17 = 128 * 2^-24
# keeps the mask narrow with margin.
X1_WINDOW = 2.0**-17


@dataclass(frozen=True)
class Finding:
    id: str
    subject: str
    title: str
    modes: tuple[str, ...]
    elems: tuple[str, ...]
    affects: Callable[[np.ndarray, str, str, np.ndarray], np.ndarray] | None = None
    rewrite: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray] | None = None

    def applies(self, subject: str, elem: str, mode: str) -> bool:
        return subject == self.subject and elem in self.elems and mode in self.modes


def _tiny_scale(blocks, elem, mode, oracle_scale):
    nonzero = (np.nan_to_num(np.abs(blocks), nan=0.0, posinf=0.0) > 0).any(axis=-1)
    return (oracle_scale == 0) & nonzero


def _rceil_boundary(blocks, elem, mode, oracle_scale):
    mag = np.abs(blocks.astype(np.float64))
    finite = np.isfinite(mag).all(axis=-1)
    amax = np.where(finite, np.where(np.isnan(mag), 0, mag).max(axis=-1), 0.0)
    mant_max = ELEMENTS[elem].max_normal / 2.0 ** np.floor(np.log2(ELEMENTS[elem].max_normal))
    safe = np.where(amax > 0, amax, 1.0)
    mant, _ = np.frexp(safe)
    mant = mant * 2.0
    window = F2_WINDOW_ULPS * 2.0**-23
    return finite & (amax >= 2.0**-126) & (mant > mant_max) & (mant <= mant_max + window)


def _inf_scale(blocks, elem, mode, oracle_scale):
    return np.isinf(blocks).any(axis=-1) & ~np.isnan(blocks).any(axis=-1)


def _just_below_power_of_two(blocks, elem, mode, oracle_scale):
    mag = np.abs(blocks.astype(np.float64))
    finite = np.isfinite(mag).all(axis=-1)
    amax = np.where(finite, np.nan_to_num(mag, nan=0.0, posinf=0.0).max(axis=-1), 0.0)
    mant, _ = np.frexp(np.where(amax > 0, amax, 1.0))  # amax = mant * 2^e, mant in [0.5, 1)
    return finite & (amax > 0) & (mant >= 1.0 - X1_WINDOW)  # 1 - mant: the relative gap below 2^e


def _negative_zero_as_positive(blocks, oracle_scale, oracle_elems):
    """+0 where the float32 quotient x / 2^s is a negative zero: an input -0.0, or a negative x so small
    that the quotient underflows (x * 2^-s rounds like x / 2^s: the same real number, rounded once)."""
    s = oracle_scale.astype(np.int64) - 127
    with np.errstate(under="ignore"):
        quotient = blocks * np.ldexp(1.0, -s).astype(np.float32)[..., None]
    negative_zero = (quotient == 0) & np.signbit(blocks)
    return np.where(negative_zero, np.uint8(0x00), oracle_elems)


FINDINGS: tuple[Finding, ...] = (
    Finding(
        "F1",
        "torchao",
        "blocks whose scale is 2^-127 (E8M0 byte 0x00) get elements for 2^-126: FLOOR/CEIL/EVEN halve them, "
        "RCEIL flushes them to zero",
        ("floor", "ceil", "even", "rceil"),
        ("e4m3", "e5m2", "e2m1"),
        affects=_tiny_scale,
    ),
    Finding(
        "F2",
        "torchao",
        "RCEIL picks a scale one power of two too small when amax is a few ulps above max_elem * 2^k, "
        "so the block maximum saturates",
        ("rceil",),
        ("e4m3", "e5m2", "e2m1"),
        affects=_rceil_boundary,
    ),
    Finding(
        "F3",
        "torchao",
        "FLOOR/CEIL/EVEN give a block holding +-Inf the scale 2^(128 - emax), read from Inf's exponent "
        "field: neither E8M0 NaN nor the largest scale",
        ("floor", "ceil", "even"),
        ("e4m3", "e5m2", "e2m1"),
        affects=_inf_scale,
    ),
    Finding(
        "X1",
        "microxcaling",
        "the shared exponent is one too large when amax is within ~44 ulps below a power of two: "
        "floor(log2(amax)) is taken of a float32 log2 that rounds up to the integer",
        ("floor",),
        ("e4m3", "e5m2", "e2m1"),
        affects=_just_below_power_of_two,
    ),
    Finding(
        "X2",
        "microxcaling",
        "a negative element whose float32 quotient x / 2^s is zero (an input -0.0, or |x| below 2^(s - 150)) "
        "gets +0 (0x00) instead of -0 (0x80); other negative values that round to zero keep their sign",
        ("floor",),
        ("e4m3", "e5m2", "e2m1"),
        rewrite=_negative_zero_as_positive,
    ),
)
BY_ID = {f.id: f for f in FINDINGS}


def applicable(subject: str, elem: str, mode: str) -> list[Finding]:
    return [f for f in FINDINGS if f.applies(subject, elem, mode)]


def known_blocks(x: np.ndarray, elem: str, mode: str, oracle_scale: np.ndarray, *, subject: str,
                 block: int = 32) -> dict[str, np.ndarray]:
    """Mask of blocks each applicable block-predicate finding claims, keyed by finding id."""
    blocks = x.reshape(*x.shape[:-1], x.shape[-1] // block, block)
    return {f.id: f.affects(blocks, elem, mode, oracle_scale)
            for f in applicable(subject, elem, mode) if f.affects is not None}
