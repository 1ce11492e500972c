"""Are two training runs the same, step for step? (``python -m convergence ep-identity RUN_A RUN_B``)

Two claims of the suite are checked with it: DeepEP changes speed, not results (the same run with
``--ep-backend reference`` and ``--ep-backend deepep``), and so do the fast MXFP8 casts (``--mxfp8-kernel
emulated`` and ``fast``). Both need ``--deterministic`` runs; the report shows each side's backend, kernel
and whether it was deterministic.

Public: ``compare_runs(a, b, recipes=None) -> dict``, ``report(result) -> str``.

Each argument is a run directory (``OUT`` of ``convergence train``, holding ``<recipe>/metrics.jsonl``) or one
``metrics.jsonl``. Every record's fields are compared for equality except
``convergence.train.loop.MEASURED_FIELDS`` (wall time, memory, and what derives from them); JSON floats are
written with ``repr``, so equal values are equal bits. The report names the compared fields, the first
differing step and field (value in A and in B), where runs differ how far apart they end (the last common
step's loss, the last common evaluation's validation loss: two runs without ``--deterministic`` drift apart
by what training amplifies from one reduction order), and, from the same run, each side's median tokens/s and share
of step time in dispatch/combine (``convergence.train.profile``: steps after the first ``WARMUP``). Exit 0
identical, 1 different, 2 bad input. ``--json`` writes the result with versions and hardware (each run's, from
its config.json, and the comparing machine's), in the shape kept under ``golden/training/``; an existing file is
never overwritten without ``--force``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from convergence.curves.jsonl import is_number
from convergence.train.loop import MEASURED_FIELDS
from convergence.train.profile import WARMUP, load_records, profile
from numerics.errors import BadInput
from numerics.files import gzip_or_plain, read_json_object


def _runs(path: Path, recipes: Sequence[str] | None) -> dict[str, Path]:
    if not path.exists():
        raise BadInput(f"{path} does not exist")
    if path.is_file():
        return {"run": path}
    if (own := gzip_or_plain(path / "metrics.jsonl")).exists():  # one recipe's folder, OUT/<recipe>
        if recipes and list(recipes) != [path.name]:
            raise BadInput(f"{path} is one run's folder ({path.name}): --recipe picks recipes inside OUT; leave it out")
        return {path.name: own}
    found = {d.name: m for d in sorted(path.iterdir()) if (m := gzip_or_plain(d / "metrics.jsonl")).exists()}
    if recipes:
        missing = [r for r in recipes if r not in found]
        if missing:
            raise BadInput(f"{path} has no {missing[0]}/metrics.jsonl(.gz) (it has: {', '.join(found) or 'none'})")
        found = {r: found[r] for r in recipes}
    if not found:
        raise BadInput(f"{path} holds no <recipe>/metrics.jsonl(.gz)")
    return found


def _settings(metrics: Path) -> dict:
    """From the run's config.json: what two runs may differ in on purpose (the EP backend, the MXFP8 kernel,
    where AdamW's moments wait) and whether the run asked for --deterministic (without it, identity is not
    expected)."""
    cfg = metrics.parent / "config.json"
    if not cfg.exists():
        return {}
    d = read_json_object(cfg, what="a run's config")
    dist, train, recipe = d.get("distributed", {}), d.get("train", {}), d.get("recipe", {})
    for key, part in (("distributed", dist), ("train", train), ("recipe", recipe)):
        if not isinstance(part, dict):
            raise BadInput(f"{cfg}: '{key}' must be a JSON object, got {type(part).__name__}: the config is damaged")
    return {"ep": dist.get("ep"), "ep_backend": dist.get("ep_backend"), "backend_class": dist.get("backend_class"),
            "mxfp8_kernel": recipe.get("kernel"), "optimizer_state": train.get("optimizer_state"),
            "deterministic": train.get("deterministic", dist.get("deterministic")),
            "environment": d.get("environment")}  # where the run ran (the JSON's own is where it was compared)


def _speed(recs: list[dict]) -> dict:
    p = profile(recs)
    return {"tokens_per_s": p["tokens_per_s"], "dispatch_combine_share": p["dispatch_combine_share"]}


def first_difference(a: list[dict], b: list[dict]) -> dict | None:
    for i, (ra, rb) in enumerate(zip(a, b)):
        for key in sorted(set(ra) | set(rb)):
            if key in MEASURED_FIELDS:
                continue
            if ra.get(key, "<absent>") != rb.get(key, "<absent>"):
                return {"step": ra.get("step", i + 1), "field": key, "a": ra.get(key, "<absent>"),
                        "b": rb.get(key, "<absent>")}
    if len(a) != len(b):
        return {"step": min(len(a), len(b)) + 1, "field": "<record count>", "a": len(a), "b": len(b)}
    return None


def end_difference(a: list[dict], b: list[dict]) -> dict:
    """The last common step's loss and the last step both runs evaluated: their values in A and B and B's
    relative difference from A (a field no common step has in both is left out)."""
    steps_b = {r.get("step"): r for r in b}
    out: dict = {}
    for key in ("loss", "val_loss"):
        common = [(ra, steps_b[ra.get("step")]) for ra in a
                  if is_number(ra.get(key)) and is_number(steps_b.get(ra.get("step"), {}).get(key))]
        if common:
            ra, rb = common[-1]
            relative = rb[key] / ra[key] - 1.0 if ra[key] else None  # a loss of 0 in A: no relative difference
            out[key] = {"step": ra["step"], "a": ra[key], "b": rb[key], "relative": relative}
    return out



def compare_runs(a: Path, b: Path, recipes: Sequence[str] | None = None) -> dict:
    if recipes and Path(a).is_file() and Path(b).is_file():  # refused, not ignored: the files would be compared
        raise BadInput(f"{a} and {b} are metrics files: --recipe picks recipes inside run folders; leave it out")
    runs_a, runs_b = _runs(Path(a), recipes), _runs(Path(b), recipes)
    if set(runs_a) == set(runs_b):
        pairs = [(r, runs_a[r], runs_b[r]) for r in runs_a]
    elif len(runs_a) == len(runs_b) == 1 and "run" in {*runs_a, *runs_b}:  # a metrics.jsonl on one side
        (na, pa), (nb, pb) = next(iter(runs_a.items())), next(iter(runs_b.items()))
        pairs = [(na if na != "run" else nb, pa, pb)]
    else:
        raise BadInput(f"the runs hold different recipes: {', '.join(runs_a)} vs {', '.join(runs_b)}")
    result: dict = {"a": str(a), "b": str(b), "excluded_fields": list(MEASURED_FIELDS), "recipes": {}}
    fields: set[str] = set()
    for name, pa, pb in pairs:
        ra, rb = load_records(pa), load_records(pb)
        for r in ra + rb:
            fields.update(k for k in r if k not in MEASURED_FIELDS)
        diff = first_difference(ra, rb)
        result["recipes"][name] = {
            "steps": [len(ra), len(rb)], "identical": diff is None, "first_difference": diff,
            "at_end": None if diff is None else end_difference(ra, rb),
            "a": {"metrics": str(pa), **_settings(pa), **_speed(ra)},
            "b": {"metrics": str(pb), **_settings(pb), **_speed(rb)},
        }
    result["compared_fields"] = sorted(fields)
    result["identical"] = all(r["identical"] for r in result["recipes"].values())
    return result


def _fmt(x, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def report(r: dict) -> str:
    lines = [f"compared fields: {', '.join(r['compared_fields'])}",
             f"excluded (timing): {', '.join(r['excluded_fields'])}"]
    for name, rec in r["recipes"].items():
        d = rec["first_difference"]
        verdict = "IDENTICAL" if d is None else (
            f"DIFFER at step {d['step']}, field {d['field']}: A {d['a']!r} vs B {d['b']!r}")
        lines.append(f"{name}: {rec['steps'][0]} vs {rec['steps'][1]} steps, {verdict}")
        for key, e in (rec.get("at_end") or {}).items():
            apart = "A is 0: no relative difference" if e["relative"] is None else f"B {e['relative']:+.3%} from A"
            lines.append(f"  at the end: {key} at step {e['step']}: A {e['a']:.6g} vs B {e['b']:.6g} ({apart})")
        sa, sb = rec["a"], rec["b"]
        ratio = (sb["tokens_per_s"] / sa["tokens_per_s"]) if sa["tokens_per_s"] and sb["tokens_per_s"] else None
        lines.append(f"  {'side':<4} {'backend':<10} {'kernel':<9} {'determ.':<8} {'tokens/s':>12} "
                     f"{'dispatch+combine':>17}")
        for side, s in (("A", sa), ("B", sb)):
            lines.append(f"  {side:<4} {s.get('ep_backend')!s:<10} {s.get('mxfp8_kernel')!s:<9} "
                         f"{s.get('deterministic')!s:<8} {_fmt(s['tokens_per_s'], ',.0f'):>12} "
                         f"{_fmt(s['dispatch_combine_share'], '.1%'):>17}")
        lines.append(f"  tokens/s B / A: {_fmt(ratio, '.3f')} (medians after step {WARMUP}, one session)")
    if not r["identical"] and any(s.get("deterministic") is False for rec in r["recipes"].values()
                                  for s in (rec["a"], rec["b"])):
        lines.append("(a run was made without --deterministic: on a GPU its reductions may run in another order, "
                     "so identity was not expected)")
    lines.append("verdict: " + ("IDENTICAL" if r["identical"] else "DIFFERENT"))
    return "\n".join(lines)
