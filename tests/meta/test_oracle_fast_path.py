"""The oracle's fast path (float32 bit arithmetic, amax on bit patterns, blocks in chunks) against a slow exact one.

``slow_quantize`` takes the rules literally in float64: amax with ``np.max`` of magnitudes, ``x / 2^s`` exact in
float64, the exact ``elements.encode``. Every speed-up of ``numerics.tensor.mx.quantize`` must give its bytes:
on every element code (and its midpoints and float32 neighbours) at scales across E8M0's range, on Hypothesis
tensors of every family, and across chunk boundaries.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from numerics.assertions import assert_bits_equal
from numerics.tensor import elements, mx
from numerics.tensor import strategies as S

COMBOS = [(e, m) for e in ("e4m3", "e5m2") for m in mx.MODES]
IDS = [f"{e}-{m}" for e, m in COMBOS]


def slow_quantize(x, elem, mode, block=32, *, inf="nan", rceil="exact"):
    fmt = elements.ELEMENTS[elem]
    blocks = x.astype(np.float64).reshape(*x.shape[:-1], x.shape[-1] // block, block)
    mag = np.abs(blocks)
    nan_block = np.isnan(blocks).any(axis=-1) | ((inf == "nan") & np.isinf(blocks).any(axis=-1))
    amax = np.where(nan_block, 0.0, np.max(np.where(np.isnan(mag), 0.0, mag), axis=-1))
    s = mx.scale_exponents(amax, elem, mode, rceil=rceil)
    s = np.where(amax == 0, elements.E8M0_MIN_EXP, np.where(np.isinf(amax), elements.E8M0_MAX_EXP, s))
    s = np.where(nan_block, 0, np.clip(s, elements.E8M0_MIN_EXP, elements.E8M0_MAX_EXP))
    with np.errstate(invalid="ignore"):
        codes = elements.encode(blocks / np.ldexp(1.0, s)[..., None], fmt, saturate=True)
    nan_codes = np.uint8(fmt.nan_code) | (np.signbit(blocks).astype(np.uint8) << 7)
    codes = np.where(nan_block[..., None], nan_codes, codes)
    scale = np.where(nan_block, elements.E8M0_NAN, s + elements.E8M0_BIAS).astype(np.uint8)
    return scale, codes.reshape(x.shape)


@contextlib.contextmanager
def chunk_blocks(n):
    saved = mx.CHUNK_BLOCKS
    mx.CHUNK_BLOCKS = n
    try:
        yield
    finally:
        mx.CHUNK_BLOCKS = saved


def _assert_same(x, elem, mode, **kw):
    fast, slow = mx.quantize(x, elem, mode, **kw), slow_quantize(x, elem, mode, **kw)
    assert_bits_equal(slow[0], fast[0], what=f"{elem}/{mode} scale bytes, fast vs slow")
    assert_bits_equal(slow[1], fast[1], what=f"{elem}/{mode} element bytes, fast vs slow")


def _every_code_blocks(elem, exponents):
    """Blocks whose first value pins amax at max_normal * 2^k, the other 31 each a finite code's value, a
    midpoint to the next code, or a float32 neighbour of either, all scaled by 2^k: every code at each scale."""
    fmt = elements.ELEMENTS[elem]
    grid = np.unique(np.abs(elements.decode(np.arange(256, dtype=np.uint8), fmt)))
    grid = grid[np.isfinite(grid)]
    probes = np.concatenate([grid, (grid[:-1] + grid[1:]) / 2]).astype(np.float32)
    probes = np.concatenate([probes, np.nextafter(probes, np.float32(0)), np.nextafter(probes, np.float32(np.inf))])
    probes = np.concatenate([probes, -probes])
    probes = probes[np.abs(probes) <= fmt.max_normal]
    probes = np.concatenate([probes, np.zeros(-probes.size % 31, np.float32)]).reshape(-1, 31)
    out = []
    for k in exponents:
        anchor = np.full((probes.shape[0], 1), np.ldexp(fmt.max_normal, k), np.float32)
        out.append(np.concatenate([anchor, np.ldexp(probes, k).astype(np.float32)], axis=1))
    return np.concatenate(out).astype(np.float32)


@pytest.mark.parametrize(("elem", "mode"), COMBOS, ids=IDS)
def test_oracle_fast_path_matches_slow_path_on_every_code(elem, mode):
    # exponents: the E8M0 floor (scales clamp), subnormal-result scales, ordinary ones, near the float32 top
    x = _every_code_blocks(elem, [-140, -130, -126, -100, -20, -1, 0, 1, 20, 100, 110])
    with chunk_blocks(7):  # chunk boundaries fall inside the table, not only at its ends
        _assert_same(x, elem, mode)
    _assert_same(x, elem, mode)


@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
@given(x=S.mx_tensors(), mode=st.sampled_from(mx.MODES), chunk=st.integers(min_value=1, max_value=5),
       inf=st.sampled_from(mx.INF_POLICIES))
def test_oracle_fast_path_matches_slow_path_on_strategy_tensors(elem, x, mode, chunk, inf):
    with chunk_blocks(chunk):
        _assert_same(x, elem, mode, inf=inf)


def test_oracle_fast_path_comparison_detects_a_planted_fault(monkeypatch):
    """Control: a fast path that writes one wrong code (0x39 as 0x3A, one ulp) is caught on the code table."""
    real = elements.encode_f32

    def one_code_wrong(values, fmt):
        codes = real(values, fmt)
        codes[codes == 0x39] = 0x3A
        return codes

    monkeypatch.setattr(mx.elements, "encode_f32", one_code_wrong)
    with pytest.raises(AssertionError, match="element bytes"):
        _assert_same(_every_code_blocks("e4m3", [0]), "e4m3", "floor")
