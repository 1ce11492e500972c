"""python -m convergence bench: tokens/s and MFU of a bf16 and an MXFP8 training step, measured in one run.

Public: ``step_flops(cfg, seq)``, ``bench(...) -> list[dict]``, ``main(argv)``.

Each variant builds the model from the same seed, applies its recipe, optionally compiles it, runs
``--warmup`` steps (compilation happens here) and times ``--steps`` steps (CUDA-synchronised wall
clock). FLOPs per token follow the PaLM/torchtitan convention: 6 x (matmul parameters active per
token: attention, dense FFN, shared experts, top-k routed experts, router, head) + 6 x n_layers x seq x
n_heads x (qk_head_dim + v_head_dim) for attention scores and values (causal masking not discounted).
MFU divides by the GPU's dense BF16 peak. Emulated MXFP8 (below SM100) performs the BF16 matmuls plus
the quantize/dequantize work, so its "MFU" counts only the model's FLOPs: the step-time ratio is the
honest emulation overhead, not a speed claim about MXFP8.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from convergence.train.model import Transformer
from numerics.cli import ArgumentParser, CLIError
from numerics.layer.configs import CONFIGS, ModelConfig, get_config, param_count
from numerics.layer.mxfp8 import default_kernel
from numerics.layer.recipes import apply_recipe, get_recipe

# dense BF16 tensor-core peak, TFLOP/s (vendor datasheets, without sparsity)
PEAK_BF16_TFLOPS = {"h200": 989.5, "h100": 989.5, "b200": 2250.0, "gb200": 2500.0, "a100": 312.0}


def step_flops(cfg: ModelConfig, seq: int) -> float:
    """Training FLOPs per token (forward + backward) of ``cfg`` at sequence length ``seq``."""
    pc = param_count(cfg)
    matmul_active = pc["active"] - pc["embedding"] - pc["norms"]
    attn = 6 * cfg.n_layers * seq * cfg.n_heads * (cfg.qk_head_dim + cfg.v_head_dim)
    return 6.0 * matmul_active + attn


def _peak(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).lower()
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def _time_variant(cfg: ModelConfig, recipe: str, *, batch: int, seq: int, steps: int, warmup: int,
                  device: torch.device, compile_: bool) -> dict:
    torch.manual_seed(0)
    model = Transformer(cfg)
    model.init_weights(torch.Generator().manual_seed(0))
    model.to(device)
    apply_recipe(model, get_recipe(recipe), device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    fwd = torch.compile(model) if compile_ else model
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1), device=device)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = fwd(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        for _, m in model.moe_layers():
            m.tokens_per_expert.zero_()

    for _ in range(warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / steps
    tps = batch * seq / dt
    peak = _peak(device)
    mem = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return {
        "recipe": recipe, "compiled": compile_, "step_s": dt, "tokens_per_s": tps,
        "mfu": tps * step_flops(cfg, seq) / (peak * 1e12) if peak else None,
        "kernels": "n/a" if recipe == "bf16" else default_kernel(device),
        "max_mem_gib": mem,
    }


def bench(model: str, *, batch: int, seq: int, steps: int, warmup: int, device: torch.device,
          compile_: bool, recipes: Sequence[str] = ("bf16", "mxfp8")) -> list[dict]:
    cfg = get_config(model)
    rows = []
    for r in recipes:
        variants = [compile_] if r == "bf16" or not compile_ else [False, True]
        for c in variants:
            try:
                rows.append(_time_variant(cfg, r, batch=batch, seq=seq, steps=steps, warmup=warmup,
                                          device=device, compile_=c))
            except Exception as exc:  # a variant that fails (e.g. compile of the emulated path) is reported
                rows.append({"recipe": r, "compiled": c, "error": f"{type(exc).__name__}: {exc}"[:200]})
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = ArgumentParser(prog="python -m convergence bench", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="proxy", help=f"one of {', '.join(CONFIGS)}")
    p.add_argument("--device", choices=["cpu", "cuda"],
                   default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--no-compile", action="store_true", help="eager only (compile is the default)")
    args = p.parse_args(argv)
    if args.model not in CONFIGS:
        raise CLIError(f"unknown model {args.model!r}; choose from {', '.join(CONFIGS)}")
    if min(args.batch, args.seq, args.steps) <= 0 or args.warmup < 0:
        raise CLIError("--batch, --seq and --steps must be > 0 and --warmup >= 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise CLIError("--device cuda: no CUDA device is visible")
    device = torch.device(args.device)
    rows = bench(args.model, batch=args.batch, seq=args.seq, steps=args.steps, warmup=args.warmup,
                 device=device, compile_=not args.no_compile)
    cfg = get_config(args.model)
    print(f"model {args.model}: {param_count(cfg)['total'] / 1e6:,.1f}M params, {args.batch} x {args.seq} "
          f"tokens/step, {step_flops(cfg, args.seq) / 1e9:.4g} GFLOP/token, device {args.device}")
    print(f"{'recipe':<8} {'compiled':<9} {'kernels':<9} {'step s':>8} {'tok/s':>10} {'MFU':>6} "
          f"{'mem GiB':>8}")
    for r in rows:
        if "error" in r:
            print(f"{r['recipe']:<8} {str(r['compiled']):<9} failed: {r['error']}")
            continue
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        mem = f"{r['max_mem_gib']:.1f}" if r["max_mem_gib"] is not None else "n/a"
        print(f"{r['recipe']:<8} {str(r['compiled']):<9} {r['kernels']:<9} {r['step_s']:>8.3f} "
              f"{r['tokens_per_s']:>10,.0f} {mfu:>6} {mem:>8}")
    ok = [r for r in rows if "error" not in r]
    base = next((r for r in ok if r["recipe"] == "bf16"), None)
    for r in ok:
        if base is not None and r is not base:
            print(f"step-time ratio {r['recipe']} (compiled={r['compiled']}) / bf16 (compiled="
                  f"{base['compiled']}): {r['step_s'] / base['step_s']:.2f}x")
    return 0
