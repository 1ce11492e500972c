"""Host time of one fast MX cast on a GPU, split by where it goes: mxval's wrapper around the kernel, Triton's
launcher (argument binding, cache key, lookup), and the compiled kernel's own launch. The bench's item 6a
(docs/studies/bench.md) predicts ~0.15 ms a cast today and a target of ~0.03 ms; this says which part to cut.

Each figure is the mean host time of N calls on a tensor small enough that the GPU never holds the host back (its
kernels take a few microseconds; the launches take longer), the queue drained before and after:

  wrapper+launch  ``mx_dequantize(x)`` (or ``mx_dequantize_both``): what a step pays a cast today
  triton          the kernel called as mxval calls it (``kernel[grid](...)``) with the same arguments
  direct          the compiled kernel called with those arguments, no binding or lookup (``compiled[grid]``)
  torch.empty     one allocation of the result, for scale

and, compiled (``torch.compile`` of a function of the cast of both layouts, one call of it):
  triton op       ``mx_dequantize_both``: the kernel launched from inductor's code
  opaque op       the CPU's custom op called instead (``mxval::fast_mx_dequantize_both``): Python between
  one kernel      ``t * 2``, for scale: the compiled call's own cost (guards, wrapper, one launch)

Usage (on the GPU machine, from a tree's root, after ``source dev/gpu/env.sh``):
    python3 dev/gpu/launch_probe.py [--calls N] [--json FILE]
Without a CUDA GPU it says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch


def _per_call_us(fn, calls: int) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    return host / calls * 1e6


def _captured_launch(cast):
    """Run ``cast`` once with the kernel's launches recorded: (jit function, grid, args, kwargs) of the last one."""
    from numerics.layer.fast import kernel as K

    real, seen = K.cast_kernel, {}

    class Spy:
        def __init__(self, fn):
            self.fn = fn

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen.update(fn=self.fn, grid=grid, args=args, kwargs=kwargs)
                return self.fn[grid](*args, **kwargs)
            return launch

    K.cast_kernel = lambda device_type: Spy(real(device_type))
    try:
        cast()
    finally:
        K.cast_kernel = real
    torch.cuda.synchronize()
    return seen["fn"], seen["grid"], seen["args"], seen["kwargs"]


def probe(name: str, cast, calls: int) -> dict:
    fn, grid, args, kwargs = _captured_launch(cast)
    compiled = fn[grid](*args, **kwargs)  # JITFunction.run returns the compiled kernel it launched
    options = {k: kwargs[k] for k in ("num_warps", "num_stages", "num_ctas") if k in kwargs}
    bound = fn.signature.bind(*args, **{k: v for k, v in kwargs.items() if k not in options})
    bound.apply_defaults()
    values = list(bound.arguments.values())
    stream = torch.cuda.current_stream().cuda_stream
    runner = compiled[grid]
    row = {"cast": name,
           "wrapper_and_launch_us": _per_call_us(cast, calls),
           "triton_launch_us": _per_call_us(lambda: fn[grid](*args, **kwargs), calls),
           "direct_launch_us": _per_call_us(lambda: runner(*values, stream=stream), calls)}
    out_shape = args[1].shape
    row["torch_empty_us"] = _per_call_us(lambda: torch.empty(out_shape, dtype=torch.bfloat16, device="cuda"), calls)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("launch_probe.py: needs a CUDA GPU; none is visible", file=sys.stderr)
        return 2
    from numerics.layer.fast import cast as fast_cast

    x = torch.randn(256, 2048, device="cuda", dtype=torch.bfloat16)
    cases = {"dim -1": lambda: fast_cast.mx_dequantize(x), "dim -2": lambda: fast_cast.mx_dequantize(x, dim=-2)}
    if hasattr(fast_cast, "mx_dequantize_both"):  # trees with the one-launch cast of both layouts
        cases["both layouts"] = lambda: fast_cast.mx_dequantize_both(x)
    rows = [probe(name, cast, args.calls) for name, cast in cases.items()]
    print(f"host time a call, mean of {args.calls} ({torch.cuda.get_device_name()}, torch {torch.__version__}):")
    print(f"{'cast':<14}{'wrapper+launch':>16}{'triton':>10}{'direct':>10}{'torch.empty':>13}  (us)")
    for r in rows:
        print(f"{r['cast']:<14}{r['wrapper_and_launch_us']:>16.1f}{r['triton_launch_us']:>10.1f}"
              f"{r['direct_launch_us']:>10.1f}{r['torch_empty_us']:>13.1f}")
    compiled = {}
    if hasattr(fast_cast, "_dequantize_both_cuda_op"):  # trees whose compiled casts are triton ops
        opaque = fast_cast._dequantize_both_op
        for name, fn in (("triton op", lambda t: fast_cast.mx_dequantize_both(t)),
                         ("opaque op", lambda t: opaque(t, "e4m3", "rceil", "torchao", torch.bfloat16, None)),
                         ("one kernel", lambda t: t * 2)):
            run = torch.compile(fn, fullgraph=True)
            compiled[name] = _per_call_us(lambda run=run: run(x), args.calls)
        print("compiled, both layouts: " + ", ".join(f"{k} {v:.1f} us" for k, v in compiled.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "calls": args.calls,
                       "rows": rows, "compiled_us": compiled}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
