"""Training recipes as data: which modules run in MXFP8 and with which torchao configuration.

Public: ``Recipe``, ``RECIPES``, ``get_recipe(name)``, ``apply_recipe(model, recipe, device)``,
``quantized_fqns(model, recipe)``, ``kernel_preference_for(device)``, ``torchao_config(recipe, device)``,
``TORCHAO_OPS``.

The MXFP8 module selection is torchtitan's DeepSeek-V3 MXFP8 recipe
(``torchtitan/models/deepseek_v3/config_registry.py::deepseek_v3_debugmodel_mxfp8``, read at commit
b5bcd76c): ``MXFP8LinearConverter(fqns=["attention", "shared_experts", "feed_forward"])`` — an
include-list matched as substrings of a Linear's fully-qualified name — plus
``MXFP8GroupedExpertsConverter`` for the routed experts' grouped GEMMs. Everything else stays BF16:
the MoE router gate (``moe.router.gate``), the output head (``output``; torchtitan's ``lm_head``), the
embedding and the norms. Our module names follow torchtitan's, so the same strings select the same
layers here.

API: a selected module gets torchao's functional MXFP8 autograd op in its ``mxfp8_op`` seam —
``mxfp8_linear._to_mxfp8_then_scaled_mm`` for linears, ``_to_mxfp8_then_scaled_grouped_mm`` for the
experts — called through ``numerics.layer.harness.torchao_linear`` / ``torchao_grouped_mm`` with the
``MXFP8TrainingOpConfig`` that ``torchao_config`` builds. These are the ops that
``quantize_(MXFP8TrainingOpConfig)``'s weight wrapper dispatches to, configured the same, so the
numbers are bit-identical (tests/convergence/train/test_recipes.py); ``quantize_`` itself is not used because
torchao 0.18 refuses it on torch 2.11, the GPU machines' torch (FINDINGS.md C1). One code path on
every device. The weights stay plain FP32 masters; each op sees them cast to the compute dtype (F-T1).

Kernels: torchao's ``KernelPreference.AUTO`` (real MXFP8 tensor-core kernels) needs compute capability
10.x (B200/GB200); below that — CPU, H100/H200 — it is ``EMULATED`` (quantize to MXFP8, dequantize,
BF16/FP32 matmul): the same numerics, without the speed. The token groups of the grouped GEMM are padded
to multiples of 32 on every device, as torchtitan's MXFP8 dispatcher does: the real kernels require it,
the emulated backward's BF16 grouped GEMM on CUDA asserts without it (16-byte aligned groups, seen on
H200), and unpadded groups would share dW scale blocks across experts (FINDINGS.md L3).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import torch
from torch import nn

from convergence.train.moe import GroupedExperts

TORCHTITAN_MXFP8_LINEAR_FQNS = ("attention", "shared_experts", "feed_forward")
MX_BLOCK = 32
TORCHAO_OPS = {  # what a selected module runs, recorded in config.json
    "linear": "torchao.prototype.moe_training.mxfp8_linear._to_mxfp8_then_scaled_mm",
    "grouped_experts": "torchao.prototype.moe_training._to_mxfp8_then_scaled_grouped_mm",
}


@dataclass(frozen=True)
class Recipe:
    name: str
    mxfp8: bool  # False: plain BF16 autocast, nothing quantized
    linear_fqns: tuple[str, ...] = ()  # nn.Linear whose FQN contains one of these -> MXFP8 linear
    grouped_experts: bool = False  # routed experts' grouped GEMMs -> MXFP8 grouped GEMM
    wgrad_with_hp: bool = False  # weight gradients computed in high precision (BF16) instead of MXFP8
    scale_calculation_mode: str = "RCEIL"  # E8M0 scale rounding (torchao ScaleCalculationMode)
    description: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


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
    import dataclasses

    return dataclasses.replace(
        _mxfp8(), name="mxfp8-wgrad-hp",
        wgrad_with_hp=True,  # deviation from mxfp8: weight gradients in BF16 (torchao wgrad_with_hp)
        description="mxfp8 with weight gradients computed in BF16 (torchao MXFP8_RCEIL_WGRAD_WITH_HP)",
    )


RECIPES = {"bf16": _bf16, "mxfp8": _mxfp8, "mxfp8-wgrad-hp": _mxfp8_wgrad_hp}


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise KeyError(f"unknown recipe {name!r}; choose from {', '.join(RECIPES)}")
    return RECIPES[name]()


def kernel_preference_for(device: torch.device | str) -> str:
    """"AUTO" on compute capability 10.x (real MXFP8 kernels), "EMULATED" anywhere else."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 10:
        return "AUTO"
    return "EMULATED"


def _selected(recipe: Recipe, module: nn.Module, fqn: str) -> bool:
    if recipe.grouped_experts and isinstance(module, GroupedExperts):
        return True
    return isinstance(module, nn.Linear) and any(s in fqn for s in recipe.linear_fqns)


def quantized_fqns(model: nn.Module, recipe: Recipe) -> list[str]:
    """The modules the recipe runs in MXFP8, by fully-qualified name."""
    if not recipe.mxfp8:
        return []
    return [fqn for fqn, mod in model.named_modules() if _selected(recipe, mod, fqn)]


def _layer_recipe(recipe: Recipe) -> str:
    """The torchao training recipe (``numerics.layer.harness.RECIPES`` name) that this recipe's fields select."""
    return "mxfp8_wgrad_hp" if recipe.wgrad_with_hp else "mxfp8"


def torchao_config(recipe: Recipe, device: torch.device | str):
    """The torchao MXFP8TrainingOpConfig whose fields the recipe's MXFP8 ops run with on this device."""
    from torchao.quantization.quantize_.common import KernelPreference

    from numerics.layer.harness import op_config

    pref = kernel_preference_for(device)
    cfg = op_config(_layer_recipe(recipe), KernelPreference[pref], pad_groups=True)  # module docstring says why
    if cfg.scale_calculation_mode.name != recipe.scale_calculation_mode:
        raise ValueError(f"recipe {recipe.name!r}: scale_calculation_mode {recipe.scale_calculation_mode} is not "
                         f"torchao's {cfg.scale_calculation_mode.name}, which its MXFP8 training recipes fix")
    return cfg


def apply_recipe(model: nn.Module, recipe: Recipe, device: torch.device | str) -> dict:
    """Put torchao's MXFP8 op into the selected modules' ``mxfp8_op`` seam, in place (see the module
    docstring); parameters are left as they are.

    Returns what was done, for config.json: the ops, the torchao config fields and the selected FQNs.
    Raises ValueError when a selected weight has a dimension that is not a multiple of 32, TypeError
    when a selected module has no ``mxfp8_op`` seam.
    """
    fqns = quantized_fqns(model, recipe)
    if not recipe.mxfp8:
        return {"quantized": [], "torchao_config": None}
    modules = dict(model.named_modules())
    for fqn in fqns:
        if not hasattr(modules[fqn], "mxfp8_op"):
            raise TypeError(f"{fqn} ({type(modules[fqn]).__name__}) has no mxfp8_op seam for the MXFP8 op")
        for pname, p in modules[fqn].named_parameters(recurse=False):
            bad = [d for d in p.shape[-2:] if d % MX_BLOCK]
            if bad:
                raise ValueError(
                    f"{fqn}.{pname} has shape {tuple(p.shape)}: MXFP8 needs every matmul dimension to be "
                    f"a multiple of {MX_BLOCK}"
                )
    from numerics.layer.harness import torchao_grouped_mm, torchao_linear

    cfg = torchao_config(recipe, device)
    name, kernel = _layer_recipe(recipe), cfg.kernel_preference
    for fqn in fqns:
        mod = modules[fqn]
        mod.mxfp8_op = (
            functools.partial(torchao_grouped_mm, recipe=name, kernel=kernel,
                              pad_groups=cfg.pad_token_groups_for_grouped_mm)
            if isinstance(mod, GroupedExperts) else functools.partial(torchao_linear, recipe=name, kernel=kernel)
        )
    return {
        "quantized": fqns,
        "torchao_api": "functional",  # not quantize_: refused on torch 2.11 (module docstring)
        "torchao_ops": TORCHAO_OPS,
        "torchao_config": {
            "class": type(cfg).__name__,
            "kernel_preference": cfg.kernel_preference.name,
            "out_dtype": str(cfg.out_dtype),
            "wgrad_with_hp": cfg.wgrad_with_hp,
            "scale_calculation_mode": cfg.scale_calculation_mode.name,
            "pad_token_groups_for_grouped_mm": cfg.pad_token_groups_for_grouped_mm,
        },
    }
