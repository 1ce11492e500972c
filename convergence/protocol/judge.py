"""A protocol's verdicts and result files: the design checked from the runs' own files, the comparisons on
validation loss (and the null control's identity), and OUT/results/ with a golden-style sidecar per file.

Public: ``judge(plan, out)``, ``judge_logs(plan, log_of)``, ``check_design(plan, out)``, ``as_expected(verdict,
expected)``, ``control_outcome(plan, name, r)``, ``null_identity(twin, null)``, ``write_results(plan, out, verdicts,
command, hardware)``.

Each verdict is ``compare_paths`` of its runs against the plan's baselines, with the plan's declared test, alpha and
endpoint (a plan from before them: the ``two-ranges`` rule it was judged by), blocked by trunk in a fork plan;
``protocol.outcome`` says how a control came out by its own check (``control_outcome``): the positive control
``detected`` or not (with the chance the plan gave it in advance: ``convergence.protocol.projection``), the
negative control's interval ``covers_zero`` or not, the null control ``identical`` or not.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path

from convergence.curves.decision.equivalence import PART_OF, WORDS
from convergence.protocol.folder import amendments, gzipped, metrics_path, probes_path, run_config
from convergence.protocol.plan import COVERS_ZERO, IDENTICAL, PLANTED, ProtocolPlan, RunSpec
from convergence.protocol.provenance import run_environments, runs_environment
from convergence.train.checkpoint import JsonlLog
from numerics.errors import BadInput
from numerics.files import reading_once


def as_expected(verdict: str, expected: str | None) -> bool | None:
    """Whether a control came out as it must (None for the candidate): a diverged positive control was told
    apart from BF16 as surely as a not_equivalent one."""
    if expected is None:
        return None
    return verdict == expected or (expected == "not_equivalent" and verdict == "diverged")


def check_design(plan: ProtocolPlan, out: Path) -> None:
    """The design's premise, checked from the runs' own files: runs given one init seed start from the same
    weights and runs given different seeds from different ones (by the init fingerprint in config.json: a seed
    that does not reach the init would make an init design a rounding one), and no two finished runs ended with
    the same validation losses (a perturbation that did not reach the run would make its replicate a copy, and
    the spread too small). Fingerprints older than SHA-256 (float sums, which depend on the CPU thread count) and
    runs not made yet are not compared."""
    by_seed: dict[int, dict[str, list[str]]] = {}
    ends: dict[tuple, str] = {}
    for spec in plan.runs():
        fp = run_config(out, spec).get("init_fingerprint")
        if isinstance(fp, str) and fp.startswith("sha256:"):
            by_seed.setdefault(spec.seed, {}).setdefault(fp, []).append(spec.name)
        if spec.role == "null_control":  # the one run that must end as its twin did (null_identity checks it)
            continue
        vals = [r["val_batch_losses"] for r in JsonlLog(metrics_path(out, spec)).records() if "val_batch_losses" in r]
        if vals:
            end = tuple(vals[-1])
            if end in ends:
                raise BadInput(f"{out}: runs {ends[end]} and {spec.name} ended with the same validation losses, "
                               "batch for batch: the design's change did not reach one of them")
            ends[end] = spec.name
    for seed, fps in by_seed.items():
        if len(fps) > 1:
            raise BadInput(f"{out}: runs of init seed {seed} start from different weights ("
                           + "; ".join(f"{', '.join(names)}: {fp}" for fp, names in fps.items()) + ")")
    seeds_of: dict[str, list[int]] = {}
    for seed, fps in by_seed.items():
        seeds_of.setdefault(next(iter(fps)), []).append(seed)
    for fp, seeds in seeds_of.items():
        if len(seeds) > 1:
            raise BadInput(f"{out}: init seeds {', '.join(map(str, sorted(seeds)))} gave the same weights ({fp}): "
                           "the seed does not reach the initialisation")


def judge(plan: ProtocolPlan, out: Path) -> dict[str, dict]:
    """The plan's verdicts (``ProtocolPlan.verdicts``) on validation loss, from the finished runs (checked against
    the design first: ``check_design``); a plan changed after some of its runs had finished carries its changes in
    every verdict (``protocol.amendments``: ``folder.amendments``)."""
    check_design(plan, out)
    verdicts = judge_logs(plan, lambda spec: metrics_path(out, spec))
    changes = amendments(out)
    if changes:  # absent otherwise: the verdicts of a plan never changed read as they always did
        for r in verdicts.values():
            r["protocol"]["amendments"] = changes
    return verdicts


@reading_once()  # every verdict reads the BF16 runs' logs again, and each log is read for three series
def judge_logs(plan: ProtocolPlan, log_of: Callable[[RunSpec], Path]) -> dict[str, dict]:
    """``judge`` on the runs' metrics logs wherever they are (``log_of(spec)``): a plan's runs recorded outside its
    folder, as golden/training holds a whole plan's, are judged by the same code that judged them."""
    from convergence.curves.compare import compare_paths

    base_specs = plan.baselines()
    baselines = [log_of(r) for r in base_specs]
    declared = {} if plan.legacy else {"test": plan.test, "alpha": plan.alpha, "endpoint": plan.endpoint}
    result = {}
    for name, (_roles, expected, shows) in plan.verdicts().items():
        judged = plan.judged(name)
        if name == "null_control":
            r = null_identity(log_of(plan.run("baseline")), log_of(judged[0]))
        else:
            shift = plan.planted_shift * plan.margin if name == "positive_control" and plan.control == PLANTED else 0.0
            first, *more = (log_of(r) for r in judged)
            blocks = plan.blocks(base_specs)
            r = compare_paths(baselines, first, margin=plan.margin, metric="val_loss", candidate_replicates=more,
                              planted_shift=shift, blocks=None if blocks is None else (blocks, plan.blocks(judged)),
                              **declared)
        outcome = control_outcome(plan, name, r)
        r["protocol"] = {"verdict": name, "judged_run": judged[0].name,
                         "judged_runs": [s.name for s in judged], "expected": expected, "shows": shows,
                         "as_expected": as_expected(r["verdict"], expected) if plan.legacy or outcome is None
                         else outcome["passed"], "outcome": outcome,
                         "plan": plan.as_dict(),
                         "runs": [dataclasses.asdict(s) for s in plan.runs()]}
        result[name] = r
    return result


def control_outcome(plan: ProtocolPlan, name: str, r: dict) -> dict | None:
    """How a control of a plan with a declared test came out by its own check (None for the candidate, and for a
    plan under the rule before, whose controls keep their expected verdicts): ``passed`` and the numbers.

    * positive control: ``detected`` when the test's unfavourable verdict came out (or the runs diverged); with
      the chance the plan gave it in advance at its planned spread (``projection``), when it has one;
    * negative control: the two-sided ``1 - alpha`` interval of the declared endpoint ``covers_zero`` (the test of
      no difference, p against no difference >= alpha): true runs of BF16 fail it alpha of the time;
    * null control: ``identical``, step for step (``null_identity``)."""
    if plan.legacy or name == "verdict":
        return None
    if name == "null_control":
        return {"check": IDENTICAL, "passed": r["verdict"] == IDENTICAL}
    if name == "positive_control":
        from convergence.protocol.projection import projection

        bad = WORDS[plan.test][1]
        chance = (projection(plan).get("positive_control") or {}).get("chance_detected")
        shift = r.get("planted_shift")
        return {"check": "detected", "passed": r["verdict"] in (bad, "diverged"), "detected_as": bad,
                "planted_shift": shift, "planned_chance": chance}
    from scipy import stats

    part = r.get(PART_OF[plan.endpoint]) or {}
    se, dof, est = part.get("se"), part.get("dof"), part.get("estimate")
    if r["verdict"] == "diverged" or se is None or dof is None or est is None:
        return {"check": COVERS_ZERO, "passed": False, "covers_zero": None, "p_no_difference": None,
                "interval": None, "interval_level": 1 - plan.alpha, "why": r["reason"]}
    half = float(stats.t.ppf(1 - plan.alpha / 2, dof)) * se
    p = part["p_no_difference"]
    return {"check": COVERS_ZERO, "passed": p >= plan.alpha, "covers_zero": p >= plan.alpha,
            "p_no_difference": p, "interval": [est - half, est + half], "interval_level": 1 - plan.alpha}


def null_identity(twin: Path, null: Path) -> dict:
    """The null control's result: its metrics against its BF16 twin's, every computed figure at every step
    (``convergence.train.ep_identity.first_difference``: timing fields aside), ``verdict`` ``identical`` or
    ``not_identical``."""
    from convergence.train.ep_identity import end_difference, first_difference
    from convergence.train.profile import load_records

    a, b = load_records(twin), load_records(null)
    diff = first_difference(a, b)
    reason = (f"{len(a)} steps equal in every computed figure, bit for bit" if diff is None else
              f"differs from its BF16 twin at step {diff['step']} in {diff['field']}: {diff['a']!r} vs {diff['b']!r}")
    return {"verdict": IDENTICAL if diff is None else f"not_{IDENTICAL}", "reason": reason, "metric": "identity",
            "first_difference": diff, "at_end": None if diff is None else end_difference(a, b),
            "inputs": {"twin": str(twin), "null": str(null)}, "steps": [len(a), len(b)]}


def _note(name: str, r: dict) -> str:
    sens = r.get("sensitivity") or {}
    hw = f"; interval half-width {sens['half_width']:.3%}" if sens else ""
    if sens.get("intervals_reach") is not None:  # the margin the runs resolve, whatever the one set
        hw += f", intervals within +-{sens['intervals_reach']:.3%}"
    proto = r.get("protocol") or {}
    exp, ok = proto.get("expected"), proto.get("as_expected")
    tail = "" if exp is None else f" (a control: expected {exp}, {'as' if ok else 'NOT as'} expected)"
    return f"{name}: {r.get('verdict')}: {r.get('reason')}{hw}{tail}"


def write_results(plan: ProtocolPlan, out: Path, verdicts: dict[str, dict], command: str, hardware: str,
                  notes: dict[str, str] | None = None) -> list[Path]:
    """OUT/results/: the verdicts, their figures, every run's curve and the MXFP8 runs' probes, each with a
    golden-style sidecar (sha256, command, hardware, commit, versions, note: ``notes[name]`` where the caller
    gives one, as for a pilot's result, else the verdict's own line), and record.sh, which lists them in
    golden/ once copied there. Curves and probes are gzip-compressed (``.jsonl.gz``, read as they are by every
    loader and by ``golden check``): a proxy run's metrics are ~0.6 MB, its gzip ~0.14 MB, and the 64 runs of
    a whole plan would otherwise add ~40 MB to golden/. A run already compacted is copied as it is
    (``gzipped``): the same bytes as compressing its plain file here."""
    import hashlib

    from convergence.curves.plots import plot_comparison

    res, part = Path(out) / "results", Path(out) / "results.partial"  # written whole, then moved into place: a
    if part.exists():                                                    # kill left a results/ half written
        shutil.rmtree(part)
    part.mkdir(parents=True)
    written = []
    lines = ["#!/bin/sh", "# after: cp OUT/results/*.json* golden/training/", "set -e"]

    def emit(path: Path, data: str | bytes, cmd: str, note: str, versions: dict | None, commit: str | None = None):
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        commit = commit or (versions or {}).get("mxval_commit")
        meta = {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "command": cmd, "hardware": hardware,
                "commit": commit if isinstance(commit, str) else "unknown", "versions": versions, "note": note}
        path.with_name(path.name + ".meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        written.append(path)
        lines.append(shlex.join(["python", "-m", "golden.recorded", "add", f"golden/training/{path.name}",
                                 "--command", cmd, "--hardware", hardware, "--commit", meta["commit"],
                                 "--note", note, "--versions-from", f"golden/training/{path.name}.meta.json"]))

    # A folder is judged where it lands (the runs on a GPU machine, the verdicts here): a run's sidecar names the
    # environment and commit that trained it (its config.json), a verdict's the runs' (runs_environment) with
    # the judging one beside it, never the judging machine's alone (it would say a CPU made the H200's runs)
    judged = next(iter(verdicts.values())).get("environment")
    envs = run_environments(plan, out)
    trained = runs_environment(plan, out, envs)
    for name, r in verdicts.items():
        path = part / f"{plan.prefix}_{name}__{hardware}.json"
        emit(path, json.dumps(r, indent=1, default=str) + "\n", command, (notes or {}).get(name) or _note(name, r),
             judged if trained is None else trained | {"judged_with": judged},
             commit=(judged or {}).get("mxval_commit"))
        if "series" in r:  # a comparison (the null control's identity and a pilot's spreads have no curves)
            plot_comparison(r, path.with_suffix(".png"), force=True)
    for spec in plan.runs():
        own = envs.get(spec.name)
        note = "" if own else " (versions: the judging machine's; the run's config.json records none)"
        emit(part / f"{plan.prefix}_{spec.name}__{hardware}.jsonl.gz", gzipped(metrics_path(out, spec).read_bytes()),
             plan.train_command(spec, "OUT"), f"{spec.role} run of {plan.prefix}: {spec}{note}", own or judged)
        probes = probes_path(out, spec)  # MXFP8 runs: per-layer MXFP8-vs-BF16 SQNR on the run's activations
        if probes.exists():
            emit(part / f"{plan.prefix}_{spec.name}_probes__{hardware}.jsonl.gz", gzipped(probes.read_bytes()),
                 plan.train_command(spec, "OUT"), f"layer probes of the {spec.role} run of {plan.prefix}{note}",
                 own or judged)
    (part / "record.sh").write_text("\n".join(lines) + "\n")
    if res.exists():
        shutil.rmtree(res)
    os.replace(part, res)
    return [res / p.name for p in written]
