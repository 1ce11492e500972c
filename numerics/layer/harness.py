"""Run one layer three ways on identical inputs and upstream gradients: FP32, BF16 and MXFP8.

Public functions: ``run_linear``, ``run_grouped_mm``, ``run_moe``, ``run_mla``, ``run_config``
(each returns ``LayerResult``s), ``torchao_linear`` / ``torchao_grouped_mm`` (the subject, called
the way the harness and the training model call it), ``to_mxfp8`` (module conversion),
``default_kernel``, ``op_config``, ``quantize_api_refusal``, ``check_mx_gemm`` (bad shapes ->
ValueError naming the constraint, before torchao asserts).

The subject is torchao 0.18's MXFP8 training path, through its functional autograd ops:
``MXFP8Linear`` (which runs ``mxfp8_linear._to_mxfp8_then_scaled_mm``) for dense projections and
``_to_mxfp8_then_scaled_grouped_mm`` for the experts' grouped GEMMs, put into the expert modules'
``grouped_mm_op`` seam. These are exactly the ops that ``quantize_(MXFP8TrainingOpConfig)``'s
weight wrapper dispatches to, with the same configuration (``op_config``), so the numbers are the
same bit for bit (tests/numerics/layer/test_quantize_api.py); ``quantize_`` itself is not used
because torchao 0.18 refuses it on torch 2.11, the GPU machines' torch, asking for a nightly
(FINDINGS.md C1), while the functional ops run there. Recipes (``RECIPES``) are torchao's two
MXFP8 training recipes, ``mxfp8`` (RCEIL scales, every GEMM in MXFP8) and ``mxfp8_wgrad_hp``
(weight gradient in BF16), next to the ``bf16`` baseline. Kernels: ``KernelPreference.EMULATED``
(quantize, dequantize, BF16 GEMM) on CPU and SM90, ``AUTO`` (real MX tensor cores) on SM100.

Which modules become MXFP8 follows torchtitan's DeepSeek-V3 setup (docs/mxfp8.md and the
deepseek_v3 config registry): linears with ``filter_fqns=["output", "router.gate"]`` stay BF16,
grouped GEMMs of ``experts`` are converted.

Every run's upstream gradient is passed contiguous: torchao 0.18's grouped GEMM backward rejects
a non-contiguous one (FINDINGS.md), and the harness is not the place to trip on it.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from numerics import metrics
from numerics.layer.configs import GroupedShape, LayerConfig, LinearShape, MLAShape, MoEShape
from numerics.layer.modules import MLA, GroupedLinear, MoE, init_params, route

RECIPES = ("bf16", "mxfp8", "mxfp8_wgrad_hp")
MX_RECIPES = RECIPES[1:]
BLOCK = 32  # the MX block: torchao 0.18 supports only 32 for MXFP8 training
TORCHTITAN_BF16_FQNS = ("output", "router.gate")  # torchtitan's MXFP8 filter_fqns for DeepSeek-V3
INPUT_FAMILIES = ("normal", "outlier_channels", "lognormal_rows")


# ---------------------------------------------------------------- subject configuration

def default_kernel(device: str | torch.device):
    """EMULATED unless on an SM100 GPU, where AUTO picks torchao's real MXFP8 kernels."""
    from torchao.quantization.quantize_.common import KernelPreference

    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] == 10:
        return KernelPreference.AUTO
    return KernelPreference.EMULATED


def op_config(recipe: str, kernel, *, pad_groups: bool = False):
    """torchao's ``MXFP8TrainingOpConfig`` for a recipe name, with our kernel choice."""
    from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig, MXFP8TrainingRecipe

    if recipe not in MX_RECIPES:
        raise ValueError(f"unknown MXFP8 recipe {recipe!r}; choose from {', '.join(MX_RECIPES)}")
    base = MXFP8TrainingOpConfig.from_recipe(
        MXFP8TrainingRecipe.MXFP8_RCEIL if recipe == "mxfp8" else MXFP8TrainingRecipe.MXFP8_RCEIL_WGRAD_WITH_HP
    )
    return dataclasses.replace(base, kernel_preference=kernel, pad_token_groups_for_grouped_mm=pad_groups)


def check_mx_gemm(m: int, k: int, n: int, *, what: str, dtype: torch.dtype = torch.bfloat16,
                  tokens_blocked: bool = True) -> None:
    """ValueError naming the constraint when torchao's MXFP8 GEMM cannot take this shape or dtype.

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


def torchao_linear(x: torch.Tensor, weight: torch.Tensor, recipe: str, kernel) -> torch.Tensor:
    """``x @ weight.T`` through torchao's MXFP8 linear autograd function (what MXFP8Linear runs)."""
    from torchao.prototype.moe_training.mxfp8_linear import _to_mxfp8_then_scaled_mm

    c = op_config(recipe, kernel)
    check_mx_gemm(x.reshape(-1, x.shape[-1]).shape[0], weight.shape[1], weight.shape[0], what="linear",
                  dtype=x.dtype, tokens_blocked=not c.wgrad_with_hp)
    return _to_mxfp8_then_scaled_mm(x, weight, kernel_preference=kernel,
                                    scale_calculation_mode=c.scale_calculation_mode,
                                    wgrad_with_hp=c.wgrad_with_hp)


def torchao_grouped_mm(x: torch.Tensor, w_t: torch.Tensor, offs: torch.Tensor, recipe: str, kernel,
                       *, pad_groups: bool | None = None) -> torch.Tensor:
    """torchao's ``_to_mxfp8_then_scaled_grouped_mm``; groups are padded iff a size is not 32-aligned."""
    from torchao.prototype.moe_training import _to_mxfp8_then_scaled_grouped_mm

    sizes = torch.diff(offs, prepend=offs.new_zeros(1))
    if pad_groups is None:
        pad_groups = bool((sizes % BLOCK).any())
    c = op_config(recipe, kernel, pad_groups=pad_groups)
    check_mx_gemm(x.shape[0], w_t.shape[-2], w_t.shape[-1], what="grouped_mm", dtype=x.dtype,
                  tokens_blocked=not (c.wgrad_with_hp or pad_groups))
    return _to_mxfp8_then_scaled_grouped_mm(
        x, w_t, offs, out_dtype=torch.bfloat16, kernel_preference=kernel, wgrad_with_hp=c.wgrad_with_hp,
        scale_calculation_mode=c.scale_calculation_mode, pad_token_groups_for_grouped_mm=pad_groups,
    )


def quantize_api_refusal() -> str | None:
    """Why this torch + torchao refuse ``quantize_(MXFP8TrainingOpConfig)``, or None if they take it.

    torchao 0.18.0 asserts that torch has two DTensor APIs that torch 2.11 lacks (FINDINGS.md C1);
    the functional ops this module uses do not depend on them. Tries the conversion on a tiny
    module, so it reports what torchao does rather than what we expect it to do.
    """
    from torchao.quantization import quantize_

    try:
        quantize_(nn.Sequential(nn.Linear(BLOCK, BLOCK, bias=False)), op_config("mxfp8", default_kernel("cpu")),
                  filter_fn=lambda mod, fqn: isinstance(mod, nn.Linear))
    except AssertionError as exc:
        return f"torchao {_version('torchao')} refuses quantize_(MXFP8TrainingOpConfig) on torch " \
               f"{torch.__version__}: {exc}"
    return None


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def _fqn_kept_bf16(fqn: str, keep: Iterable[str]) -> bool:
    return any(k in fqn for k in keep)


def to_mxfp8(module: nn.Module, recipe: str, kernel, *, keep_bf16: Iterable[str] = TORCHTITAN_BF16_FQNS,
             pad_groups: bool = True) -> nn.Module:
    """Convert a BF16 module in place: nn.Linear -> torchao MXFP8Linear; a module with 3-D expert
    weights gets ``torchao_grouped_mm`` in its ``grouped_mm_op`` seam.

    Linears are swapped to ``MXFP8Linear`` rather than given to ``quantize_`` because torchao 0.18's
    ``quantize_(MXFP8TrainingOpConfig)`` drops an nn.Linear's bias (FINDINGS.md) and is refused
    on torch 2.11 (FINDINGS.md C1); experts get the functional op for the latter reason.
    """
    from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear

    keep = tuple(keep_bf16)
    c = op_config(recipe, kernel, pad_groups=pad_groups)
    for fqn, child in list(module.named_modules()):
        if isinstance(child, nn.Linear) and not _fqn_kept_bf16(fqn, keep):
            m = child.weight.shape[0]
            check_mx_gemm(BLOCK, child.in_features, m, what=f"linear {fqn!r}", dtype=child.weight.dtype)
            new = MXFP8Linear(child.in_features, child.out_features, bias=child.bias is not None,
                              kernel_preference=kernel, scale_calculation_mode=c.scale_calculation_mode,
                              wgrad_with_hp=c.wgrad_with_hp, device=child.weight.device, dtype=child.weight.dtype)
            new.load_state_dict(child.state_dict())
            parent_name, _, attr = fqn.rpartition(".")
            setattr(module.get_submodule(parent_name) if parent_name else module, attr, new)
        elif any(p.ndim == 3 for p in child.parameters(recurse=False)) and not _fqn_kept_bf16(fqn, keep):
            if not hasattr(child, "grouped_mm_op"):
                raise TypeError(f"{fqn or 'the module'} ({type(child).__name__}) has 3-D expert weights but no "
                                "grouped_mm_op seam to put torchao's MXFP8 grouped GEMM into")
            child.grouped_mm_op = functools.partial(torchao_grouped_mm, recipe=recipe, kernel=kernel,
                                                    pad_groups=pad_groups)
    return module


# ---------------------------------------------------------------- results

def _json_float(v: float | None):
    if v is None or math.isfinite(v):
        return v
    return str(v)  # "inf", "-inf", "nan": strict JSON has no such numbers


@dataclass(frozen=True)
class TensorStat:
    layer: str
    case: str
    recipe: str
    tensor: str
    sqnr_vs_fp32: float
    sqnr_vs_bf16: float | None
    rel_err: float
    max_abs_err: float
    cosine: float
    shape: dict = field(default_factory=dict)

    def record(self) -> dict:
        d = dataclasses.asdict(self)
        for k in ("sqnr_vs_fp32", "sqnr_vs_bf16", "rel_err", "max_abs_err", "cosine"):
            d[k] = _json_float(d[k])
        return d


@dataclass(frozen=True)
class LayerResult:
    layer: str
    case: str
    shape: dict
    stats: tuple[TensorStat, ...]

    def stat(self, recipe: str, tensor: str) -> TensorStat:
        for s in self.stats:
            if s.recipe == recipe and s.tensor == tensor:
                return s
        raise KeyError(f"{self.layer}/{self.case}: no {recipe}/{tensor}; have "
                       f"{sorted({(s.recipe, s.tensor) for s in self.stats})}")

    def tensors(self) -> list[str]:
        return list(dict.fromkeys(s.tensor for s in self.stats))

    def records(self) -> list[dict]:
        return [s.record() for s in self.stats]

    def table(self) -> str:
        return format_table([self])

    __str__ = table


def format_table(results: Iterable[LayerResult], *, markdown: bool = False) -> str:
    head = ("layer", "case", "recipe", "tensor", "SQNR/fp32 dB", "SQNR/bf16 dB", "rel err", "cosine")
    rows = [head]
    for r in results:
        for s in r.stats:
            vs_bf16 = "-" if s.sqnr_vs_bf16 is None else f"{s.sqnr_vs_bf16:.2f}"
            rows.append((r.layer, r.case, s.recipe, s.tensor, f"{s.sqnr_vs_fp32:.2f}", vs_bf16,
                         f"{s.rel_err:.3e}", f"{s.cosine:.6f}"))
    if markdown:
        lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def to_json(results: Iterable[LayerResult], header: dict) -> str:
    return json.dumps({"header": header, "records": [rec for r in results for rec in r.records()]}, indent=1)


def floors_for(layer: str, recipe: str, tensor: str, family: str = "normal") -> list:
    """The ``numerics.tolerances`` entries a (layer, recipe, tensor) result must meet, vs BF16.

    Block layers (moe, mla) have floors for Gaussian post-norm inputs only: heavy-tailed inputs make
    attention and routing ill-conditioned, so their figures there are reported, not judged.
    """
    from numerics.tolerances import floor

    if recipe not in MX_RECIPES:
        return []
    kind = "dw" if tensor.startswith("dw") else tensor
    if tensor == "dbias" or (recipe == "mxfp8_wgrad_hp" and kind == "dw" and layer in ("linear", "grouped_mm")):
        return [floor("layer", "mxfp8_wgrad_hp", "hp_path", "sqnr_db")]
    if layer in ("linear", "grouped_mm"):
        own = "gemm.normal" if family == "normal" else "gemm.heavy_tailed"
        return [floor("layer", "mxfp8", f"{layer}.{kind}", "sqnr_db"), floor("layer", "mxfp8", own, "sqnr_db")]
    if layer in ("moe", "mla") and family == "normal":
        return [floor("layer", "mxfp8", f"{layer}.{kind}", "sqnr_db")]
    return []


def floor_violations(results: Iterable[LayerResult]) -> list[str]:
    """One line per MXFP8 figure below its floor (SQNR against the BF16 run); empty when all pass."""
    bad = []
    for r in results:
        family = r.shape.get("input", "normal")
        for s in r.stats:
            for tol in floors_for(r.layer, s.recipe, s.tensor, family):
                v = s.sqnr_vs_bf16
                if v is None or math.isnan(v) or v < tol.floor:
                    bad.append(f"{r.layer}/{r.case}/{s.recipe}/{s.tensor}: " + tol.describe(
                        float("nan") if v is None else v))
    return bad


# ---------------------------------------------------------------- the three-way runner

def make_input(family: str, shape: tuple[int, ...], gen: torch.Generator, device) -> torch.Tensor:
    """Training-like FP32 inputs: ``normal``; ``outlier_channels`` (a few channels 50x larger, as
    in LLM activations); ``lognormal_rows`` (per-token scales spread over ~2^+-6)."""
    x = torch.randn(shape, generator=gen, device=device)
    if family == "normal":
        return x
    if family == "outlier_channels":
        idx = torch.randperm(shape[-1], generator=gen, device=device)[: max(1, shape[-1] // 64)]
        x[..., idx] *= 50.0
        return x
    if family == "lognormal_rows":
        return x * torch.exp(2.0 * torch.randn((*shape[:-1], 1), generator=gen, device=device))
    raise ValueError(f"unknown input family {family!r}; choose from {', '.join(INPUT_FAMILIES)}")


def pre_norm(x: torch.Tensor) -> torch.Tensor:
    """Per-token RMS normalisation: MoE and MLA sit after a pre-norm in DeepSeek-V3, so their
    inputs have unit RMS per token (channel outliers survive it, row scales do not)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def _plain(t: torch.Tensor) -> torch.Tensor:
    return t._data if hasattr(t, "_data") else t  # unwrap torchao's training weight wrapper


def run_once(module: nn.Module, x: torch.Tensor, args: tuple, grad: torch.Tensor) -> dict[str, torch.Tensor]:
    """Forward + backward with a contiguous upstream gradient; output, dX and every weight's grad."""
    x = x.detach().clone().requires_grad_(True)
    y = module(x, *args)
    y.backward(grad.to(y.dtype).contiguous())
    out = {"out": y.detach(), "dx": x.grad}
    for name, p in module.named_parameters():
        out[f"dw:{name}"] = _plain(p.grad) if p.grad is not None else torch.zeros_like(_plain(p.data))
    return out


def compare(layer: str, case: str, reference: nn.Module, x: torch.Tensor, args: tuple, grad: torch.Tensor,
            convert: Callable[[nn.Module, str], nn.Module], *, recipes: Iterable[str] = RECIPES,
            shape: dict | None = None) -> LayerResult:
    """The uniform three-way run: ``reference`` is an FP32 module; each recipe runs a BF16 copy."""
    recipes = tuple(recipes)
    ref = run_once(reference, x, args, grad)
    runs: dict[str, dict[str, torch.Tensor]] = {}
    for recipe in dict.fromkeys(("bf16",) + recipes):
        m = copy.deepcopy(reference).to(torch.bfloat16)
        if recipe != "bf16":
            m = convert(m, recipe)
        runs[recipe] = run_once(m, x.to(torch.bfloat16), args, grad)
    stats = []
    for recipe in recipes:
        for tensor, r in ref.items():
            got = runs[recipe][tensor]
            s = metrics.summary(r, got)
            vs_bf16 = None if recipe == "bf16" else metrics.sqnr_db(runs["bf16"][tensor], got)
            stats.append(TensorStat(layer, case, recipe, tensor, s["sqnr_db"], vs_bf16, s["rel_err"],
                                    s["max_abs_err"], s["cosine"], shape or {}))
    return LayerResult(layer, case, shape or {}, tuple(stats))


def _gen(seed: int, device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def run_linear(s: LinearShape, *, recipes=RECIPES, device="cpu", seed=0, family="normal", kernel=None) -> LayerResult:
    check_mx_gemm(s.tokens, s.in_features, s.out_features, what=f"linear {s.name}")
    kernel = kernel or default_kernel(device)
    g = _gen(seed, device)
    ref = init_params(nn.Linear(s.in_features, s.out_features, bias=s.bias, device=device), g)
    x = make_input(family, (s.tokens, s.in_features), g, device)
    grad = torch.randn(s.tokens, s.out_features, generator=g, device=device)

    class _Wrap(nn.Module):  # a bare Linear, named "proj" so no torchtitan filter matches it
        def __init__(self, lin):
            super().__init__()
            self.proj = lin

        def forward(self, x):
            return self.proj(x)

    res = compare("linear", s.name, _Wrap(ref), x, (), grad,
                  lambda m, r: to_mxfp8(m, r, kernel, keep_bf16=()), recipes=recipes,
                  shape=dataclasses.asdict(s) | {"input": family})
    return _rename(res, {"dw:proj.weight": "dw", "dw:proj.bias": "dbias"})


def _rename(res: LayerResult, names: dict[str, str]) -> LayerResult:
    stats = tuple(dataclasses.replace(s, tensor=names.get(s.tensor, s.tensor)) for s in res.stats)
    return dataclasses.replace(res, stats=stats)


def run_grouped_mm(s: GroupedShape, *, recipes=RECIPES, device="cpu", seed=0, family="normal",
                   kernel=None) -> LayerResult:
    padded = any(n % BLOCK for n in s.group_sizes)
    check_mx_gemm(s.tokens, s.dim, s.hidden, what=f"grouped_mm {s.name}", tokens_blocked=not padded)
    kernel = kernel or default_kernel(device)
    g = _gen(seed, device)
    ref = init_params(GroupedLinear(s.experts, s.dim, s.hidden).to(device), g)
    x = make_input(family, (s.tokens, s.dim), g, device)
    grad = torch.randn(s.tokens, s.hidden, generator=g, device=device)
    offs = torch.tensor(s.group_sizes, device=device).cumsum(0).to(torch.int32)
    res = compare("grouped_mm", s.name, ref, x, (offs,), grad,
                  lambda m, r: to_mxfp8(m, r, kernel, pad_groups=padded), recipes=recipes,
                  shape=dataclasses.asdict(s) | {"input": family, "padded_groups": padded})
    return _rename(res, {"dw:weight": "dw"})


def run_moe(s: MoEShape, *, recipes=RECIPES, device="cpu", seed=0, family="normal", kernel=None) -> LayerResult:
    check_mx_gemm(BLOCK, s.dim, s.expert_hidden, what="moe experts", tokens_blocked=False)
    kernel = kernel or default_kernel(device)
    g = _gen(seed, device)
    ref = init_params(MoE(s).to(device), g)
    x = pre_norm(make_input(family, (s.tokens, s.dim), g, device))
    grad = torch.randn(s.tokens, s.dim, generator=g, device=device)
    # routing from the BF16 gate (the one BF16 and MXFP8 runs use), shared by all three runs
    topk = route(copy.deepcopy(ref.router.gate).to(torch.bfloat16), x.to(torch.bfloat16), s.top_k)
    return compare("moe", "block", ref, x, (topk,), grad,
                   lambda m, r: to_mxfp8(m, r, kernel, pad_groups=True), recipes=recipes,
                   shape=dataclasses.asdict(s) | {"input": family})


def run_mla(s: MLAShape, *, recipes=RECIPES, device="cpu", seed=0, family="normal", kernel=None) -> LayerResult:
    check_mx_gemm(s.tokens, s.dim, s.kv_lora_rank + s.qk_rope_head_dim, what="mla wkv_a")
    kernel = kernel or default_kernel(device)
    g = _gen(seed, device)
    ref = init_params(MLA(s).to(device), g)
    x = pre_norm(make_input(family, (s.tokens, s.dim), g, device))
    grad = torch.randn(s.tokens, s.dim, generator=g, device=device)
    res = compare("mla", "projections", ref, x, (), grad, lambda m, r: to_mxfp8(m, r, kernel), recipes=recipes,
                  shape=dataclasses.asdict(s) | {"input": family})
    return _rename(res, {f"dw:{n}.weight": f"dw:{n}" for n in ("wq", "wkv_a", "wkv_b", "wo", "kv_norm")})


def run_config(cfg: LayerConfig, *, device="cpu", recipes=RECIPES,
               progress: Callable[[str], None] | None = None) -> list[LayerResult]:
    """Every layer of a config; ``progress`` is told each layer's name before it runs."""
    jobs: list[tuple[str, Callable[[], LayerResult]]] = []
    for lin in cfg.linears:
        jobs.append((f"linear {lin.name}", lambda lin=lin: run_linear(lin, recipes=recipes, device=device,
                                                                        seed=cfg.seed)))
    for gs in cfg.grouped:
        jobs.append((f"grouped_mm {gs.name}", lambda gs=gs: run_grouped_mm(gs, recipes=recipes, device=device,
                                                                             seed=cfg.seed)))
    jobs.append(("moe", lambda: run_moe(cfg.moe, recipes=recipes, device=device, seed=cfg.seed)))
    jobs.append(("mla", lambda: run_mla(cfg.mla, recipes=recipes, device=device, seed=cfg.seed)))
    results = []
    for i, (name, job) in enumerate(jobs):
        if progress:
            progress(f"[{i + 1}/{len(jobs)}] {name}")
        results.append(job())
    return results


# ---------------------------------------------------------------- kernel against kernel (SM100 tier)

def _fwd_bwd(fn, x: torch.Tensor, w: torch.Tensor, grad: torch.Tensor) -> dict[str, torch.Tensor]:
    x = x.detach().clone().requires_grad_(True)
    w = w.detach().clone().requires_grad_(True)
    y = fn(x, w)
    y.backward(grad.contiguous())
    return {"out": y.detach(), "dx": x.grad, "dw": w.grad}


def kernel_agreement(m: int, k: int, n: int, *, kernel_a, kernel_b, group_sizes: tuple[int, ...] | None = None,
                     recipe: str = "mxfp8", device="cpu", seed: int = 0) -> dict[str, float | bool]:
    """Two torchao kernel preferences on identical BF16 inputs: SQNR (dB) of out/dX/dW, and whether
    their MXFP8 casts of the input agree bit for bit (``cast_bits_equal``).

    On SM100 this holds AUTO (real kernels) against EMULATED; on CPU the same code runs EMULATED
    against EMULATED, where every figure must be exact.
    """
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import MXTensor

    g = _gen(seed, device)
    x = torch.randn(m, k, generator=g, device=device).to(torch.bfloat16)
    grad = torch.randn(m, n, generator=g, device=device).to(torch.bfloat16)
    if group_sizes is None:
        w = (torch.randn(n, k, generator=g, device=device) / math.sqrt(k)).to(torch.bfloat16)
        runs = [_fwd_bwd(lambda a, b, kp=kp: torchao_linear(a, b, recipe, kp), x, w, grad)
                for kp in (kernel_a, kernel_b)]
    else:
        if sum(group_sizes) != m:
            raise ValueError(f"group sizes sum to {sum(group_sizes)}, not m = {m}")
        w = (torch.randn(len(group_sizes), n, k, generator=g, device=device) / math.sqrt(k)).to(torch.bfloat16)
        offs = torch.tensor(group_sizes, device=device).cumsum(0).to(torch.int32)
        runs = [_fwd_bwd(lambda a, b, kp=kp: torchao_grouped_mm(a, b.transpose(-2, -1), offs, recipe, kp), x, w, grad)
                for kp in (kernel_a, kernel_b)]
    out: dict[str, float | bool] = {t: metrics.sqnr_db(runs[0][t], runs[1][t]) for t in ("out", "dx", "dw")}
    casts = [MXTensor.to_mx(x, torch.float8_e4m3fn, BLOCK, ScaleCalculationMode.RCEIL, kp)
             for kp in (kernel_a, kernel_b)]
    out["cast_bits_equal"] = bool(
        torch.equal(casts[0].qdata.view(torch.uint8), casts[1].qdata.view(torch.uint8))
        and torch.equal(casts[0].scale.view(torch.uint8).reshape(-1), casts[1].scale.view(torch.uint8).reshape(-1))
    )
    return out
