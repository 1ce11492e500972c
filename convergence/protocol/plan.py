"""The convergence protocol: a paired candidate, baseline replicates and both controls, judged on held-out
validation loss, run in resumable pieces.

Public: ``ProtocolPlan``, ``RunSpec``, ``DESIGNS``, ``VERDICTS``, ``open_protocol(plan, out)``, ``load_plan(out)``,
``run_status(plan, out)``, ``run_state(plan, out, spec)``, ``last_whole_level(plan, out)``,
``run_piece(plan, spec, out, ...)``, ``judge(plan, out)``, ``judge_logs(plan, log_of)``,
``changed_fields(have, want)``, ``check_design(plan, out)``, ``as_expected``,
``write_results(plan, out, verdicts, command, hardware)``, ``runs_environment(plan, out)``,
``environment_change(plan, out, here)``, ``made_with(plan, out)``, ``metrics_path(out, spec)``,
``probes_path(out, spec)`` (a run's logs, plain or compacted), ``compact_run(folder)``.

The runs (``ProtocolPlan.runs``), all from the same ``convergence.train.loop`` and the same token stream:

=================  ===============  ==========================================================================
run                recipe           initial weights / data order / batch row order
=================  ===============  ==========================================================================
``bf16``           bf16             seed / seed / as drawn: the paired baseline
``<candidate>``    mxfp8            the same: differs from ``bf16`` only by its numerics
``<control>``      mxfp8-head       the same: the positive control, known to train worse
``bf16_<d>1..``    bf16             one benign change each (``design`` d): the replicates
``<candidate>_<d>i``  mxfp8         with ``candidate_replicates`` m > 1: the candidate with change i, i < m
``<control>_<d>i``    mxfp8-head    the same for the control: it is judged at the candidate's resolution
``bf16_<d>k..``    bf16             m more, held out of the baselines: the negative control
=================  ===============  ==========================================================================

Designs (what a replicate changes; README "The convergence protocol" says which is used and why, with the
measured spreads): ``init`` (seed + i, data order of ``seed``), ``data`` (data order seed + i), ``rounding``
(rows of every batch permuted by i: the same sums in another order), ``seed`` (both, as runs at different
seeds always did).

Verdicts (``VERDICTS``), each ``python -m convergence compare --metric val_loss`` of one group of runs against
the baselines ``bf16`` + the replicates: ``verdict`` (the candidate and its replicates), ``positive_control``
(the control and its replicates: must be ``not_equivalent``), ``negative_control`` (the m held-out
replicates: must be ``equivalent``). One candidate run cannot be resolved below ``z * spread`` however many
baselines there are; m candidate runs can (``convergence.curves.paired``), so both controls get as many runs as
the candidate, and the same resolution (a control judged from one run could not pass at a resolution the
candidate's verdict reaches: FP4 elements everywhere measured 1.1-1.6 % worse at 1,500 proxy steps, under the
one-run floor).
``replicates``, ``candidate_replicates`` and ``control`` may change between calls: the
runs made stay.

Pieces: a run is continued from its checkpoint until it has ``steps`` steps (``convergence.protocol.pieces``
schedules them, one per GPU or ``--parallel`` per GPU); a checkpoint is written only when a piece stops and
at the end, and deleted once the run is complete (a proxy checkpoint is ~11 GB). A complete run's
``metrics.jsonl`` and ``probes.jsonl`` are then replaced by their gzip (``compact_run`` says why); every reader
finds either through ``metrics_path`` / ``probes_path`` and reads it gzip-aware.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from convergence.train import data as data_mod
from convergence.train.checkpoint import JsonlLog
from convergence.train.loop import TrainConfig, defaults_for, train_recipe
from convergence.train.placement import CHECKPOINT_FILE  # a protocol run trains in one process
from numerics.errors import SEED_MAX, BadInput
from numerics.files import GZIP_MAGIC, atomic_write, gzip_or_plain, read_json_object
from numerics.layer.configs import CONFIGS
from numerics.layer.recipes import RECIPES

DESIGNS = ("init", "rounding", "data", "seed")
VERDICTS = {  # name -> (role of the judged run, the verdict it must reach, what it shows)
    "verdict": ("candidate", None, "the candidate against the BF16 baseline and its replicates"),
    "positive_control": ("control", "not_equivalent", "a recipe known to be worse must be told apart"),
    "negative_control": ("heldout", "equivalent", "one more BF16 replicate must be called equivalent"),
}
# validation: every ``val_every`` steps on the first ``val_batches`` batches of the held-out split
# (README "The convergence protocol": the sampling error of the set, measured, is far below the margin)
PROTOCOL_DEFAULTS = {
    "tiny": dict(val_every=10, val_batches=32),
    "proxy": dict(val_every=50, val_batches=22),  # all the 2 % held-out split holds: 22 batches of 4 x 2048 on
    # Python 3.11.7, 18 on 3.12.3 (the GPU machines'; eval_batches takes all there are when asked for more)
    "16b": dict(val_every=50, val_batches=22),
}
TRAIN_OVERRIDES = ("batch", "seq", "lr", "warmup", "val_every", "val_batches", "probe_every")


@dataclass(frozen=True)
class RunSpec:
    name: str  # folder under OUT/runs/
    role: str  # baseline | candidate | control | replicate | heldout
    recipe: str
    seed: int  # initial weights
    data_seed: int  # order of the training windows
    row_order: int | None = None  # rows of each batch permuted by this seed


@dataclass(frozen=True)
class ProtocolPlan:
    model: str
    steps: int
    seed: int = 0
    replicates: int = 4  # BF16 baselines, the paired one included: k - 1 degrees of freedom for the spread
    candidate_replicates: int = 1  # candidate runs, the paired one included (as many control and held-out runs)
    design: str = "rounding"  # README "The convergence protocol": the smallest measured spread, arithmetic only
    candidate: str = "mxfp8"
    control: str = "mxfp8-head"
    device: str = "cpu"
    mxfp8_kernel: str = "auto"
    margin: float = 0.0025  # DeepSeek-V3's 0.25 % (numerics/tolerances.py, training/any/loss_curve)
    name: str = ""  # prefix of the verdict files; "" -> "<model>_long"
    data: str | None = None  # as convergence train --data (None: the standard-library corpus)
    val_percent: int | None = None  # as convergence train --val-percent (None: its default, 2 %)
    overrides: tuple[tuple[str, float], ...] = ()  # TRAIN_OVERRIDES given on the command line

    def check(self) -> ProtocolPlan:
        if self.model not in CONFIGS:
            raise BadInput(f"unknown model {self.model!r}; choose from {', '.join(CONFIGS)}")
        for what, r in (("--candidate", self.candidate), ("--control", self.control)):
            if r not in RECIPES or r == "bf16":
                raise BadInput(f"{what} {r!r}: choose a recipe other than bf16 from {', '.join(RECIPES)}")
        if self.candidate == self.control:
            raise BadInput("--candidate and --control name the same recipe")
        if self.steps < 2:
            raise BadInput(f"--steps must be >= 2, got {self.steps}")
        if self.replicates < 2:
            raise BadInput(f"--replicates must be >= 2 (their spread is the noise), got {self.replicates}")
        if self.candidate_replicates < 1:
            raise BadInput(f"--candidate-replicates must be >= 1, got {self.candidate_replicates}")
        if self.design not in DESIGNS:
            raise BadInput(f"--design must be one of {', '.join(DESIGNS)}, got {self.design!r}")
        above = self.replicates + self.candidate_replicates  # the replicates count their seeds up from --seed
        if not 0 <= self.seed <= SEED_MAX - above:
            raise BadInput(f"--seed must be from 0 to {SEED_MAX - above} (this plan's runs take seeds up to {above} "
                           f"above it), got {self.seed}")
        if not 0 < self.margin < 1:
            raise BadInput(f"--margin must be in (0, 1), got {self.margin}")
        for key, value in self.overrides:
            if (key not in TRAIN_OVERRIDES or not math.isfinite(value) or value < 0
                    or (value == 0 and key not in ("warmup", "probe_every"))):
                raise BadInput(f"--{key.replace('_', '-')} {value}: out of range")
        if self.name and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", self.name):
            raise BadInput(f"--name {self.name!r}: letters, digits, '.', '_' and '-' only (it begins the result "
                           "files' names in OUT/results)")
        data_mod.check_val_percent(self.val_percent)
        if self.train_defaults()["val_every"] > self.steps:
            raise BadInput(f"--val-every {self.train_defaults()['val_every']} is more than --steps {self.steps}: the "
                           "verdict compares validation losses")
        return self

    @property
    def prefix(self) -> str:
        return self.name or f"{self.model}_long"

    def train_defaults(self) -> dict:
        d = defaults_for(self.model) | PROTOCOL_DEFAULTS.get(self.model, {}) | dict(self.overrides)
        return d | {"ckpt_every": self.steps}  # a checkpoint only when a piece stops, and at the end

    def _replicate(self, i: int, role: str, recipe: str = "bf16") -> RunSpec:
        s = self.seed
        init, data, rows = {"init": (s + i, s, None), "data": (s, s + i, None), "rounding": (s, s, i),
                            "seed": (s + i, s + i, None)}[self.design]
        return RunSpec(f"{recipe}_{self.design}{i}", role, recipe, init, data, rows)

    def runs(self) -> list[RunSpec]:
        """In the order pieces are scheduled: nested, so that every prefix of finished runs is a whole smaller
        protocol (``levels``): a plan cut short by the GPU time it gets can still be judged, controls included,
        instead of missing its held-out runs, which the plan's own order puts last."""
        level = {r.name: n for n, sub in reversed(list(enumerate(self.levels()))) for r in sub._runs_by_role()}
        return sorted(self._runs_by_role(), key=lambda r: level[r.name])  # stable: the plan's order within a level

    def levels(self) -> list[ProtocolPlan]:
        """The nested smaller plans, n = 1 .. ``candidate_replicates``: plan n has n candidate runs (and as many
        control and held-out runs) and ``max(2, ceil(n k / m))`` baselines (two at least: their spread is the
        noise); the last is this plan. A run's name does not depend on its role, so a run made for one plan is
        the same run in every other that names it."""
        k, m = self.replicates, self.candidate_replicates
        return [dataclasses.replace(self, replicates=max(2, -(-n * k // m)), candidate_replicates=n)
                for n in range(1, m + 1)]

    def _runs_by_role(self) -> list[RunSpec]:
        """The paired pair first, the control, then each BF16 replicate next to the candidate's and the control's
        replicates with the same change, then the held-out runs."""
        s, k, m = self.seed, self.replicates, self.candidate_replicates
        pairs = []
        for i in range(1, max(k, m)):
            pairs += [self._replicate(i, "replicate")] if i < k else []
            pairs += [self._replicate(i, "candidate_replicate", self.candidate),
                      self._replicate(i, "control_replicate", self.control)] if i < m else []
        return [RunSpec("bf16", "baseline", "bf16", s, s), RunSpec(self.candidate, "candidate", self.candidate, s, s),
                RunSpec(self.control, "control", self.control, s, s), *pairs,
                *(self._replicate(k + j, "heldout") for j in range(m))]

    def run(self, role: str) -> RunSpec:
        return next(r for r in self.runs() if r.role == role)

    def baselines(self) -> list[RunSpec]:
        """The runs every verdict is judged against: the paired BF16 run and its replicates (the held-out ones are
        the negative control's subject, not baselines). ``judge`` and notebook 03 both take them from here."""
        return [r for r in self.runs() if r.role in ("baseline", "replicate")]

    def judged(self, verdict: str) -> list[RunSpec]:
        """The runs one verdict judges: the candidate or the control with its replicates, or the held-out runs."""
        role = VERDICTS[verdict][0]
        return [r for r in self.runs() if r.role in (role, f"{role}_replicate")]

    def train_config(self, spec: RunSpec) -> TrainConfig:
        d = self.train_defaults()
        if RECIPES[spec.recipe]().mxfp8 is False:
            d["probe_every"] = 0  # probes compare MXFP8 against BF16 on the run's activations: MXFP8 runs only
        ints = {k: (v if k == "lr" else int(v)) for k, v in d.items()}
        return TrainConfig(model=self.model, recipes=(spec.recipe,), steps=self.steps, seed=spec.seed,
                           device=self.device, mxfp8_kernel=self.mxfp8_kernel, data_seed=spec.data_seed,
                           row_order=spec.row_order,
                           data=data_mod.DataSpec(path=self.data, val_percent=self.val_percent),
                           **ints)

    def train_command(self, spec: RunSpec, out: str) -> str:
        """The ``python -m convergence train`` command that makes this run on its own."""
        cfg = self.train_config(spec)
        argv = ["python", "-m", "convergence", "train", "--model", self.model, "--recipe", spec.recipe,
                "--steps", str(self.steps), "--seed", str(spec.seed), "--data-seed", str(spec.data_seed)]
        if spec.row_order is not None:
            argv += ["--row-order", str(spec.row_order)]
        argv += ["--device", self.device, "--out", out]
        for key in ("batch", "seq", "lr", "warmup", "val_every", "val_batches", "probe_every", "ckpt_every"):
            argv += [f"--{key.replace('_', '-')}", str(getattr(cfg, key))]
        if self.mxfp8_kernel != "auto":
            argv += ["--mxfp8-kernel", self.mxfp8_kernel]
        if self.data:
            argv += ["--data", self.data]
        if self.val_percent is not None:
            argv += ["--val-percent", str(self.val_percent)]
        return shlex.join(argv)

    def command(self, out: str, *, gpus: int = 0, per_gpu: int = 1, stop_after_minutes: float | None = None) -> str:
        """The ``python -m convergence protocol`` command of this plan (repeat it until it says complete)."""
        argv = ["python", "-m", "convergence", "protocol", "--model", self.model, "--steps", str(self.steps),
                "--out", out, "--seed", str(self.seed), "--replicates", str(self.replicates),
                *(["--candidate-replicates", str(self.candidate_replicates)] if self.candidate_replicates > 1 else []),
                "--design", self.design,
                "--candidate", self.candidate, "--control", self.control, "--device", self.device,
                "--margin", str(self.margin)]
        for key, value in self.overrides:
            argv += [f"--{key.replace('_', '-')}", str(value if key == "lr" else int(value))]
        for flag, value in (("--mxfp8-kernel", self.mxfp8_kernel if self.mxfp8_kernel != "auto" else None),
                            ("--data", self.data), ("--val-percent", self.val_percent),
                            ("--name", self.name or None), ("--gpus", gpus or None),
                            ("--parallel", per_gpu if per_gpu > 1 else None),
                            ("--stop-after-minutes", stop_after_minutes)):
            if value is not None:
                argv += [flag, str(value)]
        return shlex.join(argv)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["overrides"] = [list(kv) for kv in self.overrides]
        return d


def plan_from_dict(d: dict) -> ProtocolPlan:
    return ProtocolPlan(**(d | {"overrides": tuple((k, v) for k, v in d.get("overrides", []))}))


# ------------------------------------------------------------------ state of the runs
# what may change on a folder that holds runs: how many replicates, which recipe is the positive control, and the
# result files' prefix (``name``: it names no run; #15's k = m = 16 plan was started without one, and its results
# must not take the lr 6e-4 protocol's "proxy_long"). Every run is named by what it is (recipe, change), so the
# runs made stay valid; a run no longer in the plan is kept on disk and left out of the verdicts.
CHANGEABLE = ("replicates", "candidate_replicates", "control", "name")


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
    deletes this protocol's own runs, logs, results and pace first, nothing else)."""
    out = Path(out)
    state = out / "protocol.json"
    forced = force and state.exists()
    if forced:
        for sub in ("runs", "logs", "results", "results.partial"):
            shutil.rmtree(out / sub, ignore_errors=True)
        (out / "pace.jsonl").unlink(missing_ok=True)  # pieces.PACE_FILE: the paces of runs no longer there
        state.unlink()
    if state.exists():
        have, want = check_same_plan(plan, out), plan.as_dict()
        changed = [f"{key} {old} -> {new}" for key, old, new in changed_fields(have, want)]
        if not changed:
            return None
        atomic_write(state, json.dumps(want, indent=1) + "\n", force=True)  # a kill mid-write keeps the old plan
        return f"{out}: the plan now has {', '.join(changed)}; the runs already made are kept"
    if not forced and out.exists() and (not out.is_dir() or any(out.iterdir())):  # forced: others' files stay
        raise BadInput(f"{out} is not empty and holds no protocol run; choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(state, json.dumps(plan.as_dict(), indent=1) + "\n")
    return None


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
    file is removed: a protocol folder is committed to git and travels to the GPU machines (64 MiB in all), and
    a 64-run proxy plan's is ~45 MB plain, ~10 MB compressed (a run's metrics ~0.64 MB, ~4.5x smaller as gzip)."""
    for name in COMPACTED:
        plain = Path(folder) / name
        if plain.exists():
            atomic_write(plain.with_name(name + ".gz"), gzipped(plain.read_bytes()), force=True)
            plain.unlink()


def _run_config(out: Path, spec: RunSpec) -> dict:
    """A run's config.json ({} while the run has not written one)."""
    path = run_dir(out, spec) / "config.json"
    return read_json_object(path, what="a run's config") if path.is_file() else {}


def run_state(plan: ProtocolPlan, out: Path, spec: RunSpec) -> int | str:
    """One run's steps logged so far, or "done" (all steps, or a run that diverged and stopped). A compacted log
    (``compact_run``: only a finished run's) that ends short is damage, not a run to train again over it; so is a
    file where the run's folder belongs (it had read as a run not started)."""
    folder = run_dir(out, spec)
    for part in (folder.parent.parent, folder.parent, folder):
        if part.exists() and not part.is_dir():
            raise BadInput(f"{part}: a file where the protocol keeps run {spec.name}'s folder ({folder}); move it away")
    path = metrics_path(out, spec)
    recs = JsonlLog(path).records()
    last = recs[-1] if recs else {}
    if last.get("step") == plan.steps or last.get("diverged"):
        return "done"
    if path.name.endswith(".gz"):
        raise BadInput(f"{path}: a finished run's compacted log, but it ends at step {last.get('step', 0)} of "
                       f"{plan.steps}: damaged; restore it (e.g. from git) rather than train the run again")
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
    """Whether a run stopped part-way has its checkpoint here. A folder copied off a machine whose disk ended with
    the call holds a stopped run's logs without its checkpoint: that run starts again at step 0 (training drops
    the logged steps past the checkpoint it loads, here all of them)."""
    return (run_dir(out, spec) / CHECKPOINT_FILE).is_file()


def run_piece(plan: ProtocolPlan, spec: RunSpec, out: Path, *, stop_after_s: float | None,
              tokens: data_mod.TokenData | None = None, progress: bool = True) -> bool:
    """Continue one run from its checkpoint (or start it) for at most ``stop_after_s``; True when it is done.
    A finished run keeps no checkpoint (its last step writes none, and an earlier one is deleted) and its logs
    are compacted to gzip (``compact_run``); a stopped one stays plain, for training to append to."""
    cfg = plan.train_config(spec)
    tokens = tokens or data_mod.load_tokens(cfg.data)
    for other in plan.runs():  # the folder's runs are compared with each other: all on the same tokens
        made = run_dir(out, other) / "config.json"
        if made.is_file():
            data_mod.check_same_data(made, tokens.meta)
            break
    folder = run_dir(out, spec)
    done = train_recipe(cfg, spec.recipe, folder, tokens, resume=True, progress=progress, stop_after_s=stop_after_s,
                        final_checkpoint=False)
    if done:
        finish_run(folder)
    return done


def finish_run(folder: Path) -> None:
    """A finished run's folder as the protocol keeps it: no checkpoint (an earlier one, ~11 GB on the proxy, and
    a ``.tmp`` a kill left mid-write, which nothing would replace), logs compacted (``compact_run``). Also run on
    every finished run before a protocol goes on: a kill after a run's last step left its checkpoint and plain
    logs for good, the run counting as done from then on."""
    folder = Path(folder)
    for name in (CHECKPOINT_FILE, CHECKPOINT_FILE + ".tmp"):
        (folder / name).unlink(missing_ok=True)
    compact_run(folder)


# ------------------------------------------------------------------ verdicts
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
        fp = _run_config(out, spec).get("init_fingerprint")
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
    folder, as golden/training holds #15's, are judged by the same code that judged them."""
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


def hardware_tag(device: str, gpus: int) -> str:
    from numerics.environment import hardware_tag as tag

    t = tag() if device == "cuda" else "cpu"
    return f"{t}x{gpus}" if gpus > 1 else t


def runs_hardware_tag(plan: ProtocolPlan, out: Path) -> str:
    """The hardware tag of a finished folder judged away from the machine that ran it: its runs' GPU model, from
    the environment each run's config.json records (how many GPUs ran them side by side is not recorded: the
    tag names one, as ``--hardware`` can correct). Runs on different GPU models are refused: name them."""
    from numerics.environment import gpu_tag

    envs = _run_environments(plan, out)
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


def _run_environments(plan: ProtocolPlan, out: Path) -> dict[str, dict]:
    """Each run's environment as its config.json recorded it, by run name (a run without one is left out)."""
    envs = {}
    for spec in plan.runs():
        env = _run_config(out, spec).get("environment")
        if isinstance(env, dict):
            gpus = env.get("gpus")  # training writes a list of model names; a string had read as its letters
            if gpus is not None and not (isinstance(gpus, list) and all(isinstance(g, str) for g in gpus)):
                raise BadInput(f"{run_dir(out, spec) / 'config.json'}: its environment's gpus is {gpus!r}, not a list "
                               "of GPU names; restore it, e.g. from git")
            envs[spec.name] = env
    return envs


def runs_environment(plan: ProtocolPlan, out: Path, envs: dict[str, dict] | None = None) -> dict | None:
    """The environment the plan's runs were trained in, from each run's config.json (or ``envs``, already read by
    ``_run_environments``): a field on which they agree keeps its value, one on which they differ (the commit of a
    plan run over several sessions, the platform of another lent machine) lists the distinct values; None when no
    run records one."""
    envs = list((_run_environments(plan, out) if envs is None else envs).values())
    if not envs:
        return None
    merged = {}
    for key in dict.fromkeys(k for e in envs for k in e):
        values = {json.dumps(e.get(key), sort_keys=True): e.get(key) for e in envs}
        merged[key] = next(iter(values.values())) if len(values) == 1 else [values[v] for v in sorted(values)]
    return merged


# What computes a run: the runs of a plan are compared with each other, so a session on a machine whose torch,
# torchao, CUDA or GPU differs from the runs already made would mix that change into the verdict (a plan spans
# weeks of lent machines). Not among them: the mxval commit (the protocol's own code changes between sessions;
# the training path's results are held by its bit-identity tests), the driver, the platform and the host CPU.
COMPUTE_FIELDS = {"cuda": ("torch", "torchao", "cuda", "gpu", "capability"), "cpu": ("torch", "torchao")}


def _compute_value(env: dict, field: str):
    if field == "gpu":  # the model, not how many: a two-GPU machine's runs each see one or both
        return sorted(set(env.get("gpus") or [])) or None
    return env.get(field)


def _made_with(plan: ProtocolPlan, out: Path) -> dict[str, dict[str, list[str]]]:
    """Each of the plan's ``COMPUTE_FIELDS``: its values (as JSON) in the runs' config.json, each with the runs
    that recorded it; a field a run did not record is not counted."""
    made: dict[str, dict[str, list[str]]] = {f: {} for f in COMPUTE_FIELDS[plan.device]}
    for name, env in _run_environments(plan, out).items():
        for f in made:
            value = _compute_value(env, f)
            if value is not None:
                made[f].setdefault(json.dumps(value), []).append(name)
    return made


def made_with(plan: ProtocolPlan, out: Path) -> str | None:
    """One line: what computed the plan's runs so far, a field on which they differ marked MIXED (None before
    any run has recorded its environment)."""
    made = _made_with(plan, out)
    parts = [f"{f} {json.loads(next(iter(vs)))}" if len(vs) == 1 else
             f"{f} MIXED ({'; '.join(f'{json.loads(v)} in {len(runs)}' for v, runs in sorted(vs.items()))})"
             for f, vs in made.items() if vs]
    return ", ".join(parts) or None


def environment_change(plan: ProtocolPlan, out: Path, here: dict) -> str | None:
    """How ``here`` (``numerics.environment.describe()`` of the machine about to train) differs from the plan's
    runs already made in what computes a run (``COMPUTE_FIELDS``); None when it does not. A field a run did not
    record is not compared."""
    diffs = []
    for f, values in _made_with(plan, out).items():
        now = _compute_value(here, f)
        other = {v: runs for v, runs in values.items() if now is not None and v != json.dumps(now)}
        made = [f"{json.loads(v)} in {len(runs)} run(s) ({runs[0]}{', ...' if len(runs) > 1 else ''})"
                for v, runs in sorted(other.items())]
        if made:
            diffs.append(f"{f} {now} here, " + ", ".join(made))
    return "; ".join(diffs) or None


def verdict_line(name: str, r: dict) -> str:
    """One verdict as the protocol prints it: the decision, for a control whether it came out as it must, the
    reason and what the runs resolve."""
    from convergence.curves.compare import resolution

    exp, ok = r["protocol"]["expected"], r["protocol"]["as_expected"]
    check = "" if exp is None else f" [control: expected {exp}: {'OK' if ok else 'FAILED'}]"
    return f"{name:<17} {r['verdict'].upper()}{check}: {r['reason']}; {resolution(r)}"


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
    a whole plan would otherwise add ~40 MB to a tree that travels with every GPU call (64 MiB in all). A run
    already compacted is copied as it is (``gzipped``): the same bytes as compressing its plain file here."""
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
    envs = _run_environments(plan, out)
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
