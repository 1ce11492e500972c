"""Where a protocol's runs were made: each run's environment as its config.json records it, the hardware tag of
the result files, and whether a machine about to train computes runs as the runs already made were computed.

Public: ``hardware_tag(device, gpus)``, ``runs_hardware_tag(plan, out)``, ``run_environments(plan, out)``,
``runs_environment(plan, out)``, ``COMPUTE_FIELDS``, ``made_with(plan, out)``, ``environment_change(plan, out,
here)``.
"""

from __future__ import annotations

import json
from pathlib import Path

from convergence.protocol.folder import run_config, run_dir
from convergence.protocol.plan import ProtocolPlan
from numerics.errors import BadInput

# What computes a run: the runs of a plan are compared with each other, so a machine whose torch, torchao, CUDA
# or GPU differs from the runs already made would mix that change into the verdict (a plan's runs may be made on
# several machines over a long time). Not among them: the mxval commit (the protocol's own code changes between
# calls; the training path's results are held by its bit-identity tests), the driver, the platform and the host
# CPU.
COMPUTE_FIELDS = {"cuda": ("torch", "torchao", "cuda", "gpu", "capability"), "cpu": ("torch", "torchao")}


def hardware_tag(device: str, gpus: int) -> str:
    """The tag the result files are named with: this machine's GPU model (``h200``), ``x<n>`` for n > 1 GPUs."""
    from numerics.environment import hardware_tag as tag

    t = tag() if device == "cuda" else "cpu"
    return f"{t}x{gpus}" if gpus > 1 else t


def runs_hardware_tag(plan: ProtocolPlan, out: Path) -> str:
    """The hardware tag of a finished folder judged away from the machine that ran it: its runs' GPU model, from
    the environment each run's config.json records (how many GPUs ran them side by side is not recorded: the
    tag names one, as ``--hardware`` can correct). Runs on different GPU models are refused: name them."""
    from numerics.environment import gpu_tag

    envs = run_environments(plan, out)
    unrecorded = [spec.name for spec in plan.runs() if spec.name not in envs]
    tags = {gpu_tag(env["gpus"][0]) if env.get("gpus") else "cpu" if env else "unknown" for env in envs.values()}
    if unrecorded:
        tags.add("unknown")
    if len(tags) != 1 or "unknown" in tags:
        why = (f"; unknown: {unrecorded[0]}{f' and {len(unrecorded) - 1} more' if len(unrecorded) > 1 else ''}, "
               "whose config.json is missing or records no environment" if unrecorded else "")
        raise BadInput(f"{out}: the runs do not name one kind of hardware ({', '.join(sorted(tags))}{why}): "
                       "pass --hardware TAG")
    return tags.pop()


def run_environments(plan: ProtocolPlan, out: Path) -> dict[str, dict]:
    """Each run's environment as its config.json recorded it, by run name (a run without one is left out)."""
    envs = {}
    for spec in plan.runs():
        env = run_config(out, spec).get("environment")
        if isinstance(env, dict):
            gpus = env.get("gpus")  # training writes a list of model names; a string would read as its letters
            if gpus is not None and not (isinstance(gpus, list) and all(isinstance(g, str) for g in gpus)):
                raise BadInput(f"{run_dir(out, spec) / 'config.json'}: its environment's gpus is {gpus!r}, not a list "
                               "of GPU names; restore it, e.g. from git")
            envs[spec.name] = env
    return envs


def runs_environment(plan: ProtocolPlan, out: Path, envs: dict[str, dict] | None = None) -> dict | None:
    """The environment the plan's runs were trained in, from each run's config.json (or ``envs``, already read by
    ``run_environments``): a field on which they agree keeps its value, one on which they differ (the commit of a
    plan made over several calls, the platform of another machine) lists the distinct values; None when no run
    records one."""
    envs = list((run_environments(plan, out) if envs is None else envs).values())
    if not envs:
        return None
    merged = {}
    for key in dict.fromkeys(k for e in envs for k in e):
        values = {json.dumps(e.get(key), sort_keys=True): e.get(key) for e in envs}
        merged[key] = next(iter(values.values())) if len(values) == 1 else [values[v] for v in sorted(values)]
    return merged


def _compute_value(env: dict, field: str):
    if field == "gpu":  # the model, not how many: a two-GPU machine's runs each see one or both
        return sorted(set(env.get("gpus") or [])) or None
    return env.get(field)


def _by_value(plan: ProtocolPlan, out: Path) -> dict[str, dict[str, list[str]]]:
    """Each of the plan's ``COMPUTE_FIELDS``: its values (as JSON) in the runs' config.json, each with the runs
    that recorded it; a field a run did not record is not counted."""
    made: dict[str, dict[str, list[str]]] = {f: {} for f in COMPUTE_FIELDS[plan.device]}
    for name, env in run_environments(plan, out).items():
        for f in made:
            value = _compute_value(env, f)
            if value is not None:
                made[f].setdefault(json.dumps(value), []).append(name)
    return made


def made_with(plan: ProtocolPlan, out: Path) -> dict[str, list[tuple[object, list[str]]]]:
    """What computed the plan's runs so far: per ``COMPUTE_FIELDS`` field that a run recorded, its values, each
    with the runs it computed (in the order of the values' JSON); more than one value: the runs are mixed."""
    return {f: [(json.loads(v), runs) for v, runs in sorted(values.items())]
            for f, values in _by_value(plan, out).items() if values}


def environment_change(plan: ProtocolPlan, out: Path, here: dict) -> dict[str, tuple[object, list[tuple]]]:
    """How ``here`` (``numerics.environment.describe()`` of the machine about to train) differs from the plan's
    runs already made in what computes a run (``COMPUTE_FIELDS``): field -> (its value here, [(another value, the
    runs made with it), ...]); empty when it does not differ. A field a run did not record is not compared."""
    diffs = {}
    for f, values in _by_value(plan, out).items():
        now = _compute_value(here, f)
        other = [(json.loads(v), runs) for v, runs in sorted(values.items())
                 if now is not None and v != json.dumps(now)]
        if other:
            diffs[f] = (now, other)
    return diffs
