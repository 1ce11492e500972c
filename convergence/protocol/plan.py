"""The convergence protocol's plan: a paired candidate, baseline replicates and both controls, and the commands
that make them.

Public: ``ProtocolPlan``, ``RunSpec``, ``DESIGNS``, ``VERDICTS``, ``TRAIN_OVERRIDES``, ``plan_from_dict``.

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

Designs (what a replicate changes; docs/protocol.md gives the measured spread of each): ``init`` (seed + i, data
order of ``seed``), ``data`` (data order seed + i), ``rounding`` (rows of every batch permuted by i: the same sums
in another order), ``seed`` (both).

Verdicts (``VERDICTS``), each ``python -m convergence compare --metric val_loss`` of one group of runs against
the baselines ``bf16`` + the replicates: ``verdict`` (the candidate and its replicates), ``positive_control``
(the control and its replicates: must be ``not_equivalent``), ``negative_control`` (the m held-out
replicates: must be ``equivalent``). One candidate run cannot be resolved below ``z * spread`` however many
baselines there are; m candidate runs can (``convergence.curves.paired``), so both controls get as many runs as
the candidate, and the same resolution (a control judged from one run could not pass at a resolution the
candidate's verdict reaches: FP4 elements everywhere measured 1.1-1.6 % worse at 1,500 proxy steps on an H200,
under the one-run floor). ``replicates``, ``candidate_replicates``, ``control`` and ``name`` may change on a
folder that holds runs (``convergence.protocol.folder``): the runs made stay.
"""

from __future__ import annotations

import dataclasses
import math
import re
import shlex
from dataclasses import dataclass

from convergence.train import data as data_mod
from convergence.train.loop import TrainConfig, defaults_for
from numerics.errors import SEED_MAX, BadInput
from numerics.layer.configs import CONFIGS
from numerics.layer.recipes import RECIPES

DESIGNS = ("init", "rounding", "data", "seed")
VERDICTS = {  # name -> (role of the judged run, the verdict it must reach, what it shows)
    "verdict": ("candidate", None, "the candidate against the BF16 baseline and its replicates"),
    "positive_control": ("control", "not_equivalent", "a recipe known to be worse must be told apart"),
    "negative_control": ("heldout", "equivalent", "one more BF16 replicate must be called equivalent"),
}
# validation: every ``val_every`` steps on the first ``val_batches`` batches of the held-out split
# (docs/protocol.md: the sampling error of the set, measured, is far below the margin)
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
    design: str = "rounding"  # docs/protocol.md: the smallest measured spread, arithmetic only
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
        """In the order the runs are scheduled: nested, so that every prefix of finished runs is a whole smaller
        protocol (``levels``): a plan cut short by the compute time it gets can still be judged, controls included,
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


