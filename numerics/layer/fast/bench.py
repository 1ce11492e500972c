"""Microbenchmark of the fast MX cast and the ops built on it: ``python -m numerics.layer.fast.bench``.

Casts (E4M3, RCEIL, BF16 in and out) of 16384x2048, 16384x1408 and 8192x7168 along both dims: torchao's
eager ``to_mx`` + dequantize, the same under ``torch.compile``, and the fast kernel; and the fast kernel's both
layouts in one launch (dim ``both``, what the ops cast). Each beside its memory floor, (bytes read + bytes
written) / the device's measured copy bandwidth. Then linear and grouped GEMM forward + backward at the 16B expert
shape (16384 x 2048 -> 1408 over 8 experts, even groups): fast, torchao emulated and BF16, with the floor of their
cast traffic. Device times are CUDA-event medians of ``--iters`` (default 50) after ``--warmup`` runs, each timed
with the GPU queue pre-filled (``torch.cuda._sleep``) so the Python launch cost is not counted; ``wall`` columns
time the same loop back to back from the host, launch cost included. Every figure is measured ``--repeats`` times
(default 3), each a warm-up and timing of its own, taken round the row's variants (repeat 1 of each, then repeat
2, ...):
the JSON holds each figure's median (the plain key, e.g. ``fast_ms``), its range (``fast_ms_range``: min, max) and
every repeat (``fast_ms_each``); a ratio such as ``fast_over_bf16`` is the ratio of the medians, its range that of
the per-repeat ratios. The tile sweep is measured once. Nothing asserts a time.

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

The JSON's ``version`` 2 has the repeats; ``load_report`` reads the first format too (no ``kind``: one
measurement per figure, its range that one value), as golden/layers/fast_bench__h200.json was recorded.

Public: ``run(...) -> dict``, ``format_report(result) -> str``, ``load_report(path) -> dict``, ``main(argv)``.
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
from numerics.errors import BadInput
from numerics.files import atomic_write, check_writable
from numerics.layer.fast import ops
from numerics.layer.fast.cast import _cast, available, mx_dequantize, mx_dequantize_both

CAST_SHAPES = ((16384, 2048), (16384, 1408), (8192, 7168))  # 16B activations, 16B experts, V3 activations
OP_SHAPE = (16384, 2048, 1408, 8)  # M tokens, K = dim, N = expert hidden, E experts (configs.sixteen_b grouped)
QUICK_CAST_SHAPES = ((128, 64),)  # --quick: a smoke run that finishes in seconds on a CPU
QUICK_OP_SHAPE = (64, 32, 64, 2)
# --sweep: tiles (BR, BC, num_warps) to time against the default, along the last dim and along dim -2
SWEEP = {-1: ((16, 128, 4), (32, 128, 4), (64, 128, 8), (16, 256, 4), (32, 256, 8), (8, 512, 4), (64, 64, 4)),
         -2: ((64, 64, 4), (128, 64, 8), (64, 128, 8), (32, 128, 4), (128, 32, 4), (32, 64, 2), (256, 32, 8))}
QUICK_SWEEP = {-1: ((32, 64, 1),), -2: ((32, 64, 1),)}
KIND = "fast-bench"
VERSION = 2  # 2: every figure with its repeats (median, range, each); 1 (no kind): one measurement per figure


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


def _repeated(row: dict, fns: dict[str, Callable[[], object]], measure, repeats: int, *,
              wall: bool = False) -> None:
    """``row[f"{name}_ms"]`` (and ``_wall_ms`` if asked) for each of ``fns``: the median of ``repeats``
    measurements taken round the variants, with ``_range`` and ``_each``."""
    got: dict[str, list[float]] = {k: [] for name in fns for k in ((name, f"{name}_wall") if wall else (name,))}
    for _ in range(repeats):
        for name, fn in fns.items():
            t = measure(fn)
            got[name].append(t["ms"])
            if wall:
                got[f"{name}_wall"].append(t["wall_ms"])
    for key, each in got.items():
        row[f"{key}_ms"], row[f"{key}_ms_range"], row[f"{key}_ms_each"] = statistics.median(each), \
            [min(each), max(each)], each


def _ratio(row: dict, num: str, den: str) -> None:
    """``row[f"{num}_over_{den}"]``: the ratio of the medians; ``_range``: that of the per-repeat ratios."""
    each = [a / b for a, b in zip(row[f"{num}_ms_each"], row[f"{den}_ms_each"])]
    row[f"{num}_over_{den}"] = row[f"{num}_ms"] / row[f"{den}_ms"]
    row[f"{num}_over_{den}_range"] = [min(each), max(each)]


def _copy_bandwidth(device: torch.device, measure, repeats: int = 1) -> dict:
    """Bytes per ms of a large BF16 clone (read + written), the floor every cast is measured against: the median
    of ``repeats`` (``bytes_per_ms``) and the range, in TB/s."""
    n = (1 << 29) if device.type == "cuda" else (1 << 20)  # 1 GiB of BF16 on a GPU
    x = torch.empty(n, dtype=torch.bfloat16, device=device)
    row: dict = {}
    _repeated(row, {"clone": lambda: x.clone()}, measure, repeats)
    moved = 2 * x.numel() * x.element_size()
    return {"bytes_per_ms": moved / row["clone_ms"], "tb_s_range": [moved / hi / 1e9 for hi in
                                                                    row["clone_ms_range"][::-1]]}


def _torchao_cast(dim: int):
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx

    def cast(x):
        src = x.t().contiguous() if dim == -2 else x
        scale, data = to_mx(src, torch.float8_e4m3fn, 32, ScaleCalculationMode.RCEIL)
        out = to_dtype(data, scale, torch.float8_e4m3fn, 32, torch.bfloat16)
        return out.t() if dim == -2 else out
    return cast


def _cast_rows(shapes, device, measure, bandwidth, compile_: bool, sweep, progress, repeats: int) -> list[dict]:
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
            _repeated(row, {name.removesuffix("_ms"): (lambda c=cast, t=x: c(t)) for name, cast in variants.items()},
                      measure, repeats)
            if sweep:
                row["sweep_ms"] = {"x".join(map(str, cfg)): measure(
                    lambda c=cfg, d=dim, t=x: _cast(t, "e4m3", "rceil", d == -2, "torchao", torch.bfloat16,
                                                    return_bytes=False, config=c))["ms"] for cfg in sweep[dim]}
            rows.append(row)
            progress(f"cast {m}x{k} dim {dim}: fast {row['fast_ms']:.3f} ms ({_span(row, 'fast_ms')}), "
                     f"floor {floor:.3f} ms")
        # both layouts in one launch (the ops' casts): 2 bytes read from memory (the floor takes the second
        # pass's read of a tile just read as served by L2) and 4 written per element, against the two single casts' 8
        row = {"shape": [m, k], "dim": "both", "floor_ms": 6 * x.numel() / bandwidth}
        _repeated(row, {"fast": lambda t=x: mx_dequantize_both(t)}, measure, repeats)
        rows.append(row)
        progress(f"cast {m}x{k} both dims: fast {row['fast_ms']:.3f} ms ({_span(row, 'fast_ms')}), "
                 f"floor {row['floor_ms']:.3f} ms")
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


def _op_rows(shape, device, measure, bandwidth, progress, repeats: int) -> list[dict]:
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

        def step(f, a=x, b=w):
            a.grad = b.grad = None
            f(a, b).backward(grad)
        _repeated(row, {name: (lambda f=fn: step(f)) for name, fn in _op_fns(kind, x, w, offs).items()}, measure,
                  repeats, wall=True)
        for num in ("fast", "emulated", "fast_wall"):
            _ratio(row, num, "bf16_wall" if num == "fast_wall" else "bf16")
        rows.append(row)
        progress(f"{kind} fwd+bwd: fast {row['fast_ms']:.3f} ms ({_span(row, 'fast_ms')}), bf16 {row['bf16_ms']:.3f} "
                 f"ms ({_span(row, 'bf16_ms')}), emulated {row['emulated_ms']:.3f} ms")
    return rows


def _span(row: dict, key: str) -> str:
    lo, hi = row[f"{key}_range"]
    return f"{lo:.3f}-{hi:.3f}"


def run(*, device: str = "cuda", iters: int = 50, warmup: int = 10, quick: bool = False,
        compile_: bool = True, sweep: bool = False, repeats: int = 3,
        progress: Callable[[str], None] = lambda s: None) -> dict:
    """Every figure of the report, each measured ``repeats`` times in this process."""
    dev = torch.device(device)
    reason = available(dev)
    if reason:
        raise CLIError(reason)
    measure = _timer(dev, iters, warmup)
    copy = _copy_bandwidth(dev, measure, repeats)
    bandwidth = copy["bytes_per_ms"]
    progress(f"copy bandwidth {bandwidth / 1e9:.2f} TB/s")
    return {
        "kind": KIND, "version": VERSION,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__, "iters": iters, "warmup": warmup, "repeats": repeats,
        "copy_bandwidth_tb_s": bandwidth / 1e9, "copy_bandwidth_tb_s_range": copy["tb_s_range"],
        "casts": _cast_rows(QUICK_CAST_SHAPES if quick else CAST_SHAPES, dev, measure, bandwidth, compile_,
                            (QUICK_SWEEP if quick else SWEEP) if sweep else None, progress, repeats),
        "ops": _op_rows(QUICK_OP_SHAPE if quick else OP_SHAPE, dev, measure, bandwidth, progress, repeats),
    }


def format_report(r: dict) -> str:
    """Medians of the repeats, with the range of the fast kernel's figures and of its ratios."""
    r = _as_current(r)
    lines = [f"{r['device']}, torch {r['torch']}: each figure the median of its repeats ({r['repeats']}), each the "
             f"median of {r['iters']} after {r['warmup']} warm-up; "
             f"copy bandwidth {r['copy_bandwidth_tb_s']:.3g} TB/s", "",
             f"{'cast e4m3 rceil bf16':<24} {'floor ms':>9} {'eager ms':>9} {'compiled ms':>12} {'fast ms':>8} "
             f"{'fast range':>13} {'fast/floor':>10}"]
    for c in r["casts"]:
        comp, eager = c.get("torchao_compiled_ms", float("nan")), c.get("torchao_eager_ms", float("nan"))
        lines.append(f"{c['shape'][0]:>6}x{c['shape'][1]:<6} dim {c['dim']:>4}  {c['floor_ms']:>9.3f} "
                     f"{eager:>9.3f} {comp:>12.3f} {c['fast_ms']:>8.3f} {_span(c, 'fast_ms'):>13} "
                     f"{c['fast_ms'] / c['floor_ms']:>9.1f}x")
    swept = [c for c in r["casts"] if "sweep_ms" in c]
    if swept:
        lines += ["", f"{'tile sweep (BRxBCxwarps)':<24} {'default ms':>10}  best tile and its ms (measured once)"]
        for c in swept:
            best = min(c["sweep_ms"], key=c["sweep_ms"].get)
            lines.append(f"{c['shape'][0]:>6}x{c['shape'][1]:<6} dim {c['dim']:>2}    {c['fast_ms']:>10.3f}  "
                         f"{best} {c['sweep_ms'][best]:.3f}")
    shape = "x".join(map(str, r["ops"][0]["shape"]))
    lines += ["", f"{'fwd+bwd ' + shape:<24} {'cast floor':>10} {'bf16 ms':>8} {'emulated':>9} {'fast ms':>8} "
                  f"{'fast/bf16 (range)':>19} {'emul/bf16':>9} {'wall fast/bf16 (range)':>24}"]
    for o in r["ops"]:
        fast = f"{o['fast_over_bf16']:.2f}x ({_ratio_span(o, 'fast_over_bf16')})"
        wall = f"{o['fast_wall_over_bf16_wall']:.2f}x ({_ratio_span(o, 'fast_wall_over_bf16_wall')})"
        lines.append(f"{o['op']:<24} {o['cast_floor_ms']:>10.3f} {o['bf16_ms']:>8.3f} {o['emulated_ms']:>9.3f} "
                     f"{o['fast_ms']:>8.3f} {fast:>19} {o['emulated_over_bf16']:>8.2f}x {wall:>24}")
    lines.append("ratios: the ratio of the medians; in brackets the range of the per-repeat ratios")
    return "\n".join(lines)


def _ratio_span(row: dict, key: str) -> str:
    lo, hi = row[f"{key}_range"]
    return f"{lo:.2f}-{hi:.2f}"


_CAST_KEYS = ("torchao_eager_ms", "torchao_compiled_ms", "fast_ms")
_OP_KEYS = ("fast_ms", "emulated_ms", "bf16_ms", "fast_wall_ms", "emulated_wall_ms", "bf16_wall_ms")


def _as_current(doc: dict) -> dict:
    """A result of either version in version 2's shape: a first-format figure is one measurement, its range and
    its list that one value, its ratios computed from it."""
    if doc.get("kind") == KIND and doc.get("version") == VERSION:
        return doc
    one = {"repeats": 1, "copy_bandwidth_tb_s_range": [doc["copy_bandwidth_tb_s"]] * 2}
    casts = [c | {f"{k}_range": [c[k]] * 2 for k in _CAST_KEYS if k in c}
             | {f"{k}_each": [c[k]] for k in _CAST_KEYS if k in c} for c in doc["casts"]]
    ops = []
    for o in doc["ops"]:
        o = o | {f"{k}_range": [o[k]] * 2 for k in _OP_KEYS} | {f"{k}_each": [o[k]] for k in _OP_KEYS}
        for num in ("fast", "emulated", "fast_wall"):
            _ratio(o, num, "bf16_wall" if num == "fast_wall" else "bf16")
        ops.append(o)
    return doc | one | {"kind": KIND, "version": VERSION, "read_from_version": 1, "casts": casts, "ops": ops}


def load_report(path: Path) -> dict:
    """A result file of either version, as version 2 (``read_from_version`` says which it was); ``BadInput`` for a
    file that is neither."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"{path}: not a readable JSON file ({exc})") from None
    if not isinstance(doc, dict) or doc.get("kind", KIND) != KIND or doc.get("version", 1) not in (1, VERSION):
        raise BadInput(f"{path}: not a {KIND} result of version 1 or {VERSION}")
    keys = {1: (_CAST_KEYS[::2], _OP_KEYS), VERSION: (("fast_ms_range",), ("fast_over_bf16_range",))}
    cast_keys, op_keys = keys[doc.get("version", 1)]
    try:
        ok = (isinstance(doc["copy_bandwidth_tb_s"], float) and doc["casts"] and doc["ops"]
              and all(k in c for c in doc["casts"] for k in ("shape", "dim", "floor_ms", *cast_keys))
              and all(k in o for o in doc["ops"] for k in ("op", "shape", "cast_floor_ms", *op_keys)))
    except (KeyError, TypeError):
        ok = False
    if not ok:
        raise BadInput(f"{path}: a {KIND} result lacks figures (copy bandwidth, casts or ops)")
    return _as_current(doc)


def _main(argv: Sequence[str] | None) -> int:
    parser = ArgumentParser(prog="python -m numerics.layer.fast.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (Triton's interpreter: --quick only)")
    parser.add_argument("--iters", type=int, default=50, help="timed runs per figure (median; default 50)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed runs first (default 10)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="measurements of every figure, taken round each row's variants (default 3): the "
                        "report shows the median and the range")
    parser.add_argument("--quick", action="store_true", help="tiny shapes: a smoke run, not a measurement")
    parser.add_argument("--no-compile", dest="compile_", action="store_false", help="skip the torch.compile column")
    parser.add_argument("--sweep", action="store_true", help="also time other kernel tiles for each cast")
    parser.add_argument("--json", type=Path, help="also write the figures here (refuses an existing file)")
    parser.add_argument("--force", action="store_true", help="overwrite --json's file if it exists")
    args = parser.parse_args(argv)
    if args.iters < 1 or args.warmup < 0 or args.repeats < 1:
        raise CLIError(f"--iters and --repeats must be >= 1 and --warmup >= 0, got {args.iters}, {args.repeats} and "
                       f"{args.warmup}")
    if args.device not in ("cuda", "cpu") and not args.device.startswith("cuda:"):
        raise CLIError(f"--device must be cuda, cuda:N or cpu, got {args.device!r}")
    if args.device == "cpu" and not args.quick:
        raise CLIError("--device cpu runs the kernel in Triton's interpreter, far too slow for the full shapes; "
                       "add --quick for a smoke run")
    if args.json:
        check_writable(args.json, force=args.force)
    result = run(device=args.device, iters=args.iters, warmup=args.warmup, quick=args.quick, compile_=args.compile_,
                 sweep=args.sweep, repeats=args.repeats, progress=lambda s: print(s, file=sys.stderr, flush=True))
    print(format_report(result))
    if args.json:
        from numerics.environment import describe

        atomic_write(args.json, json.dumps(result | {"environment": describe()}, indent=1) + "\n", force=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
