"""The one MXFP8 seam: the op a converted ``Linear`` / ``GroupedLinear`` runs, with a kernel choice.

Public: ``KERNELS``, ``default_kernel(device, op)``, ``kernel_problem(kernel, device, op)``, ``linear_op(op, kernel)`` /
``grouped_mm_op(op, kernel)`` (the callables ``numerics.layer.recipes.apply_recipe`` puts into a module's
``mxfp8_op``; the fast kernel's, ``FastLinear`` / ``FastGroupedMM``, can also cast an input once for two modules),
``torchao_linear`` / ``torchao_grouped_mm`` (the subject, called as the model calls it), ``op_config(op, kernel)``,
``check_mx_gemm``, ``quantize_api_refusal``, ``BLOCK``. What an op computes is an ``OpRecipe``
(``numerics.layer.op_recipe``: elements, scale rule, weight gradient's precision), taken as it is.

The subject is torchao 0.18's MXFP8 training path through its functional autograd ops:
``mxfp8_linear._to_mxfp8_then_scaled_mm`` for dense projections and ``_to_mxfp8_then_scaled_grouped_mm``
for the experts' grouped GEMMs. They are exactly the ops ``quantize_(MXFP8TrainingOpConfig)``'s weight
wrapper dispatches to, with the same configuration (``op_config``), so the numbers are the same bit for
bit (tests/numerics/layer/test_quantize_api.py); ``quantize_`` itself is not used because torchao 0.18
refuses it on torch 2.11, the GPU machines' torch (FINDINGS.md C1), while the functional ops run there.

Kernels:
  ``emulated``  torchao's ``KernelPreference.EMULATED``: quantize, dequantize, BF16 GEMM (CPU, SM90, any GPU)
  ``fast``      the same arithmetic with fused cast kernels (``numerics.layer.fast``), bit-identical to
                ``emulated``; chosen only where it can run, and the only kernel of the ops torchao has not
                (``OpRecipe.kernels``: E5M2 and E2M1 elements)
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

from numerics.layer.deepseek_v3 import SharedInputOp
from numerics.layer.op_recipe import KERNELS, MXFP8, OpRecipe

BLOCK = 32  # the MX block: torchao 0.18 supports only 32 for MXFP8 training
TORCHAO_OPS = {  # what a converted module runs, recorded in config.json
    "linear": "torchao.prototype.moe_training.mxfp8_linear._to_mxfp8_then_scaled_mm",
    "grouped": "torchao.prototype.moe_training._to_mxfp8_then_scaled_grouped_mm",
}


def _is_sm100(device: torch.device | str) -> bool:
    dev = torch.device(device)
    return dev.type == "cuda" and torch.cuda.is_available() and torch.cuda.get_device_capability(dev)[0] == 10


def default_kernel(device: torch.device | str, op: OpRecipe = MXFP8) -> str:
    """``real`` on compute capability 10.x (MX tensor cores), ``emulated`` anywhere else; ``fast`` for ops only the
    fast kernel computes (``OpRecipe.kernels``)."""
    if op.kernels == ("fast",):
        return "fast"
    return "real" if _is_sm100(device) else "emulated"


def kernel_problem(kernel: str, device: torch.device | str, op: OpRecipe | None = None) -> str | None:
    """None if ``kernel`` runs on ``device`` (``op``'s ops, where given), else one line saying why and which choices
    do run there."""
    if kernel not in KERNELS:
        return f"unknown MXFP8 kernel {kernel!r}; choose from {', '.join(KERNELS)}"
    works = [k for k in KERNELS if k == "emulated" or (k == "real" and _is_sm100(device))]
    if kernel == "real" and not _is_sm100(device):
        return f"MXFP8 kernel 'real' needs an SM100 GPU (B200/GB200); on {device} use {' or '.join(works)}"
    if kernel == "fast":
        if op is not None and op.cast == "identity":  # the null control runs none of the cast kernels: torch's GEMMs
            return None
        try:
            from numerics.layer import fast
        except ImportError:
            return f"MXFP8 kernel 'fast' is not available in this checkout; on {device} use {' or '.join(works)}"
        return fast.available(torch.device(device))
    return None


def _kernel_preference(kernel: str):
    from torchao.quantization.quantize_.common import KernelPreference

    return {"emulated": KernelPreference.EMULATED, "real": KernelPreference.AUTO}[kernel]


def op_config(op: OpRecipe = MXFP8, kernel: str = "emulated", *, pad_groups: bool = True):
    """torchao's ``MXFP8TrainingOpConfig`` of ``op`` (its ``torchao_recipe`` with ``op``'s scale rule) and a
    torchao kernel."""
    from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig, MXFP8TrainingRecipe
    from torchao.prototype.mx_formats.config import ScaleCalculationMode

    if op.torchao_recipe is None:
        raise ValueError(f"torchao has no MXFP8 training recipe for {op}")
    base = MXFP8TrainingOpConfig.from_recipe(MXFP8TrainingRecipe[op.torchao_recipe])
    kp = _kernel_preference("emulated" if kernel == "fast" else kernel)
    return dataclasses.replace(base, kernel_preference=kp, pad_token_groups_for_grouped_mm=pad_groups,
                               scale_calculation_mode=ScaleCalculationMode[op.scale_calculation_mode])


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


def torchao_linear(x: torch.Tensor, weight: torch.Tensor, op: OpRecipe = MXFP8,
                   kernel: str = "emulated") -> torch.Tensor:
    """``x @ weight.T`` through torchao's MXFP8 linear autograd function (what MXFP8Linear runs)."""
    from torchao.prototype.moe_training.mxfp8_linear import _to_mxfp8_then_scaled_mm

    c = op_config(op, kernel)
    check_mx_gemm(x.reshape(-1, x.shape[-1]).shape[0], weight.shape[1], weight.shape[0], what="linear",
                  dtype=x.dtype, tokens_blocked=not c.wgrad_with_hp)
    return _to_mxfp8_then_scaled_mm(x, weight, kernel_preference=c.kernel_preference,
                                    scale_calculation_mode=c.scale_calculation_mode,
                                    wgrad_with_hp=c.wgrad_with_hp)


def torchao_grouped_mm(x: torch.Tensor, w_t: torch.Tensor, offs: torch.Tensor, op: OpRecipe = MXFP8,
                       kernel: str = "emulated", *, pad_groups: bool = True) -> torch.Tensor:
    """torchao's ``_to_mxfp8_then_scaled_grouped_mm``: (tokens, K) @ (E, K, N) -> (tokens, N) bf16."""
    from torchao.prototype.moe_training import _to_mxfp8_then_scaled_grouped_mm

    c = op_config(op, kernel, pad_groups=pad_groups)
    check_mx_gemm(x.shape[0], w_t.shape[-2], w_t.shape[-1], what="grouped_mm", dtype=x.dtype,
                  tokens_blocked=not (c.wgrad_with_hp or pad_groups))
    return _to_mxfp8_then_scaled_grouped_mm(
        x, w_t, offs, out_dtype=torch.bfloat16, kernel_preference=c.kernel_preference,
        wgrad_with_hp=c.wgrad_with_hp, scale_calculation_mode=c.scale_calculation_mode,
        pad_token_groups_for_grouped_mm=pad_groups,
    )


class _FastOp(SharedInputOp):
    """A fast-kernel op for one ``OpRecipe``. One object per recipe (``_fast_op``), so the modules of one recipe
    hold the same op and share an input's casts (``deepseek_v3.shared_input_casts``)."""

    def __init__(self, op: OpRecipe):
        self.op = op

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.op!r})"


class FastLinear(_FastOp):
    """The fast kernel's linear: ``op(x, w)``, or ``op(x, w, x_casts=)`` with x's casts made once for several
    linears on x by ``op.input_casts(x, want_dw=)``."""

    def __call__(self, x, weight, *, x_casts=None):
        from numerics.layer.fast import ops as fast

        check_mx_gemm(x.reshape(-1, x.shape[-1]).shape[0], weight.shape[1], weight.shape[0], what="linear",
                      dtype=x.dtype, tokens_blocked=not self.op.wgrad_with_hp)
        return fast.linear(x, weight, self.op, x_casts=x_casts)

    def input_casts(self, x, *, want_dw: bool):
        from numerics.layer.fast import ops as fast

        return fast.input_casts(x, self.op, want_dw=want_dw)


class FastGroupedMM(_FastOp):
    """The fast kernel's grouped GEMM, groups padded to 32: ``op(x, w_t, offs)``, or with ``x_casts=`` from
    ``op.input_casts(x, offs, want_dw=)``, as ``FastLinear``."""

    def __call__(self, x, w_t, offs, *, x_casts=None):
        from numerics.layer.fast import ops as fast

        check_mx_gemm(x.shape[0], w_t.shape[-2], w_t.shape[-1], what="grouped_mm", dtype=x.dtype,
                      tokens_blocked=False)
        return fast.grouped_mm(x, w_t, offs, self.op, pad_groups=True, x_casts=x_casts)

    def input_casts(self, x, offs, *, want_dw: bool):
        from numerics.layer.fast import ops as fast

        return fast.grouped_input_casts(x, offs, self.op, pad_groups=True, want_dw=want_dw)


@functools.cache
def _fast_op(kind: type, op: OpRecipe):
    return kind(op)


def _require(op: OpRecipe, kernel: str) -> None:
    problem = op.kernel_problem(kernel)
    if problem:
        raise ValueError(f"an op recipe that {problem}")


def linear_op(op: OpRecipe, kernel: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The callable a converted ``Linear`` runs: ``op(x, w) -> x @ w.T``."""
    _require(op, kernel)
    if kernel == "fast":
        return _fast_op(FastLinear, op)
    return functools.partial(torchao_linear, op=op, kernel=kernel)


def grouped_mm_op(op: OpRecipe, kernel: str) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """The callable a converted ``GroupedLinear`` runs: ``op(x, w_t, offs)``, groups padded to 32."""
    _require(op, kernel)
    if kernel == "fast":
        return _fast_op(FastGroupedMM, op)
    return functools.partial(torchao_grouped_mm, op=op, kernel=kernel, pad_groups=True)


def quantize_api_refusal() -> str | None:
    """Why this torch + torchao refuse ``quantize_(MXFP8TrainingOpConfig)``, or None if they take it.

    torchao 0.18.0 asserts that torch has two DTensor APIs that torch 2.11 lacks (FINDINGS.md C1);
    the functional ops this module uses do not depend on them. Tries the conversion on a tiny
    module, so it reports what torchao does rather than what we expect it to do.
    """
    from importlib.metadata import version

    from torchao.quantization import quantize_

    try:
        quantize_(nn.Sequential(nn.Linear(BLOCK, BLOCK, bias=False)), op_config(MXFP8),
                  filter_fn=lambda mod, fqn: isinstance(mod, nn.Linear))
    except AssertionError as exc:
        return f"torchao {version('torchao')} refuses quantize_(MXFP8TrainingOpConfig) on torch " \
               f"{torch.__version__}: {exc}"
    return None
