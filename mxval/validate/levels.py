"""The five rungs of ``mxval validate``, each a function ``(plan, out, progress) -> LevelResult``.

Every level calls the suite's own Python API (nothing is re-implemented here) and writes its full
output under ``out/<level>/``; the function condenses it into checks, key numbers, a table and
figures (``mxval.validate.figures``).

  ``run_tensor``         ``numerics.tensor.report.tensor_report``: torchao's cast against the oracle, block by block
  ``run_layer``          ``numerics.layer.harness.run_suite`` + floors + ``golden.layer_stats.compare``
  ``run_communication``  ``numerics.ep.check.main``: the reference on gloo (CPU) / NCCL, DeepEP when present
  ``run_training``       ``convergence.protocol.plan`` + ``schedule``: the paired MXFP8 run, BF16 replicates, both
                         controls (one run per GPU at a time on a GPU machine)
  ``run_curves``         ``convergence.protocol.judge``: the three validation-loss verdicts and the
                         difference they resolve at this size
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

from mxval.validate import figures as figs
from mxval.validate.ladder import Check, LadderPlan, LevelResult, level_status
from numerics.files import atomic_write

Progress = Callable[[str], None]

DEEPEP_ENABLE = ("on a machine with 2+ NVLink-connected GPUs, install DeepEP per its README "
                 "(github.com/deepseek-ai/DeepEP, v1.2.x) so that `import deep_ep` works, then rerun")


def _rel(path: Path, out: Path) -> str:
    return str(path.relative_to(out))


def _fmt(v, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}" if math.isfinite(v) else str(v)
    return str(v)


# ---------------------------------------------------------------- tensor

def run_tensor(plan: LadderPlan, out: Path, progress: Progress) -> LevelResult:
    from numerics.tensor import report
    from numerics.tolerances import floor

    progress(f"torchao to_mx against numerics.tensor.mx ({plan.tensor_size} profile)")
    doc = report.tensor_report(size=plan.tensor_size, seed=plan.seed, device=plan.device, subjects=["torchao"])
    (out / "tensor").mkdir()
    atomic_write(out / "tensor" / "report.json", json.dumps(doc, indent=1, default=str) + "\n")
    recs = doc["records"]
    checks, table = [], [("elem", "mode", "family", "SQNR dB", "floor dB", "max abs err", "blocks",
                          "bit-exact", "known findings", "unexplained")]
    findings: dict[str, int] = {}
    for r in recs:
        # torchao's own bar for every family; the tighter measured floor for Gaussian activations
        tols = [floor("tensor", r["elem"], "roundtrip", "sqnr_db")]
        if r["family"] == "normal":
            tols.append(floor("tensor", r["elem"], "roundtrip_normal", "sqnr_db"))
        tol = max(tols, key=lambda t: t.floor)
        known = r.get("blocks_known_findings") or {}
        for k, n in known.items():
            findings[k] = findings.get(k, 0) + int(n)
        table.append((r["elem"], r["mode"], r["family"], _fmt(r["sqnr_db"]), _fmt(tol.floor, 1),
                      f"{r['max_abs_err']:.3g}", str(r["blocks"]), str(r["blocks_bit_exact"]),
                      ", ".join(f"{k}: {n}" for k, n in known.items() if n) or "-", str(r["blocks_unexplained"])))
        name = f"{r['elem']}/{r['mode']}/{r['family']}"
        if r["blocks_unexplained"]:
            checks.append(Check(f"bit-exact {name}", "fail", f"{r['blocks_unexplained']} of {r['blocks']} blocks "
                                "differ from the oracle and match no known finding"))
        if not r["sqnr_db"] >= tol.floor:
            checks.append(Check(f"SQNR {name}", "fail", tol.describe(r["sqnr_db"])))
    blocks = sum(r["blocks"] for r in recs)
    exact = sum(r["blocks_bit_exact"] for r in recs)
    unexplained = sum(r["blocks_unexplained"] for r in recs)
    if not any(c.name.startswith("bit-exact") for c in checks):
        checks.insert(0, Check("bit-exact against the oracle", "pass",
                               f"{blocks} blocks over {len(recs)} (elem, mode, family) cells: {exact} bit-exact, "
                               "the rest claimed by known findings (FINDINGS.md): "
                               + (", ".join(f"{k} {n}" for k, n in findings.items() if n) or "none")))
    if not any(c.name.startswith("SQNR") for c in checks):
        checks.append(Check("SQNR of the round trip", "pass", "every cell above its floor (numerics/tolerances.py)"))
    sqnr = {f"{r['elem']}/{r['mode']}": min(x["sqnr_db"] for x in recs
                                            if (x["elem"], x["mode"]) == (r["elem"], r["mode"]))
            for r in recs}
    numbers = {"blocks": blocks, "blocks_bit_exact": exact, "blocks_unexplained": unexplained,
               "blocks_known_findings": findings, "min_sqnr_db": sqnr, "versions": doc.get("header")}
    fig = figs.tensor_sqnr(recs, out / "figures" / "tensor_sqnr.png")
    status = level_status(checks)
    # the lowest per element format: MXFP8's E4M3 is not to be read off FP4's 16 dB
    lowest = {e: min(r["sqnr_db"] for r in recs if r["elem"] == e) for e in dict.fromkeys(r["elem"] for r in recs)}
    summary = (f"{exact}/{blocks} blocks bit-exact, {unexplained} unexplained; lowest SQNR "
               + ", ".join(f"{e} {v:.1f} dB" for e, v in lowest.items()) if recs else "the report returned no records")
    return LevelResult("tensor", status if recs else "fail", summary, tuple(checks), numbers, tuple(table),
                       (_rel(fig, out),), ("tensor/report.json",))


# ---------------------------------------------------------------- layer

def run_layer(plan: LadderPlan, out: Path, progress: Progress) -> LevelResult:
    from golden import layer_stats
    from numerics import environment
    from numerics.layer import harness
    from numerics.layer import results as layers
    from numerics.layer.configs import suite

    cfg = suite(plan.layer_config)
    results = harness.run_suite(cfg, device=plan.device, progress=progress)
    head = harness.header(plan.layer_config, plan.device)
    (out / "layer").mkdir()
    atomic_write(out / "layer" / "layers.json", layers.to_json(results, head) + "\n")
    atomic_write(out / "layer" / "layers.md", layers.format_table(results, markdown=True) + "\n")
    bad = layers.floor_violations(results)
    n_fig = sum(len(layers.floors_for(r.layer, s.recipe, s.tensor, r.shape.get("input", "normal"))) > 0
                for r in results for s in r.stats)
    checks = [Check("SQNR against the BF16 run, above the floors", "fail" if bad else "pass",
                    "; ".join(bad[:5]) + (f" (+{len(bad) - 5} more)" if len(bad) > 5 else "") if bad
                    else f"{n_fig} MXFP8 figures over {len(results)} layers, each above its floor")]
    hw = environment.hardware_tag() if plan.device != "cpu" else "cpu"
    gold = layer_stats.DIR / f"layer_stats_{plan.layer_config}__{hw}.json"
    if gold.exists():
        measured = [rec for r in results for rec in r.records()]
        problems = layer_stats.compare(json.loads(gold.read_text())["records"], measured)
        checks.append(Check(f"golden/{gold.parent.name}/{gold.name}", "fail" if problems else "pass",
                            "; ".join(problems[:5]) if problems else
                            f"no figure more than {layer_stats.MAX_CHANGE_DB} dB from the committed statistics"))
    else:
        checks.append(Check("golden statistics", "skipped",
                            f"no golden/layers/{gold.name} for this config and hardware; make one with "
                            f"python -m golden.layer_stats from-json {out / 'layer' / 'layers.json'}"))
    table = [("layer", "case", "tensor", "MXFP8 vs BF16 dB", "floor dB", "wgrad-hp vs BF16 dB",
              "MXFP8 vs FP32 dB", "BF16 vs FP32 dB")]
    lowest: dict[str, float] = {}
    for r in results:
        family = r.shape.get("input", "normal")
        for t in r.tensors():
            s = r.stat("mxfp8", t)
            floors = layers.floors_for(r.layer, "mxfp8", t, family)
            hp = r.stat("mxfp8_wgrad_hp", t) if "mxfp8_wgrad_hp" in {x.recipe for x in r.stats} else None
            table.append((r.layer, r.case, t, _fmt(s.sqnr_vs_bf16), _fmt(max((f.floor for f in floors), default=None)),
                          _fmt(hp.sqnr_vs_bf16 if hp else None), _fmt(s.sqnr_vs_fp32),
                          _fmt(r.stat("bf16", t).sqnr_vs_fp32)))
            key = f"{r.layer}.{t.split(':')[0]}"
            if s.sqnr_vs_bf16 is not None and t.split(":")[0] in ("out", "dx", "dw"):
                lowest[key] = min(lowest.get(key, math.inf), s.sqnr_vs_bf16)
    fig = figs.layer_sqnr(results, out / "figures" / "layer_sqnr.png")
    status = level_status(checks)
    summary = (f"config {plan.layer_config} on {plan.device}: {len(results)} layers, "
               + (f"{len(bad)} figures below floor" if bad else "all MXFP8 figures above their floors")
               + f"; lowest MXFP8 SQNR vs BF16 {min(lowest.values()):.1f} dB")
    numbers = {"config": plan.layer_config, "layers": len(results), "below_floor": len(bad),
               "min_sqnr_vs_bf16_db": {k: round(v, 2) for k, v in lowest.items()}}
    return LevelResult("layer", status, summary, tuple(checks), numbers, tuple(table), (_rel(fig, out),),
                       ("layer/layers.json", "layer/layers.md"))


# ---------------------------------------------------------------- communication

COMM_GROUPS = {  # what each group of numerics.ep.check rows means, for the report
    "bad_input": "{n} malformed inputs: ValueError naming the defect on the rank that has it, PeerInputError on "
                 "the others, before any payload moves",
    "case": "all {cases} routings ran to completion on every rank",
    "layout": "{n} layout tensors x {cases} cases, bit for bit",
    "dispatch": "{n} received tensors x {cases} cases, bit for bit (payload, top-k index and weight, counts)",
    "dispatch_cached": "{n} received tensors x {cases} cases with the cached handle, bit for bit",
    "combine": "sums x {cases} cases, bit for bit",
    "determinism": "a second identical call gives the same bits ({n} tensors x {cases} cases)",
}


def run_communication(plan: LadderPlan, out: Path, progress: Progress) -> LevelResult:
    from numerics.ep import check

    (out / "communication").mkdir()
    path = out / "communication" / "check.json"
    argv = ["--world", str(plan.ep_world), "--cases", str(plan.ep_cases), "--seed", str(plan.seed),
            "--json", str(path)] + (["--strict"] if plan.strict else [])
    if plan.ep_backend == "deepep":
        argv += ["--backend", "deepep", "--against", "reference"]
        what = f"DeepEP against the NCCL all-to-all, {plan.ep_world} GPUs"
    else:
        comm = "NCCL" if plan.gpus >= plan.ep_world else "gloo"
        what = f"all-to-all reference on {comm} against the single-process simulation, {plan.ep_world} ranks"
    progress(what)
    rc = check.main(argv)
    return communication_result(json.loads(path.read_text()), rc, what, plan)


def communication_result(doc: dict, rc: int, what: str, plan: LadderPlan) -> LevelResult:
    """The level from ``numerics.ep check``'s JSON: its status and verdict line, never a second opinion.

    A group of check rows fails when a row has a difference no known finding explains, or (under
    ``--strict``) a known one; a group whose only differences are known passes and says how many values
    the findings touched."""
    groups: dict[str, list] = {}
    for name, row in doc["checks"].items():
        groups.setdefault(name.split(".")[0], []).append((name, row))
    checks, table = [], [("check", "cases", "failures", "known findings", "first mismatch")]
    for group, rows in groups.items():
        failed = [(n, r) for n, r in rows if r["failures"]]
        found = {fid: k for _, r in rows for fid, k in (r.get("known") or {}).items()}
        cases = max(r["cases"] for _, r in rows)
        known_text = ", ".join(f"known {fid} on {k['values']} values in {k['cases']} cases" for fid, k in found.items())
        if failed:
            checks.append(Check(group, "fail", f"{failed[0][0]}: {failed[0][1]['first']} "
                                               f"(case {failed[0][1]['first_case']})"))
        elif found:
            checks.append(Check(group, "fail" if doc.get("strict") else "pass",
                                f"bit for bit except {known_text} (FINDINGS.md)"
                                + ("; --strict fails known findings" if doc.get("strict") else "")))
        else:
            checks.append(Check(group, "pass", COMM_GROUPS.get(group, "{n} checks x {cases} cases, bit for bit")
                                .format(n=len(rows), cases=cases)))
        for n, r in rows:
            known_cell = ", ".join(f"{fid}: {k['values']}" for fid, k in (r.get("known") or {}).items()) or "-"
            table.append((n, str(r["cases"]), str(r["failures"]), known_cell, r["first"] or ""))
    enable = None
    if plan.ep_backend != "deepep":
        why = (f"needs 2+ CUDA GPUs (found {plan.gpus})" if plan.gpus < 2 else "deep_ep is not importable")
        checks.append(Check("DeepEP against NCCL", "skipped", why))
        enable = DEEPEP_ENABLE
    status_of_check = doc.get("status", "pass" if doc.get("passed") else "fail")
    if (rc != 0 or status_of_check != "pass") and not any(c.status == "fail" for c in checks):
        checks.append(Check("check exit code", "fail", f"numerics.ep check exited {rc}: {doc.get('summary', '')}"))
    cases = max((r["cases"] for r in doc["checks"].values()), default=0)
    status = level_status(checks)
    found = doc.get("known") or {}
    if status == "pass" and not found:
        outcome = "every check bit-exact"
    elif status == "pass":
        outcome = "bit-exact except known findings: " + ", ".join(
            f"{fid} on {k['values']} values in {k['cases']} cases" for fid, k in found.items())
    else:
        outcome = doc.get("verdict") or "MISMATCHES (see table)"
    summary = f"{what}: {cases} cases, {outcome}"
    numbers = {"backend": doc["backend"], "against": doc["against"], "world": doc["world"],
               "comm_backend": doc["comm_backend"], "cases": cases, "seconds": doc["seconds"],
               "failures": sum(r["failures"] for r in doc["checks"].values()),
               "known": doc.get("known", {}), "strict": bool(doc.get("strict")),
               "combine_start": doc.get("combine_start")}
    return LevelResult("communication", status, summary, tuple(checks), numbers, tuple(table), (),
                       ("communication/check.json",), enable)


# ---------------------------------------------------------------- training

def protocol_plan(plan: LadderPlan):
    """The convergence protocol at this machine's size: the paired MXFP8 run and BF16 replicates, judged by the
    declared test (equivalence on the final window), the planted positive control and the held-out negative
    control; on a CPU also the null control (mxfp8-null beside its BF16 twin, deterministic, bit-identical: two
    tiny runs, a strong check of the seam; on a GPU the ``gpu`` tier holds it on the proxy)."""
    from convergence.protocol.plan import ProtocolPlan

    return ProtocolPlan(model=plan.train_model, steps=plan.train_steps, seed=plan.seed,
                        replicates=plan.train_replicates, design=plan.train_design, device=plan.device,
                        mxfp8_kernel=plan.mxfp8_kernel, null_control=plan.device == "cpu",
                        overrides=(("val_batches", plan.train_val_batches),) if plan.train_val_batches else ()).check()


def run_training(plan: LadderPlan, out: Path, progress: Progress) -> LevelResult:
    from convergence.protocol.folder import metrics_path, open_protocol, probes_path
    from convergence.protocol.schedule import LocalExecutor, execute
    from convergence.train.checkpoint import JsonlLog

    pp = protocol_plan(plan)
    root = out / "training"
    open_protocol(pp, root)
    slots = max(1, plan.gpus) if plan.device == "cuda" else 1
    progress(f"convergence protocol: {len(pp.runs())} {plan.train_model} runs of {plan.train_steps} steps, "
             f"{slots} at a time")

    execute(pp, root, LocalExecutor(slots=slots))  # no deadline here: every piece runs to the end
    checks, numbers = [], {"model": plan.train_model, "steps": plan.train_steps, "replicates": pp.replicates,
                           "design": pp.design, "runs": {}}
    table = [("run", "role", "recipe", "init / data / rows", "steps", "first loss", "final loss (last 10%)",
              "final val loss", "median tokens/s")]
    files, curves = [], {}  # each run's metrics file as it is on disk (.jsonl.gz once finished); its steps, losses
    for spec in pp.runs():
        path = metrics_path(root, spec)
        files.append(path)
        recs = JsonlLog(path).records()
        losses = [r["loss"] for r in recs]
        curves[spec.name] = ([r["step"] for r in recs], losses)
        tail = losses[-max(1, len(losses) // 10):]
        final = sum(tail) / len(tail)
        val = [r["val_loss"] for r in recs if "val_loss" in r]
        tps = sorted(r["tokens_per_s"] for r in recs)[len(recs) // 2]
        finite = all(isinstance(v, float) and math.isfinite(v) for v in losses) and len(losses) == plan.train_steps
        learned = finite and final < losses[0]
        numbers["runs"][spec.name] = {"role": spec.role, "recipe": spec.recipe, "seed": spec.seed,
                                      "data_seed": spec.data_seed, "row_order": spec.row_order,
                                      "first_loss": losses[0], "final_loss": final,
                                      "final_val_loss": val[-1] if val else None, "median_tokens_per_s": tps,
                                      "dir": _rel(path.parent, out)}
        rows = "as drawn" if spec.row_order is None else f"permuted ({spec.row_order})"
        table.append((spec.name, spec.role, spec.recipe, f"{spec.seed} / {spec.data_seed} / {rows}", str(len(losses)),
                      _fmt(losses[0], 4), _fmt(final, 4), _fmt(val[-1] if val else None, 4), f"{tps:,.0f}"))
        checks.append(Check(f"{spec.name} trains", "pass" if learned else "fail",
                            f"{len(losses)}/{plan.train_steps} steps, loss {losses[0]:.3f} -> {final:.3f}"
                            if finite else f"non-finite loss or stopped early after {len(losses)} steps"))
    probes = JsonlLog(probes_path(root, pp.run("candidate"))).records()  # none for a run without probes
    if probes:
        last = probes[-1]["layers"]
        worst = min(((v, f"{layer} {k.removesuffix('_sqnr_db')}") for layer, d in last.items() for k, v in d.items()),
                    default=(None, ""))
        numbers["probe_min_sqnr_db"] = {"step": probes[-1]["step"], "value": worst[0], "where": worst[1]}
        checks.append(Check("layer probes (reported, not judged)", "pass",
                            f"at step {probes[-1]['step']} the lowest MXFP8-vs-BF16 SQNR on the run's own "
                            f"activations is {_fmt(worst[0], 1)} dB ({worst[1]})"))
    fig = figs.training_curves(out, curves, probes, out / "figures" / "training.png")
    runs_ = numbers["runs"]
    b = runs_["bf16"]["final_val_loss"]
    rel = {name: v["final_val_loss"] / b - 1 for name, v in runs_.items() if name != "bf16" and b}
    summary = (f"{plan.train_model} model, {plan.train_steps} steps, {len(runs_)} runs: final validation loss BF16 "
               f"{b:.4f}; against it " + ", ".join(f"{n} {x:+.2%}" for n, x in rel.items()))
    return LevelResult("training", level_status(checks), summary, tuple(checks), numbers, tuple(table),
                       (_rel(fig, out),), tuple(_rel(p, out) for p in files))


# ---------------------------------------------------------------- curves

VERDICT_STATUS = {"equivalent": "pass", "non_inferior": "pass", "not_equivalent": "fail", "inferior": "fail",
                  "diverged": "fail", "inconclusive": "inconclusive",
                  "incomplete": "fail"}  # a run that did not cover the others is not a pass
# A control that does not come out as expected says the protocol cannot be trusted at this size (too short, too
# few replicates), not that MXFP8 failed: its check is inconclusive, and so is the candidate's verdict.


def _passed(r: dict) -> bool:
    """Whether a control came out as it must: by its own check (``protocol.outcome``), or for a result judged by
    the rule before declared tests, by its verdict word (``judge.as_expected``)."""
    from convergence.protocol.judge import as_expected

    if r["protocol"].get("outcome") is not None:
        return bool(r["protocol"]["outcome"]["passed"])
    return bool(as_expected(r["verdict"], r["protocol"]["expected"]))


def _control_said(name: str, r: dict) -> str:
    """A control's outcome by its own check, in words (``convergence.protocol.judge.control_outcome``)."""
    o = r["protocol"].get("outcome") or {}
    if o.get("check") == "covers_zero":
        if o.get("interval") is None:
            return f"cannot tell: {r['reason']}"
        lo, hi = o["interval"]
        return (f"{'covers' if o['covers_zero'] else 'does not cover'} 0: {o['interval_level']:.0%} interval "
                f"[{lo:+.3%}, {hi:+.3%}], p = {o['p_no_difference']:.3g} against no difference")
    if o.get("check") == "detected":
        chance = o.get("planned_chance")
        return (f"{r['verdict']} ({'detected' if o['passed'] else 'not detected'}"
                + (f", planted +{o['planted_shift']:.3%}" if o.get("planted_shift") else "")
                + (f", planned chance {chance:.0%}" if chance is not None else ", no chance planned at this size")
                + f"): {r['reason']}")
    return f"{r['verdict']}: {r['reason']}"


def protocol_checks(verdicts: dict[str, dict], pp) -> list[Check]:
    """The candidate's check and one per control (by its own check: detected, covers 0, identical); a control
    that misses makes the candidate inconclusive."""
    from convergence.curves.compare import resolution
    from convergence.protocol.plan import COVERS_ZERO

    r = verdicts["verdict"]
    controls, untrusted = [], []
    for name, (_roles, expected, shows) in pp.verdicts().items():
        if expected is None:
            continue
        c = verdicts[name]
        ok = _passed(c)
        if not ok:
            untrusted.append(name.replace("_", " "))
        runs = c["protocol"].get("judged_runs") or [c["protocol"]["judged_run"]]
        who = ", ".join(runs[:3]) + ("..." if len(runs) > 3 else "")
        must = "covers zero" if expected == COVERS_ZERO else f"is {expected.replace('_', ' ')}"
        controls.append(Check(f"{name.replace('_', ' ')} ({who}) {must}",
                              "pass" if ok else "inconclusive", f"{_control_said(name, c)} ({shows})"))
    status = VERDICT_STATUS[r["verdict"]]
    detail = f"{r['reason']}; {resolution(r)}"
    if untrusted and status != "inconclusive":
        status, detail = "inconclusive", (f"{r['verdict']} not trusted: the {' and the '.join(untrusted)} did not "
                                          f"come out as expected at this size; {detail}")
    test = r.get("test") or "two-ranges"
    return [Check(f"MXFP8 within the margin of BF16 (validation loss, paired; {test} on the "
                  f"{r.get('endpoint') or 'two ranges'})", status, detail), *controls]


def curves_summary(verdicts: dict[str, dict]) -> str:
    """The curves level's line: a control that missed comes first, since it makes the candidate's verdict
    untrusted whatever that verdict says (the row's status is inconclusive then: ``protocol_checks``); then the
    candidate's verdict (its test, the estimate, interval and p-values, what the runs resolve) and each control's
    outcome."""
    from convergence.curves.compare import resolution

    r = verdicts["verdict"]
    said = f"{r['verdict']}: {r['reason']}; {resolution(r)}"
    controls = {n: v for n, v in verdicts.items() if n != "verdict"}
    missed = [f"the {n.replace('_', ' ')} came out {_word(v)}, where {v['protocol']['expected']} was expected"
              for n, v in controls.items() if not _passed(v)]
    if missed:
        return f"not trusted at this size: {' and '.join(missed)}; the candidate's comparison alone: {said}"
    return f"{said}; controls: " + ", ".join(f"{n.replace('_', ' ').removesuffix(' control')} {_word(v)}"
                                             for n, v in controls.items())


def _word(r: dict) -> str:
    """How a control came out, in a word or two (its own check's, or its verdict under the rule before)."""
    o = r["protocol"].get("outcome")
    if not o:
        return r["verdict"]
    if o["check"] == "covers_zero":
        return {True: "covers 0", False: "does not cover 0", None: "cannot tell"}[o.get("covers_zero")]
    if o["check"] == "detected":
        return f"{r['verdict']} ({'detected' if o['passed'] else 'not detected'})"
    return r["verdict"]


def run_curves(plan: LadderPlan, out: Path, progress: Progress) -> LevelResult:
    from convergence.curves.plots import plot_comparison
    from convergence.protocol.judge import judge

    pp = protocol_plan(plan)
    progress(f"validation loss: MXFP8 and its controls against {pp.replicates} BF16 runs")
    verdicts = judge(pp, out / "training")
    (out / "curves").mkdir()
    for name, r in verdicts.items():
        atomic_write(out / "curves" / f"{name}.json", json.dumps(r, indent=1, default=str) + "\n")
    r = verdicts["verdict"]
    fig = plot_comparison(r, out / "figures" / "curves.png")
    checks = protocol_checks(verdicts, pp)
    sens, noise = r.get("sensitivity") or {}, r.get("noise") or {}
    numbers = {"verdict": r["verdict"], "reason": r["reason"], "margin": r["margin"], "estimate": r["estimate"],
               "interval": r["interval"], "final_window_interval": (r["final_window"] or {}).get("interval"),
               "half_width": sens.get("half_width"), "smallest_detectable": sens.get("smallest_detectable_difference"),
               "intervals_reach": sens.get("intervals_reach"),
               "replicate_spread": noise.get("replicate_spread"), "se_set": noise.get("se_set"),
               "noise_model": noise.get("model"), "baselines": r["baseline_runs"],
               "test": r.get("test"), "endpoint": r.get("endpoint"), "alpha": r.get("alpha"),
               "interval_level": r.get("interval_level"), "p_no_difference": r.get("p_no_difference"),
               "p_test": r.get("p_test"), "resolves": r.get("half_width"), "smallest_margin": r.get("smallest_margin"),
               "positive_control": verdicts["positive_control"]["verdict"],
               "negative_control": verdicts["negative_control"]["verdict"],
               "controls": {n: {"verdict": v["verdict"], "expected": v["protocol"]["expected"],
                                "as_expected": v["protocol"]["as_expected"], "outcome": v["protocol"].get("outcome")}
                            for n, v in verdicts.items() if n != "verdict"}}
    status = level_status(checks)
    enable = None
    if status == "inconclusive":
        enable = (f"at this size ({plan.train_model}, {plan.train_steps} steps, {pp.replicates} BF16 runs) the verdict "
                  f"resolves +-{_fmt((sens.get('half_width') or math.nan) * 100, 3)} %; python -m convergence power "
                  f"{out / 'curves' / 'verdict.json'} says how many replicates and steps reach the margin; run them "
                  "with python -m convergence protocol (README: the convergence protocol), or mxval validate --steps N")
    table = [("comparison", "verdict", "estimate", "interval", "p (no difference)", "test's p", "half-width",
              "control's check")]
    for name, v in verdicts.items():
        part = v.get("final_window") or {}
        iv = v.get("interval")
        o = v["protocol"].get("outcome") or {}
        table.append((name, v["verdict"], f"{v['estimate']:+.3%}" if v.get("estimate") is not None else "-",
                      f"[{iv[0]:+.3%}, {iv[1]:+.3%}]" if iv else "-",
                      _fmt(v.get("p_no_difference"), 3), _fmt(v.get("p_test"), 3),
                      f"{part['half_width']:.3%}" if part.get("half_width") is not None else "-",
                      "-" if not o else f"{o['check']}: {'yes' if o['passed'] else 'NO'}"))
    summary = curves_summary(verdicts)
    return LevelResult("curves", status, summary, tuple(checks), numbers, tuple(table), (_rel(fig, out),),
                       tuple(f"curves/{name}.json" for name in verdicts), enable)
