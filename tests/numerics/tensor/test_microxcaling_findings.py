"""microxcaling's MX cast: its adapter's own checks, and the minimal inputs of its known findings
(FINDINGS.md X1-X3), pinned as strict xfails. The general properties are in test_subjects.py.

Skipped with the install hint when microxcaling is not importable (it is not on the package index:
see numerics/tensor/subjects/microxcaling.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import Phase, example, given, settings

from numerics.tensor import findings
from numerics.tensor import strategies as S
from numerics.tensor.compare import compare
from numerics.tensor.subjects import microxcaling

SUBJECT = microxcaling.SUBJECT
_missing = microxcaling.unavailable()
pytestmark = pytest.mark.skipif(_missing is not None, reason=f"subject microxcaling unavailable: {_missing}")
ELEMS = SUBJECT.elems  # E4M3, E5M2 and E2M1 (fp4_e2m1): one quantizer, the findings hold for each
ONLY_PINNED = settings(phases=[Phase.explicit], database=None)


def _assert_exact(x, elem, *, round=microxcaling.ROUNDING):
    got = microxcaling.quantize(x, elem, "floor", round=round)
    result = compare(x, SUBJECT, elem, "floor", *got, masked=False)
    assert not result.unexplained.any(), result.describe()


def _block(*pairs):
    x = np.zeros((1, 32), np.float32)
    for i, v in pairs:
        x[0, i] = v
    return x


def _below(power):
    return float(np.nextafter(np.float32(power), np.float32(0)))


def _decode(codes: np.ndarray, elem: str) -> np.ndarray:
    """float32 values of element bytes, decoded by torch (FP8) or ml_dtypes (E2M1, one code a byte)."""
    if elem == "e2m1":
        import ml_dtypes

        return codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    return torch.from_numpy(codes).view(microxcaling.TORCH_ELEM[elem]).float().numpy()


@pytest.mark.parametrize("elem", ELEMS)
@given(x=S.mx_tensors())
def test_microxcaling_adapter_bytes_decode_to_its_own_output(elem, x):
    """The bytes are microxcaling's: element * 2^scale, decoded by torch, equals _quantize_mx's output bit for bit
    (the adapter checks this on every call too; here it is checked from the outside, with NaN blocks all NaN)."""
    scale, elems = microxcaling.quantize(x, elem)
    out = microxcaling.roundtrip(x, elem).numpy().reshape(*scale.shape, 32)
    values = _decode(elems, elem).reshape(out.shape)
    finite = scale != 0xFF
    with np.errstate(over="ignore"):
        scale_values = np.ldexp(1.0, scale.astype(np.int64) - 127)[..., None]
        decoded = (values.astype(np.float64) * scale_values).astype(np.float32)
    assert np.isnan(out[~finite]).all()
    np.testing.assert_array_equal(decoded[finite].view(np.uint32), out[finite].view(np.uint32))


def test_microxcaling_adapter_refuses_modes_it_does_not_implement():
    with pytest.raises(ValueError, match="FLOOR scale rule only"):
        microxcaling.quantize(np.ones((1, 32), np.float32), "e4m3", "rceil")


def test_microxcaling_comparison_flags_a_planted_fault():
    """Control: the comparison this subject is held to fails on one changed element byte."""
    x = _block((0, 1.0), (1, 0.3))
    scale, elems = microxcaling.quantize(x, "e4m3")
    assert not compare(x, SUBJECT, "e4m3", "floor", scale, elems).unexplained.any()
    elems = elems.copy()
    elems[0, 1] ^= 1
    assert compare(x, SUBJECT, "e4m3", "floor", scale, elems).unexplained.sum() == 1


@pytest.mark.xfail(strict=True, reason="X1: microxcaling's float32 log2 rounds amax just below 2^k up (FINDINGS.md)")
@pytest.mark.parametrize("elem", ELEMS)
@ONLY_PINNED
@given(x=S.mx_tensors())
@example(x=_block((0, _below(2.0**15)))).via("e4m3: 1 ulp below 2^15")
@example(x=_block((0, -_below(2.0**-111)))).via("shrunk: e4m3, -3.8518597e-34")
@example(x=_block((0, -_below(2.0**-67)))).via("shrunk: e5m2, -6.776263e-21")
def test_microxcaling_scale_just_below_power_of_two_X1(elem, x):
    _assert_exact(x, elem)


def test_microxcaling_X1_window_is_narrow():
    """X1's mask claims amax within 2^-17 (relative) below a power of two and nothing else: not 2^k itself, not
    values 2^-16 below it; the predicate is checked on the blocks it must and must not claim."""
    claims = findings.BY_ID["X1"].affects
    x = np.array([[_below(2.0**15)], [2.0**15], [2.0**15 * (1 - 2.0**-16)], [0.0]], np.float32).repeat(32, axis=1)
    assert claims(x, "e4m3", "floor", None).tolist() == [True, False, False, False]


@pytest.mark.xfail(strict=True, reason="X2: microxcaling writes +0 for negative zeros (FINDINGS.md)")
@pytest.mark.parametrize("elem", ELEMS)
@ONLY_PINNED
@given(x=S.mx_tensors())
@example(x=_block((0, -0.0))).via("shrunk: an all-zero block with one -0.0")
@example(x=_block((0, 448.0 * 2.0**100), (1, -2.0**-73))).via("shrunk: -2^-73 / 2^100 underflows to -0.0 in float32")
def test_microxcaling_negative_zero_X2(elem, x):
    _assert_exact(x, elem)


def test_microxcaling_keeps_the_sign_of_negative_values_that_round_to_zero():
    """X2 is about quotients that are -0.0 in float32: -2^-30 at scale 2^-8 is -2^-22, which rounds to -0
    (0x80) in the element, as the oracle says."""
    _assert_exact(_block((0, 1.0), (1, -2.0**-30)), "e4m3")


@pytest.mark.xfail(strict=True, reason="X3: microxcaling's default rounding is ties away from zero (FINDINGS.md)")
@pytest.mark.parametrize("elem", ELEMS)
@ONLY_PINNED
@given(x=S.mx_tensors())
@example(x=_block((0, 1.0), (1, 1.0625 * 2.0**-8))).via("e4m3: 1.0625 at scale 2^-8, a tie between 1 and 1.125")
@example(x=_block((0, 1.0), (1, 1.125 * 2.0**-15))).via("e5m2: 1.125 at scale 2^-15, a tie between 1 and 1.25")
@example(x=_block((0, 4.0), (1, 1.25))).via("e2m1: 1.25 at scale 2^0, a tie between 1 and 1.5")
def test_microxcaling_default_rounding_is_ties_to_even_X3(elem, x):
    _assert_exact(x, elem, round=microxcaling.LIBRARY_DEFAULT_ROUNDING)
