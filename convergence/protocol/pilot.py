"""A fork pilot's result: how far BF16 continuations of one trunk spread, at each evaluation after the fork and
over the final window, beside the spread of independent runs.

Public: ``pilot_result(plan, out, reference=K16) -> dict``, ``pilot_lines(r)``, ``pilot_note(r)``,
``K16``.

The pilot (``python -m convergence protocol --design fork --pilot N --fork-step S``): a BF16 trunk to step S and N
BF16 continuations of it, rows permuted by 1..N from S on. A continuation's level at an evaluation is its
validation loss over the continuations' mean there, minus 1; the spread at that horizon is the relative standard
deviation of those levels (pooled within trunks when there are several), with its 95 % interval (normal levels:
``convergence.curves.power.spread_interval``). The final-window spread is the one the verdict plans with: the
continuations as ``compare --metric val_loss`` baselines (its final window: the last fifth of the compared range,
``designs.endpoint_spread``'s arithmetic), and ``fork_spread`` is what ``python -m convergence power --fork-pilot``
puts in the fork design's row (``convergence.curves.decision.designs.pilot_spread``).

Beside it, when the reference files are there and the pilot's runs are theirs in model, steps, learning rate,
evaluations and held-out split: the independent spread of the golden k16 plan (32 BF16 runs of
1,500 steps at lr 3e-4, 290 held-out batches: its 16 baselines and 16 held-out runs, each group around its own
mean) at the same evaluations and over its final window, and ``explained``, the share of the independent variance
the fork removes, ``1 - (fork / independent)^2`` (the projection assumed 70 %). Each names the GPU model its runs
were made on (``hardware``, None where they name no one model; the reference's from its golden sidecar), and the
lines say so when they differ: a run is computed differently on another model (docs/protocol.md, the fork
design), so only the spreads compare. GPU-hours: every piece in the folder's ``pace.jsonl`` (wall seconds over the
runs sharing its GPU); ``trunk_s`` and ``continuation_s`` are a run's pieces summed, averaged over the runs, so a
trunk made again on a fresh machine counts every time it was made. ``deterministic_pace``: how many times longer a
step of the deterministic trunk took than a step of a continuation (the median tokens per second of each, from their
logs, over the pieces that had their GPU alone): what a fork design's trunks cost beyond their steps
(``convergence.curves.decision.designs.part_cost_s``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from convergence.curves import power
from convergence.protocol.folder import PACE_FILE, metrics_path
from convergence.protocol.plan import ProtocolPlan, RunSpec
from convergence.protocol.provenance import runs_hardware_tag
from convergence.train.checkpoint import JsonlLog
from numerics.errors import BadInput

ROOT = Path(__file__).resolve().parents[2]
K16 = ROOT / "golden" / "training" / "proxy_long_lr3e-4_k16_{}__h200.json"


def _shown(path: Path) -> str:
    """``path`` as a result records it: relative to the repository when inside it (a committed result names no
    one's checkout), else as given."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _val(path: Path) -> dict[int, float]:
    return {r["step"]: float(r["val_loss"]) for r in JsonlLog(path).records() if "val_loss" in r}


def _spread(groups: list[list[float]]) -> dict | None:
    pooled = power.pooled_spread([g for g in groups if len(g) > 1])
    if pooled is None:
        return None
    lo, hi = power.spread_interval(*pooled)
    return {"spread": pooled[0], "dof": pooled[1], "interval_95": [lo, hi]}


def _reference(template: str, plan: ProtocolPlan) -> dict | None:
    """The k16 plan's independent BF16 spread at each evaluation and over its final window (module docstring), when
    its files are here and its runs were of the pilot's model, length, learning rate and evaluations."""
    files = [Path(template.format(v)) for v in ("verdict", "negative_control")]
    if not all(f.is_file() for f in files):
        return None
    v, n = (json.loads(f.read_text()) for f in files)
    theirs = v["protocol"]["plan"]
    same = ("model", "steps", "val_percent")
    if any(theirs.get(k) != getattr(plan, k) for k in same) or dict(map(tuple, theirs.get("overrides", []))) != {
            k: x for k, x in plan.overrides if k in ("lr", "val_every", "val_batches")}:
        return None
    steps = v["windows"]["end_steps"]
    base, held = np.asarray(v["windows"]["replicates"]), np.asarray(n["windows"]["candidate_replicates"])
    at = {int(s): _spread([list(base[:, i]), list(held[:, i])]) for i, s in enumerate(steps)}
    final = _spread([list(v["final_window"]["replicate_levels"]), list(n["final_window"]["candidate_levels"])])
    meta = files[0].with_name(files[0].name + ".meta.json")  # golden's sidecar: the GPU model that made the runs
    hardware = json.loads(meta.read_text()).get("hardware") if meta.is_file() else None
    return {"source": [_shown(f) for f in files], "hardware": hardware, "at_step": at, "final_window": final,
            "runs": len(base) + len(held), "final_window_steps": [v["final_window"]["start_step"],
                                                                  v["final_window"]["end_step"]]}


def _gpu_hours(out: Path) -> dict:
    path = Path(out) / PACE_FILE
    entries = JsonlLog(path).records() if path.is_file() else []
    by_run: dict[str, float] = {}
    for e in entries:
        run = str(e.get("run"))
        by_run[run] = by_run.get(run, 0.0) + e["wall_s"] / max(1, int(e.get("per_gpu") or 1))
    trunks = [s for r, s in by_run.items() if r.startswith("trunk")]
    conts = [s for r, s in by_run.items() if not r.startswith("trunk")]
    return {"total": sum(by_run.values()) / 3600, "pieces": len(entries),
            "trunk_s": sum(trunks) / len(trunks) if trunks else None,
            "continuation_s": sum(conts) / len(conts) if conts else None}


def _deterministic_pace(out: Path, conts: list[RunSpec], trunks: list[RunSpec], fork_step: int) -> float | None:
    """The continuations' median tokens per second after the fork over the trunks' before it (a continuation's log
    begins with its trunk's records), counting only the steps of pieces that had their GPU alone (``pace.jsonl``'s
    ``per_gpu`` 1: a run sharing it logs a fraction of the rate); None without such steps on either side."""
    path = Path(out) / PACE_FILE
    alone: dict[str, list[tuple[int, int]]] = {}
    for e in (JsonlLog(path).records() if path.is_file() else []):
        if int(e.get("per_gpu") or 1) == 1:
            alone.setdefault(str(e.get("run")), []).append((e["from_step"], e["to_step"]))

    def rate(specs: list[RunSpec], after: bool) -> float | None:
        seen = [float(r["tokens_per_s"]) for s in specs for r in JsonlLog(metrics_path(out, s)).records()
                if r.get("tokens_per_s") and (r["step"] > fork_step) == after
                and any(a < r["step"] <= b for a, b in alone.get(s.name, []))]
        return float(np.median(seen)) if seen else None

    fast, slow = rate(conts, True), rate(trunks, False)
    return None if fast is None or slow is None else fast / slow


def pilot_result(plan: ProtocolPlan, out: Path, reference: Path | str | None = K16) -> dict:
    """The pilot's result (module docstring) from its finished runs in ``out``."""
    from convergence.curves.compare import compare_paths
    from convergence.protocol.judge import check_design

    if not plan.pilot:
        raise BadInput("not a pilot plan (--design fork --pilot N)")
    check_design(plan, out)  # continuations that ended as copies of one another would make the spread 0
    conts = [r for r in plan.runs() if r.role != "trunk"]
    trunks = [r for r in plan.runs() if r.role == "trunk"]
    vals = {r.name: _val(metrics_path(out, r)) for r in conts}
    horizons = sorted(set.intersection(*(set(v) for v in vals.values())) - set(range(plan.fork_step + 1)))
    if not horizons:
        raise BadInput(f"{out}: the continuations share no evaluation after step {plan.fork_step}")
    levels: dict[str, dict[int, float]] = {r.name: {} for r in conts}
    at = {}
    for h in horizons:
        mean = np.mean([vals[r.name][h] for r in conts])
        for r in conts:
            levels[r.name][h] = vals[r.name][h] / mean - 1
        at[h] = _spread([[levels[r.name][h] for r in conts if r.after == t.name] for t in trunks])
    paths = [metrics_path(out, r) for r in conts]
    judged = compare_paths(paths, paths[0], margin=plan.margin, metric="val_loss", each_once=False)
    fw = judged["final_window"]
    final = _spread([[x for x, r in zip(fw["replicate_levels"], conts) if r.after == t.name] for t in trunks])
    ref = _reference(str(reference), plan) if reference else None
    explained = None
    if ref and ref["final_window"] and final:
        explained = 1 - (final["spread"] / ref["final_window"]["spread"]) ** 2
    trunk_vals = {t.name: _val(metrics_path(out, t)) for t in trunks}
    try:
        hardware = runs_hardware_tag(plan, out)
    except BadInput:  # runs on several models (--mixed-environment), or without a recorded one: none to name
        hardware = None
    return {"kind": "fork pilot", "plan": plan.as_dict(), "hardware": hardware,
            "fork_step": plan.fork_step, "steps": plan.steps,
            "trunks": [{"name": t.name, "seed": t.seed, "val_loss_at_fork": trunk_vals[t.name].get(plan.fork_step)}
                       for t in trunks],
            "continuations": [{"name": r.name, "trunk": r.after, "row_order": r.row_order,
                               "val_loss": {str(h): vals[r.name][h] for h in horizons},
                               "level": {str(h): levels[r.name][h] for h in horizons},
                               "final_window_level": x} for r, x in zip(conts, fw["replicate_levels"])],
            "horizons": horizons, "spread_at_step": {str(h): at[h] for h in horizons},
            "final_window": {"steps": [fw["start_step"], fw["end_step"]], **(final or {}),
                             "se_set": fw.get("se_set"), "heldout_batches": fw.get("heldout_batches")},
            "fork_spread": None if final is None else final["spread"],
            "independent": None if ref is None else ref | {"at_step": {str(k): v for k, v in ref["at_step"].items()}},
            "explained": explained, "gpu_hours": _gpu_hours(out),
            "deterministic_pace": _deterministic_pace(out, conts, trunks, plan.fork_step)}


def pilot_lines(r: dict) -> list[str]:
    """The pilot in words."""
    fw, ref = r["final_window"], r.get("independent")
    cells = ", ".join(f"{h}: {s['spread']:.3%}" for h, s in r["spread_at_step"].items() if s)
    lines = [f"fork pilot: {len(r['continuations'])} BF16 continuations of {len(r['trunks'])} trunk(s) from step "
             f"{r['fork_step']} to {r['steps']}; their spread at each evaluation: {cells}"]
    if fw.get("spread") is not None:
        lo, hi = fw["interval_95"]
        lines.append(f"final window (steps {fw['steps'][0]}..{fw['steps'][1]}): within-trunk spread {fw['spread']:.3%} "
                     f"(95 % interval {lo:.3%} to {hi:.3%}, {fw['dof']} degrees of freedom)")
    if ref and ref.get("final_window"):
        f = ref["final_window"]
        cells = ", ".join(f"{h}: {s['spread']:.3%}" for h, s in ref["at_step"].items() if s)
        on = f" on {ref['hardware']}" if ref.get("hardware") else ""
        lines.append(f"independent runs (k16 plan, {ref['runs']} BF16 runs{on}): {cells}; final window "
                     f"{f['spread']:.3%}" + ("" if r["explained"] is None else
                                             f"; the fork removes {r['explained']:.0%} of the variance (the "
                                             "projection assumed 70 %)"))
        if ref.get("hardware") and r.get("hardware") and ref["hardware"] != r["hardware"]:
            lines.append(f"the pilot's runs ({r['hardware']}) and the k16 plan's ({ref['hardware']}) were made on "
                         "different GPU models, which compute the same run differently: the two spreads are "
                         "compared as spreads, and the share removed holds if the spread does not depend on the model")
    g = r["gpu_hours"]
    lines.append(f"GPU-hours: {g['total']:.2f} over {g['pieces']} pieces"
                 + ("" if r.get("deterministic_pace") is None else
                    f"; a step of the deterministic trunk took {r['deterministic_pace']:.2f}x a continuation's"))
    return lines


def pilot_note(r: dict) -> str:
    """The pilot in one line: its golden sidecar's note."""
    fw, ref = r["final_window"], r.get("independent") or {}
    if fw.get("spread") is None:
        return f"fork pilot: {len(r['continuations'])} continuations, no final-window spread"
    lo, hi = fw["interval_95"]
    line = (f"fork pilot: {len(r['continuations'])} BF16 continuations from step {r['fork_step']}, final-window "
            f"within-trunk spread {fw['spread']:.3%} (95 % interval {lo:.3%} to {hi:.3%})")
    if ref.get("final_window") and r.get("explained") is not None:
        on = f" on {ref['hardware']}" if ref.get("hardware") else ""
        line += (f"; independent runs{on} {ref['final_window']['spread']:.3%}: the fork removes "
                 f"{r['explained']:.0%} of the variance")
    return line
