"""A torch.profiler trace of training steps, read as where their time goes.

Public: ``STEP_MARK``, ``GROUPS``, ``group_of(frames, kernel=None)``, ``analyse(events, *, gpu, top=15) -> dict``,
``format_analysis(result) -> str``.

``events`` are the trace's ``traceEvents`` as ``torch.profiler.profile.export_chrome_trace`` writes them (the
Chrome trace format kineto emits: host events ``cpu_op``, ``user_annotation``, ``python_function`` (with
``with_stack``), ``cuda_runtime``, ``cuda_driver``; device events ``kernel``, ``gpu_memcpy``, ``gpu_memset``; a
launch and its kernel share ``args.correlation``). Each step is a ``STEP_MARK`` annotation; the window runs from
the first step's start to the later of the last step's end and the last device event, and every figure is per step
(totals over the window divided by the number of steps):

* wall: the window; GPU kernel time: the kernels' durations summed; GPU busy: the union of kernels, copies and
  sets on every stream; GPU idle: the window less busy, the host-side time no GPU work covers (a step that waits
  on its host launches, or on a synchronisation, shows it here), with its gaps counted by length;
* launches: kernels run; synchronisations: the host calls that wait for the device (``SYNC_CALLS``: ``.item()``,
  ``.tolist()`` and ``.cpu()`` of a CUDA tensor each end in one), their wait, device-to-host copies, and host-to-
  device copies from pageable memory (CUDA makes the host wait for those);
* each idle gap charged to the group of the device work that ended it (``idle_before``: what the GPU waited to be
  given; the last gap of the window, after all GPU work, has its own key), and to the host frames that launched
  that work (``idle_before_caller``, as synchronisations are named: where a step's host falls behind its GPU);
* what the time belongs to (``GROUPS``): a kernel by its own name when that names a library kernel, else by the
  host frames around its launch (``group_of``); the top kernels and the top host events by self time, each with
  its group; the synchronisations by the host frames that made them.

Host frames nest by start time on each thread: the innermost event that has started and not ended encloses the next
event, so a launch's frames are the operator that made it, that operator's caller, and so on out to the step; with
``with_stack`` they include the Python functions (torchao's ``torch_pad_token_groups``, the fast ops' ``padding.pad``,
the fast cast's ``mx_dequantize``), which is what tells group padding from other copies: in a trace without Python
functions its copies count as ``other`` and the ``padding`` group's figures are None (unknown, not 0). On a CPU-only
trace the GPU figures are None and the groups hold host time only.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from numerics.errors import BadInput

STEP_MARK = "mxval::step"  # the record_function around each profiled step
GROUPS = ("cast", "padding", "gemm", "attention", "optimizer", "other")
HOST_CATS = {"cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver"}
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
# host calls that block until the device has finished work already queued (CUDA runtime and driver names)
SYNC_CALLS = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", "cuMemcpyDtoH_v2"}
LAUNCH_CALLS = re.compile(r"^(cudaLaunchKernel|cudaLaunchKernelExC|cuLaunchKernel|cuLaunchKernelEx|"
                          r"cudaLaunchCooperativeKernel|cudaGraphLaunch)")
# a kernel whose name says what it is (checked first, in this order)
KERNEL_NAMES = (("cast", re.compile(r"_mx_cast")),  # numerics.layer.fast.kernel's Triton kernel
                ("gemm", re.compile(r"gemm|nvjet|xmma|cutlass|cublas|wgmma", re.I)),
                ("attention", re.compile(r"flash|fmha|attention", re.I)),
                ("optimizer", re.compile(r"adam|multi_tensor_apply", re.I)))
# else by the host frames around the launch: group padding (pad and unpad, called from inside the MXFP8 ops: torchao's,
# and the fast ops' numerics/layer/fast/padding.py); attention's operators (on a CPU its GEMMs are plain bmm); a GEMM
# by the operator that launched it (the innermost operator only: the copies autocast makes inside aten::linear are
# not GEMMs); the casts (the fast cast, torchao's to_mx, and what its MXFP8 ops do besides their GEMMs: transposing
# copies, dequantization); the optimizer's annotation and operators; the rest is "other"
PADDING_FRAMES = re.compile(r"pad_token_groups|fast/padding\.py")
ATTENTION_FRAMES = re.compile(r"scaled_dot_product|flash_attention|efficient_attention|cudnn_attention")
GEMM_OPS = re.compile(r"^aten::(mm|addmm|bmm|baddbmm|_grouped_mm|_scaled_mm|_scaled_grouped_mm)$")
CAST_FRAMES = re.compile(r"mxval::fast_mx_dequantize|fast/cast\.py|mx_formats/|"
                         r"moe_training/mxfp8_(grouped_mm|linear)\.py")
OPTIMIZER_FRAMES = re.compile(r"^Optimizer\.|adam|torch/optim/", re.I)
# CUPTI may name a call with its API version or per-thread-stream variant (cudaStreamSynchronize_v3020, _ptsz)
_SUFFIX = re.compile(r"(_v\d+|_ptsz|_ptds)+$")
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")  # a Python frame of a C method names its object's address
GAPS = ((0.0, 10.0, "<10us"), (10.0, 100.0, "10-100us"), (100.0, 1000.0, "0.1-1ms"), (1000.0, float("inf"), ">=1ms"))


@dataclass
class _Host:
    name: str
    cat: str
    ts: float
    end: float
    corr: object = None  # args.correlation: a launch's link to its kernel
    parent: _Host | None = None
    child_us: float = 0.0

    def ancestry(self) -> list[_Host]:
        """This event and those enclosing it, innermost first."""
        out, e = [], self
        while e is not None:
            out.append(e)
            e = e.parent
        return out


def group_of(frames: Sequence[tuple[str, str]], kernel: str | None = None) -> str:
    """The group of a kernel (by ``kernel``, its name) or of host work, from ``frames``: (category, name) of the
    host events around it, innermost first."""
    if kernel is not None:
        for group, pattern in KERNEL_NAMES:
            if pattern.search(kernel):
                return group
    names = [name for cat, name in frames if not (cat == "user_annotation" and name == STEP_MARK)]
    innermost_op = next((name for cat, name in frames if cat == "cpu_op"), None)
    for group, pattern in (("padding", PADDING_FRAMES), ("attention", ATTENTION_FRAMES)):
        if any(pattern.search(n) for n in names):
            return group
    if innermost_op is not None and GEMM_OPS.match(innermost_op):
        return "gemm"
    for group, pattern in (("cast", CAST_FRAMES), ("optimizer", OPTIMIZER_FRAMES)):
        if any(pattern.search(n) for n in names):
            return group
    return "other"


def _x_events(events: Iterable[dict]) -> list[dict]:
    return [e for e in events if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))
            and isinstance(e.get("dur"), (int, float))]


def _nest(host: list[dict]) -> list[_Host]:
    """Host events as ``_Host``, each with its enclosing event on its thread (by start time) and its children's
    total duration."""
    by_thread: dict[tuple, list[dict]] = defaultdict(list)
    for e in host:
        by_thread[(e.get("pid"), e.get("tid"))].append(e)
    out = []
    for evs in by_thread.values():
        stack: list[_Host] = []
        for e in sorted(evs, key=lambda e: (e["ts"], -e["dur"])):
            h = _Host(e["name"], e["cat"], e["ts"], e["ts"] + e["dur"], (e.get("args") or {}).get("correlation"))
            while stack and stack[-1].end <= h.ts:
                stack.pop()
            if stack:
                h.parent = stack[-1]
                h.parent.child_us += e["dur"]
            stack.append(h)
            out.append(h)
    return out


def _frames(h: _Host) -> list[tuple[str, str]]:
    return [(a.cat, a.name) for a in h.ancestry()]


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _caller(h: _Host) -> str:
    """Where a synchronisation came from: the innermost Python frame outside torch (with ``with_stack``), then the
    three innermost operators, innermost first."""
    frames = h.ancestry()[1:]
    py = next((f.name for f in frames if f.cat == "python_function" and not f.name.startswith(("torch/", "<built-in"))
               and "/torch/" not in f.name), None)
    ops = [f.name for f in frames if f.cat in ("cpu_op", "user_annotation") and f.name != STEP_MARK][:3]
    return " < ".join(([py] if py else []) + ops) or "(no enclosing operator)"


def _top(table: dict[tuple[str, str], list[float]], steps: int, top: int, key: str) -> list[dict]:
    rows = sorted(table.items(), key=lambda kv: -kv[1][0])[:top]
    return [{"name": name[:200], "group": group, key: us / 1e3 / steps, "calls": n / steps}
            for (name, group), (us, n) in rows]


def analyse(events: Iterable[dict], *, gpu: bool, top: int = 15) -> dict:
    """Per-step figures of the steps in a trace (module docstring); ``gpu``: whether the device was profiled too
    (False: the GPU figures are None). ``BadInput`` for a trace without a ``STEP_MARK``."""
    evs = _x_events(events)
    marks = [e for e in evs if e.get("cat") == "user_annotation" and e["name"] == STEP_MARK]
    if not marks:
        raise BadInput(f"the trace has no step marked {STEP_MARK!r}: not a profile of training steps")
    steps = len(marks)
    t0 = min(e["ts"] for e in marks)
    host_end = max(e["ts"] + e["dur"] for e in marks)
    host = _nest([e for e in evs if e.get("cat") in HOST_CATS])
    in_steps = [h for h in host if t0 <= h.ts < host_end]
    device = sorted((e for e in evs if e.get("cat") in GPU_CATS and e["ts"] + e["dur"] > t0) if gpu else (),
                    key=lambda e: e["ts"])
    t_end = max([host_end] + [e["ts"] + e["dur"] for e in device])
    per = 1e3 * steps  # us in total -> ms per step

    groups = {g: {"gpu_ms": 0.0 if gpu else None, "kernels": 0.0 if gpu else None, "host_self_ms": 0.0}
              for g in GROUPS}
    stacks = any(h.cat == "python_function" for h in in_steps)
    host_table: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for h in in_steps:
        if h.cat != "user_annotation":  # operators, CUDA calls, and Python functions in a trace with stacks
            g = group_of(_frames(h))
            self_us = max(0.0, h.end - h.ts - h.child_us)
            groups[g]["host_self_ms"] += self_us / per
            name = _ADDRESS.sub("", h.name)
            host_table[(name, g)][0] += self_us
            host_table[(name, g)][1] += 1
    result = {"steps": steps, "wall_ms": (t_end - t0) / per, "gpu": None, "groups": groups, "top_kernels": None,
              "top_host_ops": _top(host_table, steps, top, "self_ms"), "syncs_by_caller": None}
    if gpu:
        _device_figures(result, host, in_steps, device, (t0, t_end), top)
    if not stacks:  # nothing could be told as padding: its copies are in "other"
        groups["padding"] = dict.fromkeys(groups["padding"])
    return result


def _device_figures(result: dict, host: list[_Host], in_steps: list[_Host], device: list[dict],
                    window: tuple[float, float], top: int) -> None:
    """The GPU figures of ``analyse``, into ``result``: device events (sorted by start) grouped by their launches,
    the busy union and its gaps, launches, synchronisations and copies."""
    steps, groups = result["steps"], result["groups"]
    t0, t_end = window
    per = 1e3 * steps
    launches = {h.corr: h for h in host if h.cat in ("cuda_runtime", "cuda_driver") and h.corr is not None}
    kernel_table: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    # a start time -> the group of the first device work starting there, and its launch (None: not traced)
    first_at: dict[float, tuple[str, _Host | None]] = {}
    for e in device:
        corr = (e.get("args") or {}).get("correlation")
        g = group_of(_frames(launches[corr]) if corr in launches else [], e["name"] if e["cat"] == "kernel" else None)
        first_at.setdefault(max(e["ts"], t0), (g, launches.get(corr)))
        groups[g]["gpu_ms"] += e["dur"] / per
        if e["cat"] == "kernel":
            groups[g]["kernels"] += 1 / steps
            kernel_table[(e["name"], g)][0] += e["dur"]
            kernel_table[(e["name"], g)][1] += 1
    busy = _union([(max(e["ts"], t0), min(e["ts"] + e["dur"], t_end)) for e in device])
    edges = [t0] + [x for iv in busy for x in iv] + [t_end]
    spans = [(a, b) for a, b in zip(edges[::2], edges[1::2]) if b > a]
    waited: dict[str, float] = defaultdict(float)  # each gap charged to the work that ended it
    waited_by: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])  # ... and to its launch's frames: us, gaps
    for a, b in spans:
        if b in first_at:
            g, launch = first_at[b]
            caller = _caller(launch) if launch is not None else "(launch not traced)"
        else:
            g = caller = "after the last GPU work"
        waited[g] += (b - a) / per
        by = waited_by[caller]  # the frames of a gap's launch only: a trace holds thousands of launches
        by[0] += b - a
        by[1] += 1
    gaps = [b - a for a, b in spans]
    syncs = [h for h in in_steps if h.cat in ("cuda_runtime", "cuda_driver") and _SUFFIX.sub("", h.name) in SYNC_CALLS]
    callers: dict[str, int] = defaultdict(int)
    for h in syncs:
        callers[_caller(h)] += 1
    copies = [e for e in device if e["cat"] == "gpu_memcpy"]
    g = result["gpu"] = {
        "kernel_ms": sum(e["dur"] for e in device if e["cat"] == "kernel") / per,
        "memcpy_ms": sum(e["dur"] for e in copies) / per,
        "memset_ms": sum(e["dur"] for e in device if e["cat"] == "gpu_memset") / per,
        "busy_ms": sum(b - a for a, b in busy) / per,
        "idle_ms": sum(gaps) / per,
        "idle_before": dict(sorted(waited.items(), key=lambda kv: -kv[1])),
        "idle_before_caller": [{"caller": c[:200], "ms": us / per, "gaps": n / steps}
                               for c, (us, n) in sorted(waited_by.items(), key=lambda kv: -kv[1][0])[:top]],
        "idle_gaps": {label: {"count": sum(lo <= x < hi for x in gaps) / steps,
                              "ms": sum(x for x in gaps if lo <= x < hi) / per} for lo, hi, label in GAPS},
        "launches": sum(e["cat"] == "kernel" for e in device) / steps,
        "launch_call_ms": sum(h.end - h.ts for h in in_steps if LAUNCH_CALLS.match(h.name)) / per,
        "syncs": len(syncs) / steps,
        "sync_wait_ms": sum(h.end - h.ts for h in syncs) / per,
        "d2h_copies": sum("DtoH" in e["name"] for e in copies) / steps,
        "pageable_h2d_copies": sum("HtoD" in e["name"] and "Pageable" in e["name"] for e in copies) / steps,
    }
    g["idle_share"] = g["idle_ms"] / result["wall_ms"] if result["wall_ms"] else None
    result["top_kernels"] = _top(kernel_table, steps, top, "ms")
    result["syncs_by_caller"] = [{"caller": c, "count": n / steps}
                                 for c, n in sorted(callers.items(), key=lambda kv: -kv[1])[:top]]


def _ms(x) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def format_analysis(r: dict, *, top: int = 8) -> str:
    """The step's figures, its groups, and the first ``top`` kernels and host events: a short table."""
    g = r["gpu"]
    lines = [f"per step (mean of {r['steps']} profiled): wall {_ms(r['wall_ms'])} ms"]
    if g is not None:
        lines += [f"  GPU kernels {_ms(g['kernel_ms'])} ms, busy {_ms(g['busy_ms'])} ms, idle {_ms(g['idle_ms'])} ms "
                  f"({100 * (g['idle_share'] or 0):.0f} % of the wall: host-side time no GPU work covers)",
                  "  idle before: " + ", ".join(f"{k} {v:.2f} ms" for k, v in g["idle_before"].items())]
        if g.get("idle_before_caller"):  # a result recorded before it was counted has none
            lines.append("  idle before work launched by: " + "; ".join(
                f"{c['caller']} {c['ms']:.2f} ms ({c['gaps']:.0f} gaps)" for c in g["idle_before_caller"][:3]))
        lines += ["  idle gaps: " + ", ".join(f"{k} {v['count']:.0f} ({v['ms']:.2f} ms)"
                                              for k, v in g["idle_gaps"].items()),
                  f"  launches {g['launches']:.0f} (launch calls {_ms(g['launch_call_ms'])} ms of host time), "
                  f"synchronisations {g['syncs']:.0f} (waiting {_ms(g['sync_wait_ms'])} ms), "
                  f"device-to-host copies {g['d2h_copies']:.0f}, "
                  f"pageable host-to-device {g['pageable_h2d_copies']:.0f}"]
    lines += ["", f"{'group':<10} {'GPU ms':>8} {'kernels':>8} {'host self ms':>13}"]
    for name, v in r["groups"].items():
        kernels = "n/a" if v["kernels"] is None else f"{v['kernels']:.0f}"
        lines.append(f"{name:<10} {_ms(v['gpu_ms']):>8} {kernels:>8} {_ms(v['host_self_ms']):>13}")
    if r["groups"]["padding"]["host_self_ms"] is None:
        lines.append("(padding: n/a without Python stacks, its copies counted in other; --stacks tells them apart)")
    if r["top_kernels"]:
        lines += ["", f"{'top kernels':<70} {'group':<10} {'ms':>7} {'calls':>6}"]
        lines += [f"{k['name'][:70]:<70} {k['group']:<10} {k['ms']:>7.2f} {k['calls']:>6.0f}"
                  for k in r["top_kernels"][:top]]
    lines += ["", f"{'top host events (self time)':<70} {'group':<10} {'ms':>7} {'calls':>6}"]
    lines += [f"{k['name'][:70]:<70} {k['group']:<10} {k['self_ms']:>7.2f} {k['calls']:>6.0f}"
              for k in r["top_host_ops"][:top]]
    if r["syncs_by_caller"]:
        lines += ["", "synchronisations by caller (per step):"]
        lines += [f"  {s['count']:>5.0f}  {s['caller'][:110]}" for s in r["syncs_by_caller"][:top]]
    return "\n".join(lines)
