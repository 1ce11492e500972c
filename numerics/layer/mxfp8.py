"""The one MXFP8 seam: the op a converted ``Linear`` / ``GroupedLinear`` runs, with a kernel choice.

Public: ``KERNELS``, ``default_kernel(device, recipe)``, ``kernel_problem(kernel, device)``,
``recipe_kernel_problem(recipe, kernel)``, ``FAST_ONLY``, ``SCALE_MODES``, ``linear_op`` /
``grouped_mm_op`` (the callables ``numerics.layer.recipes.apply_recipe`` puts into a module's ``mxfp8_op``),
``torchao_linear`` / ``torchao_grouped_mm`` (the subject, called as the model calls it), ``op_config``,
``check_mx_gemm``, ``quantize_api_refusal``, ``BLOCK``.

The subject is torchao 0.18's MXFP8 training path through its functional autograd ops:
``mxfp8_linear._to_mxfp8_then_scaled_mm`` for dense projections and ``_to_mxfp8_then_scaled_grouped_mm``
for the experts' grouped GEMMs. They are exactly the ops ``quantize_(MXFP8TrainingOpConfig)``'s weight
wrapper dispatches to, with the same configuration (``op_config``), so the numbers are the same bit for
bit (tests/numerics/layer/test_quantize_api.py); ``quantize_`` itself is not used because torchao 0.18
refuses it on torch 2.11, the GPU machines' torch (FINDINGS.md C1), while the functional ops run there.

Kernels:
  ``emulated``  torchao's ``KernelPreference.EMULATED``: quantize, dequantize, BF16 GEMM (CPU, SM90, any GPU)
  ``fast``      the same arithmetic with fused cast kernels (``numerics.layer.fast``), bit-identical to
                ``emulated`` (issue #14); chosen only where it can run
  ``real``      torchao's ``KernelPreference.AUTO``: MX tensor cores, compute capability 10.x (B200/GB200)

Token groups of the grouped GEMM are padded to multiples of 32 on every device, as torchtitan's MXFP8
dispatcher does: the real kernels require it, the emulated backward's BF16 grouped GEMM on CUDA asserts
without it (16-byte aligned groups), and unpadded groups would share dW scale blocks across experts
(FINDINGS.md L3).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch
from torch import nn

BLOCK = 32  # the MX block: torchao 0.18 supports only 32 for MXFP8 training
KERNELS = ("emulated", "fast", "real")
TORCHAO_RECIPE = {"mxfp8": "MXFP8_RCEIL", "mxfp8-wgrad-hp": "MXFP8_RCEIL_WGRAD_WITH_HP", "mxfp8-floor": "MXFP8_RCEIL"}
# op recipes whose E8M0 scales are not RCEIL: torchao's ops take the mode (its recipes fix RCEIL), as do the fast ops
SCALE_MODES = {"mxfp8-floor": "FLOOR"}
FAST_ONLY = {"mxfp8-e5m2": "e5m2", "mxfp8-e2m1": "e2m1"}  # op recipes torchao has no training ops for: their
# element format, kernel fast (E5M2 cast as torchao's to_mx casts it; E2M1 by the spec, numerics.tensor.mx)
TORCHAO_OPS = {  # what a converted module runs, recorded in config.json
    "linear": "torchao.prototype.moe_training.mxfp8_linear._to_mxfp8_then_scaled_mm",
    "grouped": "torchao.prototype.moe_training._to_mxfp8_then_scaled_grouped_mm",
}


def _is_sm100(device: torch.device | str) -> bool:
    dev = torch.device(device)
    return dev.type == "cuda" and torch.cuda.is_available() and torch.cuda.get_device_capability(dev)[0] == 10


def default_kernel(device: torch.device | str, recipe: str = "mxfp8") -> str:
    """``real`` on compute capability 10.x (MX tensor cores), ``emulated`` anywhere else; ``fast`` for an op
    recipe only the fast kernel computes (``FAST_ONLY``)."""
    if recipe in FAST_ONLY:
        return "fast"
    return "real" if _is_sm100(device) else "emulated"


def kernel_problem(kernel: str, device: torch.device | str) -> str | None:
    """None if ``kernel`` runs on ``device``, else one line saying why and which choices do run there."""
    if kernel not in KERNELS:
        return f"unknown MXFP8 kernel {kernel!r}; choose from {', '.join(KERNELS)}"
    works = [k for k in KERNELS if k == "emulated" or (k == "real" and _is_sm100(device))]
    if kernel == "real" and not _is_sm100(device):
        return f"MXFP8 kernel 'real' needs an SM100 GPU (B200/GB200); on {device} use {' or '.join(works)}"
    if kernel == "fast":
        try:
            from numerics.layer import fast
        except ImportError:
            return f"MXFP8 kernel 'fast' is not available in this checkout; on {device} use {' or '.join(works)}"
        return fast.available(torch.device(device))
    return None


def _kernel_preference(kernel: str):
    from torchao.quantization.quantize_.common import KernelPreference

    return {"emulated": KernelPreference.EMULATED, "real": KernelPreference.AUTO}[kernel]


def op_config(recipe: str, kernel: str = "emulated", *, pad_groups: bool = True):
    """torchao's ``MXFP8TrainingOpConfig`` for a recipe name (``TORCHAO_RECIPE``) and a torchao kernel."""
    from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig, MXFP8TrainingRecipe

    if recipe not in TORCHAO_RECIPE:
        raise ValueError(f"no torchao MXFP8 training recipe for {recipe!r}; choose from {', '.join(TORCHAO_RECIPE)}")
    base = MXFP8TrainingOpConfig.from_recipe(MXFP8TrainingRecipe[TORCHAO_RECIPE[recipe]])
    kp = _kernel_preference("emulated" if kernel == "fast" else kernel)
    cfg = dataclasses.replace(base, kernel_preference=kp, pad_token_groups_for_grouped_mm=pad_groups)
    if recipe in SCALE_MODES:
        from torchao.prototype.mx_formats.config import ScaleCalculationMode

        cfg = dataclasses.replace(cfg, scale_calculation_mode=ScaleCalculationMode[SCALE_MODES[recipe]])
    return cfg


def check_mx_gemm(m: int, k: int, n: int, *, what: str, dtype: torch.dtype = torch.bfloat16,
                  tokens_blocked: bool = True) -> None:
    """ValueError naming the constraint when an MXFP8 GEMM cannot take this shape or dtype.

    torchao quantizes along K for the forward, along N for the input gradient, and along the
    tokens M for the weight gradient (unless that is in high precision or groups are padded).
    """
    if dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"{what}: torchao MXFP8 training takes bfloat16 or float32 inputs, got {dtype}")
    for name, size in (("K (in_features)", k), ("N (out_features)", n)) + (
        (("M (tokens)", m),) if tokens_blocked else ()
    ):
        if size % BLOCK:
            raise ValueError(f"{what}: {name} = {size} is not a multiple of the MX block size {BLOCK}, "
                             "which torchao's MXFP8 GEMMs quantize along")


def torchao_linear(x: torch.Tensor, weight: torch.Tensor, recipe: str, kernel: str = "emulated") -> torch.Tensor:
    """``x @ weight.T`` through torchao's MXFP8 linear autograd function (what MXFP8Linear runs)."""
    from torchao.prototype.moe_training.mxfp8_linear import _to_mxfp8_then_scaled_mm

    c = op_config(recipe, kernel)
    check_mx_gemm(x.reshape(-1, x.shape[-1]).shape[0], weight.shape[1], weight.shape[0], what="linear",
                  dtype=x.dtype, tokens_blocked=not c.wgrad_with_hp)
    return _to_mxfp8_then_scaled_mm(x, weight, kernel_preference=c.kernel_preference,
                                    scale_calculation_mode=c.scale_calculation_mode,
                                    wgrad_with_hp=c.wgrad_with_hp)


def torchao_grouped_mm(x: torch.Tensor, w_t: torch.Tensor, offs: torch.Tensor, recipe: str,
                       kernel: str = "emulated", *, pad_groups: bool = True) -> torch.Tensor:
    """torchao's ``_to_mxfp8_then_scaled_grouped_mm``: (tokens, K) @ (E, K, N) -> (tokens, N) bf16."""
    from torchao.prototype.moe_training import _to_mxfp8_then_scaled_grouped_mm

    c = op_config(recipe, kernel, pad_groups=pad_groups)
    check_mx_gemm(x.shape[0], w_t.shape[-2], w_t.shape[-1], what="grouped_mm", dtype=x.dtype,
                  tokens_blocked=not (c.wgrad_with_hp or pad_groups))
    return _to_mxfp8_then_scaled_grouped_mm(
        x, w_t, offs, out_dtype=torch.bfloat16, kernel_preference=c.kernel_preference,
        wgrad_with_hp=c.wgrad_with_hp, scale_calculation_mode=c.scale_calculation_mode,
        pad_token_groups_for_grouped_mm=pad_groups,
    )


def _fast_mode(recipe: str) -> str:
    return SCALE_MODES.get(recipe, "RCEIL").lower()


def _fast_linear(x, weight, *, recipe: str):
    from numerics.layer.fast import ops as fast

    check_mx_gemm(x.reshape(-1, x.shape[-1]).shape[0], weight.shape[1], weight.shape[0], what="linear",
                  dtype=x.dtype, tokens_blocked=recipe != "mxfp8-wgrad-hp")
    return fast.linear(x, weight, wgrad_with_hp=recipe == "mxfp8-wgrad-hp", scale_mode=_fast_mode(recipe),
                       elem=FAST_ONLY.get(recipe, "e4m3"))


def _fast_grouped_mm(x, w_t, offs, *, recipe: str):
    from numerics.layer.fast import ops as fast

    check_mx_gemm(x.shape[0], w_t.shape[-2], w_t.shape[-1], what="grouped_mm", dtype=x.dtype, tokens_blocked=False)
    return fast.grouped_mm(x, w_t, offs, wgrad_with_hp=recipe == "mxfp8-wgrad-hp", scale_mode=_fast_mode(recipe),
                           pad_groups=True, elem=FAST_ONLY.get(recipe, "e4m3"))


def recipe_kernel_problem(recipe: str, kernel: str) -> str | None:
    """None if the op recipe runs on ``kernel``, else one line: the ``FAST_ONLY`` recipes have no torchao ops."""
    if recipe in FAST_ONLY and kernel != "fast":
        return (f"{recipe} has {FAST_ONLY[recipe].upper()} elements, which torchao's MXFP8 training ops do not "
                f"take: it runs on kernel 'fast' only, not {kernel!r}")
    return None


def _require(recipe: str, kernel: str) -> None:
    problem = recipe_kernel_problem(recipe, kernel)
    if problem:
        raise ValueError(problem)


def linear_op(recipe: str, kernel: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The callable a converted ``Linear`` runs: ``op(x, w) -> x @ w.T``."""
    _require(recipe, kernel)
    if kernel == "fast":
        return functools.partial(_fast_linear, recipe=recipe)
    return functools.partial(torchao_linear, recipe=recipe, kernel=kernel)


def grouped_mm_op(recipe: str, kernel: str) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """The callable a converted ``GroupedLinear`` runs: ``op(x, w_t, offs)``, groups padded to 32."""
    _require(recipe, kernel)
    if kernel == "fast":
        return functools.partial(_fast_grouped_mm, recipe=recipe)
    return functools.partial(torchao_grouped_mm, recipe=recipe, kernel=kernel, pad_groups=True)


def quantize_api_refusal() -> str | None:
    """Why this torch + torchao refuse ``quantize_(MXFP8TrainingOpConfig)``, or None if they take it.

    torchao 0.18.0 asserts that torch has two DTensor APIs that torch 2.11 lacks (FINDINGS.md C1);
    the functional ops this module uses do not depend on them. Tries the conversion on a tiny
    module, so it reports what torchao does rather than what we expect it to do.
    """
    from importlib.metadata import version

    from torchao.quantization import quantize_

    try:
        quantize_(nn.Sequential(nn.Linear(BLOCK, BLOCK, bias=False)), op_config("mxfp8"),
                  filter_fn=lambda mod, fqn: isinstance(mod, nn.Linear))
    except AssertionError as exc:
        return f"torchao {version('torchao')} refuses quantize_(MXFP8TrainingOpConfig) on torch " \
               f"{torch.__version__}: {exc}"
    return None
