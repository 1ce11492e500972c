"""Alignment on common steps and the two smoothers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from convergence.curves.align import align, block_means, ema, windowed_mean
from convergence.curves.load import Curve, CurveError, CurveMeta


def _c(steps, values=None, name="x"):
    steps = np.asarray(steps, dtype=np.int64)
    values = np.asarray(values if values is not None else 1.0 / steps, dtype=np.float64)
    return Curve(steps, values, CurveMeta(name, "synthetic", "loss", name))


def test_align_uses_common_steps_of_commensurate_intervals():
    a = align([_c(np.arange(1, 101))], _c(np.arange(10, 201, 10), name="y"))
    np.testing.assert_array_equal(a.steps, np.arange(10, 101, 10))
    assert a.method == "common_steps" and a.dropped["x"] == 81  # 91 points in 10..100, 10 compared


def test_align_interpolates_incommensurate_intervals_onto_coarsest():
    a = align([_c(np.arange(7, 701, 7))], _c(np.arange(10, 701, 10), name="y"))
    assert a.method == "interpolated"
    np.testing.assert_array_equal(a.steps, np.arange(10, 701, 10))
    np.testing.assert_allclose(a.baselines[0], np.interp(a.steps, np.arange(7, 701, 7), 1.0 / np.arange(7, 701, 7)))


def test_align_no_overlap_is_bad_input():
    with pytest.raises(CurveError, match="no overlapping steps"):
        align([_c(np.arange(1, 10))], _c(np.arange(20, 30), name="y"))


@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=200), st.floats(0.5, 50))
def test_ema_of_constant_is_constant_and_bounded(xs, halflife):
    x = np.array(xs)
    np.testing.assert_allclose(ema(np.full(len(x), 3.0), halflife), 3.0)
    y = ema(x, halflife)
    assert np.all(y <= x.max() + 1e-9) and np.all(y >= x.min() - 1e-9)


@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=200), st.integers(1, 60))
def test_windowed_mean_matches_direct_centred_mean(xs, window):
    x = np.array(xs)
    y = windowed_mean(x, window)
    half = window // 2
    direct = [x[max(0, i - half):i + window - half].mean() for i in range(len(x))]
    np.testing.assert_allclose(y, direct, rtol=1e-9, atol=1e-9)


def test_block_means_are_aligned_to_the_end():
    np.testing.assert_array_equal(block_means(np.arange(10.0), 3), [2.0, 5.0, 8.0])
