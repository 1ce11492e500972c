"""The model's MLA attention (RoPE, YaRN temperature) under the MXFP8 recipes: floors and conversion."""

from __future__ import annotations

import functools

import pytest
from torch import nn

from numerics.layer import harness
from numerics.layer.configs import suite, tiny
from numerics.layer.deepseek_v3 import Attention
from numerics.layer.recipes import apply_recipe, get_recipe
from numerics.layer.results import floor_violations

TOKENS = suite("tiny").tokens


@functools.cache
def _tiny_mla(seed: int):
    return harness.run_mla(tiny(), TOKENS, seed=seed)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mla_attention_meets_floors(seed):
    res = _tiny_mla(seed)
    assert floor_violations([res]) == []
    assert {"out", "dx", "dw:wq", "dw:wkv_a", "dw:wkv_b", "dw:wo", "dw:kv_norm"} <= set(res.tensors())


def test_mla_converts_all_four_projections():
    m = nn.ModuleDict({"attention": Attention(tiny())})
    done = apply_recipe(m, get_recipe("mxfp8"), "cpu")
    assert set(done["quantized"]) == {f"attention.{n}" for n in ("wq", "wkv_a", "wkv_b", "wo")}


def test_mla_bf16_is_much_closer_to_fp32_than_mxfp8():
    res = _tiny_mla(0)
    for t in ("out", "dx", "dw:wq"):
        assert res.stat("bf16", t).sqnr_vs_fp32 > res.stat("mxfp8", t).sqnr_vs_fp32 + 10
