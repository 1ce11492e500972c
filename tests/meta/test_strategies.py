"""The strategies produce what they promise (so the properties above are tested on real inputs)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import Phase, find, given, settings

from numerics.tensor import strategies as S


@pytest.mark.parametrize("family", S.FAMILIES)
@given(data=S.st.data())
def test_strategies_blocks_are_float32_of_block_size(family, data):
    b = data.draw(S.mx_blocks(family=family))
    assert b.dtype == np.float32 and b.shape == (32,)


@given(shape=S.block_shapes())
def test_strategies_shapes_have_whole_blocks_and_leading_dims(shape):
    assert shape[-1] % 32 == 0 and 1 <= len(shape) <= 3


@given(b=S.mx_blocks(family="zeros"))
def test_strategies_zero_blocks_are_zero(b):
    assert (b == 0).all()


@given(b=S.mx_blocks(family="specials"))
def test_strategies_special_blocks_hold_nan_or_inf(b):
    assert (~np.isfinite(b)).any()


@given(b=S.mx_blocks(family="bf16"))
def test_strategies_bf16_blocks_are_bf16_representable(b):
    assert (b.view(np.uint32) & 0xFFFF == 0).all()


# find() raises NoSuchExample when no example in its budget satisfies the condition: that is the failure. Shrinking
# the example it finds to a minimal one proves nothing more about the strategy and took most of the time.
FIND = settings(max_examples=500, database=None, phases=[Phase.generate])


def _search(family, condition):
    return find(S.mx_blocks(family=family), condition, settings=FIND)


def test_strategies_gradients_reach_below_1e_30_and_fp32_subnormals():
    _search("gradients", lambda b: 0 < np.abs(b[b != 0]).min(initial=np.inf) < 1e-30)
    _search("gradients", lambda b: ((np.abs(b) < 2.0**-126) & (b != 0)).any())


def test_strategies_boundary_hits_anchor_and_its_neighbours():
    anchors = {448.0, 57344.0}
    _search("boundary", lambda b: bool(anchors & set(np.abs(b).tolist())))
    up = np.nextafter(np.float32(448.0), np.float32(np.inf))
    _search("boundary", lambda b: bool((np.abs(b) == up).any()))


def test_strategies_outliers_stand_out_from_their_block():
    _search("outliers", lambda b: np.abs(b).max() >= 16 * max(np.median(np.abs(b)), 1e-300))


def test_strategies_tensors_mix_families_and_can_hold_tiny_blocks():
    find(S.mx_tensors(), lambda x: x.ndim >= 2 and (np.abs(x).max(axis=-1) < 2.0**-119).any(), settings=FIND)
