"""Figures for a loss-curve comparison (matplotlib, Agg canvas; nothing global is touched at import).

Public function
  ``plot_comparison(result, out_png, *, force=False) -> Path``
      ``result`` is the dict returned by ``convergence.curves.compare.compare_paths`` / ``compare_curves``
      (or read back from the ``--json`` file): it carries block-averaged copies of the curves
      (``result["series"]``), the per-window relative differences (``result["windows"]``), the
      intervals and the divergence, so the figure can be redrawn from the JSON alone.
      Top panel: baseline (mean of seeds) and candidate, raw (thin) and smoothed (thick), log-scaled
      loss, divergence marked. Bottom panel: per-window relative difference, the +-margin band, and
      the whole-range and final-window intervals as shaded bars; for ``metric="val_loss"`` the
      candidate's and each baseline replicate's difference from the baselines' mean at every evaluation.
      Refuses to overwrite unless ``force``;
      written atomically (``numerics.files.atomic_path``): an interrupted run leaves no torn PNG.
  ``plot_verdicts(verdicts, out_png, *, title, force=False) -> Path``
      Several ``val_loss`` results judged against the same baselines (a protocol's candidate and controls):
      where each run ends in the final window relative to the baselines' mean (one dot a run, the baselines'
      own levels on the first row), each result's final-window and whole-range intervals, and the margin.
  ``plot_replicate_drift(result, out_png, *, title, force=False, spread=None) -> Path``
      ``convergence.protocol.replicate_drift.drift``'s result, log-log: per recipe, the median over its replicates
      of the relative training-loss difference from its paired run against the step bin's middle, and their
      range (a bin where they are identical, 0, is left out of the log axis).
"""

from __future__ import annotations

from pathlib import Path

from numerics.files import atomic_path, check_writable


def plot_comparison(result: dict, out_png, *, force: bool = False) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = check_writable(out_png, force=force)  # before drawing: atomic_path would refuse it only after
    fig = Figure(figsize=(10, 7), layout="constrained")
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    s = result.get("series")
    if s:
        bname = "baseline" if len(s["baseline_names"]) == 1 else f"baseline (mean of {len(s['baseline_names'])})"
        top.plot(s["steps"], s["baseline"], color="tab:blue", lw=0.6, alpha=0.4)
        top.plot(s["steps"], s["candidate"], color="tab:orange", lw=0.6, alpha=0.4)
        top.plot(s["steps"], s["baseline_smoothed"], color="tab:blue", lw=1.8, label=f"{bname} (smoothed)")
        top.plot(s["steps"], s["candidate_smoothed"], color="tab:orange", lw=1.8,
                 label=f"{s['candidate_name']} (smoothed)")
        top.set_yscale("log")
    else:  # too few points to draw curves (e.g. a 5-step smoke run): say so instead of an empty panel
        top.text(0.5, 0.5, "no curves to draw: too few points were compared", transform=top.transAxes,
                 ha="center", va="center", color="tab:gray")
    div = result.get("divergence")
    if div:
        for ax in (top, bottom):
            ax.axvline(div["step"], color="tab:red", ls="--", lw=1.2)
        top.annotate(f"diverged: {div['kind']} @ {div['step']}", (div["step"], 0.95),
                     xycoords=("data", "axes fraction"),
                     color="tab:red", ha="right", va="top")
    val = result.get("metric") == "val_loss"
    top.set_ylabel("validation loss (held-out set)" if val else "loss")
    if top.get_legend_handles_labels()[0]:  # matplotlib warns on a legend with nothing in it
        top.legend(loc="upper right", fontsize=8)
    top.set_title(f"{result['verdict'].upper()}: {result['reason']}", fontsize=9, loc="left")

    m = result["margin"]
    bottom.axhspan(-m, m, color="tab:green", alpha=0.12, label=f"margin +-{m:.2%}")
    bottom.axhline(0.0, color="black", lw=0.6)
    w = result.get("windows")
    if w:
        for i, rep in enumerate(w.get("replicates") or []):  # val_loss: each baseline against the baselines' mean
            bottom.plot(w["end_steps"], rep, color="tab:blue", lw=0.7, alpha=0.5,
                        label="baseline replicates" if i == 0 else None)
        for i, rep in enumerate(w.get("candidate_replicates") or []):  # val_loss with candidate replicates
            bottom.plot(w["end_steps"], rep, "-", color="tab:orange", lw=0.6, alpha=0.5,
                        label="candidate runs" if i == 0 else None)
        cands = len(w.get("candidate_replicates") or []) or 1
        label = "candidate, per evaluation" if cands == 1 else f"mean of {cands} candidate runs"
        bottom.plot(w["end_steps"], w["rel_diff"], ".-" if val else ".", color="tab:orange" if val else "tab:gray",
                    ms=3, lw=1.0, label=label if val else "per-window rel. diff.")
    for key, color in (("overall", "tab:purple"), ("final_window", "tab:brown")):
        part = result.get(key)
        if part and part["interval"]:
            lo, hi = part["interval"]
            level = part.get("confidence_each") or part["interval_level"]  # two-ranges, or a declared test's
            bottom.fill_between([part["start_step"], part["end_step"]], lo, hi, color=color, alpha=0.35,
                                label=f"{key} {level:.1%} interval ({part['decision']})")
    bottom.set_ylabel("candidate / baseline - 1")
    bottom.set_xlabel("step")
    bottom.legend(loc="upper left", fontsize=8)
    with atomic_path(out, force=force) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    return out


DECISION_COLORS = {"equivalent": "tab:green", "non_inferior": "tab:green", "not_equivalent": "tab:red",
                   "inferior": "tab:red", "diverged": "tab:red", "inconclusive": "tab:gray"}


def plot_verdicts(verdicts: dict[str, dict], out_png, *, title: str, force: bool = False) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    out = check_writable(out_png, force=force)  # before drawing: atomic_path would refuse it only after
    first = next(iter(verdicts.values()))
    rows = [("BF16 baselines", first["final_window"]["replicate_levels"], None)]
    for name, r in verdicts.items():
        who = (r.get("series") or {}).get("candidate_name") or name
        expected = (r.get("protocol") or {}).get("expected")
        check = "" if expected is None else f" (expected {expected})"
        rows.append((f"{name}: {who}\n{r['verdict'].upper()}{check}",
                     r["final_window"].get("candidate_levels") or [r["final_window"]["estimate"]], r))
    fig = Figure(figsize=(9, 1.6 + 0.8 * len(rows)), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    m = first["margin"]
    ax.axvspan(-100 * m, 100 * m, color="tab:green", alpha=0.12)
    ax.axvline(0.0, color="black", lw=0.6)
    colors = []
    for i, (_, levels, r) in enumerate(rows):
        y = len(rows) - 1 - i  # the baselines on top
        ax.plot([100 * v for v in levels], [y] * len(levels), "o", ms=4, alpha=0.7,
                color="tab:blue" if r is None else "tab:orange")
        color = "black" if r is None else DECISION_COLORS.get(r["verdict"], "tab:gray")
        colors.append(color)
        for part, dy, lw in (("final_window", -0.18, 5), ("overall", -0.32, 2)):
            iv = ((r or {}).get(part) or {}).get("interval")
            if iv:
                ax.plot([100 * iv[0], 100 * iv[1]], [y + dy] * 2, lw=lw, solid_capstyle="butt", alpha=0.8,
                        color=DECISION_COLORS.get(r[part]["decision"], "tab:gray"))
    ax.set_yticks(range(len(rows)), [label for label, _, _ in reversed(rows)], fontsize=8)
    for tick, color in zip(ax.get_yticklabels(), reversed(colors)):
        tick.set_color(color)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlabel("final-window validation loss vs the BF16 baselines' mean (%)")
    ax.set_title(title, fontsize=9, loc="left")
    key = [Line2D([], [], color="tab:green", alpha=0.3, lw=8, label=f"margin +-{m:.2%}"),
           Line2D([], [], ls="", marker="o", color="tab:blue", label="each baseline's level"),
           Line2D([], [], ls="", marker="o", color="tab:orange", label="each run's level"),
           Line2D([], [], color="tab:gray", lw=5, label="final-window interval"),
           Line2D([], [], color="tab:gray", lw=2, label="whole-range interval")]
    fig.legend(handles=key, loc="outside lower center", ncols=5, fontsize=8, frameon=False)
    with atomic_path(out, force=force) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    return out


def plot_replicate_drift(result: dict, out_png, *, title: str, force: bool = False, spread: dict | None = None) -> Path:
    """The replicates' drift from their paired runs (``convergence.protocol.replicate_drift.drift``) on log axes;
    with ``spread`` (``spread_by_evaluation``) a second panel beside it: where the drift ends, the validation loss
    spread at each evaluation."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = check_writable(out_png, force=force)  # before drawing: atomic_path would refuse it only after
    fig = Figure(figsize=(8 if spread is None else 13, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    if spread is None:
        ax = fig.subplots()
    else:
        ax, right = fig.subplots(1, 2, width_ratios=(8, 5))
        from convergence.curves.power import spread_interval

        bf16, cand = spread["runs"]
        right.plot(spread["steps"], [100 * v for v in spread["spread"]], "o-", ms=4, color="k",
                   label=f"{bf16} BF16 and {cand} {spread['candidate']} runs, pooled")
        band = [spread_interval(v, spread["dof"]) for v in spread["spread"]]
        right.fill_between(spread["steps"], [100 * lo for lo, _ in band], [100 * hi for _, hi in band], color="k",
                           alpha=0.1, lw=0, label=f"95 % interval of each ({spread['dof']} degrees of freedom)")
        right.set_ylim(bottom=0)
        right.set_xlabel("training step (evaluations)")
        right.set_ylabel("spread of the runs' validation loss (%)")
        right.set_title("where it ends: the validation loss spread", fontsize=9, loc="left")
        right.legend(fontsize=8, loc="lower right")
        right.grid(True, alpha=0.3)
    for recipe, r in result.items():
        x = [np.sqrt(lo * hi) for lo, hi in r["bins"]]  # the bin's middle on a log axis
        positive = {k: [v if v > 0 else np.nan for v in r[k]] for k in ("median", "low", "high")}
        line, = ax.plot(x, positive["median"], "o-", ms=3, label=f"{recipe} (median of {r['runs']})")
        ax.fill_between(x, positive["low"], positive["high"], color=line.get_color(), alpha=0.15, lw=0)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("training step (bins 1, 2-3, 4-7, ...)")
    ax.set_ylabel("|loss of a replicate - its recipe's paired run| / loss")
    ax.set_title(title, fontsize=9, loc="left")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, which="major", alpha=0.3)
    with atomic_path(out, force=force) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    return out
