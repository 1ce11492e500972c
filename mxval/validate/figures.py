"""Figures of ``mxval validate`` (matplotlib Agg canvases; nothing global is touched at import).

``tensor_sqnr(records, png)``      SQNR of torchao's round trip per element type and scale mode, per input family
``layer_sqnr(results, png)``       MXFP8 SQNR against the BF16 run per layer and tensor, with each figure's floor
``training_curves(out, runs, probes, png)``  loss of every run, and the MXFP8 layer probes over the run
Each returns the PNG path; the folder is created if needed.
"""

from __future__ import annotations

import math
from pathlib import Path


def _figure(size: tuple[float, float], rows: int = 1, **kw):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(rows, 1, **kw)


def _save(fig, png: Path) -> Path:
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    return png


def tensor_sqnr(records: list[dict], png: Path) -> Path:
    cells = sorted({(r["elem"], r["mode"]) for r in records})
    families = sorted({r["family"] for r in records})
    fig, ax = _figure((9, 3.8))
    width = 0.8 / max(1, len(families))
    for j, fam in enumerate(families):
        vals = [next((r["sqnr_db"] for r in records if (r["elem"], r["mode"], r["family"]) == (*c, fam)), math.nan)
                for c in cells]
        ax.bar([i + j * width for i in range(len(cells))], vals, width, label=fam)
    ax.set_xticks([i + width * (len(families) - 1) / 2 for i in range(len(cells))],
                  [f"{e}\n{m}" for e, m in cells], fontsize=8)
    ax.set_ylabel("SQNR of the round trip (dB)")
    ax.set_title("torchao MX cast: quantize + dequantize against the input", fontsize=10, loc="left")
    ax.legend(fontsize=7, ncols=min(4, len(families)) or 1)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, png)


def layer_sqnr(results, png: Path) -> Path:
    from numerics.layer import results as layers

    labels, vals, floors = [], {"out": [], "dx": [], "dw": []}, {"out": [], "dx": [], "dw": []}
    for r in results:
        labels.append(f"{r.layer}\n{r.case}")
        family = r.shape.get("input", "normal")
        for kind in vals:
            stats = [s for s in r.stats if s.recipe == "mxfp8" and s.tensor.split(":")[0] == kind]
            v = min((s.sqnr_vs_bf16 for s in stats if s.sqnr_vs_bf16 is not None), default=math.nan)
            fl = [f.floor for s in stats for f in layers.floors_for(r.layer, "mxfp8", s.tensor, family)]
            vals[kind].append(v)
            floors[kind].append(max(fl) if fl else math.nan)
    fig, ax = _figure((max(8.0, 0.9 * len(labels)), 4.2))
    width = 0.27
    for j, (kind, color) in enumerate((("out", "tab:blue"), ("dx", "tab:orange"), ("dw", "tab:green"))):
        xs = [i + (j - 1) * width for i in range(len(labels))]
        ax.bar(xs, vals[kind], width, color=color, label=f"{kind} (lowest of the layer's)")
        ax.scatter(xs, floors[kind], marker="_", s=250, color="black", zorder=3,
                   label="floor (numerics/tolerances.py)" if j == 0 else None)
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    finite = [v for k in vals for v in vals[k] + floors[k] if math.isfinite(v)]
    if finite:
        ax.set_ylim(max(0.0, min(finite) - 6), max(finite) + 2)
    ax.set_ylabel("MXFP8 SQNR against BF16 (dB)")
    ax.set_title("Layers: MXFP8 (torchao recipe mxfp8) against the BF16 run, forward and backward",
                 fontsize=10, loc="left")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=4, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, png)


def training_curves(out: Path, runs: dict[str, tuple[list[int], list[float]]], probes: list[dict], png: Path) -> Path:
    """``runs``: run name -> its steps and training losses (as the training level read them from its metrics)."""
    fig, (top, bottom) = _figure((9, 6), rows=2, height_ratios=[3, 2])
    for name, (steps, loss) in runs.items():
        style = dict(color="tab:orange", lw=1.4) if name == "mxfp8" else \
            dict(color="tab:blue", lw=1.4) if name == "bf16" else \
            dict(color="tab:blue", lw=0.8, alpha=0.45, ls="--") if name.startswith("bf16") else \
            dict(color="tab:red", lw=0.9, alpha=0.7)  # the positive control
        top.plot(steps, loss, label=name, **style)
    top.set_ylabel("training loss")
    top.set_xlabel("step")
    top.legend(fontsize=8)
    top.set_title("Paired runs: MXFP8 and BF16 from one seed and token stream; dashed: BF16 replicates; red: the "
                  "positive control", fontsize=10, loc="left")
    if probes:
        steps = [p["step"] for p in probes]
        per_step = [{layer: min(v.values()) for layer, v in p["layers"].items() if v} for p in probes]
        lo = [min(d.values()) for d in per_step]
        hi = [max(d.values()) for d in per_step]
        med = [sorted(d.values())[len(d) // 2] for d in per_step]
        bottom.fill_between(steps, lo, hi, color="tab:orange", alpha=0.2, label="range over layers")
        bottom.plot(steps, med, color="tab:orange", marker="o", ms=3, label="median layer")
        worst = min(per_step[-1], key=per_step[-1].get)
        ys = [d.get(worst, math.nan) for d in per_step]
        bottom.plot(steps, ys, color="tab:red", marker="o", ms=3, lw=1, label=f"lowest at the end: {worst}")
        bottom.set_ylabel("probe SQNR, lowest of out/dX/dW (dB)", fontsize=8)
        bottom.set_xlabel("step")
        bottom.set_title(f"MXFP8 layer probes ({len(per_step[-1])} layers) against BF16 on the run's own "
                         "activations and gradients", fontsize=9, loc="left")
        bottom.legend(fontsize=7)
        bottom.grid(alpha=0.3)
    else:
        bottom.axis("off")
        bottom.text(0.5, 0.5, "no probes recorded (run shorter than the probe interval)", ha="center")
    return _save(fig, png)
