"""The null control: the MXFP8 seam with its casts replaced by the identity (``mxfp8-null``: the fast ops' autograd
functions, group padding and GEMM calls, ``OpRecipe.cast == "identity"``) trains bit-identically to BF16 under
``--deterministic``, step for step and in every logged figure but timing; the real cast, through the same seam,
differs from the first step (the control that the comparison can fail). On the CPU with the tiny model; in the
``gpu`` tier with the proxy for 300 steps."""

from __future__ import annotations

from pathlib import Path

import pytest

from convergence.train.ep_identity import compare_runs
from convergence.train.loop import TrainConfig, defaults_for, run
from numerics.layer.recipes import CONTROLS, MX_RECIPES, NULL_CONTROLS, get_recipe


def _train(out: Path, model: str, recipes: tuple[str, ...], steps: int, device: str, **over) -> None:
    cfg = TrainConfig(model=model, recipes=recipes, steps=steps, device=device, deterministic=True,
                      **(defaults_for(model) | {"probe_every": 0, "ckpt_every": 0} | over))
    run(cfg, out, progress=False)


def _first_difference(out: Path, recipe: str) -> dict | None:
    result = compare_runs(out / "bf16" / "metrics.jsonl", out / recipe / "metrics.jsonl")
    assert {"loss", "grad_norm"} <= set(result["compared_fields"])
    return next(iter(result["recipes"].values()))["first_difference"]


def test_null_control_recipe_is_neither_a_candidate_nor_a_positive_control():
    assert NULL_CONTROLS == ("mxfp8-null",)
    assert "mxfp8-null" not in MX_RECIPES + CONTROLS
    null = get_recipe("mxfp8-null")
    assert null.op.cast == "identity" and null.op.kernels == ("fast",)
    assert (null.linear_fqns, null.grouped_experts) == (get_recipe("mxfp8").linear_fqns, True)


def test_null_control_trains_bit_identically_to_bf16_on_the_tiny_model(tmp_path):
    """Three steps with an evaluation after each (batch 2 x seq 32): every loss, gradient norm, learning rate,
    expert load and validation loss equal; mxfp8 (kernel auto: emulated here) differs at step 1."""
    _train(tmp_path, "tiny", ("bf16", "mxfp8-null", "mxfp8"), 3, "cpu", batch=2, seq=32, val_every=1, val_batches=2)
    assert _first_difference(tmp_path, "mxfp8-null") is None
    assert (_first_difference(tmp_path, "mxfp8") or {}).get("step") == 1


@pytest.mark.gpu
def test_null_control_trains_bit_identically_to_bf16_on_the_proxy(tmp_path):
    """300 deterministic proxy steps at the proxy's batch and sequence (4 x 2048), one evaluation at the end, no
    probes: about 2 x 300 proxy steps on an H200."""
    _train(tmp_path, "proxy", ("bf16", "mxfp8-null"), 300, "cuda", val_every=300)
    assert _first_difference(tmp_path, "mxfp8-null") is None


def test_null_control_needs_no_triton(monkeypatch):
    """Its ops run none of the fast cast kernels, so a machine without Triton (``pip install -e .[test]``, no
    ``fast`` extra) still trains it, as ``mxval validate`` does on a CPU; a real cast on kernel fast needs Triton
    there (the control)."""
    import sys

    from numerics.layer import mxfp8
    from numerics.layer.fast import cast

    monkeypatch.setitem(sys.modules, "triton", None)  # an import of triton fails, as where it is not installed
    cast._available.cache_clear()
    try:
        assert mxfp8.kernel_problem("fast", "cpu", get_recipe("mxfp8-null").op) is None
        assert "needs Triton" in mxfp8.kernel_problem("fast", "cpu", get_recipe("mxfp8-e5m2").op)
    finally:
        cast._available.cache_clear()
