"""Training-step throughput of BF16 and of MXFP8 per kernel, eager and compiled, measured in one run.

Public: ``step_flops(cfg, seq)``, ``variants(device, kernels, compile_)``, ``bench(...) -> list[dict]``,
``report(rows, ...) -> dict``, ``format_rows(rows)``.

Each variant builds the model from the same seed, applies its recipe with its MXFP8 kernel
(``numerics.layer.mxfp8``: ``emulated``, ``fast``, ``real``), optionally compiles the model, runs
``warmup`` steps (compilation happens here) and times ``steps`` steps with CUDA events (a
synchronised wall clock on CPU); each row is printed as soon as it is measured. FLOPs per token follow
the PaLM / torchtitan convention: 6 x (matmul parameters active per token) + 6 x n_layers x seq x n_heads
x (qk_head_dim + v_head_dim) for attention (causal masking not discounted); MFU divides by the GPU's
dense BF16 peak. Emulated and fast MXFP8 below SM100 run BF16 matmuls plus the cast work, so their
"MFU" counts only the model's FLOPs: the step-time ratio to BF16 is the honest cost of emulation.

The cast work emulation adds is bounded below by memory traffic: each MXFP8 GEMM operand is read once
and written once as the dequantized BF16 operand, three GEMMs (forward, dX, dW) with two operands each;
``cast_floor_ms`` prints that estimate at the device-to-device copy bandwidth measured in the same run,
so the gap between a kernel and its limit is visible.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

import torch

from convergence.train.model import Transformer, build_initialised
from numerics.layer import mxfp8
from numerics.layer.configs import ModelConfig, get_config, param_count
from numerics.layer.recipes import apply_recipe, get_recipe, quantized_fqns

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


def copy_gbps(device: torch.device, mib: int = 1024) -> float | None:
    """Device-to-device copy bandwidth (bytes read + written per second / 1e9), median of 10 after 3."""
    if device.type != "cuda":
        return None
    src = torch.empty(mib * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = []
    for i in range(13):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        if i >= 3:
            times.append(a.elapsed_time(b) / 1e3)
    return 2 * src.numel() / sorted(times)[len(times) // 2] / 1e9


def cast_bytes(cfg: ModelConfig, tokens: int) -> int:
    """Bytes the MXFP8 recipe's casts must move per training step at least: every operand of every
    converted GEMM (forward, dX, dW: two operands each) read once in BF16 and written once in BF16."""
    d, h = cfg.dim, cfg.n_heads
    att = [(d, h * cfg.qk_head_dim), (d, cfg.kv_lora_rank + cfg.qk_rope_head_dim),
           (cfg.kv_lora_rank, h * (cfg.qk_nope_head_dim + cfg.v_head_dim)), (h * cfg.v_head_dim, d)]
    dense = [(d, cfg.dense_hidden), (cfg.dense_hidden, d), (d, cfg.dense_hidden)]
    shared_hidden = cfg.moe_hidden * cfg.n_shared_experts
    shared = [(d, shared_hidden), (shared_hidden, d), (d, shared_hidden)]
    routed = [(d, cfg.moe_hidden), (cfg.moe_hidden, d), (d, cfg.moe_hidden)]
    elems = 0
    for k, n in att * cfg.n_layers + dense * cfg.n_dense_layers + shared * cfg.n_moe_layers:
        elems += 3 * (tokens * k + k * n)  # x and w in each of fwd, dX, dW (the cast of the other side)
    for k, n in routed * cfg.n_moe_layers:
        rows = tokens * cfg.top_k
        elems += 3 * (rows * k + cfg.n_routed_experts * k * n)
    return 2 * 2 * elems  # bf16 read + bf16 written


# torch.compile of a model whose MXFP8 ops are torchao's emulated eager ops does not finish within the
# 3-minute budget on an H200 (bf16 eager, bf16 compiled and emulated eager take ~60 s, then compiling the
# emulated model runs past 110 s more); it is opt-in. The fast kernel is one opaque op to
# torch.compile and compiles like BF16.
COMPILE_BY_DEFAULT = {"fast", "real"}


def variants(device: torch.device, kernels: Sequence[str] | None, compile_: bool,
             compile_emulated: bool = False) -> list[tuple[str, str | None, bool]]:
    """(recipe, kernel, compiled) rows, eager ones first (bf16, then mxfp8 with every kernel that runs here),
    then the compiled ones."""
    kernels = list(kernels) if kernels else [k for k in mxfp8.KERNELS if mxfp8.kernel_problem(k, device) is None]
    rows = [("bf16", None, False)] + [("mxfp8", k, False) for k in kernels]
    if compile_:
        rows += [("bf16", None, True)] + [("mxfp8", k, True) for k in kernels
                                          if k in COMPILE_BY_DEFAULT or compile_emulated]
    return rows


def _time_variant(cfg: ModelConfig, recipe: str, kernel: str | None, *, batch: int, seq: int, steps: int,
                  warmup: int, device: torch.device, compile_: bool) -> dict:
    model = build_initialised(cfg, 0)
    model.to(device)
    apply_recipe(model, get_recipe(recipe), device, kernel=kernel)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    fwd = torch.compile(model) if compile_ else model
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1), device=device,
                           generator=torch.Generator(device=device).manual_seed(0))

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = fwd(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        for _, m in model.moe_layers():
            m.tokens_per_expert.zero_()

    t_warm = time.perf_counter()
    for _ in range(warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    warm_s = time.perf_counter() - t_warm
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        end.record()
        end.synchronize()
        dt = start.elapsed_time(end) / 1e3 / steps
    else:
        dt = (time.perf_counter() - t0) / steps
    tps = batch * seq / dt
    peak = _peak(device)
    mem = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    if device.type == "cuda":
        del model, opt, fwd
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return {
        "recipe": recipe, "kernel": kernel, "compiled": compile_, "step_s": dt, "tokens_per_s": tps,
        "warmup_s": warm_s, "mfu": tps * step_flops(cfg, seq) / (peak * 1e12) if peak else None,
        "max_mem_gib": mem,
    }


def bench(model: str, *, batch: int, seq: int, steps: int, warmup: int, device: torch.device, compile_: bool,
          kernels: Sequence[str] | None = None, progress=None, compile_emulated: bool = False) -> list[dict]:
    """One row per variant; a variant that fails (e.g. compiling an op) is a row with its error."""
    cfg = get_config(model)
    rows = []
    for recipe, kernel, compiled in variants(device, kernels, compile_, compile_emulated):
        try:
            row = _time_variant(cfg, recipe, kernel, batch=batch, seq=seq, steps=steps, warmup=warmup,
                                device=device, compile_=compiled)
        except Exception as exc:  # reported in the table, the other variants still run
            row = {"recipe": recipe, "kernel": kernel, "compiled": compiled,
                   "error": f"{type(exc).__name__}: {exc}"[:300]}
        rows.append(row)
        if progress:
            progress(format_rows([row], header=False))
    base = {r["compiled"]: r for r in rows if r["recipe"] == "bf16" and "error" not in r}
    for r in rows:
        ref = base.get(r["compiled"]) or base.get(False)
        if "error" not in r and ref is not None:
            r["ratio_to_bf16"] = r["step_s"] / ref["step_s"]
    return rows


def format_rows(rows: list[dict], *, header: bool = True) -> str:
    lines = [f"{'recipe':<8} {'kernel':<9} {'compiled':<9} {'step ms':>9} {'tok/s':>10} {'x bf16':>7} {'MFU':>6} "
             f"{'mem GiB':>8}"] if header else []
    for r in rows:
        head = f"{r['recipe']:<8} {str(r['kernel'] or '-'):<9} {str(r['compiled']):<9}"
        if "error" in r:
            lines.append(f"{head} failed: {r['error']}")
            continue
        ratio = f"{r['ratio_to_bf16']:.2f}" if r.get("ratio_to_bf16") is not None else "-"
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        mem = f"{r['max_mem_gib']:.1f}" if r["max_mem_gib"] is not None else "n/a"
        lines.append(f"{head} {1e3 * r['step_s']:>9.1f} {r['tokens_per_s']:>10,.0f} {ratio:>7} {mfu:>6} {mem:>8}")
    return "\n".join(lines)


def report(rows: list[dict], *, model: str, batch: int, seq: int, device: torch.device) -> dict:
    """The JSON document: rows, the cast-work floor, the run's settings and environment."""
    from numerics.environment import describe

    cfg = get_config(model)
    gbps = copy_gbps(device)
    floor_ms = 1e3 * cast_bytes(cfg, batch * seq) / (gbps * 1e9) if gbps else None
    return {"kind": "convergence-bench", "version": 1, "model": model, "batch": batch, "seq": seq,
            "device": str(device), "flops_per_token": step_flops(cfg, seq), "copy_gbps": gbps,
            "cast_bytes_per_step": cast_bytes(cfg, batch * seq), "cast_floor_ms": floor_ms,
            "quantized_modules": len(quantized_fqns(Transformer(cfg) if device.type == "meta" else _meta(cfg),
                                                    get_recipe("mxfp8"))),
            "rows": rows, "environment": describe()}


def _meta(cfg: ModelConfig) -> Transformer:
    with torch.device("meta"):
        return Transformer(cfg)


def progress_line(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()
