"""Training-step time of BF16 and of MXFP8 per kernel, eager and compiled, each configuration repeated in one run.

Public: ``step_flops(cfg, seq)``, ``variants(device, kernels, compile_)``, ``bench(...) -> list[dict]``,
``summarise(rows)``, ``report(rows, ...) -> dict``, ``load_report(path) -> dict``, ``format_rows(rows)``,
``VERSION``.

Each measurement builds its variant afresh (``convergence.train.perf.step``: the model from the same seed, its
recipe with its MXFP8 kernel, compiled from an empty dynamo cache if asked), runs ``warmup`` steps (compilation
happens here) and times ``steps`` steps with CUDA events (a synchronised wall clock on CPU). The repeats go round
the variants (the first of every variant, then the second, ...), so a variant's repeats are separate builds at
separate times and repeat r of MXFP8 sits next to repeat r of BF16. A row reports the median step time and the
range (min-max) of its repeats; its ratio to BF16 is the ratio of the medians, and its range is the range of the
per-repeat ratios (repeat r over BF16's repeat r). ``after_round`` hands over the rows after every round, so
``python -m convergence bench --json`` keeps what a run cut short had measured. FLOPs per token follow
the PaLM / torchtitan convention: 6 x (matmul parameters active per token) + 6 x n_layers x seq x n_heads
x (qk_head_dim + v_head_dim) for attention (causal masking not discounted); MFU divides by the GPU's
dense BF16 peak. Emulated and fast MXFP8 below SM100 run BF16 matmuls plus the cast work, so their
"MFU" counts only the model's FLOPs: the step-time ratio to BF16 is the honest cost of emulation.

The cast work emulation adds is bounded below by memory traffic: each MXFP8 GEMM operand is read once
and written once as the dequantized BF16 operand, three GEMMs (forward, dX, dW) with two operands each;
``cast_floor_ms`` prints that estimate at the device-to-device copy bandwidth measured in the same run,
so the gap between a kernel and its limit is visible.

The JSON's ``version`` 2 has the repeats; ``load_report`` reads version 1 too (one measurement per row, its range
that one value), as golden/training/bench_proxy__h200.json was recorded.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from convergence.train.model import Transformer
from convergence.train.perf.step import build_step, free, graphs_note, peak_gib, seconds_per_step, sync
from numerics.errors import BadInput
from numerics.layer import mxfp8
from numerics.layer.configs import ModelConfig, get_config, param_count
from numerics.layer.recipes import get_recipe, quantized_fqns

KIND = "convergence-bench"
VERSION = 2  # 2: rows carry their repeats (median, range, each); 1: one measurement per row

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
    """One measurement: a fresh build, its warm-up, ``steps`` timed steps."""
    t_build = time.perf_counter()
    step = build_step(cfg, recipe, kernel, batch=batch, seq=seq, device=device, compile_=compile_)
    t_warm = time.perf_counter()
    for _ in range(warmup):
        step()
    sync(device)
    warm_s = time.perf_counter() - t_warm
    dt = seconds_per_step(step, steps, device)
    mem = peak_gib(device)
    graphs = step.compiled_graphs()
    del step
    free(device)
    return {"step_s": dt, "build_s": t_warm - t_build, "warmup_s": warm_s, "max_mem_gib": mem, "graphs": graphs}


def bench(model: str, *, batch: int, seq: int, steps: int, warmup: int, device: torch.device, compile_: bool,
          kernels: Sequence[str] | None = None, progress=None, compile_emulated: bool = False, repeats: int = 3,
          measure=_time_variant, after_round=None) -> list[dict]:
    """One row per variant, ``repeats`` measurements each, taken round the variants; a variant whose measurement
    fails (e.g. compiling an op) is a row with its error and is not measured again. ``measure`` takes the
    arguments of ``_time_variant`` and returns its dict (a test's stand-in); ``after_round(rows, done)`` gets the
    rows of the first ``done`` rounds after each (a run cut short keeps what it measured)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    cfg = get_config(model)
    plan = variants(device, kernels, compile_, compile_emulated)
    done: dict[tuple, list[dict]] = {v: [] for v in plan}
    errors: dict[tuple, str] = {}
    for r in range(repeats):
        for recipe, kernel, compiled in plan:
            if (recipe, kernel, compiled) in errors:
                continue
            try:
                m = measure(cfg, recipe, kernel, batch=batch, seq=seq, steps=steps, warmup=warmup, device=device,
                            compile_=compiled)
            except Exception as exc:  # reported in the table, the other variants still run
                errors[(recipe, kernel, compiled)] = f"{type(exc).__name__}: {exc}"[:300]
                m = None
            if progress:
                progress(_progress_line(recipe, kernel, compiled, r, repeats, m,
                                        errors.get((recipe, kernel, compiled))))
            if m is not None:
                done[(recipe, kernel, compiled)].append(m)
        if after_round is not None:
            after_round(_rows(cfg, plan, done, errors, batch=batch, seq=seq, device=device), r + 1)
    return _rows(cfg, plan, done, errors, batch=batch, seq=seq, device=device)


def _rows(cfg: ModelConfig, plan, done: dict, errors: dict, *, batch: int, seq: int,
          device: torch.device) -> list[dict]:
    """The rows of the measurements made so far, with their ratios to BF16."""
    rows = []
    for recipe, kernel, compiled in plan:
        head = {"recipe": recipe, "kernel": kernel, "compiled": compiled}
        if (recipe, kernel, compiled) in errors:
            rows.append(head | {"error": errors[(recipe, kernel, compiled)]})
            continue
        ms = done[(recipe, kernel, compiled)]
        if not ms:
            continue
        each = [m["step_s"] for m in ms]
        mems = [m["max_mem_gib"] for m in ms if m["max_mem_gib"] is not None]
        graphs = [m["graphs"] for m in ms if m.get("graphs") is not None]
        tps = batch * seq / statistics.median(each)
        peak = _peak(device)
        rows.append(head | {"repeats": len(each), "step_s": statistics.median(each), "step_s_range": _span(each),
                            "step_s_each": each, "tokens_per_s": tps, "build_s_each": [m["build_s"] for m in ms],
                            "warmup_s_each": [m["warmup_s"] for m in ms],
                            "mfu": tps * step_flops(cfg, seq) / (peak * 1e12) if peak else None,
                            "max_mem_gib": max(mems) if mems else None,
                            "dynamo_graphs": max(graphs) if graphs else None})
    return summarise(rows)


def _span(values: Sequence[float]) -> list[float]:
    return [min(values), max(values)]


def _progress_line(recipe, kernel, compiled, r, repeats, m, error) -> str:
    head = f"{recipe:<8} {str(kernel or '-'):<9} {str(compiled):<9} repeat {r + 1}/{repeats}:"
    if m is None:
        return f"{head} failed: {error}"
    return f"{head} {1e3 * m['step_s']:.1f} ms/step (build {m['build_s']:.1f} s, warm-up {m['warmup_s']:.1f} s)"


def summarise(rows: list[dict]) -> list[dict]:
    """Each measured row's ratio to BF16 (eager to eager, compiled to compiled, else to eager BF16): the ratio of
    the medians (``ratio_to_bf16``), and each repeat over BF16's repeat of the same index (``ratio_to_bf16_each``,
    its range ``ratio_to_bf16_range``; over as many repeats as both have)."""
    base = {r["compiled"]: r for r in rows if r["recipe"] == "bf16" and "error" not in r}
    for r in rows:
        ref = base.get(r["compiled"]) or base.get(False)
        if "error" in r or ref is None:
            continue
        each = [a / b for a, b in zip(r["step_s_each"], ref["step_s_each"])]
        r["ratio_to_bf16"] = r["step_s"] / ref["step_s"]
        r["ratio_to_bf16_each"] = each
        r["ratio_to_bf16_range"] = _span(each)
    return rows


def format_rows(rows: list[dict], *, header: bool = True) -> str:
    """Median step time (and the range of the repeats), tokens/s at the median, the ratio of medians to BF16 (and
    the range of the per-repeat ratios), MFU and peak memory."""
    lines = [f"{'recipe':<8} {'kernel':<9} {'compiled':<9} {'n':>2} {'step ms (range)':>22} {'tok/s':>10} "
             f"{'x bf16 (range)':>19} {'MFU':>6} {'mem GiB':>8}"] if header else []
    for r in rows:
        head = f"{r['recipe']:<8} {str(r['kernel'] or '-'):<9} {str(r['compiled']):<9}"
        if "error" in r:
            lines.append(f"{head} failed: {r['error']}")
            continue
        lo, hi = r["step_s_range"]
        step = f"{1e3 * r['step_s']:.1f} ({1e3 * lo:.1f}-{1e3 * hi:.1f})"
        ratio = "-"
        if r.get("ratio_to_bf16") is not None:
            ratio = f"{r['ratio_to_bf16']:.2f} ({r['ratio_to_bf16_range'][0]:.2f}-{r['ratio_to_bf16_range'][1]:.2f})"
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        mem = f"{r['max_mem_gib']:.1f}" if r["max_mem_gib"] is not None else "n/a"
        lines.append(f"{head} {r['repeats']:>2} {step:>22} {r['tokens_per_s']:>10,.0f} {ratio:>19} {mfu:>6} {mem:>8}")
    lines += [f"note: {r['recipe']} {r['kernel'] or '-'} compiled ran as {graphs_note(r['dynamo_graphs'])}"
              for r in rows if (r.get("dynamo_graphs") or 1) > 1]
    return "\n".join(lines)


def report(rows: list[dict], *, model: str, batch: int, seq: int, device: torch.device, steps: int | None = None,
           warmup: int | None = None, repeats: int | None = None) -> dict:
    """The JSON document: rows, the cast-work floor, the run's settings and environment."""
    from numerics.environment import describe

    cfg = get_config(model)
    gbps = copy_gbps(device)
    floor_ms = 1e3 * cast_bytes(cfg, batch * seq) / (gbps * 1e9) if gbps else None
    return {"kind": KIND, "version": VERSION, "model": model, "batch": batch, "seq": seq, "steps": steps,
            "warmup": warmup, "repeats": repeats, "ratio": "ratio_to_bf16: median step / BF16's median step; "
            "ratio_to_bf16_range: min and max of repeat r's step / BF16's repeat r",
            "device": str(device), "flops_per_token": step_flops(cfg, seq), "copy_gbps": gbps,
            "cast_bytes_per_step": cast_bytes(cfg, batch * seq), "cast_floor_ms": floor_ms,
            "quantized_modules": len(quantized_fqns(Transformer(cfg) if device.type == "meta" else _meta(cfg),
                                                    get_recipe("mxfp8"))),
            "rows": rows, "repeats_done": None, "environment": describe()}


# what a measured row of each version must hold (an error row holds recipe, kernel, compiled and error)
_ROW_KEYS = {1: ("recipe", "kernel", "compiled", "step_s", "tokens_per_s"),
             2: ("recipe", "kernel", "compiled", "repeats", "step_s", "step_s_range", "step_s_each", "tokens_per_s")}


def load_report(path: Path) -> dict:
    """A bench JSON of version 1 or 2, as version 2: a version-1 row is one measurement (``repeats`` 1, its range
    and its per-repeat ratio that one value). ``BadInput`` for a file that is not a bench of a known version."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"{path}: not a readable JSON file ({exc})") from None
    if not isinstance(doc, dict) or doc.get("kind") != KIND or doc.get("version") not in _ROW_KEYS:
        raise BadInput(f"{path}: not a {KIND} file of version {' or '.join(map(str, _ROW_KEYS))}")
    version = doc["version"]
    rows = doc.get("rows")
    if not isinstance(rows, list) or not rows:
        raise BadInput(f"{path}: no rows")
    for i, row in enumerate(rows):
        need = _ROW_KEYS[version] if "error" not in row else ("recipe", "kernel", "compiled", "error")
        missing = [k for k in need if k not in row]
        if missing:
            raise BadInput(f"{path}: row {i} lacks {', '.join(missing)}")
    if version == 1:
        rows = [r if "error" in r else r | {"repeats": 1, "step_s_range": [r["step_s"]] * 2,
                                            "step_s_each": [r["step_s"]], "warmup_s_each": [r.get("warmup_s")]}
                for r in rows]
        for r in rows:
            r.pop("warmup_s", None)
            if r.get("ratio_to_bf16") is not None:
                r |= {"ratio_to_bf16_each": [r["ratio_to_bf16"]], "ratio_to_bf16_range": [r["ratio_to_bf16"]] * 2}
    return doc | {"version": VERSION, "read_from_version": version, "rows": rows}


def _meta(cfg: ModelConfig) -> Transformer:
    with torch.device("meta"):
        return Transformer(cfg)


def progress_line(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()
