"""The oracle's own laws: properties that follow from the MX rules, checked on drawn tensors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given

from numerics.tensor import elements, mx
from numerics.tensor import strategies as S

COMBOS = [(e, m) for e in ("e4m3", "e5m2") for m in mx.MODES]
ids = [f"{e}-{m}" for e, m in COMBOS]
# Each law is drawn per (element, mode), 8 combinations (4 for the never-saturate law): a third of the profile's
# examples each (at least 20) still gives a law 80-160 examples in the ci profile and 4,000-8,000 in thorough. At
# the full profile the laws took ~45 s of the CPU suite, about half of it Hypothesis drawing values one by one.
LAW = S.share_of_profile(1 / 3)


def _blocks(a):
    return a.reshape(*a.shape[:-1], a.shape[-1] // 32, 32)


def _finite_blocks(x):
    return np.isfinite(_blocks(x)).all(axis=-1)


@pytest.mark.parametrize(("elem", "mode"), COMBOS, ids=ids)
@LAW
@given(x=S.mx_tensors())
def test_oracle_error_at_most_half_element_ulp_unless_saturated(elem, mode, x):
    fmt = elements.ELEMENTS[elem]
    scale, codes = mx.quantize(x, elem, mode)
    deq = _blocks(mx.dequantize(scale, codes, elem, dtype=np.float64))
    xb = _blocks(x.astype(np.float64))
    X = elements.scale_value(scale)[..., None]
    ok = _finite_blocks(x)[..., None] & np.ones_like(xb, dtype=bool)
    v = np.abs(xb) / X
    saturated = v > fmt.max_normal
    _, k = np.frexp(np.where(v > 0, v, 1.0))
    quantum = np.exp2(np.maximum(k - 1, fmt.emin) - fmt.mbits) * X
    err = np.abs(deq - xb)
    within = err <= quantum / 2
    sat_exact = np.abs(deq) == fmt.max_normal * X
    bad = ok & ~np.where(saturated, sat_exact, within)
    assert not bad.any(), f"{elem}/{mode}: x={xb[bad][:3]}, got {deq[bad][:3]}, scale {X[..., 0].ravel()[:3]}"


@pytest.mark.parametrize(("elem", "mode"), COMBOS, ids=ids)
@LAW
@given(x=S.mx_tensors(families=S.FINITE_FAMILIES))
def test_oracle_scale_brackets_block_amax_per_mode(elem, mode, x):
    """amax / X lies in the interval each mode's rule promises, unless the exponent was clamped."""
    fmt = elements.ELEMENTS[elem]
    scale, _ = mx.quantize(x, elem, mode)
    amax = np.abs(_blocks(x.astype(np.float64))).max(axis=-1)
    s = scale.astype(np.int64) - 127
    r = amax / np.exp2(s.astype(np.float64))
    live = (amax > 0) & (s > -127) & (s < 127)
    lo, hi = {
        "floor": (2.0**fmt.emax, 2.0 ** (fmt.emax + 1)),  # [2^emax, 2^(emax+1))
        "rceil": (fmt.max_normal / 2, fmt.max_normal),  # (max/2, max]
        "ceil": (2.0 ** (fmt.emax - 1), 2.0**fmt.emax),  # (2^(emax-1), 2^emax]
        "even": (2.0**fmt.emax * (1 - 2.0 ** -(fmt.mbits + 2)), 2.0 ** (fmt.emax + 1) * (1 - 2.0 ** -(fmt.mbits + 2))),
    }[mode]
    if mode in ("floor", "even"):
        good = (r >= lo) & (r < hi)
    else:
        good = (r > lo) & (r <= hi)
    assert (good | ~live).all(), f"{mode}: amax/X = {r[live & ~good][:3]} outside {(lo, hi)}"


@pytest.mark.parametrize(("elem", "mode"), COMBOS, ids=ids)
@LAW
@given(x=S.mx_tensors())
def test_oracle_quantize_is_idempotent_on_representable_values(elem, mode, x):
    """A dequantized tensor is representable: quantizing it again gives back the same values.

    Checked for every block whose dequantized values fit float32 (a block near float32's maximum
    can round up to 2^128). FLOOR and EVEN also give back the same bytes. RCEIL and CEIL need not:
    when the block maximum rounds down onto max/2 (RCEIL) or 2^(emax-1) (CEIL), their rule picks
    the next smaller scale, under which the same values have other codes."""
    scale, codes = mx.quantize(x, elem, mode)
    deq = mx.dequantize(scale, codes, elem)
    live = np.isfinite(_blocks(deq)).all(axis=-1) & (scale != 0xFF)
    scale2, codes2 = mx.quantize(deq, elem, mode)
    deq2 = mx.dequantize(scale2, codes2, elem)
    keep = np.repeat(live, 32, axis=-1)
    np.testing.assert_array_equal(deq2[keep], deq[keep])
    if mode in ("floor", "even"):
        np.testing.assert_array_equal(scale2[live], scale[live])
        np.testing.assert_array_equal(codes2[keep], codes[keep])


@pytest.mark.parametrize(("elem", "mode"), COMBOS, ids=ids)
@LAW
@given(x=S.mx_tensors())
def test_oracle_sign_symmetry(elem, mode, x):
    s1, c1 = mx.quantize(x, elem, mode)
    s2, c2 = mx.quantize(-x, elem, mode)
    np.testing.assert_array_equal(s1, s2)
    np.testing.assert_array_equal(c1 ^ np.uint8(0x80), c2)


@pytest.mark.parametrize(("elem", "mode"), COMBOS, ids=ids)
@LAW
@given(x=S.mx_tensors(families=S.FINITE_FAMILIES))
@example(x=np.where(np.arange(32) >= 30, np.float32(3.1901472e38), np.float32(0)).astype(np.float32))
def test_oracle_is_monotone_within_a_block(elem, mode, x):
    scale, codes = mx.quantize(x, elem, mode)
    # float64: the exact value of every code (float32 overflows to Inf for blocks scaled near 2^127,
    # e.g. E5M2 RCEIL of 3.19e38, and Inf - Inf has no order)
    xb, deq = _blocks(x), _blocks(mx.dequantize(scale, codes, elem, dtype=np.float64))
    order = np.argsort(xb, axis=-1, kind="stable")
    d_sorted = np.take_along_axis(deq, order, axis=-1)
    assert (np.diff(d_sorted, axis=-1) >= 0).all()


@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
@pytest.mark.parametrize("mode", ["rceil", "ceil"])
@LAW
@given(x=S.mx_tensors(families=S.FINITE_FAMILIES))
def test_oracle_rceil_and_ceil_never_saturate(elem, mode, x):
    fmt = elements.ELEMENTS[elem]
    scale, _ = mx.quantize(x, elem, mode)
    X = elements.scale_value(scale)[..., None]
    v = np.abs(_blocks(x.astype(np.float64))) / X
    assert (v[scale < 254] <= fmt.max_normal).all()


@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
def test_oracle_rceil_readings_agree_on_a_whole_binade(elem):
    """Exact and fp32 RCEIL readings agree on all 2^23 mantissas at exponents 0, 60 and -100."""
    mant = np.arange(2**23, dtype=np.uint32)
    for k in (0, 60, -100):
        amax = (((k + 127) << 23) | mant).view(np.float32).astype(np.float64)
        np.testing.assert_array_equal(mx.scale_exponents(amax, elem, "rceil", rceil="exact"),
                                      mx.scale_exponents(amax, elem, "rceil", rceil="fp32"))


def test_oracle_rceil_readings_differ_where_amax_over_max_is_fp32_subnormal():
    """amax one float32 ulp above 448 * 2^-127: amax/448 rounds down to 2^-127 in float32."""
    amax = np.nextafter(np.float32(448.0 * 2.0**-127), np.float32(1))
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = amax
    exact, _ = mx.quantize(x, "e4m3", "rceil", rceil="exact")
    fp32, fp32_codes = mx.quantize(x, "e4m3", "rceil", rceil="fp32")
    assert exact[0, 0] == 1 and fp32[0, 0] == 0  # 2^-126 vs 2^-127
    assert fp32_codes[0, 0] == 0x7E  # the fp32 reading saturates the block maximum


@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
def test_oracle_inf_readings(elem):
    fmt = elements.ELEMENTS[elem]
    x = np.ones((1, 32), np.float32)
    x[0, 3], x[0, 4] = np.inf, -np.inf
    s_nan, c_nan = mx.quantize(x, elem, "floor", inf="nan")
    assert s_nan[0, 0] == 0xFF and (np.isnan(elements.decode(c_nan, fmt))).all()
    s_sat, c_sat = mx.quantize(x, elem, "floor", inf="saturate")
    max_code = elements.encode_max_code(fmt)
    assert s_sat[0, 0] == 254 and c_sat[0, 3] == max_code and c_sat[0, 4] == max_code | 0x80
    assert (c_sat[0, :3] == 0).all()  # 1 / 2^127 is far below the smallest subnormal
