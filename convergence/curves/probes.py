"""Per-layer probe SQNRs of a training run, read back: where along the depth MXFP8 loses accuracy, and how much.

Public: ``QUANTITIES``, ``load_probes(path) -> list[dict]``, ``summarise(records, name) -> dict``,
``report(summary) -> str``, ``plot_probes(summaries, out_png, *, force=False) -> Path``, ``main(argv)``.

A run's ``probes.jsonl`` (``convergence.train.probes``) has one record per probed step: for every quantized
module, the SQNR (dB) of its MXFP8 output, input gradient and weight gradient against BF16's on that step's
activations. ``summarise`` reduces them the way the docs quote them: the median over probe steps of each
module, then per layer the median and the lowest over the layer's modules, and for the whole run the median
over every module and step. The figure has one panel per quantity, SQNR against layer index, each run's
per-layer median as a line and its lowest module as a band: several runs (say MXFP8 and a worse element)
side by side show the gap at every depth.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Sequence
from pathlib import Path

from numerics.errors import BadInput
from numerics.files import atomic_path, read_json_lines

QUANTITIES = {"out_sqnr_db": "output", "dx_sqnr_db": "input gradient (dX)", "dweight_sqnr_db": "weight gradient (dW)"}
SHORT = {"out_sqnr_db": "out", "dx_sqnr_db": "dX", "dweight_sqnr_db": "dW"}
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def load_probes(path: Path) -> list[dict]:
    """The records of a ``probes.jsonl`` (or of a run folder's ``probes.jsonl``), each ``{"step", "layers"}``."""
    return read_json_lines(path, what="probes", hint="a run probes with --probe-every N",
                           need={"step": int, "layers": dict}, inside="probes.jsonl")


def _layer_of(fqn: str) -> int | None:
    m = _LAYER.search(fqn)
    return int(m.group(1)) if m else None


def summarise(records: Sequence[dict], name: str) -> dict:
    """Per-module medians over steps, per-layer median and lowest module, whole-run medians, the worst case."""
    per_module: dict[str, dict[str, list[float]]] = {}
    worst = {}
    for rec in records:
        for fqn, values in rec["layers"].items():
            for q in QUANTITIES:
                v = values.get(q) if isinstance(values, dict) else None
                if isinstance(v, (int, float)):
                    per_module.setdefault(fqn, {}).setdefault(q, []).append(float(v))
                    if q not in worst or v < worst[q]["sqnr_db"]:
                        worst[q] = {"sqnr_db": float(v), "module": fqn, "step": rec["step"]}
    if not per_module:
        raise BadInput(f"{name}: the probe records hold no SQNR values")
    modules = {fqn: {q: statistics.median(vs) for q, vs in qs.items()} for fqn, qs in per_module.items()}
    layers: dict[int, dict[str, dict]] = {}
    for fqn, qs in modules.items():
        layer = _layer_of(fqn)
        if layer is None:
            continue
        for q, v in qs.items():
            layers.setdefault(layer, {}).setdefault(q, []).append((v, fqn))
    by_layer = {layer: {q: _layer_part(vs) for q, vs in qs.items()} for layer, qs in sorted(layers.items())}
    overall = {q: statistics.median(v for qs in per_module.values() for v in qs.get(q, ()))
               for q in QUANTITIES if any(q in qs for qs in per_module.values())}
    return {"name": name, "steps": [rec["step"] for rec in records], "modules": modules, "layers": by_layer,
            "overall": overall, "worst": worst}


def _layer_part(values: list[tuple[float, str]]) -> dict:
    """A layer's (module median, module) pairs -> its median and its lowest module."""
    lowest, module = min(values)
    return {"median": statistics.median(v for v, _ in values), "lowest": lowest, "lowest_module": module}


def report(summary: dict) -> str:
    qs = [q for q in QUANTITIES if q in summary["overall"]]
    steps = summary["steps"]
    lines = [f"{summary['name']}: {len(steps)} probe steps ({steps[0]}-{steps[-1]}), {len(summary['modules'])} "
             "modules; median SQNR over modules and steps: "
             + ", ".join(f"{QUANTITIES[q]} {summary['overall'][q]:.1f} dB" for q in qs),
             "  layer  " + "  ".join(f"{SHORT[q] + ' median/lowest':>16}" for q in qs)]
    for layer, parts in summary["layers"].items():
        lines.append(f"  {layer:>5}  " + "  ".join(
            f"{parts[q]['median']:8.1f} / {parts[q]['lowest']:5.1f}" if q in parts else f"{'-':>16}" for q in qs))
    for q in qs:
        w = summary["worst"][q]
        lines.append(f"  lowest {QUANTITIES[q]}: {w['sqnr_db']:.1f} dB, {w['module']} at step {w['step']}")
    return "\n".join(lines)


def plot_probes(summaries: Sequence[dict], out_png, *, force: bool = False) -> Path:
    """One panel per quantity: each run's per-layer median (line) and lowest module (band) against layer."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = Path(out_png)
    qs = [q for q in QUANTITIES if any(q in s["overall"] for s in summaries)]
    fig = Figure(figsize=(4.2 * len(qs), 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(qs), sharey=True, squeeze=False)[0]
    for ax, q in zip(axes, qs):
        for s in summaries:
            layers = [layer for layer, parts in s["layers"].items() if q in parts]
            med = [s["layers"][layer][q]["median"] for layer in layers]
            low = [s["layers"][layer][q]["lowest"] for layer in layers]
            line, = ax.plot(layers, med, marker="o", ms=3, label=f"{s['name']} (median {s['overall'][q]:.1f} dB)")
            ax.fill_between(layers, low, med, color=line.get_color(), alpha=0.15, lw=0)
        ax.set_title(QUANTITIES[q], fontsize=10)
        ax.set_xlabel("layer")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower left")
    axes[0].set_ylabel("SQNR vs BF16 (dB)")
    fig.suptitle("line: each layer's median module; band: down to its lowest module (each module's median over "
                 "the probe steps)", fontsize=9)
    with atomic_path(out, force=force) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """python -m convergence probes RUN [RUN ...]: per-layer probe SQNRs of each run, a table and a figure."""
    from numerics.cli import parse_run_report, run_report_parser
    from numerics.files import atomic_write

    p = run_report_parser("python -m convergence probes", main.__doc__.split(": ", 1)[1], reads="probes.jsonl",
                          plot="SQNR against layer, one panel per quantity", json="write the summaries as JSON")
    args, names = parse_run_report(p, argv)
    summaries = [summarise(load_probes(r), n) for r, n in zip(args.runs, names)]
    print("\n\n".join(report(s) for s in summaries))
    if args.plot:
        print(f"figure: {plot_probes(summaries, args.plot, force=args.force)}")
    if args.json:
        atomic_write(args.json, json.dumps(summaries, indent=1) + "\n", force=args.force)
    return 0
