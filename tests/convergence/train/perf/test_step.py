"""The step the bench times and the profile profiles: each build is a fresh model holding seed 0's initial weights."""

from __future__ import annotations

import torch

from convergence.train.model import build_initialised
from convergence.train.perf.step import build_step
from numerics.layer.configs import get_config


def _state(model) -> dict[str, torch.Tensor]:
    return dict(model.named_parameters()) | dict(model.named_buffers())


def test_step_builds_are_fresh_models_with_the_seed_0_weights():
    cfg = get_config("tiny")
    reference = _state(build_initialised(cfg, 0))
    first, second = (build_step(cfg, "bf16", None, batch=1, seq=32, device=torch.device("cpu"), compile_=False)
                     for _ in range(2))
    for step in (first, second):
        got = _state(step.model)
        assert got.keys() == reference.keys() and all(torch.equal(got[k], reference[k]) for k in got)
    first()  # one optimizer step changes the first model only: the second and the cached values are untouched
    changed = [k for k, t in _state(first.model).items() if not torch.equal(t, reference[k])]
    assert changed and all(torch.equal(t, reference[k]) for k, t in _state(second.model).items())
    third = build_step(cfg, "bf16", None, batch=1, seq=32, device=torch.device("cpu"), compile_=False)
    assert all(torch.equal(t, reference[k]) for k, t in _state(third.model).items())
