"""``python -m numerics.ep bench``: dispatch / combine time and bandwidth, DeepEP vs NCCL, vs the NVLink limit.

    torchrun --nproc-per-node 2 -m numerics.ep bench --json results/ep-bench.json
    python -m numerics.ep bench --world 2 --backends nccl,reference --tokens 64 --iters 5   # CPU (gloo)

Shapes: ``v3`` (4096 tokens/rank, hidden 7168, top-8 of 256 experts) and ``16b`` (4096, 2048, top-6 of
64), uniform routing, BF16 and FP8 payloads. What each row times:

* ``nccl``: a bare ``all_to_all_single`` of the payload rows along the case's routing (the floor any
  all-to-all path pays): ``dispatch_cached`` (rows out) and ``combine`` (bf16 rows back).
* ``reference``: ``AllToAllReference`` with its bookkeeping (layout, count exchange, packing, metadata).
* ``deepep`` (V1 ``Buffer``) and ``deepep-v2`` (V2 ``ElasticBuffer``, ``deterministic=False``, DeepEP's
  default) at each ``--num-sms``: ``dispatch`` (layout + dispatch, DeepEP's own CPU sync included),
  ``dispatch_cached`` (along a handle) and ``combine`` (bf16).

Every backend is timed as built by ``numerics.ep.backends.make_backend(validate=False)``: the inputs
are checked once by a validating call, never inside the timed calls. Timing: after ``--warmup``
calls, the ranks synchronise (device sync and a gloo barrier), then ``--iters`` calls run back to back,
each between two CUDA events on the current stream (GPU) or two ``perf_counter`` readings (CPU); a rank's
figure is the median per-call time, the row's is the slowest rank's median (the mean, first start to
last end over the calls, is kept too). Bytes per rank, averaged over ranks: ``logical`` counts every
received row including those a rank sends itself, ``remote`` only rows that cross a link. The NVLink
limit is measured in the same run, as an independent measurement on H200s did: rank 0 copies 1 GiB from GPU 0
to GPU 1 (and both ways at once), 3 warm-ups then 10 timed copies, synchronised wall clock, while the
other ranks wait on the CPU. A benchmark: it prints a table (and ``--json``), it asserts nothing.

What stays out of the timed window, and why. Each of these, inside it, moves the figures far from
independent measurement on the same machine kind (measured on 2 x H200 with DeepEP v1.2.1: peer copy 238.8
GB/s against 372.7; DeepEP at 20 SMs 0.82 ms cached and 1.2-1.5 ms full dispatch against 0.412 cached; the
reference's dispatch 6.1 ms against 0.224 for a bare all-to-all):

1. Input checks: a collective check is an NCCL all-gather plus host syncs (``int(topk_idx.min())``,
   ``.tolist()``); the timed calls go through backends built with ``validate=False``.
2. ``work.wait(timeout)`` on NCCL makes the CPU poll with 1 ms sleeps (PyTorch's ``WorkNCCL::wait``,
   ``kSynchronizeBusyWaitMillis = 1``): up to 1 ms per collective while the GPU idles in the window, four
   of them in the reference's dispatch. On CUDA the stream waits instead (``numerics.ep.backend``).
3. A barrier before every call and events around that single call make each call start from an idle GPU
   and pay its launch latency, and the median of 20 such calls is noisy (the 20- and 64-SM rows come out
   in the wrong order for several ops): the calls run back to back between events, ``QUOTABLE_ITERS`` of them.
4. A peer copy timed on rank 0 while rank 1 waits for the next task inside an NCCL broadcast (a kernel
   spinning on GPU 1): torch's cross-device ``copy_`` records and waits on events on GPU 1's stream in rank
   0's context, and a GPU time-slices between processes' contexts, so each copy waits for a time slice
   behind that kernel (1 GiB in 4.5 ms instead of 2.9; "both ways" the same 4.5 ms per step for twice the
   bytes, as a fixed wait per step gives). Control messages travel over gloo (``numerics.ep.launch``), so no
   rank waits in a GPU kernel while another is timed; this bench measures 373-394 GB/s.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from numerics.cli import ArgumentParser, CLIError
from numerics.ep.backend import MAX_TOKENS, row_bytes
from numerics.ep.backends import make_backend, require
from numerics.ep.strategies import CaseSpec, make_combine_input, make_inputs
from numerics.errors import BadInput
from numerics.files import atomic_write, check_creatable

SHAPES = {  # name -> (tokens per rank, hidden, top-k, experts)
    "v3": (4096, 7168, 8, 256),
    "16b": (4096, 2048, 6, 64),
}
BACKEND_NAMES = ("nccl", "reference", "deepep", "deepep-v2")
QUOTABLE_ITERS = 50  # fewer timed calls per op and the median moves by more than the effects compared
PEER_COPY = {"nbytes": 1 << 30, "warmup": 3, "iters": 10}  # as the independent H200 measurement it is compared with


@dataclass(frozen=True)
class BenchTask:
    shape: str
    tokens: int
    payload: str
    backend: str  # one of BACKEND_NAMES
    num_sms: int | None = None


@dataclass(frozen=True)
class PeerCopyTask:
    nbytes: int = PEER_COPY["nbytes"]


class BenchRunner:
    """One per rank: builds every backend once (``validate=False``), then times tasks."""

    def __init__(self, rank: int, world: int, device: torch.device, *, warmup: int, iters: int,
                 max_num_sms: int | None, timeout_s: float, backends: Sequence[str]):
        from numerics.ep.launch import control_group

        self.rank, self.world, self.device = rank, world, device
        self.warmup, self.iters = warmup, iters
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.control = control_group(self.timeout)  # CPU barriers: no GPU kernel waits while another times
        hidden = max(s[1] for s in SHAPES.values())
        self.checker = make_backend("reference", device=device, timeout=self.timeout)  # validates, routes
        self.backends = {}
        for name in backends:
            if name != "nccl":
                self.backends[name] = make_backend(name, device=device, timeout=self.timeout, validate=False,
                                                   num_sms=max_num_sms, max_hidden=hidden, deterministic=False)

    def close(self) -> None:
        for backend in self.backends.values():
            backend.close()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier(group=self.control)

    def _time(self, fn: Callable[[], Any]) -> dict[str, float]:
        """Per-call milliseconds of ``fn``: median, mean (first start to last end / iters), min, max."""
        for _ in range(self.warmup):
            fn()
        self._sync()
        if self.device.type == "cuda":
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(self.iters)]
            for start, end in events:
                start.record()
                fn()
                end.record()
            torch.cuda.synchronize()
            times = [s.elapsed_time(e) for s, e in events]
            total = events[0][0].elapsed_time(events[-1][1])
        else:
            times, t0 = [], time.perf_counter()
            for _ in range(self.iters):
                t = time.perf_counter()
                fn()
                times.append(1e3 * (time.perf_counter() - t))
            total = 1e3 * (time.perf_counter() - t0)
        return {"median": statistics.median(times), "mean": total / self.iters, "min": min(times),
                "max": max(times)}

    def __call__(self, task: BenchTask | PeerCopyTask) -> dict[str, Any]:
        if isinstance(task, PeerCopyTask):
            return {"peer_copy": peer_copy_gbps(task.nbytes) if self.rank == 0 else None}
        _, hidden, topk, experts = SHAPES[task.shape]
        spec = CaseSpec(world=self.world, seed=12345, tokens=(task.tokens,) * self.world, hidden=hidden,
                        topk=topk, num_experts=experts, payload=task.payload, specials=0.0)
        x, idx, w = make_inputs(spec, self.rank, self.device)
        routed = self.checker.dispatch(x, idx, w, experts)  # validates the inputs once, outside any timing
        h = routed.handle
        recv = sum(h.recv_counts)
        y = make_combine_input(spec, self.rank, recv, hidden, self.device)
        out = {"recv_rows": recv, "remote_rows": recv - h.recv_counts[self.rank], "ms": {}}
        if task.backend == "nccl":
            out["ms"] = self._time_floor(x, y, h, combine=task.payload == "bf16")
            return out
        backend = self.backends[task.backend]
        if task.num_sms is not None:
            backend.set_num_sms(task.num_sms)
        d = backend.dispatch(x, idx, w, experts)
        out["ms"]["dispatch"] = self._time(lambda: backend.dispatch(x, idx, w, experts))
        out["ms"]["dispatch_cached"] = self._time(lambda: backend.dispatch_cached(x, d.handle))
        if task.payload == "bf16":
            out["ms"]["combine"] = self._time(lambda: backend.combine(y, d.handle))
        return out

    def _time_floor(self, x: Any, y: torch.Tensor, handle: Any, *, combine: bool) -> dict[str, dict[str, float]]:
        """A bare all_to_all_single of the rows the routing moves: out (payload) and back (bf16)."""
        from numerics.ep.reference import _as_bytes, _pack_payload

        group = self.checker.group
        send = _pack_payload(x)[handle.send_index].contiguous()
        recv = torch.empty((sum(handle.recv_counts), send.shape[1]), dtype=send.dtype, device=send.device)
        back_send = _as_bytes(y)
        back = torch.empty((sum(handle.send_counts), back_send.shape[1]), dtype=torch.uint8, device=y.device)
        ms = {"dispatch_cached": self._time(lambda: dist.all_to_all_single(
            recv, send, handle.recv_counts, handle.send_counts, group=group))}
        if combine:  # as for the backends: a combine always moves bf16 rows, timed with the bf16 payload
            ms["combine"] = self._time(lambda: dist.all_to_all_single(
                back, back_send, handle.send_counts, handle.recv_counts, group=group))
        return ms


def peer_copy_gbps(nbytes: int = PEER_COPY["nbytes"]) -> dict[str, float] | None:
    """GB/s of a plain GPU0 -> GPU1 copy (and of both directions at once), or None without 2 GPUs."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return None
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    b = torch.empty(nbytes, dtype=torch.uint8, device="cuda:1")
    a2, b2 = torch.empty_like(a), torch.empty_like(b)
    s0, s1 = torch.cuda.Stream(device=0), torch.cuda.Stream(device=1)

    def one_way():
        with torch.cuda.stream(s0):
            b.copy_(a, non_blocking=True)

    def both_ways():
        one_way()
        with torch.cuda.stream(s1):
            a2.copy_(b2, non_blocking=True)

    def sync():
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)

    result = {"nbytes": nbytes, "iters": PEER_COPY["iters"], "warmup": PEER_COPY["warmup"]}
    for name, fn, moved in (("one_way", one_way, nbytes), ("both_ways", both_ways, 2 * nbytes)):
        for _ in range(PEER_COPY["warmup"]):
            fn()
        sync()
        t0 = time.perf_counter()
        for _ in range(PEER_COPY["iters"]):
            fn()
        sync()
        result[f"{name}_gbps"] = round(moved * PEER_COPY["iters"] / (time.perf_counter() - t0) / 1e9, 1)
    return result


def summarize(tasks: list[BenchTask], results: list[list[dict]], peer: dict | None) -> list[dict]:
    rows = []
    floor: dict[tuple[str, str, str], float] = {}
    for task, per_rank in zip(tasks, results):
        _, hidden, topk, experts = SHAPES[task.shape]
        for op in per_rank[0]["ms"]:
            ms = max(r["ms"][op]["median"] for r in per_rank)
            mean = max(r["ms"][op]["mean"] for r in per_rank)
            width = 2 * hidden if op == "combine" else row_bytes(hidden, task.payload == "fp8")
            logical = statistics.mean(r["recv_rows"] for r in per_rank) * width
            remote = statistics.mean(r["remote_rows"] for r in per_rank) * width
            if task.backend == "nccl":
                floor[(task.shape, task.payload, op)] = ms
            row = {"shape": task.shape, "tokens": task.tokens, "hidden": hidden, "topk": topk, "experts": experts,
                   "payload": task.payload, "op": op, "backend": task.backend, "num_sms": task.num_sms,
                   "ms": round(ms, 4), "mean_ms": round(mean, 4), "logical_gbps": round(logical / ms / 1e6, 1),
                   "remote_gbps": round(remote / ms / 1e6, 1), "logical_bytes": int(logical),
                   "remote_bytes": int(remote)}
            if peer:
                row["remote_pct_of_peer_copy"] = round(100 * row["remote_gbps"] / peer["one_way_gbps"], 1)
            rows.append(row)
    for row in rows:  # both dispatch ops move what the floor's bare all-to-all moves
        ref = floor.get((row["shape"], row["payload"], "combine" if row["op"] == "combine" else "dispatch_cached"))
        row["vs_floor"] = round(row["ms"] / ref, 3) if ref else None
    return rows


def format_table(rows: list[dict], peer: dict | None, iters: int | None = None) -> str:
    head = (f"{'shape':<5} {'payload':<7} {'op':<15} {'backend':<15} {'ms':>8} {'mean ms':>8} {'logical GB/s':>12} "
            f"{'remote GB/s':>11} {'% peer':>6} {'x floor':>7}")
    lines = [head]
    for r in rows:
        name = r["backend"] + (f"/{r['num_sms']}sm" if r["num_sms"] else "")
        pct = r.get("remote_pct_of_peer_copy")
        ratio = r.get("vs_floor", r.get("vs_reference"))
        lines.append(f"{r['shape']:<5} {r['payload']:<7} {r['op']:<15} {name:<15} {r['ms']:>8.3f} "
                     f"{r.get('mean_ms', r['ms']):>8.3f} {r['logical_gbps']:>12.1f} {r['remote_gbps']:>11.1f} "
                     f"{'' if pct is None else f'{pct:.0f}':>6} {'' if ratio is None else f'{ratio:.2f}':>7}")
    if peer:
        lines.append(f"NVLink limit (peer copy GPU0->GPU1, 1 GiB, 10 timed after 3 warm-ups): {peer['one_way_gbps']} "
                     f"GB/s one way, {peer['both_ways_gbps']} GB/s both ways together")
    else:
        lines.append("NVLink limit: not measured (needs 2 visible GPUs)")
    lines.append("ms: median per call, slowest rank; x floor: against a bare all_to_all_single of the same rows "
                 "(row nccl; NCCL on GPUs, gloo on CPUs)")
    if iters is not None and iters < QUOTABLE_ITERS:
        lines.append(f"{iters} timed calls per op (< {QUOTABLE_ITERS}): a smoke run, not figures to quote")
    return "\n".join(lines)


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m numerics.ep bench", description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="v3,16b")
    p.add_argument("--payload", default="bf16,fp8")
    p.add_argument("--backends", default="nccl,reference,deepep", help=", ".join(BACKEND_NAMES))
    p.add_argument("--num-sms", default="20,24,32,64", help="DeepEP SM counts to sweep (even)")
    p.add_argument("--tokens", type=int, default=4096, help="tokens per rank")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=QUOTABLE_ITERS,
                   help=f"timed calls per op (quote only >= {QUOTABLE_ITERS})")
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


def plan(args, world: int) -> tuple[list[Any], dict]:
    """Tasks and runner arguments from the options; CLIError (one line, exit 2) on anything bad."""
    shapes = _list(args.shapes, list(SHAPES), "shapes")
    payloads = _list(args.payload, ["bf16", "fp8"], "payload")
    backends = _list(args.backends, BACKEND_NAMES, "backends")
    try:
        sms = sorted({int(v) for v in args.num_sms.split(",") if v})
    except ValueError:
        raise CLIError(f"--num-sms {args.num_sms!r} is not a list of even integers") from None
    if not sms or any(v <= 0 or v % 2 for v in sms):
        raise CLIError(f"--num-sms {args.num_sms!r}: DeepEP needs positive even SM counts")
    if not 1 <= args.tokens <= MAX_TOKENS or args.iters < 1 or args.warmup < 0 or not 0 < args.timeout < math.inf:
        raise CLIError(f"--tokens must be in [1, {MAX_TOKENS}], --iters >= 1, --warmup >= 0, --timeout > 0")
    if world < 2:
        raise CLIError(f"--world {world}: the communication level needs at least 2 ranks")
    odd = [s for s in shapes if SHAPES[s][3] % world]
    if odd:
        raise CLIError(f"--world {world} does not divide the experts of shape {odd[0]} ({SHAPES[odd[0]][3]})")
    if args.json:
        check_creatable(args.json, force=args.force)
    for name in backends:
        if name in ("deepep", "deepep-v2"):
            require(name, world=world)
    tasks: list[Any] = [BenchTask(s, args.tokens, p, b) for s in shapes for p in payloads
                        for b in backends if b in ("nccl", "reference")]
    tasks += [BenchTask(s, args.tokens, p, b, n) for s in shapes for p in payloads
              for b in backends if b.startswith("deepep") for n in sms]
    kwargs = {"warmup": args.warmup, "iters": args.iters, "max_num_sms": max(sms), "timeout_s": args.timeout,
              "backends": backends}
    return tasks, kwargs


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun else args.world
    try:
        tasks, kwargs = plan(args, world)
    except BadInput:
        if under_torchrun and os.environ["RANK"] != "0":
            return 2  # rank 0 prints the one line; every rank stops before any process group exists
        raise
    factory = "numerics.ep.bench:BenchRunner"
    if under_torchrun:
        from numerics.ep.launch import lead_under_torchrun

        def lead(run, world: int, device):
            return _drive(run, tasks), "nccl" if device.type == "cuda" else "gloo"

        led = lead_under_torchrun(factory, kwargs, args.timeout, lead)
        if led is None:  # a serving rank
            return 0
        (peer, results), comm = led
    else:
        from numerics.ep.launch import Session

        on_gpu = torch.cuda.is_available() and torch.cuda.device_count() >= world
        comm = "nccl" if on_gpu else "gloo"
        with Session(world, factory, kwargs, comm=comm, timeout_s=args.timeout) as session:
            peer, results = _drive(session.run, tasks)
    return _report(args, tasks, results, world, comm, peer)


def _drive(run, tasks: list[BenchTask]) -> tuple[dict | None, list[list[dict]]]:
    """The peer copy first (rank 0 copies, the others wait on the CPU), then every task in order."""
    first = run(PeerCopyTask())[0]
    if "error" in first:
        raise RuntimeError(f"peer copy failed on rank 0: {first['error']}")
    peer = first.get("peer_copy")
    results = []
    for i, task in enumerate(tasks):
        per_rank = run(task)
        errors = [f"rank {r}: {res['error']}" for r, res in enumerate(per_rank) if "error" in res]
        if errors:
            raise RuntimeError(f"bench task {task} failed: {errors[0]}")
        results.append(per_rank)
        print(f"  {i + 1}/{len(tasks)} {task.shape} {task.payload} {task.backend}"
              f"{'/' + str(task.num_sms) + 'sm' if task.num_sms else ''}", file=sys.stderr, flush=True)
    return peer, results


def _report(args, tasks, results, world: int, comm: str, peer: dict | None) -> int:
    from numerics.environment import describe

    rows = summarize(tasks, results, peer)
    print(format_table(rows, peer, args.iters))
    if args.json:
        doc = {"kind": "ep-bench", "version": 2, "world": world, "comm_backend": comm,
               "method": (f"per call CUDA events (GPU) or perf_counter (CPU), {args.iters} calls back to back after "
                          f"{args.warmup} warm-ups and a device sync + gloo barrier; median per rank, slowest rank; "
                          "backends built with validate=False; peer copy 1 GiB, 10 timed after 3 warm-ups, "
                          "synchronised wall clock, other ranks idle on the CPU"),
               "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               "tasks": [asdict(t) for t in tasks], "peer_copy": peer, "rows": rows, "environment": describe()}
        if any(t.backend.startswith("deepep") for t in tasks):
            from numerics.ep.deepep import describe_deep_ep
            doc["deep_ep"] = describe_deep_ep()
        args.json.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(args.json, json.dumps(doc, indent=1) + "\n", force=True)  # check_creatable asked for --force
        print(f"wrote {args.json}")
    return 0
