"""Layer benchmark: wall time of forward + backward of the model's layers in BF16 and in MXFP8, per kernel.

``run(suite_name, device, kernels=...) -> list[dict]`` times every layer of a suite in one process and
returns ``{"layer", "case", "bf16_ms", "<kernel>_ms", "<kernel>_ratio", "device", "recipe"}`` per layer, one
column per MXFP8 kernel that runs on the device (``emulated`` everywhere, ``fast`` where it is available,
``real`` on SM100); ``main(argv)`` prints the table. Ratios come from one run on one machine; nothing
here asserts a time. On Hopper ``emulated`` is quantize, dequantize, BF16 GEMM, so its ratio is what
emulation costs, not what MXFP8 saves on SM100.
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Sequence

import torch
from torch import nn

from numerics.cli import ArgumentParser, CLIError, run_main
from numerics.layer import mxfp8
from numerics.layer.configs import SUITES, suite
from numerics.layer.deepseek_v3 import Attention, GroupedLinear, Linear, MoE, rope_frequencies
from numerics.layer.harness import Named, init_params
from numerics.layer.recipes import apply_recipe, get_recipe, set_op


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _time_ms(module: nn.Module, x: torch.Tensor, args: tuple, grad: torch.Tensor, device: str,
             iters: int, warmup: int) -> float:
    x = x.detach().requires_grad_(True)
    for _ in range(warmup):  # allocator, kernel selection, compilation
        module(x, *args).backward(grad)
    _sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        module(x, *args).backward(grad)
    _sync(device)
    return (time.perf_counter() - start) * 1e3 / iters


def _cases(s, device: str):
    """(layer, case, module, x shape, extra args, grad shape, convert(module, recipe, kernel))."""
    g = torch.Generator(device=device).manual_seed(s.seed)
    one_op = lambda m, recipe, kernel: set_op(m, get_recipe(recipe), kernel)  # noqa: E731
    as_model = lambda m, recipe, kernel: apply_recipe(m, get_recipe(recipe), device, kernel=kernel)  # noqa: E731
    for lin in s.linears:
        m = init_params(Linear(lin.in_features, lin.out_features).to(device), g)
        yield "linear", lin.name, m, (lin.tokens, lin.in_features), (), (lin.tokens, lin.out_features), one_op
    for gs in s.grouped:
        offs = torch.tensor(gs.group_sizes, device=device).cumsum(0).to(torch.int32)
        m = init_params(GroupedLinear(gs.experts, gs.dim, gs.hidden).to(device), g)
        yield "grouped_mm", gs.name, m, (gs.tokens, gs.dim), (offs,), (gs.tokens, gs.hidden), one_op
    cfg, t = s.model, s.tokens
    moe = init_params(Named("moe", MoE(cfg)).to(device), g)
    x = torch.randn(t, cfg.dim, generator=g, device=device)
    topk = copy.deepcopy(moe.moe).to(torch.bfloat16).route(x.to(torch.bfloat16))
    yield "moe", "block", moe, (t, cfg.dim), (topk,), (t, cfg.dim), as_model
    cos, sin = (v.to(device) for v in rope_frequencies(cfg, t))
    mla = init_params(Named("attention", Attention(cfg)).to(device), g)
    yield "mla", "attention", mla, (1, t, cfg.dim), (cos, sin), (1, t, cfg.dim), as_model


def kernels_here(device: str) -> list[str]:
    """The MXFP8 kernels that run on ``device``, in ``mxfp8.KERNELS`` order."""
    return [k for k in mxfp8.KERNELS if mxfp8.kernel_problem(k, device) is None]


def run(suite_name: str, device: str, *, iters: int | None = None, warmup: int = 2, recipe: str = "mxfp8",
        kernels: Sequence[str] | None = None) -> list[dict]:
    s = suite(suite_name)
    kernels = list(kernels or kernels_here(device))
    iters = iters or (10 if device.startswith("cuda") else 2)
    rows = []
    for layer, case, module, x_shape, args, g_shape, convert in _cases(s, device):
        gen = torch.Generator(device=device).manual_seed(1)
        x = torch.randn(x_shape, generator=gen, device=device).to(torch.bfloat16)
        grad = torch.randn(g_shape, generator=gen, device=device).to(torch.bfloat16)
        row = {"layer": layer, "case": case, "device": device, "recipe": recipe,
               "bf16_ms": _time_ms(copy.deepcopy(module).to(torch.bfloat16), x, args, grad, device, iters, warmup)}
        for kernel in kernels:
            mx = copy.deepcopy(module).to(torch.bfloat16)
            convert(mx, recipe, kernel)
            row[f"{kernel}_ms"] = _time_ms(mx, x, args, grad, device, iters, warmup)
            row[f"{kernel}_ratio"] = row[f"{kernel}_ms"] / row["bf16_ms"]
        rows.append(row)
        print(f"  {layer} {case}: " + ", ".join(f"{k} {row[k]:.2f} ms" for k in row if k.endswith("_ms")),
              file=sys.stderr, flush=True)
    return rows


def format_rows(rows: list[dict]) -> str:
    kernels = [k[:-3] for k in rows[0] if k.endswith("_ms") and k != "bf16_ms"] if rows else []
    head = f"{'layer':<11} {'case':<12} {'bf16 ms':>9}" + "".join(f" {k + ' ms':>12} {'ratio':>6}" for k in kernels)
    lines = [head]
    for r in rows:
        cells = "".join(f" {r[k + '_ms']:>12.2f} {r[k + '_ratio']:>5.1f}x" for k in kernels)
        lines.append(f"{r['layer']:<11} {r['case']:<12} {r['bf16_ms']:>9.2f}{cells}")
    return "\n".join(lines)


def _main(argv: Sequence[str] | None) -> int:
    parser = ArgumentParser(prog="python -m numerics.layer.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=sorted(SUITES), default="tiny")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--iters", type=int, help="timed iterations per layer (default 10 on GPU, 2 on CPU)")
    parser.add_argument("--kernel", action="append", choices=mxfp8.KERNELS,
                        help="repeatable; default: every MXFP8 kernel that runs on the device")
    args = parser.parse_args(argv)
    if args.iters is not None and args.iters < 1:  # -1 printed negative timings, 0 fell back to the default
        raise CLIError(f"--iters must be >= 1, got {args.iters}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise CLIError("--device cuda: no CUDA device is visible")
    for k in args.kernel or []:
        problem = mxfp8.kernel_problem(k, args.device)
        if problem:
            raise CLIError(problem)
    rows = run(args.config, args.device, iters=args.iters, kernels=args.kernel)
    print(f"forward + backward, suite {args.config}, {args.device}, recipe mxfp8")
    print(format_rows(rows))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
