"""``python -m numerics.ep bench``: dispatch / combine latency and bandwidth, DeepEP vs NCCL.

    torchrun --nproc-per-node 2 -m numerics.ep bench --json results/ep-bench.json
    python -m numerics.ep bench --world 2 --backends reference --tokens 64    # CPU smoke run (gloo)

Shapes: ``v3`` (4096 tokens/rank, hidden 7168, top-8 of 256 experts) and ``16b`` (4096, 2048, top-6 of
64), uniform routing, BF16 and FP8 payloads. Ops: ``dispatch`` (layout + dispatch, what a training
step pays), ``dispatch_cached`` (along an earlier handle) and ``combine`` (bf16 only: combine always
sums bf16). Per op: the median over ``--iters`` timed calls on each rank (CUDA events; a barrier
before each call), the slowest rank's median as the latency. Bytes, per rank and averaged over ranks:
``logical`` counts every received row including those a rank sends itself, ``remote`` only rows that
cross a link. The NVLink limit is measured in the same run by a plain device-to-device peer copy of
1 GiB from GPU 0 to GPU 1 (one direction, and both at once). It prints a table and, with ``--json``,
writes it with ``numerics.environment.describe()``. A benchmark, never a timed assertion.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from numerics.cli import ArgumentParser, CLIError
from numerics.ep.backend import row_bytes
from numerics.ep.strategies import CaseSpec, make_combine_input, make_inputs

SHAPES = {  # name -> (tokens per rank, hidden, top-k, experts)
    "v3": (4096, 7168, 8, 256),
    "16b": (4096, 2048, 6, 64),
}


@dataclass(frozen=True)
class BenchTask:
    shape: str
    tokens: int
    payload: str
    backend: str  # "reference" or "deepep"
    num_sms: int | None = None


class BenchRunner:
    def __init__(self, rank: int, world: int, device: torch.device, *, warmup: int, iters: int,
                 max_num_sms: int | None, timeout_s: float, backends: Sequence[str]):
        from numerics.ep.reference import AllToAllReference

        self.rank, self.world, self.device = rank, world, device
        self.warmup, self.iters = warmup, iters
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.reference = AllToAllReference(device=device, timeout=self.timeout)
        self.deepep = None
        if "deepep" in backends:
            from numerics.ep.deepep import DeepEPBackend
            self.deepep = DeepEPBackend(num_sms=max_num_sms, max_hidden=max(s[1] for s in SHAPES.values()),
                                        timeout=self.timeout)

    def close(self) -> None:
        if self.deepep is not None:
            self.deepep.close()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def _time(self, fn) -> float:
        """Median milliseconds of ``fn`` over the timed iterations, after warm-up."""
        for _ in range(self.warmup):
            fn()
        self._sync()
        times = []
        for _ in range(self.iters):
            dist.barrier(async_op=True).wait(self.timeout)
            if self.device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append(1e3 * (time.perf_counter() - t0))
        return statistics.median(times)

    def __call__(self, task: BenchTask) -> dict[str, Any]:
        _, hidden, topk, experts = SHAPES[task.shape]
        spec = CaseSpec(world=self.world, seed=12345, tokens=(task.tokens,) * self.world, hidden=hidden,
                        topk=topk, num_experts=experts, payload=task.payload, specials=0.0)
        x, idx, w = make_inputs(spec, self.rank, self.device)
        ref = self.reference.dispatch(x, idx, w, experts)
        recv = sum(ref.handle.recv_counts)
        remote = recv - ref.handle.recv_counts[self.rank]
        backend = self.reference
        if task.backend == "deepep":
            backend = self.deepep
            backend.set_num_sms(task.num_sms or backend.max_num_sms)
        d = backend.dispatch(x, idx, w, experts)
        y = make_combine_input(spec, self.rank, recv, hidden, self.device)
        out = {"recv_rows": recv, "remote_rows": remote, "ms": {}}
        out["ms"]["dispatch"] = self._time(lambda: backend.dispatch(x, idx, w, experts))
        out["ms"]["dispatch_cached"] = self._time(lambda: backend.dispatch_cached(x, d.handle))
        if task.payload == "bf16":
            out["ms"]["combine"] = self._time(lambda: backend.combine(y, d.handle))
        return out


def peer_copy_gbps(nbytes: int = 1 << 30, iters: int = 10) -> dict[str, float] | None:
    """GB/s of a plain GPU0 -> GPU1 copy (and of both directions at once), or None without 2 GPUs."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return None
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    b = torch.empty(nbytes, dtype=torch.uint8, device="cuda:1")
    a2 = torch.empty_like(a)
    b2 = torch.empty_like(b)
    s0, s1 = torch.cuda.Stream(device=0), torch.cuda.Stream(device=1)

    def one_way():
        with torch.cuda.stream(s0):
            b.copy_(a, non_blocking=True)

    def both_ways():
        with torch.cuda.stream(s0):
            b.copy_(a, non_blocking=True)
        with torch.cuda.stream(s1):
            a2.copy_(b2, non_blocking=True)

    result = {}
    for name, fn, moved in (("one_way", one_way, nbytes), ("both_ways", both_ways, 2 * nbytes)):
        fn()
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        result[f"{name}_gbps"] = round(moved * iters / (time.perf_counter() - t0) / 1e9, 1)
    return result


def summarize(tasks: list[BenchTask], results: list[list[dict]], world: int, peer: dict | None) -> list[dict]:
    rows = []
    nccl_ms = {}
    for task, per_rank in zip(tasks, results):
        _, hidden, topk, experts = SHAPES[task.shape]
        fp8 = task.payload == "fp8"
        for op in per_rank[0]["ms"]:
            ms = max(r["ms"][op] for r in per_rank)
            width = 2 * hidden if op == "combine" else row_bytes(hidden, fp8)
            logical = statistics.mean(r["recv_rows"] for r in per_rank) * width
            remote = statistics.mean(r["remote_rows"] for r in per_rank) * width
            key = (task.shape, task.payload, op)
            if task.backend == "reference":
                nccl_ms[key] = ms
            row = {"shape": task.shape, "tokens": task.tokens, "hidden": hidden, "topk": topk,
                   "experts": experts, "payload": task.payload, "op": op, "backend": task.backend,
                   "num_sms": task.num_sms, "ms": round(ms, 4), "logical_gbps": round(logical / ms / 1e6, 1),
                   "remote_gbps": round(remote / ms / 1e6, 1), "logical_bytes": int(logical),
                   "remote_bytes": int(remote)}
            if peer:
                row["remote_pct_of_peer_copy"] = round(100 * row["remote_gbps"] / peer["one_way_gbps"], 1)
            rows.append(row)
    for row in rows:
        ref = nccl_ms.get((row["shape"], row["payload"], row["op"]))
        row["vs_reference"] = round(row["ms"] / ref, 3) if ref else None
    return rows


def format_table(rows: list[dict], peer: dict | None) -> str:
    head = (f"{'shape':<5} {'payload':<7} {'op':<15} {'backend':<12} {'ms':>8} {'logical GB/s':>12} "
            f"{'remote GB/s':>11} {'% peer':>6} {'x NCCL':>7}")
    lines = [head]
    for r in rows:
        name = r["backend"] + (f"/{r['num_sms']}sm" if r["num_sms"] else "")
        pct = r.get("remote_pct_of_peer_copy")
        lines.append(f"{r['shape']:<5} {r['payload']:<7} {r['op']:<15} {name:<12} {r['ms']:>8.3f} "
                     f"{r['logical_gbps']:>12.1f} {r['remote_gbps']:>11.1f} "
                     f"{'' if pct is None else f'{pct:.0f}':>6} {r['vs_reference'] or 0:>7.2f}")
    if peer:
        lines.append(f"NVLink limit (peer copy GPU0->GPU1, 1 GiB): {peer['one_way_gbps']} GB/s one way, "
                     f"{peer['both_ways_gbps']} GB/s both ways together")
    else:
        lines.append("NVLink limit: not measured (needs 2 visible GPUs)")
    return "\n".join(lines)


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m numerics.ep bench", description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="v3,16b")
    p.add_argument("--payload", default="bf16,fp8")
    p.add_argument("--backends", default="reference,deepep")
    p.add_argument("--num-sms", default="20,64", help="DeepEP SM counts to sweep (even)")
    p.add_argument("--tokens", type=int, default=4096, help="tokens per rank")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--world", type=int, default=2, help="ranks to spawn when not under torchrun")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--force", action="store_true", help="overwrite --json if it exists")
    return p


def _list(text: str, allowed: Sequence[str], what: str) -> list[str]:
    vals = [v for v in text.split(",") if v]
    if not vals or any(v not in allowed for v in vals):
        raise CLIError(f"--{what} {text!r}: choose from {', '.join(allowed)}")
    return vals


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    shapes = _list(args.shapes, list(SHAPES), "shapes")
    payloads = _list(args.payload, ["bf16", "fp8"], "payload")
    backends = _list(args.backends, ["reference", "deepep"], "backends")
    try:
        sms = sorted({int(v) for v in args.num_sms.split(",") if v})
    except ValueError:
        raise CLIError(f"--num-sms {args.num_sms!r} is not a list of even integers") from None
    if not sms or any(v <= 0 or v % 2 for v in sms):
        raise CLIError(f"--num-sms {args.num_sms!r}: DeepEP needs positive even SM counts")
    if args.tokens < 1 or args.iters < 1 or args.warmup < 0:
        raise CLIError("--tokens and --iters must be >= 1, --warmup >= 0")
    if args.json and args.json.exists() and not args.force:
        raise CLIError(f"{args.json} exists; pass --force to overwrite it")
    if "deepep" in backends:
        from numerics.ep.deepep import import_deep_ep
        try:
            import_deep_ep()
        except ImportError as exc:
            raise CLIError(f"{exc} (or pass --backends reference)") from None
    tasks = [BenchTask(s, args.tokens, p, "reference") for s in shapes for p in payloads]
    if "deepep" in backends:
        tasks += [BenchTask(s, args.tokens, p, "deepep", n) for s in shapes for p in payloads for n in sms]
    kwargs = {"warmup": args.warmup, "iters": args.iters, "max_num_sms": max(sms), "timeout_s": args.timeout,
              "backends": backends}
    factory = "numerics.ep.bench:BenchRunner"
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        from numerics.ep.launch import lead_under_torchrun

        def lead(run, world: int, device):
            return world, peer_copy_gbps(), _drive(run, tasks), "nccl" if device.type == "cuda" else "gloo"

        led = lead_under_torchrun(factory, kwargs, args.timeout, lead)
        if led is None:  # a serving rank
            return 0
        world, peer, results, comm = led
    else:
        if args.world < 2:
            raise CLIError("--world must be >= 2")
        from numerics.ep.launch import Session

        world = args.world
        on_gpu = torch.cuda.is_available() and torch.cuda.device_count() >= world
        if "deepep" in backends and not on_gpu:
            raise CLIError(f"DeepEP needs {world} CUDA GPUs, found {torch.cuda.device_count()}")
        comm = "nccl" if on_gpu else "gloo"
        peer = peer_copy_gbps()
        with Session(world, factory, kwargs, comm=comm, timeout_s=args.timeout) as session:
            results = _drive(session.run, tasks)
    return _report(args, tasks, results, world, comm, peer)


def _drive(run, tasks: list[BenchTask]) -> list[list[dict]]:
    results = []
    for i, task in enumerate(tasks):
        per_rank = run(task)
        errors = [f"rank {r}: {res['error']}" for r, res in enumerate(per_rank) if "error" in res]
        if errors:
            raise RuntimeError(f"bench task {task} failed: {errors[0]}")
        results.append(per_rank)
        print(f"  {i + 1}/{len(tasks)} {task.shape} {task.payload} {task.backend}"
              f"{'/' + str(task.num_sms) + 'sm' if task.num_sms else ''}", file=sys.stderr, flush=True)
    return results


def _report(args, tasks, results, world: int, comm: str, peer: dict | None) -> int:
    from numerics.environment import describe

    rows = summarize(tasks, results, world, peer)
    print(format_table(rows, peer))
    if args.json:
        doc = {"kind": "ep-bench", "version": 1, "world": world, "comm_backend": comm,
               "method": "median of --iters calls per rank after --warmup, barrier before each; slowest rank",
               "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               "tasks": [asdict(t) for t in tasks], "peer_copy": peer, "rows": rows, "environment": describe()}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0
