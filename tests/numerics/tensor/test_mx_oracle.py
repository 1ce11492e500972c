"""The oracle against hand-derived bytes, and its input validation."""

from __future__ import annotations

import numpy as np
import pytest

from numerics.assertions import assert_bits_equal
from numerics.tensor import cases, mx


@pytest.mark.parametrize("case", cases.CASES, ids=lambda c: c.name)
def test_oracle_quantize_matches_hand_derived_bytes(case):
    scale, elems = mx.quantize(case.block(), case.elem, case.mode)
    assert scale.shape == (1, 1)
    assert scale[0, 0] == case.scale, f"{case.name}: scale 0x{scale[0, 0]:02x}, derived 0x{case.scale:02x}"
    assert_bits_equal(case.expected_elements(), elems, what=f"{case.name} elements")


@pytest.mark.parametrize("case", [c for c in cases.CASES if c.scale != 0xFF], ids=lambda c: c.name)
def test_oracle_dequantize_of_case_is_scale_times_element(case):
    scale, elems = mx.quantize(case.block(), case.elem, case.mode)
    # float64: under EVEN a block at float32's top rounds to 256 * 2^120 = 2^128, past float32's range
    # (case e4m3_even_amax_rounds_to_2^128), though every code and scale is finite
    got = mx.dequantize(scale, elems, case.elem, dtype=np.float64)
    # every listed value is recovered to within the element's half-ulp at that scale, or saturated
    assert np.all(np.isfinite(got))
    assert np.all(np.sign(got) * np.sign(case.block()) >= 0)


def test_oracle_dequantize_nan_scale_makes_block_nan():
    scale = np.array([[0xFF, 127]], dtype=np.uint8)
    elems = np.full((1, 64), 0x38, dtype=np.uint8)
    out = mx.dequantize(scale, elems, "e4m3")
    assert np.isnan(out[0, :32]).all() and (out[0, 32:] == 1.0).all()


def test_oracle_dequantize_scale_byte_zero_is_two_to_minus_127():
    out = mx.dequantize(np.zeros((1, 1), np.uint8), np.full((1, 32), 0x38, np.uint8), "e4m3")
    assert (out == np.float32(2.0**-127)).all()


def test_oracle_all_zero_block_gets_smallest_scale_in_every_mode():
    for mode in mx.MODES:
        for elem in ("e4m3", "e5m2"):
            scale, elems = mx.quantize(np.zeros((2, 32), np.float32), elem, mode)
            assert (scale == 0).all() and (elems == 0).all()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"x": np.zeros((1, 32), np.float64)}, "float32"),
        ({"x": [0.0] * 32}, "float32"),
        ({"x": np.zeros((1, 33), np.float32)}, "multiple of block=32"),
        ({"x": np.zeros((), np.float32)}, "multiple of block=32"),
        ({"elem": "e3m4"}, "elem='e3m4'"),
        ({"mode": "nearest"}, "mode='nearest'"),
        ({"block": 0}, "block must be a positive integer"),
        ({"inf": "clip"}, "inf='clip'"),
        ({"rceil": "fp16"}, "rceil='fp16'"),
    ],
)
def test_oracle_quantize_rejects_bad_input_naming_the_argument(kwargs, message):
    args = {"x": np.zeros((1, 32), np.float32), "elem": "e4m3", "mode": "floor"}
    extra = {k: kwargs.pop(k) for k in ("block", "inf", "rceil") if k in kwargs}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        mx.quantize(args["x"], args["elem"], args["mode"], **extra)


def test_oracle_dequantize_rejects_mismatched_scale_shape():
    with pytest.raises(ValueError, match="scale_bits must have shape"):
        mx.dequantize(np.zeros((1, 2), np.uint8), np.zeros((1, 32), np.uint8), "e4m3")
