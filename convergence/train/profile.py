"""What a training run cost, read back from its own ``metrics.jsonl``: step time, tokens/s, where a step's time
went (forward, backward, optimizer, dispatch + combine) and the peak GPU and host memory.
(``python -m convergence profile RUN [RUN ...]``)

Public: ``WARMUP``, ``load_records(path) -> list[dict]``, ``profile(records) -> dict``, ``report(profiles) ->
str``, ``plot_profiles(runs, out_png, *, force=False) -> Path``.

Every number comes from the fields the loop logs as measured (``convergence.train.loop.MEASURED_FIELDS``):
a step's seconds are its tokens over its ``tokens_per_s``; ``phase_s`` (``--phase-times``) holds the slowest
rank's seconds of each phase, so on several ranks the phases need not add up to the step, and "other" (data,
the loss's reduction, the gap between the slowest ranks) is what the step took beyond their sum, floored at
zero. Medians over the steps after the first ``WARMUP`` (and over ``SPANS`` spans of them, fastest and slowest
shown: a slowdown for part of a run); memory is the run's peak (the largest rank's). A run
made without ``--phase-times`` has no breakdown, and says so. Besides its steps, a run's wall time goes to each
piece's set-up (``setup_s``: model, init, recipe, resume), its evaluations (``val_s``) and its probes
(``probe_s``), summed here; what is left of a measured wall time is process start, checkpoints and exit.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path

from numerics.errors import BadInput
from numerics.files import atomic_path, read_json_lines

# first steps left out of the medians: allocator and communicator warm-up, and the first optimizer step's
# allocations (pinned host moments of the 16b under --optimizer-state host: 45 s of its first step on 2 x H200)
WARMUP = 2
PHASES = ("forward", "backward", "optimizer")
# the steps after WARMUP cut into SPANS spans of at least SPAN_MIN steps, each span's median step time: a
# machine that slows down for minutes shows as a slow span (one H200 ran a 1,500-step E2M1 proxy run's spans
# at 0.164-0.217 s, a slowdown the run's median, 0.187 s, hides)
SPANS, SPAN_MIN = 6, 10


def load_records(path: Path) -> list[dict]:
    """The records of a ``metrics.jsonl``, or of the one a run's recipe folder (``OUT/<recipe>``) holds. Every
    record's loss is a number (or null: a diverged step's NaN is logged so) and one at least has one, else
    ``BadInput``: a file of steps without losses (a run's probes.jsonl) would profile as "n/a" everywhere, and a
    loss that is text would fail in arithmetic, as a traceback."""
    recs = read_json_lines(path, what="metrics", hint="a run's OUT/<recipe>/metrics.jsonl", need={"step": int},
                           inside="metrics.jsonl")
    for r in recs:
        if not isinstance(r.get("loss"), (int, float, type(None))) or isinstance(r.get("loss"), bool):
            raise BadInput(f"{path}: step {r['step']}: loss {r['loss']!r} is not a number")
    if not any(isinstance(r.get("loss"), (int, float)) for r in recs):
        raise BadInput(f"{path}: no record has a training loss: not a run's metrics (a probes.jsonl?)")
    return recs


def _numbers(records: list[dict], key: str) -> list[float]:
    """The records' values of ``key`` where it is a number (a field a record lacks or logged as null is left out)."""
    return [r[key] for r in records if isinstance(r.get(key), (int, float))]


def _total(values: list[float]) -> tuple[float, int] | tuple[None, None]:
    """(their sum, how many); (None, None) when there are none, as in a run whose log lacks the field."""
    return (sum(values), len(values)) if values else (None, None)


def _median(values) -> float | None:
    vals = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(vals) if vals else None


def _step_seconds(records: list[dict]) -> list[float | None]:
    """Each step's seconds: the tokens it added over its tokens/s (None where either is missing)."""
    out, before = [], 0
    for r in records:
        tokens, tps = r.get("tokens"), r.get("tokens_per_s")
        ok = isinstance(tokens, (int, float)) and isinstance(tps, (int, float)) and tps > 0 and tokens > before
        out.append((tokens - before) / tps if ok else None)
        before = tokens if isinstance(tokens, (int, float)) else before
    return out


def _span_medians(seconds: list[float | None]) -> list[float] | None:
    """The median step time of each of ``SPANS`` consecutive spans of equal length (the last takes the rest);
    None for fewer than ``SPANS * SPAN_MIN`` timed steps."""
    known = [x for x in seconds if x is not None]
    if len(known) < SPANS * SPAN_MIN:
        return None
    size = len(known) // SPANS
    return [statistics.median(known[i * size:(i + 1) * size if i < SPANS - 1 else None]) for i in range(SPANS)]


def profile(records: list[dict]) -> dict:
    """Medians after ``WARMUP`` (all steps when there are no more) and the run's peaks."""
    seconds = _step_seconds(records)
    tail = slice(WARMUP, None) if len(records) > WARMUP else slice(None)
    recs, secs = records[tail], seconds[tail]
    step_s = _median(secs)
    phases = None
    if all(isinstance(r.get("phase_s"), dict) for r in recs):
        phases = {p: _median(r["phase_s"].get(p) for r in recs) for p in PHASES}
        if step_s is not None and None not in phases.values():
            phases["other"] = max(0.0, step_s - sum(phases.values()))
    vals, gpu, host = (_numbers(records, k) for k in ("val_loss", "gpu_peak_gib", "host_peak_gib"))
    # where a run's wall time goes besides its steps
    setup_s, pieces = _total(_numbers(records, "setup_s"))
    each_val = _numbers(records, "val_s")
    val_s, evaluations = _total(each_val)
    probe_s, probes = _total(_numbers(records, "probe_s"))
    spans = _span_medians(secs)
    return {
        "steps": len(records), "median_over_steps": [records[tail][0]["step"], records[-1]["step"]],
        "tokens_per_step": records[0].get("tokens") if isinstance(records[0].get("tokens"), int) else None,
        "first_step_s": seconds[0], "step_s": step_s, "tokens_per_s": _median(r.get("tokens_per_s") for r in recs),
        "steps_total_s": sum(x for x in seconds if x is not None),
        "step_s_spans": [min(spans), max(spans)] if spans else None,
        "setup_s": setup_s, "pieces": pieces, "val_s": val_s, "evaluations": evaluations, "probe_s": probe_s,
        "val_s_each": [min(each_val), max(each_val)] if each_val else None,
        "probes": probes,
        "phase_s": phases, "dispatch_combine_s": _median(r.get("dispatch_combine_s") for r in recs),
        "dispatch_combine_share": _median(r.get("dispatch_combine_share") for r in recs),
        "gpu_peak_gib": max(gpu) if gpu else None, "host_peak_gib": max(host) if host else None,
        "loss_first": records[0].get("loss"), "loss_last": records[-1].get("loss"),
        "val_loss_last": vals[-1] if vals else None,
    }


def _cell(x, spec: str) -> str:
    return format(x, spec) if isinstance(x, (int, float)) else "n/a"


def _range(pair, spec: str) -> str:
    return "n/a" if pair is None else f"{pair[0]:{spec}}-{pair[1]:{spec}}"


def report(profiles: dict[str, dict]) -> str:
    """One column per run; with several runs, each after the first also as a ratio to the first."""
    names = list(profiles)
    first = profiles[names[0]]
    rows = [("steps (median over)", lambda p: "{} ({}-{})".format(p["steps"], *p["median_over_steps"])),
            ("step s", lambda p: _cell(p["step_s"], ".3f")),
            (f"  over {SPANS} spans", lambda p: _range(p["step_s_spans"], ".3f")),
            ("tokens/s", lambda p: _cell(p["tokens_per_s"], ",.0f")),
            ("first step s", lambda p: _cell(p["first_step_s"], ".1f")),
            ("all steps s", lambda p: _cell(p["steps_total_s"], ".1f")),
            ("set-up s (pieces)", lambda p: f"{_cell(p['setup_s'], '.1f')} ({p['pieces'] or 0})"),
            ("evaluations s (n)", lambda p: f"{_cell(p['val_s'], '.1f')} ({p['evaluations'] or 0})"),
            ("  each", lambda p: _range(p["val_s_each"], ".1f")),
            ("probes s (n)", lambda p: f"{_cell(p['probe_s'], '.1f')} ({p['probes'] or 0})")]
    for phase in (*PHASES, "other"):
        rows.append((f"  {phase} s", lambda p, ph=phase: _cell((p["phase_s"] or {}).get(ph), ".3f")))
    rows += [("  dispatch+combine s", lambda p: _cell(p["dispatch_combine_s"], ".3f")),
             ("peak GPU GiB", lambda p: _cell(p["gpu_peak_gib"], ".1f")),
             ("peak host GiB", lambda p: _cell(p["host_peak_gib"], ".1f")),
             ("loss first / last", lambda p: f"{_cell(p['loss_first'], '.4f')} / {_cell(p['loss_last'], '.4f')}"),
             ("last val loss", lambda p: _cell(p["val_loss_last"], ".4f"))]
    cells = [(label, [cell(profiles[n]) for n in names]) for label, cell in rows]
    width = max(len(c) for c in [*names, *(c for _, row in cells for c in row)]) + 2
    lines = [f"{'':<22}" + "".join(f"{n:>{width}}" for n in names)]
    lines += [f"{label:<22}" + "".join(f"{c:>{width}}" for c in row) for label, row in cells]
    for n in names[1:]:
        p = profiles[n]
        if p["step_s"] and first["step_s"]:
            lines.append(f"step time {n} / {names[0]}: {p['step_s'] / first['step_s']:.2f}x "
                         f"(medians, steps after the first {WARMUP})")
    if any(p["phase_s"] is None for p in profiles.values()):
        lines.append("n/a phases: the run was made without --phase-times")
    return "\n".join(lines)


def plot_profiles(runs: dict[str, list[dict]], out_png: Path, *, force: bool = False) -> Path:
    """Loss per step (validation loss as points), gradient norm per step, and each run's median step split
    into its phases: the curves and the cost in one figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_grad, ax_time) = plt.subplots(1, 3, figsize=(15, 4.2),
                                                    gridspec_kw={"width_ratios": [2, 2, 1.3]})
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, recs) in enumerate(runs.items()):
        c = colours[i % len(colours)]
        for key, ax, style in (("loss", ax_loss, dict(lw=1.3, label=f"{name} train")),
                               ("val_loss", ax_loss, dict(marker="o", ls="", ms=6, mfc="white",
                                                          label=f"{name} validation")),
                               ("grad_norm", ax_grad, dict(lw=1.3, label=name))):
            if points := [(r["step"], r[key]) for r in recs if isinstance(r.get(key), (int, float))]:
                ax.plot(*zip(*points), color=c, **style)
        p = profile(recs)
        bottom = 0.0
        for j, phase in enumerate((*PHASES, "other")):
            sec = (p["phase_s"] or {}).get(phase)
            if sec is None:
                continue
            ax_time.bar(i, sec, bottom=bottom, color=colours[(j + 3) % len(colours)], edgecolor="white",
                        label=phase if i == 0 else None)
            bottom += sec
        if p["phase_s"] is None and p["step_s"] is not None:
            ax_time.bar(i, p["step_s"], color="0.7", label="step (no --phase-times)" if i == 0 else None)
            bottom = p["step_s"]
        if p["tokens_per_s"] is not None:
            ax_time.text(i, bottom, f"{p['tokens_per_s']:,.0f} tok/s", ha="center", va="bottom", fontsize=8)
    ax_loss.set(xlabel="step", ylabel="loss", title="training loss (lines), validation loss (points)")
    ax_grad.set(xlabel="step", ylabel="gradient norm (before clipping)", title="gradient norm", yscale="log")
    ax_time.set(xticks=range(len(runs)), xticklabels=list(runs), ylabel="seconds",
                title=f"median step (after step {WARMUP})")
    for ax in (ax_loss, ax_grad, ax_time):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(out_png, force=force) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return Path(out_png)


def profiles_of(paths: Sequence[Path], names: Sequence[str]) -> dict[str, list[dict]]:
    """Each run's records under its name (one distinct name per path, ``numerics.cli.run_labels``)."""
    return {name: load_records(Path(path)) for name, path in zip(names, paths, strict=True)}


def main(argv: Sequence[str] | None = None) -> int:
    """python -m convergence profile RUN [RUN ...]: each run's step time, tokens/s, phases and peak memory,
    from its metrics.jsonl."""
    from numerics.cli import parse_run_report, run_report_parser
    from numerics.files import atomic_write

    p = run_report_parser("python -m convergence profile",
                          "each run's step time, tokens/s, phases and peak memory, from its metrics.jsonl",
                          reads="metrics.jsonl", plot="loss, gradient norm and the median step's phases",
                          json="write the profiles as JSON")
    args, names = parse_run_report(p, argv)
    runs = profiles_of(args.runs, names)
    profiles = {name: profile(recs) for name, recs in runs.items()}
    print(report(profiles))
    if args.plot:
        print(f"figure: {plot_profiles(runs, args.plot, force=args.force)}")
    if args.json:
        atomic_write(args.json, json.dumps(profiles, indent=1) + "\n", force=args.force)
    return 0


if __name__ == "__main__":
    import sys

    from numerics.cli import run_main

    sys.exit(run_main(main))
