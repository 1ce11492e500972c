"""Numerics probes: a BF16 and an MXFP8 copy of each recipe layer, compared on the run's activations."""

from __future__ import annotations

import math

import torch

from convergence.train.model import Transformer
from convergence.train.probes import probe
from numerics.layer.configs import tiny
from numerics.layer.recipes import apply_recipe, get_recipe, quantized_fqns


def test_probe_of_an_mxfp8_model_compares_mxfp8_with_bf16():
    """The model's modules carry the recipe's MXFP8 op; the probe's BF16 copy must not (an infinite
    SQNR would mean it compared MXFP8 with MXFP8), and the probe leaves the model's ops in place."""
    model = Transformer(tiny())
    model.init_weights(torch.Generator().manual_seed(0))
    recipe = get_recipe("mxfp8")
    apply_recipe(model, recipe, "cpu")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tokens = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(1))
    layers = probe(model, tokens, recipe=recipe, device=torch.device("cpu"))["layers"]
    assert set(layers) == set(quantized_fqns(model, recipe))
    for fqn, stats in layers.items():
        assert {"out_sqnr_db", "dx_sqnr_db", "dweight_sqnr_db"} <= set(stats), fqn
        for key, value in stats.items():
            assert math.isfinite(value), f"{fqn} {key}: {value} dB, the two copies agree bit for bit"
    mods = dict(model.named_modules())
    assert all(mods[fqn].mxfp8_op is not None for fqn in layers)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
