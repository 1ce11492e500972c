"""Run the model's own layers three ways on identical inputs and upstream gradients: FP32, BF16 and MXFP8.

Public: ``run_linear``, ``run_grouped_mm``, ``run_moe``, ``run_mla``, ``run_suite`` (each returns
``LayerResult``s, see ``numerics.layer.results``), ``compare`` (the uniform three-way run),
``mxfp8_vs_bf16`` (one module, BF16 against MXFP8 under autocast: the training level's probes),
``kernel_agreement`` (two kernels of the seam on the same inputs), ``make_input``, ``init_params``,
``header``, ``RECIPES``, ``INPUT_FAMILIES``.

The modules are ``numerics.layer.deepseek_v3``, the ones ``convergence.train.model`` trains, converted by the
one converter (``numerics.layer.recipes``): a single projection or grouped GEMM gets the recipe's op
directly (``set_op``: what MXFP8 costs that GEMM, even for ``output``, which torchtitan keeps BF16); the
MoE block and MLA attention are converted as the model is (``apply_recipe``: torchtitan's selection, so
``moe.router.gate`` stays BF16). The FP32 reference is the same module with FP32 weights and input; each
recipe runs a BF16 copy. Every run's upstream gradient is passed contiguous: torchao 0.18's grouped GEMM
backward rejects a non-contiguous one (FINDINGS.md L1), and the harness is not the place to trip on it.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Iterable

import torch
from torch import nn

from numerics import metrics
from numerics.layer import mxfp8
from numerics.layer.configs import GroupedShape, LayerSuite, LinearShape, ModelConfig
from numerics.layer.deepseek_v3 import Attention, GroupedLinear, Linear, MoE, rope_frequencies
from numerics.layer.recipes import CONTROLS as _CONTROLS
from numerics.layer.recipes import NULL_CONTROLS as _NULL
from numerics.layer.recipes import RECIPES as _REGISTRY
from numerics.layer.recipes import Recipe, apply_recipe, get_recipe, set_op
from numerics.layer.results import LayerResult, TensorStat

RECIPES = tuple(r for r in _REGISTRY if r not in _CONTROLS + _NULL)  # bf16, mxfp8, mxfp8-wgrad-hp
INPUT_FAMILIES = ("normal", "outlier_channels", "lognormal_rows")


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


def init_params(module: nn.Module, gen: torch.Generator) -> nn.Module:
    """Deterministic init from ``gen`` (no global seed): N(0, 1/fan_in) weights, norm weights near 1."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen, device=p.device))
            elif p.ndim == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen, device=p.device))
            else:
                p.copy_(torch.randn(p.shape, generator=gen, device=p.device) / math.sqrt(p.shape[-1]))
    return module


def header(suite_name: str, device: str) -> dict:
    """The provenance every layer-statistics file carries: suite, device, kernel, versions, hardware."""
    from numerics import environment
    from numerics.layer.configs import suite

    return {
        "config": suite(suite_name).to_dict(),
        "device": device,
        "kernel": mxfp8.default_kernel(device),
        "fp32_matmul_precision": torch.get_float32_matmul_precision(),
        "versions": environment.describe(),
        "hardware": environment.hardware_tag() if device != "cpu" else "cpu",
    }


class Named(nn.Module):
    """Holds a layer under the name the model gives it (``attention``, ``moe``), so the recipe's
    fully-qualified-name selection sees the model's names."""

    def __init__(self, name: str, layer: nn.Module):
        super().__init__()
        self.name = name
        self.add_module(name, layer)

    def forward(self, x, *args):
        return getattr(self, self.name)(x, *args)


def run_once(module: nn.Module, x: torch.Tensor, args: tuple, grad: torch.Tensor, *,
             autocast: bool = False) -> dict[str, torch.Tensor]:
    """Forward + backward with a contiguous upstream gradient: output, dX and every weight's gradient
    (``dw:<name>``, zeros for a parameter no gradient reached). ``autocast``: under BF16 autocast, as
    training runs its FP32 master weights."""
    x = x.detach().clone().requires_grad_(True)
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
        y = module(x, *args)
    y.backward(grad.to(y.dtype).contiguous())
    out = {"out": y.detach(), "dx": x.grad}
    for name, p in module.named_parameters():
        out[f"dw:{name}"] = p.grad if p.grad is not None else torch.zeros_like(p)
    return out


def compare(layer: str, case: str, reference: nn.Module, x: torch.Tensor, args: tuple, grad: torch.Tensor,
            convert: Callable[[nn.Module, str], None], *, recipes: Iterable[str] = RECIPES,
            shape: dict | None = None, names: Callable[[str], str] = lambda t: t) -> LayerResult:
    """The uniform three-way run: ``reference`` is an FP32 module; each recipe runs a BF16 copy,
    ``convert(copy, recipe)`` making the MXFP8 ones; ``names`` shortens tensor names for the tables."""
    recipes = tuple(recipes)
    ref = run_once(reference, x, args, grad)
    runs: dict[str, dict[str, torch.Tensor]] = {}
    for recipe in dict.fromkeys(("bf16",) + recipes):
        m = copy.deepcopy(reference).to(torch.bfloat16)
        if recipe != "bf16":
            convert(m, recipe)
        runs[recipe] = run_once(m, x.to(torch.bfloat16), args, grad)
    stats = []
    for recipe in recipes:
        for tensor, r in ref.items():
            got = runs[recipe][tensor]
            s = metrics.summary(r, got)
            vs_bf16 = None if recipe == "bf16" else metrics.sqnr_db(runs["bf16"][tensor], got)
            stats.append(TensorStat(layer, case, recipe, names(tensor), s["sqnr_db"], vs_bf16, s["rel_err"],
                                    s["max_abs_err"], s["cosine"], shape or {}))
    return LayerResult(layer, case, shape or {}, tuple(stats))


def _gen(seed: int, device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _short(prefix: str) -> Callable[[str], str]:
    """``dw:moe.experts.w1.weight`` -> ``dw:experts.w1``; ``dw:weight`` -> ``dw``."""
    def name(t: str) -> str:
        if not t.startswith("dw:"):
            return t
        rest = t[3:].removeprefix(prefix).removesuffix("weight").rstrip(".")
        return f"dw:{rest}" if rest else "dw"
    return name


def _set_op(kernel: str) -> Callable[[nn.Module, str], None]:
    return lambda m, recipe: set_op(m, get_recipe(recipe), kernel)


def _apply(kernel: str) -> Callable[[nn.Module, str], None]:
    return lambda m, recipe: apply_recipe(m, get_recipe(recipe), kernel=kernel, device=next(m.parameters()).device)


def run_linear(s: LinearShape, *, recipes=RECIPES, device="cpu", seed=0, family="normal",
               kernel: str | None = None) -> LayerResult:
    """One of the model's projections (``deepseek_v3.Linear``) as its own MXFP8 GEMM."""
    mxfp8.check_mx_gemm(s.tokens, s.in_features, s.out_features, what=f"linear {s.name}")
    kernel = kernel or mxfp8.default_kernel(device)
    g = _gen(seed, device)
    ref = init_params(Linear(s.in_features, s.out_features).to(device), g)
    x = make_input(family, (s.tokens, s.in_features), g, device)
    grad = torch.randn(s.tokens, s.out_features, generator=g, device=device)
    return compare("linear", s.name, ref, x, (), grad, _set_op(kernel), recipes=recipes,
                   shape=dataclasses.asdict(s) | {"input": family}, names=_short(""))


def run_grouped_mm(s: GroupedShape, *, recipes=RECIPES, device="cpu", seed=0, family="normal",
                   kernel: str | None = None) -> LayerResult:
    """One of the experts' grouped GEMMs (``deepseek_v3.GroupedLinear``) over one split of the routed rows."""
    padded = any(n % mxfp8.BLOCK for n in s.group_sizes)
    mxfp8.check_mx_gemm(s.tokens, s.dim, s.hidden, what=f"grouped_mm {s.name}", tokens_blocked=False)
    kernel = kernel or mxfp8.default_kernel(device)
    g = _gen(seed, device)
    ref = init_params(GroupedLinear(s.experts, s.dim, s.hidden).to(device), g)
    x = make_input(family, (s.tokens, s.dim), g, device)
    grad = torch.randn(s.tokens, s.hidden, generator=g, device=device)
    offs = torch.tensor(s.group_sizes, device=device).cumsum(0).to(torch.int32)
    return compare("grouped_mm", s.name, ref, x, (offs,), grad, _set_op(kernel), recipes=recipes,
                   shape=dataclasses.asdict(s) | {"input": family, "padded_groups": padded}, names=_short(""))


def run_moe(cfg: ModelConfig, tokens: int, *, recipes=RECIPES, device="cpu", seed=0, family="normal",
            kernel: str | None = None) -> LayerResult:
    """The model's MoE block, converted by the recipe; every run sends each token to the experts the
    BF16 run's router picks (``MoE.forward``'s ``topk_idx``), the routing weights from its own gate."""
    mxfp8.check_mx_gemm(mxfp8.BLOCK, cfg.dim, cfg.moe_hidden, what="moe experts", tokens_blocked=False)
    kernel = kernel or mxfp8.default_kernel(device)
    g = _gen(seed, device)
    ref = init_params(Named("moe", MoE(cfg)).to(device), g)
    x = pre_norm(make_input(family, (tokens, cfg.dim), g, device))
    grad = torch.randn(tokens, cfg.dim, generator=g, device=device)
    topk = copy.deepcopy(ref.moe).to(torch.bfloat16).route(x.to(torch.bfloat16))
    shape = {"tokens": tokens, "dim": cfg.dim, "experts": cfg.n_routed_experts, "top_k": cfg.top_k,
             "shared_experts": cfg.n_shared_experts, "expert_hidden": cfg.moe_hidden, "input": family}
    return compare("moe", "block", ref, x, (topk,), grad, _apply(kernel), recipes=recipes, shape=shape,
                   names=_short("moe."))


def run_mla(cfg: ModelConfig, tokens: int, *, recipes=RECIPES, device="cpu", seed=0, family="normal",
            kernel: str | None = None) -> LayerResult:
    """The model's MLA attention (with RoPE) on one sequence of ``tokens``, converted by the recipe."""
    mxfp8.check_mx_gemm(tokens, cfg.dim, cfg.kv_lora_rank + cfg.qk_rope_head_dim, what="mla wkv_a")
    kernel = kernel or mxfp8.default_kernel(device)
    g = _gen(seed, device)
    ref = init_params(Named("attention", Attention(cfg)).to(device), g)
    x = pre_norm(make_input(family, (1, tokens, cfg.dim), g, device))
    grad = torch.randn(1, tokens, cfg.dim, generator=g, device=device)
    cos, sin = (t.to(device) for t in rope_frequencies(cfg, tokens))
    shape = {"tokens": tokens, "dim": cfg.dim, "heads": cfg.n_heads, "kv_lora_rank": cfg.kv_lora_rank,
             "qk_nope_head_dim": cfg.qk_nope_head_dim, "qk_rope_head_dim": cfg.qk_rope_head_dim,
             "v_head_dim": cfg.v_head_dim, "input": family}
    return compare("mla", "attention", ref, x, (cos, sin), grad, _apply(kernel), recipes=recipes, shape=shape,
                   names=_short("attention."))


def run_suite(s: LayerSuite, *, device="cpu", recipes=RECIPES, kernel: str | None = None,
              progress: Callable[[str], None] | None = None) -> list[LayerResult]:
    """Every layer of a suite; ``progress`` is told each layer's name before it runs."""
    kw = {"recipes": recipes, "device": device, "seed": s.seed, "kernel": kernel}
    jobs: list[tuple[str, Callable[[], LayerResult]]] = []
    for lin in s.linears:
        jobs.append((f"linear {lin.name}", lambda lin=lin: run_linear(lin, **kw)))
    for gs in s.grouped:
        jobs.append((f"grouped_mm {gs.name}", lambda gs=gs: run_grouped_mm(gs, **kw)))
    jobs.append(("moe", lambda: run_moe(s.model, s.tokens, **kw)))
    jobs.append(("mla", lambda: run_mla(s.model, s.tokens, **kw)))
    results = []
    for i, (name, job) in enumerate(jobs):
        if progress:
            progress(f"[{i + 1}/{len(jobs)}] {name}")
        results.append(job())
    return results


# ---------------------------------------------------------------- one module, BF16 against MXFP8 (probes)

def _plain_copy(module: nn.Module, device: torch.device) -> nn.Module:
    """A copy with plain FP32 parameters on ``device``, no gradients and no MXFP8 op. A parameter sharded by
    FSDP2 (a DTensor) is gathered whole: a collective, so every rank must copy the same modules in order."""
    twin = copy.deepcopy(module)
    for sub in twin.modules():
        for name, p in list(sub.named_parameters(recurse=False)):
            whole = p.full_tensor() if callable(getattr(p, "full_tensor", None)) else p
            setattr(sub, name, nn.Parameter(whole.detach().float().to(device)))
        if hasattr(sub, "mxfp8_op"):
            sub.mxfp8_op = None
    return twin


def mxfp8_vs_bf16(module: nn.Module, inputs: tuple, grad_out: torch.Tensor, recipe: Recipe, device: torch.device,
                  kernel: str | None = None) -> dict[str, float]:
    """SQNR (dB) of the MXFP8 run of ``module`` (``recipe``'s op, on ``kernel``: by default the one its op runs on
    here) against its BF16 run, on the same inputs and upstream gradient, both under BF16 autocast with FP32
    master weights as training runs: ``out_sqnr_db``, ``dx_sqnr_db`` and ``d<param>_sqnr_db``. ``module`` is left
    untouched."""
    bf16 = _plain_copy(module, device)
    mx = _plain_copy(module, device)
    set_op(mx, recipe, kernel or mxfp8.default_kernel(device, recipe.op))
    a = run_once(bf16, inputs[0], inputs[1:], grad_out, autocast=True)
    b = run_once(mx, inputs[0], inputs[1:], grad_out, autocast=True)
    rec = {"out_sqnr_db": metrics.sqnr_db(a["out"], b["out"]), "dx_sqnr_db": metrics.sqnr_db(a["dx"], b["dx"])}
    for key in a:
        if key.startswith("dw:"):
            rec[f"d{key[3:]}_sqnr_db"] = metrics.sqnr_db(a[key], b[key])
    return rec


# ---------------------------------------------------------------- kernel against kernel (SM100 tier, fast)

def _fwd_bwd(fn, x: torch.Tensor, w: torch.Tensor, grad: torch.Tensor) -> dict[str, torch.Tensor]:
    x = x.detach().clone().requires_grad_(True)
    w = w.detach().clone().requires_grad_(True)
    y = fn(x, w)
    y.backward(grad.contiguous())
    return {"out": y.detach(), "dx": x.grad, "dw": w.grad}


def kernel_agreement(m: int, k: int, n: int, *, kernel_a: str, kernel_b: str,
                     group_sizes: tuple[int, ...] | None = None, recipe: str = "mxfp8", device="cpu",
                     seed: int = 0) -> dict[str, float | bool | None]:
    """Two kernels of the seam on identical BF16 inputs: SQNR (dB) of out/dX/dW, and whether torchao's
    MXFP8 casts of the input agree bit for bit under both (``cast_bits_equal``; None when a kernel is
    not torchao's).

    On SM100 this holds ``real`` against ``emulated``; on CPU the same code runs ``emulated`` against
    itself, where every figure must be exact; ``fast`` against ``emulated`` must be exact everywhere.
    """
    op = get_recipe(recipe).op
    g = _gen(seed, device)
    x = torch.randn(m, k, generator=g, device=device).to(torch.bfloat16)
    grad = torch.randn(m, n, generator=g, device=device).to(torch.bfloat16)
    if group_sizes is None:
        w = (torch.randn(n, k, generator=g, device=device) / math.sqrt(k)).to(torch.bfloat16)
        runs = [_fwd_bwd(mxfp8.linear_op(op, kern), x, w, grad) for kern in (kernel_a, kernel_b)]
    else:
        if sum(group_sizes) != m:
            raise ValueError(f"group sizes sum to {sum(group_sizes)}, not m = {m}")
        w = (torch.randn(len(group_sizes), n, k, generator=g, device=device) / math.sqrt(k)).to(torch.bfloat16)
        offs = torch.tensor(group_sizes, device=device).cumsum(0).to(torch.int32)
        runs = []
        for kern in (kernel_a, kernel_b):
            grouped = mxfp8.grouped_mm_op(op, kern)
            runs.append(_fwd_bwd(lambda a, b, f=grouped: f(a, b.transpose(-2, -1), offs), x, w, grad))
    out: dict[str, float | bool | None] = {t: metrics.sqnr_db(runs[0][t], runs[1][t]) for t in ("out", "dx", "dw")}
    out["cast_bits_equal"] = None
    if "fast" not in (kernel_a, kernel_b):
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.mx_tensor import MXTensor

        casts = [MXTensor.to_mx(x, torch.float8_e4m3fn, mxfp8.BLOCK, ScaleCalculationMode.RCEIL,
                                mxfp8.op_config(op, kern).kernel_preference) for kern in (kernel_a, kernel_b)]
        out["cast_bits_equal"] = bool(
            torch.equal(casts[0].qdata.view(torch.uint8), casts[1].qdata.view(torch.uint8))
            and torch.equal(casts[0].scale.view(torch.uint8).reshape(-1), casts[1].scale.view(torch.uint8).reshape(-1))
        )
    return out
