"""The golden k16 plan judged again, post hoc, by the rule plans declare now: one endpoint (the final window), the
standard tests, and controls that can pass and fail; derived on any machine from its recorded curves.

``golden/training/proxy_long_lr3e-4_k16_posthoc__h200.json`` (``FILE``) holds, for the 64-run plan recorded in
``golden/training/proxy_long_lr3e-4_k16_*`` (MXFP8 against BF16 on the proxy, 1,500 steps, one H200): the
candidate's verdict by ``equivalence`` (TOST at alpha 0.05) and by ``non-inferiority`` on the final window, the
negative control (its 16 held-out BF16 runs: does their interval cover 0?), the planted positive control (those
runs made 2 x the margin worse: detected?) with the chance the plan's design gave it, and the plan's own E2M1
control judged by the same test. It is post hoc: the plan was declared under the two-ranges rule, which its
recorded verdicts (``proxy_long_lr3e-4_k16_{verdict,positive_control,negative_control}__h200.json``) keep; the
rule changed after those data were seen, so this file describes the runs and decides nothing.

``check(root)`` judges it again (``convergence.protocol.judge.judge_logs`` on the recorded curves) and compares
every number (relative 1e-9: numpy may group float64 sums differently between versions); ``regenerate(root)``
writes it and its sidecar.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

NAME = "posthoc"
ROOT = Path(__file__).resolve().parent
PREFIX = "proxy_long_lr3e-4_k16"
FILE = f"training/{PREFIX}_posthoc__h200.json"
REL = 1e-9  # tests/convergence/protocol/test_golden_protocol.py: numpy's float64 sums move the last bits only
KEYS = ("verdict", "estimate", "interval", "interval_level", "p_no_difference", "p_test", "half_width",
        "smallest_margin")
LABEL = ("post hoc: the plan was declared, run and judged under the two-ranges rule (its recorded verdicts stand); "
         "this re-judgement by the rule declared plans use now (one endpoint, TOST or non-inferiority, controls at "
         "the margin) was made after its data were seen, so it describes the runs and decides nothing")


def _curve(root: Path, run: str) -> Path:
    return Path(root) / "training" / f"{PREFIX}_{run}__h200.jsonl.gz"


def _recorded(root: Path, verdict: str) -> dict:
    return json.loads((Path(root) / "training" / f"{PREFIX}_{verdict}__h200.json").read_text())


def _summary(r: dict) -> dict:
    out = {k: r.get(k) for k in KEYS} | {"reason": r["reason"], "judged_runs": r["protocol"]["judged_runs"],
                                         "baselines": r["baseline_runs"]}
    whole = r.get("overall") or {}
    out["secondary_whole_range"] = {k: whole.get(k) for k in ("estimate", "interval", "p_no_difference")}
    if r["protocol"].get("outcome"):
        out["outcome"] = r["protocol"]["outcome"]
    return out


def reading(root: Path, test: str, replace: dict[str, Path] | None = None) -> dict:
    """One test's post-hoc reading, judged by the protocol's own code from the recorded curves (``replace``: run
    name -> another file, for a planted fault)."""
    from convergence.curves.decision.equivalence import WORDS
    from convergence.protocol.judge import judge_logs
    from convergence.protocol.plan import PLANTED, plan_from_dict
    from convergence.protocol.projection import projection

    def log_of(spec):
        return (replace or {}).get(spec.name, _curve(root, spec.name))

    old = plan_from_dict(_recorded(root, "verdict")["protocol"]["plan"])
    plan = dataclasses.replace(old, test=test, alpha=0.05, endpoint="final", control=PLANTED).check()
    out = {name: _summary(r) for name, r in judge_logs(plan, log_of).items()}
    recipe = dataclasses.replace(plan, control=old.control).check()  # the E2M1 runs, by the same test
    out[f"recipe_control_{old.control}"] = _summary(judge_logs(recipe, log_of)["positive_control"])
    p = projection(plan)
    out["planned"] = {"chance_favourable_at_0": p["verdict"][f"chance_{WORDS[test][0]}_at_0"],
                      "chance_planted_detected": p["positive_control"]["chance_detected"], "spread": p["spread"],
                      "note": "the design's chances at the spread these same runs measured (post hoc too)"}
    return out


def build(root: Path = ROOT) -> dict:
    """The post-hoc readings (module docstring)."""
    from numerics.files import reading_once

    old = _recorded(root, "verdict")["protocol"]["plan"]
    with reading_once():  # the four judgements read the same 64 curves: each is read and parsed once
        readings = {test: reading(root, test) for test in ("equivalence", "non-inferiority")}
    return {"label": LABEL, "plan": PREFIX, "rule": {"tests": list(readings), "alpha": 0.05, "endpoint": "final",
                                                    "planted_shift_margins": 2.0, "margin": old["margin"]},
            "recorded_verdicts": {v: _recorded(root, v)["verdict"]
                                  for v in ("verdict", "positive_control", "negative_control")},
            "readings": readings}


def _differences(a, b, where: str = "") -> list[str]:
    if isinstance(a, float) and isinstance(b, float):
        return [] if math.isclose(a, b, rel_tol=REL, abs_tol=0.0) else [f"{where}: {a!r} != {b!r}"]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where}: keys {sorted(a)} != {sorted(b)}"]
        return [d for k in a for d in _differences(a[k], b[k], f"{where}.{k}" if where else k)]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def check(root: Path = ROOT) -> list[str]:
    path = Path(root) / FILE
    if not path.is_file():
        return []  # golden.integrity names a listed file that is missing
    return [f"{FILE}: {d}" for d in _differences(json.loads(path.read_text()), build(root))[:5]]


def rederived(root: Path = ROOT) -> list[Path]:
    """The post-hoc readings, judged again from the recorded curves."""
    path = Path(root) / FILE
    return [path] if path.is_file() else []


def regenerate(root: Path = ROOT) -> str:
    from golden import integrity
    from numerics.environment import describe
    from numerics.files import atomic_write

    path = Path(root) / FILE
    new = build(root)
    before = json.loads(path.read_text()) if path.is_file() else None
    atomic_write(path, json.dumps(new, indent=1) + "\n", force=True)
    runs = json.loads((Path(root) / "training" / f"{PREFIX}_verdict__h200.json.meta.json").read_text())
    meta = {"sha256": integrity.sha256(path), "command": "python -m golden regenerate --only posthoc",
            "hardware": "h200", "commit": runs.get("commit", "unknown"),
            "versions": (runs.get("versions") or {}) | {"judged_with": describe()},
            "note": f"{LABEL}; the runs' versions and commit (the k16 plan's), the judging machine's beside them"}
    sidecar = path.with_name(path.name + ".meta.json")
    atomic_write(sidecar, json.dumps(meta, indent=1) + "\n", force=True)
    integrity.record(Path(root), path, sidecar, NAME)
    if before is None:
        return f"{FILE}: new"
    changed = _differences(before, new)
    return f"{FILE}: " + ("no number changed" if not changed else f"{len(changed)} changed, e.g. {changed[0]}")
