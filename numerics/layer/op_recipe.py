"""What one converted GEMM of the MXFP8 seam computes, as a typed value: the op recipe.

Public: ``OpRecipe``, ``MXFP8`` (the default op: torchao's ``MXFP8_RCEIL``), ``KERNELS``, ``SCALE_MODES``,
``TORCHAO_ELEMENTS``, ``CASTS``.

A ``numerics.layer.recipes.Recipe`` carries one (``Recipe.op``); the ops of ``numerics.layer.mxfp8`` and
``numerics.layer.fast.ops`` take it as it is. Each field is read where it acts (the element format by the casts,
the scale rule by the casts, the weight gradient's precision by the backward), so a new element format or scale
rule is a field value, and a new kind of operand cast one more field read by the casts.

``cast`` is that field: ``mx`` (the MX cast) or ``identity``, the seam's null control: every operand passed to the
same GEMM calls as it is (in the compute dtype), through the same autograd functions and group padding, so that a
run with it differs from BF16 by nothing but the seam's own plumbing. It must train bit-identically to BF16
(tests/convergence/train/test_null_control.py); a change to the seam that alters arithmetic beyond the cast
breaks that identity.
"""

from __future__ import annotations

from dataclasses import dataclass

from numerics.errors import BadInput
from numerics.tensor.elements import ELEMENTS

KERNELS = ("emulated", "fast", "real")  # the MXFP8 seam's kernels (numerics.layer.mxfp8)
# The E8M0 scale rules both kernels compute alike: tests/numerics/layer/test_fast.py holds the fast ops bit-identical
# to torchao's with each (torchao's ScaleCalculationMode names). RCEIL is what torchao's training recipes fix; FLOOR
# is the OCP MX v1.0 rule (the mxfp8-floor control).
SCALE_MODES = ("RCEIL", "FLOOR")
TORCHAO_ELEMENTS = ("e4m3",)  # the elements torchao 0.18's MXFP8 training ops take: others run on kernel fast only
CASTS = ("mx", "identity")  # identity: the null control (module docstring); the casts are ours, kernel fast only


@dataclass(frozen=True)
class OpRecipe:
    """Every operand of the GEMM (forward, dX, dW) cast to MX ``elements`` in blocks of 32 with E8M0 scales by
    ``scale_calculation_mode``, then dequantized for a BF16 GEMM; with ``wgrad_with_hp`` the weight gradient is
    computed from the unquantized operands instead; with ``cast="identity"`` no operand is cast at all (the null
    control: ``elements`` and the scale rule are then unused). The default is torchao's ``MXFP8_RCEIL`` training
    recipe. The field order is config.json's (``Recipe.as_dict``)."""

    wgrad_with_hp: bool = False
    scale_calculation_mode: str = "RCEIL"
    elements: str = "e4m3"
    cast: str = "mx"

    def __post_init__(self):
        if self.elements not in ELEMENTS:
            raise BadInput(f"op recipe elements {self.elements!r}: choose one of {', '.join(ELEMENTS)}")
        if self.scale_calculation_mode not in SCALE_MODES:
            raise BadInput(f"op recipe scale_calculation_mode {self.scale_calculation_mode!r}: choose one of "
                           f"{', '.join(SCALE_MODES)}, the rules both kernels compute alike")
        if self.cast not in CASTS:
            raise BadInput(f"op recipe cast {self.cast!r}: choose one of {', '.join(CASTS)}")

    @property
    def torchao_recipe(self) -> str | None:
        """torchao's ``MXFP8TrainingRecipe`` of these ops (its scale rule replaced by ours), or None when torchao
        has no training op for them."""
        if self.elements not in TORCHAO_ELEMENTS or self.cast != "mx":
            return None
        return "MXFP8_RCEIL_WGRAD_WITH_HP" if self.wgrad_with_hp else "MXFP8_RCEIL"

    @property
    def kernels(self) -> tuple[str, ...]:
        """The kernels that compute these ops: all of them with torchao's ops, else the fast ops alone."""
        return KERNELS if self.torchao_recipe is not None else ("fast",)

    def kernel_problem(self, kernel: str) -> str | None:
        """None if ``kernel`` computes these ops (or is no kernel at all: ``numerics.layer.mxfp8.kernel_problem``
        says so), else why not, in words that follow a recipe's name."""
        if kernel in self.kernels or kernel not in KERNELS:
            return None
        what = ("casts no operand (the null control), which only the fast ops can leave out" if self.cast == "identity"
                else f"has {self.elements.upper()} elements, which torchao's MXFP8 training ops do not take")
        return f"{what}: it runs on kernel 'fast' only, not {kernel!r}"


MXFP8 = OpRecipe()  # torchao's MXFP8_RCEIL: E4M3 elements, RCEIL scales, every GEMM (forward, dX, dW) in MXFP8
