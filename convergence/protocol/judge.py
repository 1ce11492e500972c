"""A protocol's verdicts and result files: the design checked from the runs' own files, the three comparisons
on validation loss, and OUT/results/ with a golden-style sidecar per file.

Public: ``judge(plan, out)``, ``judge_logs(plan, log_of)``, ``check_design(plan, out)``, ``as_expected(verdict,
expected)``, ``write_results(plan, out, verdicts, command, hardware)``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path

from convergence.protocol.folder import gzipped, metrics_path, probes_path, run_config
from convergence.protocol.plan import VERDICTS, ProtocolPlan, RunSpec
from convergence.protocol.provenance import run_environments, runs_environment
from convergence.train.checkpoint import JsonlLog
from numerics.errors import BadInput


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
    """The three comparisons (``VERDICTS``) on validation loss, from the finished runs (checked against the design
    first: ``check_design``)."""
    check_design(plan, out)
    return judge_logs(plan, lambda spec: metrics_path(out, spec))


def judge_logs(plan: ProtocolPlan, log_of: Callable[[RunSpec], Path]) -> dict[str, dict]:
    """``judge`` on the runs' metrics logs wherever they are (``log_of(spec)``): a plan's runs recorded outside its
    folder, as golden/training holds a whole plan's, are judged by the same code that judged them."""
    from convergence.curves.compare import compare_paths

    baselines = [log_of(r) for r in plan.baselines()]
    result = {}
    for name, (_role, expected, shows) in VERDICTS.items():
        judged = plan.judged(name)
        first, *more = (log_of(r) for r in judged)
        r = compare_paths(baselines, first, margin=plan.margin, metric="val_loss", candidate_replicates=more)
        r["protocol"] = {"verdict": name, "judged_run": judged[0].name,
                         "judged_runs": [s.name for s in judged], "expected": expected, "shows": shows,
                         "as_expected": as_expected(r["verdict"], expected),
                         "plan": plan.as_dict(),
                         "runs": [dataclasses.asdict(s) for s in plan.runs()]}
        result[name] = r
    return result


def _note(name: str, r: dict) -> str:
    sens = r.get("sensitivity") or {}
    hw = f"; interval half-width {sens['half_width']:.3%}" if sens else ""
    if sens.get("intervals_reach") is not None:  # the margin the runs resolve, whatever the one set
        hw += f", intervals within +-{sens['intervals_reach']:.3%}"
    exp = r["protocol"]["expected"]
    ok = r["protocol"]["as_expected"]
    tail = "" if exp is None else f" (a control: expected {exp}, {'as' if ok else 'NOT as'} expected)"
    return f"{name}: {r['verdict']}: {r['reason']}{hw}{tail}"


def write_results(plan: ProtocolPlan, out: Path, verdicts: dict[str, dict], command: str, hardware: str) -> list[Path]:
    """OUT/results/: the verdicts, their figures, every run's curve and the MXFP8 runs' probes, each with a
    golden-style sidecar (sha256, command, hardware, commit, versions, note), and record.sh, which lists them in
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
        emit(path, json.dumps(r, indent=1, default=str) + "\n", command, _note(name, r),
             judged if trained is None else trained | {"judged_with": judged},
             commit=(judged or {}).get("mxval_commit"))
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
