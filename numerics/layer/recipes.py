"""Recipes as data, one registry and one spelling, and the one converter that applies a recipe to modules.

Public: ``Recipe``, ``RECIPES``, ``MX_RECIPES`` (the MXFP8 candidates), ``CONTROLS`` (positive controls),
``NULL_CONTROLS`` (the seam with its casts left out), ``get_recipe(name)``, ``apply_recipe(model, recipe, ...)``,
``set_op(module, recipe, kernel)``, ``quantized_fqns(model, recipe)``. A recipe is which modules are converted
(``linear_fqns``, ``grouped_experts``) and what each converted GEMM computes (``op``, a
``numerics.layer.op_recipe.OpRecipe``).

Positive controls are recipes meant to train worse, which the convergence protocol must call
``not_equivalent``: ``mxfp8-head``, the same MXFP8 ops on more modules (the output head, which every FP8
recipe keeps in high precision; on the proxy at lr 6e-4 it trained *better*, so it is no proof), and
``mxfp8-e5m2`` and ``mxfp8-e2m1``, worse by construction: the same modules and ops with one (E5M2) or two
(E2M1, MXFP4's element) element mantissa bits fewer (E5M2 on the proxy at lr 3e-4: 6 dB per GEMM lost
and no measurable loss), and ``mxfp8-floor``, the OCP v1.0 scale rule that a published 8B pretraining run
diverged with. The layer level leaves controls out.

The null control, ``mxfp8-null``, is neither a candidate nor a positive control: mxfp8's modules through the same
seam (the fast ops' autograd functions, group padding and GEMM calls) with the cast replaced by the identity
(``OpRecipe.cast``). It must train bit-identically to ``bf16`` under ``--deterministic``
(tests/convergence/train/test_null_control.py, on the CPU and, in the ``gpu`` tier, on the proxy), so any change to
the seam that alters arithmetic beyond quantization is seen; the convergence protocol can run it beside its paired
BF16 run (``--null-control``). It is in ``NULL_CONTROLS``, not ``MX_RECIPES`` or ``CONTROLS``.

The MXFP8 module selection is torchtitan's DeepSeek-V3 MXFP8 recipe
(``torchtitan/models/deepseek_v3/config_registry.py::deepseek_v3_debugmodel_mxfp8``, read at commit
b5bcd76c): ``MXFP8LinearConverter(fqns=["attention", "shared_experts", "feed_forward"])`` -- an
include-list matched as substrings of a Linear's fully-qualified name -- plus
``MXFP8GroupedExpertsConverter`` for the routed experts' grouped GEMMs. Everything else stays BF16:
the MoE router gate (``moe.router.gate``), the output head (``output``; torchtitan's ``lm_head``), the
embedding and the norms. ``numerics.layer.deepseek_v3`` names its modules as torchtitan does, so the same
strings select the same layers.

A selected module gets the op of ``numerics.layer.mxfp8`` for ``Recipe.op`` in its ``mxfp8_op`` seam; parameters
stay as they are (plain tensors, FP32 masters in training), each op seeing them cast to the compute dtype.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from torch import nn

from numerics.errors import BadInput
from numerics.layer import mxfp8
from numerics.layer.deepseek_v3 import GroupedLinear, Linear
from numerics.layer.op_recipe import MXFP8, OpRecipe

TORCHTITAN_MXFP8_LINEAR_FQNS = ("attention", "shared_experts", "feed_forward")


@dataclass(frozen=True)
class Recipe:
    name: str
    mxfp8: bool  # False: plain BF16, nothing quantized
    linear_fqns: tuple[str, ...] = ()  # a Linear whose FQN contains one of these -> MXFP8 linear
    grouped_experts: bool = False  # every GroupedLinear (the routed experts' grouped GEMMs) -> MXFP8
    op: OpRecipe = MXFP8  # what each converted GEMM computes: elements, scale rule, weight gradient's precision
    description: str = ""
    control: bool = False  # a positive control of the convergence protocol (known worse), not a candidate

    def as_dict(self) -> dict:
        """The recipe as config.json records it: the op's fields in the op's place."""
        d = {}
        for f in dataclasses.fields(self):
            d |= asdict(self.op) if f.name == "op" else {f.name: getattr(self, f.name)}
        return d


def _bf16() -> Recipe:
    return Recipe(
        name="bf16", mxfp8=False,
        description="the baseline: FP32 master weights, every matmul in BF16 (torch.autocast semantics)",
    )


def _mxfp8() -> Recipe:
    return Recipe(
        name="mxfp8", mxfp8=True, linear_fqns=TORCHTITAN_MXFP8_LINEAR_FQNS, grouped_experts=True,
        description="torchtitan's DeepSeek-V3 MXFP8 recipe: attention, dense FFN and shared-expert "
        "linears and routed-expert grouped GEMMs in MXFP8 (fwd, dgrad, wgrad); router gate, head, "
        "embedding and norms BF16",
    )


def _mxfp8_wgrad_hp() -> Recipe:
    return dataclasses.replace(
        _mxfp8(), name="mxfp8-wgrad-hp",
        op=OpRecipe(wgrad_with_hp=True),  # deviation from mxfp8: weight gradients in BF16 (torchao wgrad_with_hp)
        description="mxfp8 with weight gradients computed in BF16 (torchao MXFP8_RCEIL_WGRAD_WITH_HP)",
    )


def _mxfp8_head() -> Recipe:
    return dataclasses.replace(
        _mxfp8(), name="mxfp8-head",
        # deviation from mxfp8: the output head too, which torchtitan and DeepSeek-V3 keep in high precision
        linear_fqns=(*TORCHTITAN_MXFP8_LINEAR_FQNS, "output"),
        control=True,
        description="positive control: mxfp8 plus the output head (logits and their gradient) in MXFP8, a "
        "layer every FP8 recipe keeps in high precision; the convergence protocol must call it worse",
    )


def _mxfp8_e5m2() -> Recipe:
    return dataclasses.replace(
        _mxfp8(), name="mxfp8-e5m2",
        # deviation from mxfp8: E5M2 elements (2 mantissa bits, not 3) in every operand, forward included
        op=OpRecipe(elements="e5m2"),
        control=True,
        description="positive control, worse by construction: mxfp8's modules and ops with E5M2 elements in "
        "every operand (one mantissa bit fewer than E4M3: twice the rounding step, about 6 dB less SQNR per "
        "cast); FP8 recipes keep E5M2 for gradients at most. Kernel fast only (torchao has no such recipe)",
    )


def _mxfp8_floor() -> Recipe:
    return dataclasses.replace(
        _mxfp8(), name="mxfp8-floor",
        # deviation from mxfp8: FLOOR scales, the OCP MX v1.0 rule, in place of torchao's RCEIL
        op=OpRecipe(scale_calculation_mode="FLOOR"),
        control=True,
        description="positive control, known worse at scale: mxfp8 with the OCP v1.0 scale rule (floor of "
        "log2 amax, so a block's largest values can saturate at 448), which Mishra, Stosic and Layton "
        "(arXiv:2506.08027) found can make LLM pretraining diverge, and replaced by rounding the scale up "
        "(what torchao's RCEIL does). torchao's own ops with ScaleCalculationMode.FLOOR, or the fast kernel",
    )


def _mxfp8_e2m1() -> Recipe:
    return dataclasses.replace(
        _mxfp8(), name="mxfp8-e2m1",
        # deviation from mxfp8: E2M1 elements (MXFP4's: 1 mantissa bit, largest value 6) in every operand
        op=OpRecipe(elements="e2m1"),
        control=True,
        description="positive control, worse by construction: mxfp8's modules and ops with E2M1 (MXFP4) "
        "elements in every operand, rounded to nearest even with no Hadamard transform or stochastic "
        "rounding (two mantissa bits fewer than E4M3, about 12 dB less SQNR per cast, and values under a "
        "quarter of the block's scale flushed to zero); FP4 training recipes need both tricks. Kernel fast "
        "only, cast by the MX spec (numerics.tensor.mx)",
    )


def _mxfp8_null() -> Recipe:
    return dataclasses.replace(
        _mxfp8(), name="mxfp8-null",
        op=OpRecipe(cast="identity"),  # deviation from mxfp8: no operand cast; the seam's plumbing alone
        description="null control: mxfp8's modules through the same seam (the fast ops' autograd functions, "
        "group padding and GEMM calls) with every cast replaced by the identity; it must train bit-identically "
        "to bf16 under --deterministic. Kernel fast only",
    )


RECIPES = {"bf16": _bf16, "mxfp8": _mxfp8, "mxfp8-wgrad-hp": _mxfp8_wgrad_hp, "mxfp8-head": _mxfp8_head,
           "mxfp8-e5m2": _mxfp8_e5m2, "mxfp8-floor": _mxfp8_floor, "mxfp8-e2m1": _mxfp8_e2m1,
           "mxfp8-null": _mxfp8_null}
NULL_CONTROLS = tuple(name for name, make in RECIPES.items() if make().op.cast == "identity")
MX_RECIPES = tuple(name for name, make in RECIPES.items()
                   if make().mxfp8 and not make().control and name not in NULL_CONTROLS)
CONTROLS = tuple(name for name, make in RECIPES.items() if make().control)  # same ops, more modules: not layer cases


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise KeyError(f"unknown recipe {name!r}; choose from {', '.join(RECIPES)}")
    return RECIPES[name]()


def check_recipe_kernels(recipes: Sequence[str], kernel: str, device: str | None = None) -> None:
    """One line when a recipe cannot run on the chosen kernel. ``auto`` picks the fast kernel for a recipe only it
    computes (``OpRecipe.kernels``): whether that runs on ``device`` is checked here too, before any run starts (not
    as a traceback at the recipe's first step, after the other recipes have trained); None: not checked (a folder
    only judged)."""
    for name in recipes:
        recipe = RECIPES[name]()
        if not recipe.mxfp8:
            continue
        if kernel != "auto":
            problem = recipe.op.kernel_problem(kernel)
            problem = problem and f"{name} {problem}"
        elif recipe.op.kernels == ("fast",) and device is not None:
            # the problem's advice after ';' names the other kernels, which this recipe cannot take
            problem = mxfp8.kernel_problem("fast", device, recipe.op)
            problem = problem and f"{name} runs on kernel 'fast' only, and {problem.partition(';')[0]}"
        else:
            problem = None
        if problem:
            raise BadInput(f"--mxfp8-kernel {kernel}: {problem}")


def _selected(recipe: Recipe, module: nn.Module, fqn: str) -> bool:
    if recipe.grouped_experts and isinstance(module, GroupedLinear):
        return True
    return isinstance(module, Linear) and any(s in fqn for s in recipe.linear_fqns)


def quantized_fqns(model: nn.Module, recipe: Recipe) -> list[str]:
    """The modules the recipe runs in MXFP8, by fully-qualified name."""
    if not recipe.mxfp8:
        return []
    return [fqn for fqn, mod in model.named_modules() if _selected(recipe, mod, fqn)]


def _check_block_dims(module: nn.Module, fqn: str) -> None:
    for pname, p in module.named_parameters(recurse=False):
        bad = [d for d in p.shape[-2:] if d % mxfp8.BLOCK]
        if bad:
            raise ValueError(f"{fqn}.{pname} has shape {tuple(p.shape)}: MXFP8 needs every matmul dimension to "
                             f"be a multiple of {mxfp8.BLOCK}")


def set_op(module: nn.Module, recipe: Recipe, kernel: str) -> None:
    """Put the recipe's MXFP8 op (with ``kernel``) into this one module's ``mxfp8_op`` seam."""
    if isinstance(module, GroupedLinear):
        module.mxfp8_op = mxfp8.grouped_mm_op(recipe.op, kernel)
    elif isinstance(module, Linear):
        module.mxfp8_op = mxfp8.linear_op(recipe.op, kernel)
    else:
        raise TypeError(f"{type(module).__name__} has no mxfp8_op seam (numerics.layer.deepseek_v3.Linear or "
                        "GroupedLinear)")


def apply_recipe(model: nn.Module, recipe: Recipe, device: torch.device | str = "cpu", *,
                 kernel: str | None = None) -> dict:
    """Convert ``model`` in place for ``recipe``: each selected module gets the MXFP8 op with ``kernel``
    (default: ``mxfp8.default_kernel(device, recipe.op)``). Returns what was done, for config.json.

    Raises ValueError when a selected weight has a dimension that is not a multiple of 32 or ``kernel``
    cannot run on ``device`` (the message names the kernels that can).
    """
    if not recipe.mxfp8:
        return {"quantized": [], "kernel": None, "torchao_config": None}
    kernel = kernel or mxfp8.default_kernel(device, recipe.op)
    problem = recipe.op.kernel_problem(kernel)
    problem = f"{recipe.name} {problem}" if problem else mxfp8.kernel_problem(kernel, device, recipe.op)
    if problem:
        raise ValueError(problem)
    fqns = quantized_fqns(model, recipe)
    modules = dict(model.named_modules())
    for fqn in fqns:
        _check_block_dims(modules[fqn], fqn)
    for fqn in fqns:
        set_op(modules[fqn], recipe, kernel)
    op = recipe.op
    if op.torchao_recipe is None:  # no torchao op computes it: the fast ops' own settings
        what = ("identity casts (the null control)" if op.cast == "identity" else
                f"{op.elements.upper()} elements, {op.scale_calculation_mode} scales")
        return {"quantized": fqns, "kernel": kernel, "elements": op.elements, "cast": op.cast,
                "torchao_config": None, "ops": f"numerics.layer.fast.ops (linear, grouped_mm) with {what}"}
    cfg = mxfp8.op_config(op, kernel)
    return {
        "quantized": fqns,
        "kernel": kernel,
        "torchao_api": "functional",  # not quantize_: refused on torch 2.11 (numerics.layer.mxfp8)
        "torchao_ops": mxfp8.TORCHAO_OPS,
        "torchao_config": {
            "class": type(cfg).__name__,
            "kernel_preference": cfg.kernel_preference.name,
            "out_dtype": str(cfg.out_dtype),
            "wgrad_with_hp": cfg.wgrad_with_hp,
            "scale_calculation_mode": cfg.scale_calculation_mode.name,
            "pad_token_groups_for_grouped_mm": cfg.pad_token_groups_for_grouped_mm,
        },
    }
