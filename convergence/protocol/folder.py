"""A protocol's folder: the plan it holds, each run's state on disk, and a finished run's compaction.

Public: ``open_protocol(plan, out)``, ``load_plan(out)``, ``read_plan(path)``, ``check_same_plan(plan, out)``,
``changed_fields(have, want)``, ``CHANGEABLE``, ``run_dir(out, spec)``, ``run_config(out, spec)``,
``metrics_path(out, spec)``, ``probes_path(out, spec)`` (a run's logs, plain or compacted), ``run_state``,
``run_status``, ``resumable_status``, ``can_continue``, ``last_whole_level``, ``finish_run``, ``compact_run``,
``gzipped``, ``amendments(out)``, ``COMPACTED``, ``PACE_FILE``, ``AMENDMENTS_FILE``.

Layout: ``OUT/protocol.json`` (the plan), ``OUT/runs/<run>/<recipe>/`` (each run's ``config.json``,
``metrics.jsonl``, ``probes.jsonl`` and, while unfinished, its checkpoint), ``OUT/logs/`` (the workers' output),
``OUT/pace.jsonl`` (each piece's pace: ``convergence.protocol.schedule``), ``OUT/amendments.jsonl`` (each change
of the plan made after some of its runs had finished), ``OUT/slurm/`` (the Slurm jobs' record
and logs: ``convergence.protocol.slurm``) and ``OUT/results/`` (the verdicts and their files:
``convergence.protocol.judge``). A run is continued from its checkpoint until it has ``steps`` steps;
its checkpoint is written only when a piece stops and at the end, and deleted once the run is complete (a proxy
checkpoint is ~11 GB). A complete run's ``metrics.jsonl`` and ``probes.jsonl`` are then replaced by their gzip
(``compact_run``); every reader finds either through ``metrics_path`` / ``probes_path`` and reads it gzip-aware.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from convergence.protocol.plan import ProtocolPlan, RunSpec, plan_from_dict
from convergence.train.checkpoint import JsonlLog
from convergence.train.placement import CHECKPOINT_FILE  # a protocol run trains in one process
from numerics.errors import BadInput
from numerics.files import GZIP_MAGIC, atomic_write, gzip_or_plain, read_json_object

PACE_FILE = "pace.jsonl"  # each piece's recipe, steps and wall seconds (convergence.protocol.schedule)
# each CHANGEABLE change of a plan made once some of its runs had finished (``name`` aside: it names files, not
# runs): what changed and which runs were finished then. A plan's verdicts are declared before its runs; one changed
# after (another positive control, more replicates once some results were in) is judged as it now is, and its
# verdicts say so (``amendments``).
AMENDMENTS_FILE = "amendments.jsonl"

# What may change on a folder that holds runs: how many replicates (and a fork plan's trunks), which recipe is the
# positive control, and the result files' prefix (``name``: it names no run, so a plan started without one can
# still be given its own).
# Every run is named by what it is (recipe, change), so the runs made stay valid; a run no longer in the plan is
# kept on disk and left out of the verdicts.
CHANGEABLE = ("replicates", "candidate_replicates", "control", "name", "trunks")


def changed_fields(have: dict, want: dict) -> list[tuple[str, object, object]]:
    """``(key, have, want)`` for each ``CHANGEABLE`` field on which two plans' ``as_dict()`` differ, as a message
    shows them (a name not given: "(none)", the default prefix)."""
    shown = {"": "(none)"}
    return [(key, shown.get(have[key], have[key]), shown.get(want[key], want[key]))
            for key in CHANGEABLE if have[key] != want[key]]


def check_same_plan(plan: ProtocolPlan, out: Path) -> dict:
    """``out``'s plan (as a dict), when it is ``plan`` up to ``CHANGEABLE`` fields; ``BadInput`` naming the first
    field that differs otherwise. Before anything reads ``out``'s runs as ``plan``'s: another plan's runs (another
    --steps) read as damaged ones."""
    have = read_plan(Path(out) / "protocol.json").as_dict()  # keys added since: their defaults
    for key, value in plan.as_dict().items():
        if have.get(key) != value and key not in CHANGEABLE:
            raise BadInput(f"{out} holds a protocol run with {key}={have.get(key)!r}, the command line says "
                           f"{key}={value!r}: repeat its command to continue it, or pass --force to start again")
    return have


def open_protocol(plan: ProtocolPlan, out: Path, *, force: bool = False) -> str | None:
    """Make ``out`` hold ``plan`` (``out/protocol.json``): a new or empty folder gets it; a folder with the same
    plan is continued, also when only ``CHANGEABLE`` fields differ (the plan is rewritten, every run made is
    kept; returns a line saying so); another plan, or a folder of something else, is refused (``force``
    deletes this protocol's own runs, logs, results, pace and Slurm jobs' records first, nothing else)."""
    out = Path(out)
    state = out / "protocol.json"
    forced = force and state.exists()
    if forced:
        for sub in ("runs", "logs", "results", "results.partial", "slurm"):  # slurm: convergence.protocol.slurm.jobs
            shutil.rmtree(out / sub, ignore_errors=True)
        (out / PACE_FILE).unlink(missing_ok=True)  # the paces of runs no longer there
        (out / AMENDMENTS_FILE).unlink(missing_ok=True)  # changes to a plan whose runs are gone
        state.unlink()
    if state.exists():
        have, want = check_same_plan(plan, out), plan.as_dict()
        fields = changed_fields(have, want)
        if not fields:
            return None
        old = plan_from_dict(have)
        finished = [s.name for s in old.runs() if run_state(old, out, s) == "done"]
        judged = {key: [was, now] for key, was, now in fields if key != "name"}  # a name changes no verdict
        if finished and judged:  # recorded before the plan changes: a kill between leaves the record, and the same
            JsonlLog(out / AMENDMENTS_FILE).append(  # command records it again when it changes the plan after all
                {"changed": judged, "finished_runs": finished})
        atomic_write(state, json.dumps(want, indent=1) + "\n", force=True)  # a kill mid-write keeps the old plan
        changed = [f"{key} {was} -> {now}" for key, was, now in fields]
        after = (f", after {len(finished)} of its runs had finished (recorded in {AMENDMENTS_FILE})"
                 if finished and judged else "")
        return f"{out}: the plan now has {', '.join(changed)}{after}; the runs already made are kept"
    if not forced and out.exists() and (not out.is_dir() or any(out.iterdir())):  # forced: others' files stay
        raise BadInput(f"{out} is not empty and holds no protocol run; choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(state, json.dumps(plan.as_dict(), indent=1) + "\n")
    return None


def amendments(out: Path) -> list[dict]:
    """The plan's changes made after some of its runs had finished (``AMENDMENTS_FILE``), oldest first."""
    path = Path(out) / AMENDMENTS_FILE
    return JsonlLog(path).records() if path.is_file() else []


def load_plan(out: Path) -> ProtocolPlan:
    return read_plan(Path(out) / "protocol.json")


def read_plan(state: Path) -> ProtocolPlan:
    """The plan a protocol.json holds, checked as a command line's is: a damaged one is one line naming it."""
    d = read_json_object(state, what="a protocol plan")
    try:
        return plan_from_dict(d).check()
    except BadInput as exc:
        raise BadInput(f"{state}: {exc}") from None
    except (TypeError, ValueError, KeyError, AttributeError) as exc:  # a field missing, unknown or of another type
        raise BadInput(f"{state}: not a protocol plan ({type(exc).__name__}: {exc}); restore it, e.g. from "
                       "git") from None


def run_dir(out: Path, spec: RunSpec) -> Path:
    return Path(out) / "runs" / spec.name / spec.recipe


COMPACTED = ("metrics.jsonl", "probes.jsonl")  # the logs a finished run keeps as gzip (``compact_run``)


def metrics_path(out: Path, spec: RunSpec) -> Path:
    """The run's ``metrics.jsonl``, or ``metrics.jsonl.gz`` once finished (``compact_run``; the gzip wins when both
    exist: ``gzip_or_plain``): read it gzip-aware (``numerics.files.file_bytes``, ``JsonlLog.records``)."""
    return gzip_or_plain(run_dir(out, spec) / "metrics.jsonl")


def probes_path(out: Path, spec: RunSpec) -> Path:
    """The run's ``probes.jsonl``, or ``probes.jsonl.gz`` once finished (MXFP8 runs only write probes)."""
    return gzip_or_plain(run_dir(out, spec) / "probes.jsonl")


def gzipped(data: bytes) -> bytes:
    """``data`` as gzip, or as it is when it already is gzip: mtime 0, so the same run gives the same bytes
    whether it is compressed here or was compacted when it finished."""
    import gzip

    return data if data.startswith(GZIP_MAGIC) else gzip.compress(data, mtime=0)


def compact_run(folder: Path) -> None:
    """A finished run's logs (``COMPACTED``) replaced by their gzip, each written atomically before its plain
    file is removed: a protocol folder is kept, copied and committed whole, and a 64-run proxy plan's is ~45 MB
    plain, ~10 MB compressed (a run's metrics ~0.64 MB, ~4.5x smaller as gzip)."""
    for name in COMPACTED:
        plain = Path(folder) / name
        if plain.exists():
            atomic_write(plain.with_name(name + ".gz"), gzipped(plain.read_bytes()), force=True)
            plain.unlink()


def run_config(out: Path, spec: RunSpec) -> dict:
    """A run's config.json ({} while the run has not written one)."""
    path = run_dir(out, spec) / "config.json"
    return read_json_object(path, what="a run's config") if path.is_file() else {}


def run_state(plan: ProtocolPlan, out: Path, spec: RunSpec) -> int | str:
    """One run's steps logged so far, or "done" (all its steps: a trunk's end at its ``stop_at``; or a run that
    diverged and stopped). A compacted log
    (``compact_run``: only a finished run's) that ends short is damage, not a run to train again over it; so is a
    file where the run's folder belongs (it is not a run not started)."""
    folder = run_dir(out, spec)
    for part in (folder.parent.parent, folder.parent, folder):
        if part.exists() and not part.is_dir():
            raise BadInput(f"{part}: a file where the protocol keeps run {spec.name}'s folder ({folder}); move it away")
    path = metrics_path(out, spec)
    recs = JsonlLog(path).records()
    last = recs[-1] if recs else {}
    end = spec.stop_at or plan.steps
    if last.get("step") == end or last.get("diverged"):
        return "done"
    if path.name.endswith(".gz"):
        raise BadInput(f"{path}: a finished run's compacted log, but it ends at step {last.get('step', 0)} of "
                       f"{end}: damaged; restore it (e.g. from git) rather than train the run again")
    return len(recs)


def run_status(plan: ProtocolPlan, out: Path) -> dict[str, int | str]:
    """name -> ``run_state`` of every run of the plan (it reads every run's metrics: a folder's worth)."""
    return {spec.name: run_state(plan, out, spec) for spec in plan.runs()}


def last_whole_level(plan: ProtocolPlan, out: Path, status: dict | None = None) -> ProtocolPlan | None:
    """The largest of ``plan.levels()`` whose runs are all finished in ``out`` (``plan`` itself once it is whole):
    what the runs made so far can be judged as; None before the first level is whole. ``status``: ``run_status``'s,
    when the caller has it (reading it is a folder's worth)."""
    status = run_status(plan, out) if status is None else status
    whole = [sub for sub in plan.levels() if all(status.get(r.name) == "done" for r in sub.runs())]
    return whole[-1] if whole else None


def can_continue(out: Path, spec: RunSpec) -> bool:
    """Whether a run stopped part-way has its checkpoint here. A folder copied without its checkpoints (from a
    machine whose disk did not outlive the work) holds a stopped run's logs alone: that run starts again at step 0
    (training drops the logged steps past the checkpoint it loads, here all of them)."""
    return (run_dir(out, spec) / CHECKPOINT_FILE).is_file()


def resumable_status(plan: ProtocolPlan, out: Path, status: dict | None = None) -> dict[str, int | str]:
    """``run_status`` (or ``status``, already read), with a started run whose checkpoint is not here
    (``can_continue``) at 0: it starts again at step 0, so it is ordered, fitted and paced as a run not yet
    started."""
    status = run_status(plan, out) if status is None else status
    return {s.name: 0 if status[s.name] not in ("done", 0) and not can_continue(out, s) else status[s.name]
            for s in plan.runs()}


def finish_run(folder: Path) -> None:
    """A finished run's folder as the protocol keeps it: no checkpoint (an earlier one, ~11 GB on the proxy, and
    a ``.tmp`` a kill left mid-write, which nothing would replace), logs compacted (``compact_run``). Also run on
    every finished run before a protocol goes on: a kill after a run's last step left its checkpoint and plain
    logs for good, the run counting as done from then on."""
    folder = Path(folder)
    for name in (CHECKPOINT_FILE, CHECKPOINT_FILE + ".tmp"):
        (folder / name).unlink(missing_ok=True)
    compact_run(folder)
