"""SM100 tier: the seam's ``real`` kernels (torchao AUTO) against ``emulated`` on the same inputs.

torchao's own bars: > 80 dB for the MX GEMMs, bit-exact for the cast kernels. The comparison logic
(``harness.kernel_agreement``) runs on CPU with ``emulated`` on both sides, where it must be exact.
"""

from __future__ import annotations

import pytest

from numerics.layer import harness
from numerics.layer.recipes import MX_RECIPES
from numerics.tolerances import floor

CASES = [
    pytest.param({"m": 256, "k": 128, "n": 96}, id="linear"),
    pytest.param({"m": 256, "k": 128, "n": 96, "group_sizes": (64, 0, 160, 32)}, id="grouped"),
]


@pytest.mark.parametrize("recipe", MX_RECIPES)
@pytest.mark.parametrize("case", CASES)
def test_kernel_agreement_emulated_against_itself_is_exact(case, recipe):
    got = harness.kernel_agreement(**case, kernel_a="emulated", kernel_b="emulated", recipe=recipe)
    assert got == {"out": float("inf"), "dx": float("inf"), "dw": float("inf"), "cast_bits_equal": True}


@pytest.mark.sm100
@pytest.mark.parametrize("recipe", MX_RECIPES)
@pytest.mark.parametrize("case", CASES + [pytest.param({"m": 4096, "k": 2048, "n": 1408, "group_sizes": (512,) * 8},
                                                       id="grouped_16b")])
def test_kernel_agreement_real_against_emulated(case, recipe):
    got = harness.kernel_agreement(**case, kernel_a="real", kernel_b="emulated", recipe=recipe, device="cuda")
    tol = floor("layer", "mxfp8", "emulation_identity", "sqnr_db")
    for t in ("out", "dx", "dw"):
        assert got[t] >= tol.floor, f"{t}: " + tol.describe(got[t])
    assert got["cast_bits_equal"], "AUTO and EMULATED MXFP8 casts differ bitwise"
