"""The oracle's element casts against ml_dtypes, an independent implementation, bit for bit."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from numerics.assertions import assert_bits_equal
from numerics.tensor import cases, elements, mx

ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2, "e2m1": ml_dtypes.float4_e2m1fn}
ALL_CODES = np.arange(256, dtype=np.uint8)


def _codes(fmt) -> np.ndarray:
    """Every code of the format: 256 for FP8, 16 for E2M1 (one per byte, as ml_dtypes stores float4)."""
    return ALL_CODES[: 1 << fmt.width]


@pytest.mark.parametrize("elem", sorted(ML))
def test_elements_decode_every_code_matches_ml_dtypes(elem):
    fmt = elements.ELEMENTS[elem]
    ours = elements.decode(_codes(fmt), fmt)
    theirs = _codes(fmt).view(ML[elem]).astype(np.float64)
    assert_bits_equal(theirs, ours, what=f"{elem} decode", canonical_nan=True)


def test_elements_e2m1_by_hand():
    """E2M1 (MXFP4's element, OCP MX v1.0): 0, 0.5 (the one subnormal), 1, 1.5, 2, 3, 4, 6; no Inf, no NaN, so
    conversion saturates; ties go to the even code (2.5 -> 2, 5 -> 4, 0.25 -> 0, 0.75 -> 1); bit 3 is the sign;
    codes beyond 4 bits are not E2M1 codes."""
    fmt = elements.ELEMENTS["e2m1"]
    assert list(elements.decode(np.arange(8, dtype=np.uint8), fmt)) == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    v = np.array([2.5, 5.0, 0.25, 0.75, 7.0, 1e30, -np.inf, -3.0, -0.0])
    assert list(elements.encode(v, fmt)) == [4, 6, 0, 2, 7, 7, 15, 13, 8]
    assert elements.encode_max_code(fmt) == 7 and np.isnan(elements.decode(np.uint8(16), fmt))
    with pytest.raises(ValueError, match="saturates"):
        elements.encode(v, fmt, saturate=False)


@pytest.mark.parametrize("elem", sorted(ML))
def test_elements_encode_every_finite_code_round_trips(elem):
    fmt = elements.ELEMENTS[elem]
    values = elements.decode(_codes(fmt), fmt)
    finite = np.isfinite(values)
    assert_bits_equal(_codes(fmt)[finite], elements.encode(values[finite], fmt), what=f"{elem} encode(decode)")


@pytest.mark.parametrize("elem", sorted(ML))
@given(data=st.data())
def test_elements_encode_random_values_matches_ml_dtypes(elem, data):
    fmt = elements.ELEMENTS[elem]
    # within +-max_normal ml_dtypes' cast rounds half to even with no saturation question; beyond,
    # ml_dtypes gives Inf/NaN while MX conversion saturates, so the range is the format's.
    bound = fmt.max_normal
    v = np.asarray(data.draw(st.lists(st.floats(-bound, bound, width=32), min_size=1, max_size=64)),
                   dtype=np.float32).astype(np.float64)
    assert_bits_equal(v.astype(ML[elem]).view(np.uint8), elements.encode(v, fmt), what=f"{elem} encode")


@pytest.mark.parametrize("elem", sorted(ML))
def test_elements_encode_rounding_midpoints_match_ml_dtypes(elem):
    """Exactly halfway between every pair of neighbouring codes, and one float32 ulp either side.

    float32 probes, as the MX cast sees: (ml_dtypes casts float64 through float32, so a float64
    probe one float64 ulp off a midpoint is rounded twice there and is no test of the oracle.)"""
    fmt = elements.ELEMENTS[elem]
    positive = elements.decode(ALL_CODES[: fmt.sign_bit], fmt)
    pos = np.sort(positive[np.isfinite(positive)])
    mids = ((pos[:-1] + pos[1:]) / 2).astype(np.float32)  # exact: a few significant bits
    probes = np.concatenate([mids, np.nextafter(mids, np.float32(0)), np.nextafter(mids, np.float32(np.inf))])
    probes = np.concatenate([probes, -probes])
    assert_bits_equal(probes.astype(ML[elem]).view(np.uint8), elements.encode(probes.astype(np.float64), fmt),
                      what=f"{elem} midpoints")


def test_elements_e8m0_bytes_match_ml_dtypes():
    theirs = ALL_CODES.view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
    ours = elements.scale_value(ALL_CODES)
    assert_bits_equal(theirs, ours, what="E8M0 decode", canonical_nan=True)
    exps = np.arange(-127, 128)
    assert_bits_equal(np.exp2(exps.astype(np.float64)).astype(ml_dtypes.float8_e8m0fnu).view(np.uint8),
                      elements.scale_byte(exps), what="E8M0 encode")


@pytest.mark.parametrize("case", [c for c in cases.CASES if c.scale != 0xFF], ids=lambda c: c.name)
def test_elements_case_table_elements_match_ml_dtypes(case):
    """The same named cases, with ml_dtypes doing the element cast of x / 2^s."""
    x = case.block().astype(np.float64)
    s = float(elements.scale_value(np.uint8(case.scale)))
    fmt = elements.ELEMENTS[case.elem]
    scaled = np.clip(x / s, -fmt.max_normal, fmt.max_normal)  # MX conversion saturates
    assert_bits_equal(case.expected_elements(), scaled.astype(ML[case.elem]).view(np.uint8),
                      what=f"{case.name} via ml_dtypes")
    assert mx.quantize(case.block(), case.elem, case.mode)[0][0, 0] == case.scale


def _f32_probe_values(fmt, rng) -> np.ndarray:
    """Every float32 around each element code: the code, its midpoints to both neighbours and one
    float32 ulp either side of them, in every binade a scaled block can produce, plus random bits."""
    codes = elements.decode(_codes(fmt), fmt)
    grid = np.unique(np.abs(codes[np.isfinite(codes)]))
    mids = (grid[:-1] + grid[1:]) / 2
    above = np.array([fmt.max_normal * 1.0625, fmt.max_normal * 2, fmt.max_normal * 4, np.inf])
    base = np.concatenate([grid, mids, above]).astype(np.float32)
    near = [base, np.nextafter(base, np.float32(0)), np.nextafter(base, np.float32(np.inf))]
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    rand = bits[~np.isnan(bits)]
    tiny = np.ldexp(np.float32(rng.standard_normal(20_000)), rng.integers(-150, 0, 20_000)).astype(np.float32)
    v = np.concatenate([*near, rand, tiny, np.float32([0.0, 2.0**-149, 2.0**-126])])
    return np.concatenate([v, -v]).astype(np.float32)


@pytest.mark.parametrize("elem", sorted(ML))
def test_elements_encode_f32_matches_exact_encode(elem):
    """The oracle's fast float32 path gives the float64 encode's codes on every probe value."""
    fmt = elements.ELEMENTS[elem]
    v = _f32_probe_values(fmt, np.random.default_rng(7))
    assert_bits_equal(elements.encode(v.astype(np.float64), fmt), elements.encode_f32(v, fmt),
                      what=f"{elem} encode_f32 vs encode")
