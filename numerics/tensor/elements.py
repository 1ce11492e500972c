"""Exact element formats of the MX spec: E4M3 (FN), E5M2, E2M1 (FP4) and the E8M0 scale, as bit codes.

Written from the OCP Microscaling Formats (MX) v1.0 specification, section 5 (element formats)
and 5.4 (E8M0): no library cast is used, so ``ml_dtypes`` and torch can be checked against it.
E2M1 codes are 4 bits (sign bit 0x08) held one per byte; it has neither Inf nor NaN, so conversion to
it always saturates and a NaN block is marked by its scale byte alone.

Public: ``ELEMENTS`` (name -> ``ElementFormat``), ``encode(values, fmt, saturate=True)`` (float64
-> uint8 with round-half-to-even), ``encode_f32(values, fmt)`` (float32 -> uint8, saturating: the
same codes as ``encode``, through float32 bit arithmetic, which is what makes the oracle fast),
``decode(bits, fmt)`` (uint8 -> float64), and the E8M0 helpers ``scale_byte(exponent)`` /
``scale_value(byte)``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ElementFormat:
    """One FP8 element format, in the spec's vocabulary."""

    name: str
    ebits: int
    mbits: int
    bias: int
    emax: int  # exponent of the largest normal number ("emax_elem" in the spec)
    max_normal: float
    has_inf: bool  # E5M2 follows IEEE (Inf and several NaNs); E4M3 "FN" has no Inf, one NaN per sign
    nan_code: int  # the code this oracle emits for NaN (sign bit clear); E2M1 has none: 0, the scale says NaN
    has_nan: bool = True  # E2M1: no NaN code, every code is a number

    @property
    def width(self) -> int:
        """Bits of a code: sign, exponent and mantissa (8 for the FP8 formats, 4 for E2M1)."""
        return 1 + self.ebits + self.mbits

    @property
    def sign_bit(self) -> int:
        return 1 << (self.ebits + self.mbits)

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number."""
        return 1 - self.bias

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (self.emin - self.mbits)


# E4M3FN: S.EEEE.MMM, bias 7; S.1111.111 is NaN, so the largest normal is 1.75 * 2^8 = 448.
E4M3 = ElementFormat("e4m3", 4, 3, 7, 8, 448.0, False, 0x7F)
# E5M2: S.EEEEE.MM, bias 15, IEEE-style; largest normal 1.75 * 2^15 = 57344; 0x7E is a quiet NaN.
E5M2 = ElementFormat("e5m2", 5, 2, 15, 15, 57344.0, True, 0x7E)
# E2M1 (MXFP4's element in the spec): S.EE.M, bias 1; 0.5 is its only subnormal, 6 = 1.5 * 2^2 the largest.
E2M1 = ElementFormat("e2m1", 2, 1, 1, 2, 6.0, False, 0x0, has_nan=False)
ELEMENTS = {"e4m3": E4M3, "e5m2": E5M2, "e2m1": E2M1}

E8M0_BIAS = 127
E8M0_NAN = 0xFF
E8M0_MIN_EXP = -127  # byte 0x00 means 2^-127 (E8M0 has no zero)
E8M0_MAX_EXP = 127  # byte 0xFE


def _decode_table(fmt: ElementFormat) -> np.ndarray:
    codes = np.arange(256, dtype=np.int64)
    sign = np.where(codes & fmt.sign_bit, -1.0, 1.0)
    exp_field = (codes >> fmt.mbits) & ((1 << fmt.ebits) - 1)
    mant = codes & ((1 << fmt.mbits) - 1)
    subnormal = exp_field == 0
    magnitude = np.where(
        subnormal,
        mant * 2.0 ** (fmt.emin - fmt.mbits),
        (1.0 + mant / 2.0**fmt.mbits) * np.exp2(exp_field.astype(np.float64) - fmt.bias),
    )
    values = sign * magnitude
    all_ones = exp_field == (1 << fmt.ebits) - 1
    if fmt.has_inf:
        values = np.where(all_ones & (mant == 0), sign * np.inf, values)
        values = np.where(all_ones & (mant != 0), np.nan, values)
    elif fmt.has_nan:
        values = np.where(all_ones & (mant == (1 << fmt.mbits) - 1), np.nan, values)
    return np.where(codes >= 1 << fmt.width, np.nan, values)  # not a code of a narrower format


_TABLES = {name: _decode_table(fmt) for name, fmt in ELEMENTS.items()}


def decode(bits: np.ndarray, fmt: ElementFormat) -> np.ndarray:
    """uint8 codes -> float64 values (exact)."""
    return _TABLES[fmt.name][np.asarray(bits, dtype=np.uint8)]


def encode(values: np.ndarray, fmt: ElementFormat, *, saturate: bool = True) -> np.ndarray:
    """float64 values -> uint8 codes, rounding half to even.

    Finite magnitudes above ``max_normal`` become ``max_normal`` when ``saturate`` (what MX
    conversion does), else Inf for E5M2 and NaN for E4M3FN (which has no Inf); E2M1, with neither,
    only saturates (``saturate=False`` is refused). NaN becomes ``nan_code`` with the input's sign bit.
    Zeros keep their sign. The arithmetic is exact: the
    quantum ``2^(e - mbits)`` is a power of two, so ``v / quantum`` is exact in float64 and
    ``np.rint`` rounds half to even.
    """
    if not saturate and not (fmt.has_inf or fmt.has_nan):
        raise ValueError(f"{fmt.name} has no Inf or NaN: conversion to it saturates (saturate=True)")
    v = np.asarray(values, dtype=np.float64)
    sign_bit = np.signbit(v).astype(np.uint8) << (fmt.width - 1)
    a = np.abs(v)
    finite = np.isfinite(a)
    a_f = np.where(finite, a, 0.0)
    # floor(log2(a)) for a > 0; np.frexp gives a = m * 2^k with m in [0.5, 1).
    _, k = np.frexp(a_f)
    e = np.maximum(k.astype(np.int64) - 1, fmt.emin)  # below emin the grid is the subnormal one
    quantum = np.ldexp(1.0, (e - fmt.mbits).astype(np.int32))
    rounded = np.rint(a_f / quantum) * quantum  # may step up to the next binade, which is exact too
    overflow = rounded > fmt.max_normal
    rounded = np.where(overflow, fmt.max_normal, rounded)

    # Re-derive exponent and mantissa fields from the (exact) rounded magnitude.
    _, k2 = np.frexp(rounded)
    e2 = k2.astype(np.int64) - 1
    is_sub = (rounded < 2.0**fmt.emin)
    exp_field = np.where(is_sub, 0, e2 + fmt.bias)
    mant = np.where(
        is_sub,
        rounded / 2.0 ** (fmt.emin - fmt.mbits),
        (np.ldexp(rounded, (-e2).astype(np.int32)) - 1.0) * 2.0**fmt.mbits,
    )
    codes = (np.where(rounded == 0, 0, (exp_field << fmt.mbits) | mant.astype(np.int64))).astype(np.uint8)

    special_overflow = overflow & ~np.bool_(saturate)
    inf_in = ~finite & ~np.isnan(v)
    if fmt.has_inf:
        inf_code = np.uint8(((1 << fmt.ebits) - 1) << fmt.mbits)
        codes = np.where(special_overflow | (inf_in & ~np.bool_(saturate)), inf_code, codes)
    else:
        codes = np.where(special_overflow | (inf_in & ~np.bool_(saturate)), np.uint8(fmt.nan_code), codes)
    max_code = np.uint8(encode_max_code(fmt))
    codes = np.where(inf_in & np.bool_(saturate), max_code, codes)
    codes = np.where(np.isnan(v), np.uint8(fmt.nan_code), codes)
    return (codes | sign_bit).astype(np.uint8)


@functools.cache
def _magnitude_table(fmt: ElementFormat) -> np.ndarray:
    """Code of every float32 whose low ``23 - mbits`` mantissa bits are zero, indexed by its top
    ``9 + mbits`` bits (sign, exponent, ``mbits`` mantissa bits); built with the exact ``encode``."""
    idx = np.arange(1 << (9 + fmt.mbits), dtype=np.uint32)
    values = (idx << (23 - fmt.mbits)).view(np.float32)
    with np.errstate(invalid="ignore"):
        return encode(np.where(np.isnan(values), np.inf, values).astype(np.float64), fmt, saturate=True)


def encode_f32(values: np.ndarray, fmt: ElementFormat) -> np.ndarray:
    """float32 values -> uint8 codes with saturation; the same codes as ``encode(values, fmt)``.

    Exact by construction: for a value ``a`` with exponent ``e`` (at least ``emin``, at most
    ``emax + 2``), ``C = copysign(2^(e + 23 - mbits), a)`` has ulp ``2^(e - mbits)``, the element
    quantum of ``a``'s binade, so the float32 sum ``a + C`` is ``a`` rounded half-to-even to that
    quantum (one rounding, done by the FPU) and ``(a + C) - C`` is exact. The rounded value has at
    most ``mbits`` mantissa bits, so its top ``9 + mbits`` bits index a table of codes built with
    ``encode`` (saturation included). Exponents clamp to ``emax + 2``: anything that large is far
    above ``max_normal`` and saturates whatever its rounding; +-Inf saturates too. NaN input gives
    an unspecified code (callers mask NaN blocks). Checked against ``encode`` in
    tests/numerics/tensor/test_elements.py.
    """
    a = np.ascontiguousarray(values, dtype=np.float32)
    u = a.view(np.uint32)
    sign = u & np.uint32(0x80000000)
    c = u >> 23
    c &= 0xFF
    np.clip(c, 127 + fmt.emin, 127 + fmt.emax + 2, out=c)
    c += 23 - fmt.mbits
    c <<= 23
    c |= sign
    cf = c.view(np.float32)
    r = a + cf
    r -= cf
    idx = r.view(np.uint32)
    idx |= sign  # a value that rounds to zero keeps its sign (x - x is +0 under round-to-nearest)
    idx >>= 23 - fmt.mbits
    return _magnitude_table(fmt)[idx]


def encode_max_code(fmt: ElementFormat) -> int:
    """Code of +max_normal: exponent field all ones for E4M3FN (mantissa 110), all-ones minus one for E5M2,
    every bit but the sign for E2M1."""
    if not fmt.has_nan:
        return fmt.sign_bit - 1
    if fmt.has_inf:
        return ((((1 << fmt.ebits) - 2) << fmt.mbits) | ((1 << fmt.mbits) - 1))
    return (((1 << fmt.ebits) - 1) << fmt.mbits) | ((1 << fmt.mbits) - 2)


def scale_byte(exponent: np.ndarray) -> np.ndarray:
    """Unbiased exponent in [-127, 127] -> E8M0 byte (2^e is stored as e + 127)."""
    e = np.asarray(exponent, dtype=np.int64)
    if e.size and (e.min() < E8M0_MIN_EXP or e.max() > E8M0_MAX_EXP):
        raise ValueError(f"E8M0 exponent out of range [{E8M0_MIN_EXP}, {E8M0_MAX_EXP}]")
    return (e + E8M0_BIAS).astype(np.uint8)


def scale_value(byte: np.ndarray) -> np.ndarray:
    """E8M0 byte -> float64 2^(byte - 127); 0xFF is NaN; 0x00 is 2^-127 (there is no zero)."""
    b = np.asarray(byte, dtype=np.uint8).astype(np.int64)
    return np.where(b == E8M0_NAN, np.nan, np.ldexp(1.0, (b - E8M0_BIAS).astype(np.int32)))
