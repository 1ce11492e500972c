"""Microbenchmark of the fast MX cast and the ops built on it: ``python -m numerics.layer.fast.bench``.

Casts (E4M3, RCEIL, BF16 in and out) of 16384x2048, 16384x1408 and 8192x7168 along both dims: torchao's
eager ``to_mx`` + dequantize, the same under ``torch.compile``, and the fast kernel; each beside its
memory floor, (bytes read + bytes written) / the device's measured copy bandwidth. Then linear and
grouped GEMM forward + backward at the 16B expert shape (16384 x 2048 -> 1408 over 8 experts, even
groups): fast, torchao emulated and BF16, with the floor of their cast traffic. Device times are
CUDA-event medians of ``--iters`` (default 50) after ``--warmup`` runs, each timed with the GPU queue
pre-filled (``torch.cuda._sleep``) so the Python launch cost is not counted; ``wall`` columns time the
same loop back to back from the host, launch cost included. Ratios come from one run; nothing asserts a time.

What to expect on an H200, from independent measurements of the same operations there (the measured
figures: golden/layers/fast_bench__h200.json, docs/studies/bench.md):
- copy bandwidth ~3.9 TB/s (bf16 clones: 134 MB read + written in 0.035 ms = 3.8 TB/s, 235 MB in
  0.058 ms = 4.1 TB/s); cast floors = 4 bytes per element / that = 0.034, 0.024, 0.060 ms.
- torchao eager ~0.94, 0.65, 1.6 ms (0.94 ms measured for 16384x2048, scaled by size); along dim 0
  ~0.1 ms more (its transposing copy).
- torch.compile 0.046, 0.18, 0.43 ms, along dim 0 0.32-0.81 ms (transposed operand).
- fast along the last dim ~0.05, 0.035, 0.08 ms: about 25 integer and float operations per element
  against Hopper's ~17 T int32 operations/s put the 33.5 M elements of 16384x2048 near 40 us of
  issue time, beside a 35 us memory floor, so 1.3-1.5x the floor; along dim 0 ~20% more (the
  transposed store goes through shared memory).
- fwd + bwd at the 16B expert shape: BF16 ~0.4 ms (three GEMMs of ~0.13 ms); emulated ~4.5 ms (the
  grouped GEMM's measured 11x); fast ~0.7 ms: the BF16 GEMMs plus six casts (x and the upstream gradient along both
  dims, the weights along both) of ~0.05 ms each, so fast / BF16 ~1.7x for grouped (goal <= 2x) and
  ~1.5x for linear, whose weight is 8x smaller.

Public: ``run(...) -> dict``, ``format_report(result) -> str``, ``main(argv)``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from numerics.cli import ArgumentParser, CLIError, run_main
from numerics.files import atomic_write, check_writable
from numerics.layer.fast import ops
from numerics.layer.fast.cast import _cast, available, mx_dequantize

CAST_SHAPES = ((16384, 2048), (16384, 1408), (8192, 7168))  # 16B activations, 16B experts, V3 activations
OP_SHAPE = (16384, 2048, 1408, 8)  # M tokens, K = dim, N = expert hidden, E experts (configs.sixteen_b grouped)
QUICK_CAST_SHAPES = ((128, 64),)  # --quick: a smoke run that finishes in seconds on a CPU
QUICK_OP_SHAPE = (64, 32, 64, 2)
# --sweep: tiles (BR, BC, num_warps) to time against the default, along the last dim and along dim -2
SWEEP = {-1: ((16, 128, 4), (32, 128, 4), (64, 128, 8), (16, 256, 4), (32, 256, 8), (8, 512, 4), (64, 64, 4)),
         -2: ((64, 64, 4), (128, 64, 8), (64, 128, 8), (32, 128, 4), (128, 32, 4), (32, 64, 2), (256, 32, 8))}
QUICK_SWEEP = {-1: ((32, 64, 1),), -2: ((32, 64, 1),)}


def _timer(device: torch.device, iters: int, warmup: int) -> Callable[[Callable[[], object]], dict]:
    """fn -> {"ms": median device time, "wall_ms": mean host time per call}."""
    cuda = device.type == "cuda"
    cycles_per_ms = _sleep_rate(device) if cuda else 0.0

    def measure(fn) -> dict:
        for _ in range(warmup):  # compiles, autotunes, fills the allocator's cache
            fn()
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize(device)
        host_ms = (time.perf_counter() - t0) * 1e3
        # GPU sleep ahead of each timed call, 3x one call's host time (1 to 50 ms), so the host has
        # enqueued all of fn before the GPU gets there and launch cost stays out of the device time
        ahead = int(cycles_per_ms * min(50.0, max(1.0, 3 * host_ms)))
        if cuda:
            pairs = []
            for _ in range(iters):
                torch.cuda._sleep(ahead)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                pairs.append((start, end))
            torch.cuda.synchronize(device)
            device_ms = statistics.median(s.elapsed_time(e) for s, e in pairs)
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        if cuda:
            torch.cuda.synchronize(device)
        wall = (time.perf_counter() - t0) * 1e3 / iters
        return {"ms": device_ms if cuda else wall, "wall_ms": wall}

    return measure


def _sleep_rate(device: torch.device) -> float:
    """GPU clock cycles per ms, measured on ``torch.cuda._sleep`` itself."""
    torch.cuda._sleep(1_000_000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    torch.cuda.synchronize(device)
    return 10_000_000 / start.elapsed_time(end)


def _copy_bandwidth(device: torch.device, measure) -> float:
    """Bytes per ms of a large BF16 clone (read + written), the floor every cast is measured against."""
    n = (1 << 29) if device.type == "cuda" else (1 << 20)  # 1 GiB of BF16 on a GPU
    x = torch.empty(n, dtype=torch.bfloat16, device=device)
    ms = measure(lambda: x.clone())["ms"]
    return 2 * x.numel() * x.element_size() / ms


def _torchao_cast(dim: int):
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx

    def cast(x):
        src = x.t().contiguous() if dim == -2 else x
        scale, data = to_mx(src, torch.float8_e4m3fn, 32, ScaleCalculationMode.RCEIL)
        out = to_dtype(data, scale, torch.float8_e4m3fn, 32, torch.bfloat16)
        return out.t() if dim == -2 else out
    return cast


def _cast_rows(shapes, device, measure, bandwidth, compile_: bool, sweep, progress) -> list[dict]:
    rows = []
    for m, k in shapes:
        x = torch.randn(m, k, device=device).to(torch.bfloat16)
        floor = 4 * x.numel() / bandwidth  # 2 bytes read, 2 written per element
        for dim in (-1, -2):
            row = {"shape": [m, k], "dim": dim, "floor_ms": floor}
            variants = {"torchao_eager_ms": _torchao_cast(dim)}
            if compile_:
                variants["torchao_compiled_ms"] = torch.compile(_torchao_cast(dim), dynamic=False)
            variants["fast_ms"] = lambda t, d=dim: mx_dequantize(t, dim=d)
            for name, cast in variants.items():
                row[name] = measure(lambda c=cast, t=x: c(t))["ms"]
            if sweep:
                row["sweep_ms"] = {"x".join(map(str, cfg)): measure(
                    lambda c=cfg, d=dim, t=x: _cast(t, "e4m3", "rceil", d == -2, "torchao", torch.bfloat16,
                                                    return_bytes=False, config=c))["ms"] for cfg in sweep[dim]}
            rows.append(row)
            progress(f"cast {m}x{k} dim {dim}: fast {row['fast_ms']:.3f} ms, floor {floor:.3f} ms")
    return rows


def _emulated():
    from torchao.quantization.quantize_.common import KernelPreference

    return KernelPreference.EMULATED


def _op_fns(kind: str, x, w, offs):
    """{variant: (x, w) -> y}: fast, torchao emulated and BF16 for a linear ([N, K] weight) or grouped GEMM."""
    from torchao.prototype.moe_training import _to_mxfp8_then_scaled_grouped_mm
    from torchao.prototype.moe_training.mxfp8_linear import _to_mxfp8_then_scaled_mm
    from torchao.prototype.mx_formats.config import ScaleCalculationMode

    rceil = ScaleCalculationMode.RCEIL
    if kind == "linear":
        return {
            "fast": lambda a, b: ops.linear(a, b),
            "emulated": lambda a, b: _to_mxfp8_then_scaled_mm(a, b, kernel_preference=_emulated(),
                                                              scale_calculation_mode=rceil, wgrad_with_hp=False),
            "bf16": lambda a, b: a @ b.t(),
        }
    return {
        "fast": lambda a, b: ops.grouped_mm(a, b.transpose(-2, -1), offs, pad_groups=False),
        "emulated": lambda a, b: _to_mxfp8_then_scaled_grouped_mm(
            a, b.transpose(-2, -1), offs, out_dtype=torch.bfloat16, kernel_preference=_emulated(),
            wgrad_with_hp=False, scale_calculation_mode=rceil),
        "bf16": lambda a, b: torch._grouped_mm(a, b.transpose(-2, -1), offs=offs, out_dtype=torch.bfloat16),
    }


def _op_rows(shape, device, measure, bandwidth, progress) -> list[dict]:
    m, k, n, e = shape
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(m, k, generator=g, device=device).to(torch.bfloat16).requires_grad_(True)
    grad = torch.randn(m, n, generator=g, device=device).to(torch.bfloat16)
    offs = torch.arange(1, e + 1, device=device, dtype=torch.int32) * (m // e)
    rows = []
    for kind, w_shape in (("linear", (n, k)), ("grouped_mm", (e, n, k))):
        w = (torch.randn(w_shape, generator=g, device=device) / k**0.5).to(torch.bfloat16).requires_grad_(True)
        # cast traffic of fwd + bwd: x, the gradient and the weight each cast along both dims, 4 bytes/element
        floor = 4 * 2 * (x.numel() + grad.numel() + w.numel()) / bandwidth
        row = {"op": kind, "shape": list(shape), "cast_floor_ms": floor}
        for name, fn in _op_fns(kind, x, w, offs).items():
            def step(f=fn, a=x, b=w):
                a.grad = b.grad = None
                f(a, b).backward(grad)
            t = measure(step)
            row[f"{name}_ms"], row[f"{name}_wall_ms"] = t["ms"], t["wall_ms"]
        rows.append(row)
        progress(f"{kind} fwd+bwd: fast {row['fast_ms']:.3f} ms, bf16 {row['bf16_ms']:.3f} ms, "
                 f"emulated {row['emulated_ms']:.3f} ms")
    return rows


def run(*, device: str = "cuda", iters: int = 50, warmup: int = 10, quick: bool = False,
        compile_: bool = True, sweep: bool = False, progress: Callable[[str], None] = lambda s: None) -> dict:
    """Every figure of the report, measured in this process."""
    dev = torch.device(device)
    reason = available(dev)
    if reason:
        raise CLIError(reason)
    measure = _timer(dev, iters, warmup)
    bandwidth = _copy_bandwidth(dev, measure)
    progress(f"copy bandwidth {bandwidth / 1e9:.2f} TB/s")
    return {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__, "iters": iters, "warmup": warmup,
        "copy_bandwidth_tb_s": bandwidth / 1e9,
        "casts": _cast_rows(QUICK_CAST_SHAPES if quick else CAST_SHAPES, dev, measure, bandwidth, compile_,
                            (QUICK_SWEEP if quick else SWEEP) if sweep else None, progress),
        "ops": _op_rows(QUICK_OP_SHAPE if quick else OP_SHAPE, dev, measure, bandwidth, progress),
    }


def format_report(r: dict) -> str:
    lines = [f"{r['device']}, torch {r['torch']}: median of {r['iters']} after {r['warmup']} warm-up; "
             f"copy bandwidth {r['copy_bandwidth_tb_s']:.3g} TB/s", "",
             f"{'cast e4m3 rceil bf16':<24} {'floor ms':>9} {'eager ms':>9} {'compiled ms':>12} {'fast ms':>8} "
             f"{'fast/floor':>10}"]
    for c in r["casts"]:
        comp = c.get("torchao_compiled_ms", float("nan"))
        lines.append(f"{c['shape'][0]:>6}x{c['shape'][1]:<6} dim {c['dim']:>2}    {c['floor_ms']:>9.3f} "
                     f"{c['torchao_eager_ms']:>9.3f} {comp:>12.3f} {c['fast_ms']:>8.3f} "
                     f"{c['fast_ms'] / c['floor_ms']:>9.1f}x")
    swept = [c for c in r["casts"] if "sweep_ms" in c]
    if swept:
        lines += ["", f"{'tile sweep (BRxBCxwarps)':<24} {'default ms':>10}  best tile and its ms"]
        for c in swept:
            best = min(c["sweep_ms"], key=c["sweep_ms"].get)
            lines.append(f"{c['shape'][0]:>6}x{c['shape'][1]:<6} dim {c['dim']:>2}    {c['fast_ms']:>10.3f}  "
                         f"{best} {c['sweep_ms'][best]:.3f}")
    shape = "x".join(map(str, r["ops"][0]["shape"]))
    lines += ["", f"{'fwd+bwd ' + shape:<24} {'cast floor':>10} {'bf16 ms':>8} {'emulated':>9} {'fast ms':>8} "
                  f"{'fast/bf16':>9} {'emul/bf16':>9} {'wall fast/bf16':>14}"]
    for o in r["ops"]:
        lines.append(f"{o['op']:<24} {o['cast_floor_ms']:>10.3f} {o['bf16_ms']:>8.3f} {o['emulated_ms']:>9.3f} "
                     f"{o['fast_ms']:>8.3f} {o['fast_ms'] / o['bf16_ms']:>8.2f}x "
                     f"{o['emulated_ms'] / o['bf16_ms']:>8.2f}x {o['fast_wall_ms'] / o['bf16_wall_ms']:>13.2f}x")
    return "\n".join(lines)


def _main(argv: Sequence[str] | None) -> int:
    parser = ArgumentParser(prog="python -m numerics.layer.fast.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (Triton's interpreter: --quick only)")
    parser.add_argument("--iters", type=int, default=50, help="timed runs per figure (median; default 50)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed runs first (default 10)")
    parser.add_argument("--quick", action="store_true", help="tiny shapes: a smoke run, not a measurement")
    parser.add_argument("--no-compile", dest="compile_", action="store_false", help="skip the torch.compile column")
    parser.add_argument("--sweep", action="store_true", help="also time other kernel tiles for each cast")
    parser.add_argument("--json", type=Path, help="also write the figures here (refuses an existing file)")
    parser.add_argument("--force", action="store_true", help="overwrite --json's file if it exists")
    args = parser.parse_args(argv)
    if args.iters < 1 or args.warmup < 0:
        raise CLIError(f"--iters must be >= 1 and --warmup >= 0, got {args.iters} and {args.warmup}")
    if args.device not in ("cuda", "cpu") and not args.device.startswith("cuda:"):
        raise CLIError(f"--device must be cuda, cuda:N or cpu, got {args.device!r}")
    if args.device == "cpu" and not args.quick:
        raise CLIError("--device cpu runs the kernel in Triton's interpreter, far too slow for the full shapes; "
                       "add --quick for a smoke run")
    if args.json:
        check_writable(args.json, force=args.force)
    result = run(device=args.device, iters=args.iters, warmup=args.warmup, quick=args.quick, compile_=args.compile_,
                 sweep=args.sweep, progress=lambda s: print(s, file=sys.stderr, flush=True))
    print(format_report(result))
    if args.json:
        from numerics.environment import describe

        atomic_write(args.json, json.dumps(result | {"environment": describe()}, indent=1) + "\n", force=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
