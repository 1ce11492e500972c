"""Where one training step's time goes: ``python -m convergence profile-step``.

Public: ``KIND``, ``profile_step(...) -> (result, trace)``, ``reanalyse(trace) -> dict``, ``format_result(result)``,
``main(argv)``.

Builds the step ``convergence bench`` times (``convergence.train.perf.step``: model, recipe, kernel, optionally
compiled), runs ``warmup`` steps, times ``steps`` more without the profiler (``step_ms``: the profiler's own cost
stays out of it), then profiles ``steps`` steps with torch.profiler (CPU, and CUDA on a GPU), each inside a
``trace.STEP_MARK`` annotation, and reads the trace with ``convergence.train.perf.trace.analyse``: wall, GPU kernel
time, GPU idle (host-side time no GPU work covers), launches, synchronisations, and the time of casts, group
padding, GEMMs, attention, the optimizer and the rest, with the top kernels and host events. ``--stacks`` profiles
one step more with Python stacks (much slower on the host, so its times are not the step's), which tells group
padding from other copies and names the Python line behind each synchronisation (``with_stacks``). On a CPU the
GPU figures are null.

``--trace FILE.json.gz`` keeps the raw events (``traceEvents``, Perfetto and chrome://tracing open it) with the
run's settings; ``--from-trace FILE`` reads such a file again, on any machine, without running anything.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from convergence.train.perf import trace as trace_mod
from convergence.train.perf.step import build_step, graphs_note, seconds_per_step, sync
from numerics.errors import BadInput
from numerics.layer.configs import get_config

KIND = "convergence-profile-step"
VERSION = 1


def _record(step, steps: int, device: torch.device, *, with_stack: bool) -> list[dict]:
    """The trace events of ``steps`` steps, each inside a ``STEP_MARK`` annotation."""
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    with profile(activities=activities, with_stack=with_stack) as prof:
        for _ in range(steps):
            with record_function(trace_mod.STEP_MARK):
                step()
        sync(device)
    fd, tmp = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(tmp)
        return json.loads(Path(tmp).read_text())["traceEvents"]
    finally:
        os.unlink(tmp)


def profile_step(model: str, recipe: str, kernel: str | None, *, compile_: bool, batch: int, seq: int,
                 device: torch.device, warmup: int, steps: int, stacks: bool = False, top: int = 15,
                 progress=lambda s: None) -> tuple[dict, dict]:
    """(the result, the trace: its events and settings, as ``--trace`` writes it)."""
    from numerics.environment import describe

    settings = {"kind": KIND, "version": VERSION, "model": model, "recipe": recipe, "kernel": kernel,
                "compiled": compile_, "batch": batch, "seq": seq, "device": str(device), "warmup": warmup,
                "steps": steps, "environment": describe()}
    step = build_step(get_config(model), recipe, kernel, batch=batch, seq=seq, device=device, compile_=compile_)
    progress(f"built; {warmup} warm-up steps")
    for _ in range(warmup):
        step()
    settings["dynamo_graphs"] = step.compiled_graphs()
    step_s = seconds_per_step(step, steps, device)
    progress(f"{1e3 * step_s:.1f} ms/step unprofiled; profiling {steps} steps")
    events = _record(step, steps, device, with_stack=False)
    stack_events = None
    if stacks:
        progress("one step more with Python stacks")
        stack_events = _record(step, 1, device, with_stack=True)
    trace = {"mxval": settings | {"step_ms": 1e3 * step_s}, "traceEvents": events, "stackEvents": stack_events}
    return reanalyse(trace, top=top), trace


def reanalyse(trace: dict, *, top: int = 15) -> dict:
    """The result of a trace as ``--trace`` keeps it (its settings under ``mxval``)."""
    settings = trace.get("mxval") if isinstance(trace, dict) else None
    if not isinstance(settings, dict) or settings.get("kind") != KIND or not isinstance(trace.get("traceEvents"), list):
        raise BadInput(f"not a trace kept by python -m convergence profile-step --trace (no '{KIND}' settings)")
    gpu = settings["device"].startswith("cuda")
    result = settings | trace_mod.analyse(trace["traceEvents"], gpu=gpu, top=top)
    result["profiler_overhead"] = result["wall_ms"] / settings["step_ms"] if settings.get("step_ms") else None
    result["with_stacks"] = None
    if trace.get("stackEvents"):
        s = trace_mod.analyse(trace["stackEvents"], gpu=gpu, top=top)
        result["with_stacks"] = {k: s[k] for k in ("groups", "top_kernels", "top_host_ops", "syncs_by_caller")}
    return result


def format_result(r: dict) -> str:
    head = (f"{r['model']} {r['recipe']}{'' if r['kernel'] is None else ' (' + r['kernel'] + ')'}"
            f"{' compiled' if r['compiled'] else ''}, {r['batch']} x {r['seq']} tokens, {r['device']}: "
            f"{r['step_ms']:.1f} ms/step unprofiled")
    if r.get("dynamo_graphs") is not None:  # a trace kept before the count was recorded has none
        head += f"; {graphs_note(r['dynamo_graphs'])}"
    lines = [head, trace_mod.format_analysis(r)]
    if r["with_stacks"]:
        w = r["with_stacks"]
        lines += ["", "with Python stacks (one step; host times inflated by the stack recording):"]
        lines += [f"  {g:<10} GPU {trace_mod._ms(v['gpu_ms'])} ms, host self {trace_mod._ms(v['host_self_ms'])} ms"
                  for g, v in w["groups"].items()]
        if w["syncs_by_caller"]:
            lines += ["  synchronisations by caller:"]
            lines += [f"    {s['count']:>4.0f}  {s['caller'][:110]}" for s in w["syncs_by_caller"][:8]]
    return "\n".join(lines)


def _write_trace(path: Path, trace: dict, *, force: bool) -> None:
    from numerics.files import atomic_write

    data = json.dumps(trace).encode()
    atomic_write(path, gzip.compress(data, compresslevel=6) if path.suffix == ".gz" else data, force=force)


def _main(argv: Sequence[str] | None) -> int:
    from numerics.cli import ArgumentParser, CLIError
    from numerics.files import atomic_write, check_distinct, check_writable, file_bytes
    from numerics.layer.configs import CONFIGS
    from numerics.layer.mxfp8 import KERNELS, default_kernel, kernel_problem
    from numerics.layer.recipes import RECIPES

    p = ArgumentParser(prog="python -m convergence profile-step", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="proxy", help=f"one of {', '.join(CONFIGS)} (default proxy)")
    p.add_argument("--recipe", default="bf16", help=f"one of {', '.join(RECIPES)} (default bf16)")
    p.add_argument("--mxfp8-kernel", default="auto", choices=["auto", *KERNELS],
                   help="the MXFP8 recipes' kernel; auto: real on SM100, emulated elsewhere")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (compiled in the warm-up)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--warmup", type=int, default=3, help="steps before anything is timed (default 3)")
    p.add_argument("--steps", type=int, default=3, help="steps timed, then as many profiled (default 3)")
    p.add_argument("--stacks", action="store_true",
                   help="profile one step more with Python stacks: group padding told from other copies, each "
                   "synchronisation's Python line")
    p.add_argument("--top", type=int, default=15, help="kernels and host events listed in the JSON (default 15)")
    p.add_argument("--json", type=Path, help="write the result here, with versions and hardware")
    p.add_argument("--trace", type=Path, help="keep the trace's events here (.json or .json.gz)")
    p.add_argument("--from-trace", type=Path, metavar="TRACE",
                   help="read a trace kept with --trace again instead of running (the other settings are its own)")
    p.add_argument("--force", action="store_true", help="overwrite an existing --json or --trace file")
    args = p.parse_args(argv)
    if min(args.batch, args.seq, args.steps, args.top) <= 0 or args.warmup < 0:
        raise CLIError("--batch, --seq, --steps and --top must be > 0 and --warmup >= 0")
    outputs = {k: v for k, v in (("--json", args.json), ("--trace", args.trace)) if v is not None}
    check_distinct(inputs=[args.from_trace] if args.from_trace else (), **outputs)
    for path in outputs.values():
        check_writable(path, force=args.force)
    if args.from_trace is not None:
        if args.trace is not None:
            raise CLIError("--trace keeps a new profile's events; --from-trace reads kept ones")
        try:
            kept = json.loads(file_bytes(args.from_trace))
        except OSError as exc:
            raise CLIError(f"--from-trace {args.from_trace}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise CLIError(f"--from-trace {args.from_trace}: not JSON ({exc})") from None
        result = reanalyse(kept, top=args.top)
    else:
        if args.model not in CONFIGS:
            raise CLIError(f"unknown model {args.model!r}; choose from {', '.join(CONFIGS)}")
        if args.recipe not in RECIPES:
            raise CLIError(f"unknown recipe {args.recipe!r}; choose from {', '.join(RECIPES)}")
        if args.device == "cuda" and not torch.cuda.is_available():
            raise CLIError("--device cuda: no CUDA device is visible")
        device = torch.device(args.device)
        recipe = RECIPES[args.recipe]()
        kernel = None
        if recipe.mxfp8:
            kernel = default_kernel(device, recipe.op) if args.mxfp8_kernel == "auto" else args.mxfp8_kernel
            problem = recipe.op.kernel_problem(kernel)
            problem = f"{args.recipe} {problem}" if problem else kernel_problem(kernel, device, recipe.op)
            if problem:
                raise CLIError(f"--mxfp8-kernel {kernel}: {problem}")
        result, kept = profile_step(args.model, args.recipe, kernel, compile_=args.compile, batch=args.batch,
                                    seq=args.seq, device=device, warmup=args.warmup, steps=args.steps,
                                    stacks=args.stacks, top=args.top,
                                    progress=lambda s: print(s, file=sys.stderr, flush=True))
        if args.trace is not None:
            _write_trace(args.trace, kept, force=True)
            print(f"trace: {args.trace}")
    print(format_result(result))
    if args.json is not None:
        atomic_write(args.json, json.dumps(result, indent=1) + "\n", force=True)
        print(f"wrote {args.json}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from numerics.cli import run_main

    return run_main(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
