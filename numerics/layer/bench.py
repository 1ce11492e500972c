"""Layer benchmark: wall time of forward + backward in BF16 against emulated (or real) MXFP8.

``run(config_name, device) -> list[dict]`` times every layer of a config in one process and returns
``{"layer", "case", "bf16_ms", "mxfp8_ms", "ratio", "kernel", "device"}`` per layer; ``main(argv)``
prints the table. Ratios come from one run on one machine; nothing here asserts a time. On Hopper
the MXFP8 path is emulated (quantize, dequantize, BF16 GEMM), so the ratio is what emulation costs,
not what MXFP8 saves on SM100.
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Sequence

import torch
from torch import nn

from numerics.cli import ArgumentParser, run_main
from numerics.layer import harness as layers
from numerics.layer.configs import CONFIGS, get
from numerics.layer.modules import MLA, GroupedLinear, MoE, init_params, route


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _time_ms(module: nn.Module, x: torch.Tensor, args: tuple, grad: torch.Tensor, device: str,
             iters: int, warmup: int) -> float:
    x = x.detach().requires_grad_(True)
    for _ in range(warmup):  # allocator, kernel selection
        module(x, *args).backward(grad)
    _sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        module(x, *args).backward(grad)
    _sync(device)
    return (time.perf_counter() - start) * 1e3 / iters


class _Linear(nn.Module):
    def __init__(self, lin: nn.Linear):
        super().__init__()
        self.proj = lin

    def forward(self, x):
        return self.proj(x)


def _cases(cfg, device: str):
    g = torch.Generator(device=device).manual_seed(cfg.seed)
    bf = torch.bfloat16
    for s in cfg.linears:
        m = init_params(_Linear(nn.Linear(s.in_features, s.out_features, bias=s.bias, device=device)), g)
        yield "linear", s.name, m, (s.tokens, s.in_features), (), (s.tokens, s.out_features), {"keep_bf16": ()}
    for s in cfg.grouped:
        offs = torch.tensor(s.group_sizes, device=device).cumsum(0).to(torch.int32)
        m = init_params(GroupedLinear(s.experts, s.dim, s.hidden).to(device), g)
        yield ("grouped_mm", s.name, m, (s.tokens, s.dim), (offs,), (s.tokens, s.hidden),
               {"pad_groups": any(n % layers.BLOCK for n in s.group_sizes)})
    s = cfg.moe
    m = init_params(MoE(s).to(device), g)
    x = torch.randn(s.tokens, s.dim, generator=g, device=device)
    topk = route(copy.deepcopy(m.router.gate).to(bf), x.to(bf), s.top_k)
    yield "moe", "block", m, (s.tokens, s.dim), (topk,), (s.tokens, s.dim), {}
    s = cfg.mla
    yield "mla", "projections", init_params(MLA(s).to(device), g), (s.tokens, s.dim), (), (s.tokens, s.dim), {}


def run(config_name: str, device: str, *, iters: int | None = None, warmup: int = 2,
        recipe: str = "mxfp8") -> list[dict]:
    cfg = get(config_name)
    kernel = layers.default_kernel(device)
    iters = iters or (10 if device.startswith("cuda") else 2)
    rows = []
    for layer, case, module, x_shape, args, g_shape, conv in _cases(cfg, device):
        gen = torch.Generator(device=device).manual_seed(1)
        x = torch.randn(x_shape, generator=gen, device=device).to(torch.bfloat16)
        grad = torch.randn(g_shape, generator=gen, device=device).to(torch.bfloat16)
        bf16 = copy.deepcopy(module).to(torch.bfloat16)
        mx = layers.to_mxfp8(copy.deepcopy(module).to(torch.bfloat16), recipe, kernel, **conv)
        t_bf16 = _time_ms(bf16, x, args, grad, device, iters, warmup)
        t_mx = _time_ms(mx, x, args, grad, device, iters, warmup)
        rows.append({"layer": layer, "case": case, "bf16_ms": t_bf16, "mxfp8_ms": t_mx,
                     "ratio": t_mx / t_bf16, "kernel": kernel.name, "device": device, "recipe": recipe})
        print(f"  {layer} {case}: {t_bf16:.2f} ms bf16, {t_mx:.2f} ms {recipe}", file=sys.stderr, flush=True)
    return rows


def format_rows(rows: list[dict]) -> str:
    head = f"{'layer':<11} {'case':<12} {'bf16 ms':>9} {'mxfp8 ms':>9} {'ratio':>6}"
    lines = [head] + [f"{r['layer']:<11} {r['case']:<12} {r['bf16_ms']:>9.2f} {r['mxfp8_ms']:>9.2f} "
                      f"{r['ratio']:>5.1f}x" for r in rows]
    return "\n".join(lines)


def _main(argv: Sequence[str] | None) -> int:
    parser = ArgumentParser(prog="python -m numerics.layer.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="small")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--iters", type=int, help="timed iterations per layer (default 10 on GPU, 2 on CPU)")
    args = parser.parse_args(argv)
    rows = run(args.config, args.device, iters=args.iters)
    print(f"forward + backward, config {args.config}, {args.device}, MXFP8 kernels {rows[0]['kernel']}")
    print(format_rows(rows))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
