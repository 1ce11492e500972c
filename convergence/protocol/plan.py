"""The convergence protocol's plan: what it declares before any run (design, endpoint, test, margin, controls) and
the runs that make it, with the commands that make them.

Public: ``ProtocolPlan``, ``RunSpec``, ``DESIGNS``, ``VERDICTS``, ``TRAIN_OVERRIDES``, ``PLANTED``, ``plan_from_dict``.

The runs (``ProtocolPlan.runs``), all from the same ``convergence.train.loop`` and the same token stream:

=================  ===============  ==========================================================================
run                recipe           initial weights / data order / batch row order
=================  ===============  ==========================================================================
``bf16``           bf16             seed / seed / as drawn: the paired baseline
``<candidate>``    mxfp8            the same: differs from ``bf16`` only by its numerics
``<control>``      mxfp8-head       the same: a recipe positive control, when the plan declares one
``bf16_<d>1..``    bf16             one benign change each (``design`` d): the replicates
``<candidate>_<d>i``  mxfp8         with ``candidate_replicates`` m > 1: the candidate with change i, i < m
``<control>_<d>i``    mxfp8-head    the same for a recipe control: judged at the candidate's resolution
``bf16_<d>k..``    bf16             m more, held out of the baselines: the negative control (and, shifted, the
                                    planted positive control)
``mxfp8-null``     mxfp8-null       with ``null_control``: ``bf16``'s twin through the seam's identity cast
=================  ===============  ==========================================================================

Designs (what a replicate changes; docs/protocol.md gives the measured spread of each): ``init`` (seed + i, data
order of ``seed``), ``data`` (data order seed + i), ``rounding`` (rows of every batch permuted by i: the same sums
in another order), ``seed`` (both), and ``fork``: ``trunks`` BF16 runs to ``fork_step`` (``trunk<t>``, init seed
seed + t - 1, stopped there with their checkpoint, trained ``--deterministic`` so that a lost checkpoint is made
again bit-identically), each continued (``RunSpec.after``) by k BF16 (``bf16_t<t>r<j>``), m candidate
(``<candidate>_t<t>r<j>``) and m held-out BF16 runs (``bf16_t<t>h<j>``), continuation j with rows permuted by j
(held-out: k + j), or with ``fork_change`` ``data`` its remaining windows drawn with data seed seed + j (on a CPU
whose sums of a few rows round alike, permuted rows can leave a tiny run unchanged). Judged with the trunk as a
block (``convergence.curves.paired.within_blocks``): the estimand is the candidate from ``fork_step`` on.
``pilot``: a fork plan with no candidate (one trunk's k BF16 continuations), whose result is the continuations'
spread (``convergence.protocol.pilot``).

What a plan declares (recorded in OUT/protocol.json before any run): the endpoint (``endpoint``: the final window,
or the whole range; the other is reported, never deciding), the test (``test``: ``equivalence``, TOST at
``alpha``, or ``non-inferiority``; ``convergence.curves.decision.equivalence``), the margin and the controls. A
protocol.json without a test is a plan from before the field: judged by the rule it was declared under,
``two-ranges`` (``plan_from_dict``).

Verdicts (``ProtocolPlan.verdicts``), each ``python -m convergence compare --metric val_loss`` of one group of runs
against the baselines (every BF16 run not held out):

* ``verdict``: the candidate and its replicates, by the declared test;
* ``positive_control``: a known worse candidate, which the test must call unfavourable (``not_equivalent`` or
  ``inferior``): by default (``control`` = ``PLANTED``) the held-out runs with their validation losses made
  ``planted_shift`` x margin worse (a known true effect, no runs of its own; the plan's projection says in advance
  how likely its test is to see it: ``convergence.protocol.projection``), or a recipe's runs;
* ``negative_control``: the held-out BF16 runs, whose true difference is 0: it passes when its interval covers 0
  (the two-sided test of no difference at ``alpha`` does not reject), which it fails alpha of the time by chance;
* ``null_control`` (``null_control``): ``mxfp8-null`` must be bit-identical to its BF16 twin, step for step.

A plan under the ``two-ranges`` rule keeps its three verdicts as it was judged: the control recipe must be
``not_equivalent``, the held-out runs ``equivalent`` (``VERDICTS``). One candidate run cannot be resolved below
``z * spread`` however many baselines there are; m candidate runs can (``convergence.curves.paired``), so both
controls get as many runs as the candidate, and the same resolution. ``replicates``, ``candidate_replicates``,
``trunks``, ``control`` and ``name`` may change on a folder that holds runs (``convergence.protocol.folder``): the
runs made stay.
"""

from __future__ import annotations

import dataclasses
import math
import re
import shlex
from dataclasses import dataclass

from convergence.curves.decision.equivalence import ENDPOINTS, LEGACY, TESTS, WORDS
from convergence.train import data as data_mod
from convergence.train.loop import TrainConfig, defaults_for, evaluation_steps
from numerics.errors import SEED_MAX, BadInput
from numerics.layer.configs import CONFIGS
from numerics.layer.recipes import NULL_CONTROLS, RECIPES

DESIGNS = ("init", "rounding", "data", "seed", "fork")
FORK_CHANGES = ("rounding", "data")  # what a fork's continuation j changes: rows permuted by j, or data seed + j
PLANTED = "planted"  # the positive control by default: the held-out BF16 runs made planted_shift x margin worse
NULL_RECIPE = NULL_CONTROLS[0]
# the rule before declared tests (a plan without ``test``): name -> (role of the judged run, the verdict it must
# reach, what it shows); ``ProtocolPlan.verdicts`` gives a plan's own
VERDICTS = {
    "verdict": ("candidate", None, "the candidate against the BF16 baseline and its replicates"),
    "positive_control": ("control", "not_equivalent", "a recipe known to be worse must be told apart"),
    "negative_control": ("heldout", "equivalent", "one more BF16 replicate must be called equivalent"),
}
COVERS_ZERO, IDENTICAL = "covers_zero", "identical"  # what the negative and the null control must come out as
# validation: every ``val_every`` steps on the first ``val_batches`` batches of the held-out split
# (docs/protocol.md: the sampling error of the set, measured, is far below the margin)
PROTOCOL_DEFAULTS = {
    "tiny": dict(val_every=10, val_batches=32),
    "proxy": dict(val_every=50, val_batches=22),  # all the 2 % held-out split holds: 22 batches of 4 x 2048 on
    # Python 3.11.7, 18 on 3.12.3 (the GPU machines'; eval_batches takes all there are when asked for more)
    "16b": dict(val_every=50, val_batches=22),
}
TRAIN_OVERRIDES = ("batch", "seq", "lr", "warmup", "val_every", "val_batches", "probe_every")
# the shift of a planted control, in margins: at the margin or beyond (1x), and not so far beyond (3x) that seeing
# it says nothing about a difference near the margin
PLANTED_SHIFTS = (1.0, 3.0)


@dataclass(frozen=True)
class RunSpec:
    """One run of a plan. ``after``: the run it continues, its trunk (fork design): it starts from that run's
    checkpoint at ``ProtocolPlan.fork_step``, so it can start only once that checkpoint exists; an executor keeps
    the trunk's checkpoint until every run ``after`` it has finished or holds a checkpoint of its own
    (``convergence.protocol.forks``), and a Slurm executor makes it a job dependency. ``stop_at``: a trunk's last
    step (it stops there with its checkpoint; None: the plan's steps). ``deterministic``: trained with
    deterministic algorithms (trunks, and the null control and its twin)."""

    name: str  # folder under OUT/runs/
    role: str  # baseline | candidate | control | replicate | heldout | trunk | null_control (+ _replicate)
    recipe: str
    seed: int  # initial weights
    data_seed: int  # order of the training windows
    row_order: int | None = None  # rows of each batch permuted by this seed
    after: str | None = None
    stop_at: int | None = None
    deterministic: bool = False


@dataclass(frozen=True)
class ProtocolPlan:
    model: str
    steps: int
    seed: int = 0
    replicates: int = 4  # BF16 baselines (fork: per trunk), the paired one included
    candidate_replicates: int = 1  # candidate runs (fork: per trunk), the paired one included (as many held-out)
    design: str = "rounding"  # docs/protocol.md: the smallest measured spread, arithmetic only
    candidate: str = "mxfp8"
    control: str = PLANTED  # PLANTED, or a recipe known to be worse
    device: str = "cpu"
    mxfp8_kernel: str = "auto"
    margin: float = 0.0025  # DeepSeek-V3's 0.25 % (numerics/tolerances.py, training/any/loss_curve)
    name: str = ""  # prefix of the verdict files; "" -> "<model>_long"
    data: str | None = None  # as convergence train --data (None: the standard-library corpus)
    val_percent: int | None = None  # as convergence train --val-percent (None: its default, 2 %)
    overrides: tuple[tuple[str, float], ...] = ()  # TRAIN_OVERRIDES given on the command line
    test: str = "equivalence"  # the declared test; LEGACY for a plan from before the field (plan_from_dict)
    alpha: float = 0.05  # each one-sided test's level
    endpoint: str = "final"  # the final window (or "whole": the whole compared range)
    planted_shift: float = 2.0  # the planted control's true effect, in margins (PLANTED_SHIFTS)
    null_control: bool = False  # run mxfp8-null beside its BF16 twin, both deterministic
    trunks: int = 1  # fork: BF16 trunks
    fork_step: int = 0  # fork: the trunks' last step, where the continuations start
    pilot: bool = False  # fork: no candidate; the continuations' spread is the result
    planned_spread: float | None = None  # the run-to-run spread the projection plans with (None: projection's)
    fork_change: str = "rounding"  # fork: what tells continuations apart, "rounding" (rows) or "data" (windows)

    def check(self) -> ProtocolPlan:
        if self.model not in CONFIGS:
            raise BadInput(f"unknown model {self.model!r}; choose from {', '.join(CONFIGS)}")
        if self.candidate not in RECIPES or self.candidate == "bf16" or self.candidate in NULL_CONTROLS:
            raise BadInput(f"--candidate {self.candidate!r}: choose a recipe other than bf16 and the null control "
                           f"from {', '.join(RECIPES)}")
        if self.control != PLANTED and (self.control not in RECIPES or self.control in ("bf16", *NULL_CONTROLS)):
            raise BadInput(f"--control {self.control!r}: '{PLANTED}' or a recipe other than bf16 and the null control "
                           f"from {', '.join(RECIPES)}")
        if self.candidate == self.control:
            raise BadInput("--candidate and --control name the same recipe")
        if self.test not in TESTS or self.endpoint not in ENDPOINTS:
            raise BadInput(f"--test must be one of {', '.join(TESTS)} and --endpoint one of {', '.join(ENDPOINTS)}, "
                           f"got {self.test!r} and {self.endpoint!r}")
        if not 0 < self.alpha < 0.5:  # the 1 - 2 alpha interval must be a real one
            raise BadInput(f"--alpha must be in (0, 0.5), got {self.alpha}")
        if self.test == LEGACY and (self.control == PLANTED or self.design == "fork" or self.null_control):
            raise BadInput(f"--test {LEGACY} (the rule before declared tests) judges the plans made under it: a "
                           "recipe control, independent runs and no null control")
        lo, hi = PLANTED_SHIFTS
        if not lo <= self.planted_shift <= hi:
            raise BadInput(f"--planted-shift must be from {lo:g} to {hi:g} margins, got {self.planted_shift:g}")
        if self.steps < 2:
            raise BadInput(f"--steps must be >= 2, got {self.steps}")
        if self.replicates < 2 and not (self.design == "fork" and self.replicates == 1 and self.trunks >= 2):
            raise BadInput(f"--replicates must be >= 2 (their spread is the noise), got {self.replicates}")
        if self.candidate_replicates < 1:
            raise BadInput(f"--candidate-replicates must be >= 1, got {self.candidate_replicates}")
        if self.design not in DESIGNS:
            raise BadInput(f"--design must be one of {', '.join(DESIGNS)}, got {self.design!r}")
        self._check_fork()
        above = self.replicates + self.candidate_replicates + self.trunks  # seeds counted up from --seed
        if not 0 <= self.seed <= SEED_MAX - above:
            raise BadInput(f"--seed must be from 0 to {SEED_MAX - above} (this plan's runs take seeds up to {above} "
                           f"above it), got {self.seed}")
        if not 0 < self.margin < 1:
            raise BadInput(f"--margin must be in (0, 1), got {self.margin}")
        if self.planned_spread is not None and not 0 < self.planned_spread < 1:
            raise BadInput(f"--planned-spread must be in (0, 1), got {self.planned_spread}")
        for key, value in self.overrides:
            if (key not in TRAIN_OVERRIDES or not math.isfinite(value) or value < 0
                    or (value == 0 and key not in ("warmup", "probe_every"))):
                raise BadInput(f"--{key.replace('_', '-')} {value}: out of range")
        if self.name and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", self.name):
            raise BadInput(f"--name {self.name!r}: letters, digits, '.', '_' and '-' only (it begins the result "
                           "files' names in OUT/results)")
        data_mod.check_val_percent(self.val_percent)
        every = self.train_defaults()["val_every"]
        if len(evaluation_steps(self.steps, every)) < 2:
            raise BadInput(f"--steps {self.steps} with --val-every {every:g}: a run evaluates every --val-every steps "
                           f"and at its last, here at step {self.steps} only, and a verdict compares validation "
                           f"losses at two steps at the least: --val-every below --steps")
        return self

    def _check_fork(self) -> None:
        if self.design != "fork":
            if self.pilot or self.fork_step or self.trunks != 1 or self.fork_change != "rounding":
                raise BadInput("--pilot, --fork-step, --fork-change and --trunks go with --design fork")
            return
        if self.trunks < 1 or not 0 < self.fork_step < self.steps:
            raise BadInput(f"--design fork needs --trunks >= 1 and a --fork-step inside the run (1 to "
                           f"{self.steps - 1}), got {self.trunks} and {self.fork_step}")
        if self.fork_change not in FORK_CHANGES:
            raise BadInput(f"--fork-change must be one of {', '.join(FORK_CHANGES)}, got {self.fork_change!r}")
        if self.pilot and self.null_control:
            raise BadInput("--pilot runs BF16 continuations only: leave out --null-control")

    @property
    def prefix(self) -> str:
        return self.name or f"{self.model}_long"

    @property
    def legacy(self) -> bool:
        """A plan under the rule before declared tests (``VERDICTS``)."""
        return self.test == LEGACY

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
        instead of missing its held-out runs, which the plan's own order puts last. A fork's trunk comes before
        the runs that continue it."""
        level = {r.name: n for n, sub in reversed(list(enumerate(self.levels()))) for r in sub._runs_by_role()}
        return sorted(self._runs_by_role(), key=lambda r: level[r.name])  # stable: the plan's order within a level

    def levels(self) -> list[ProtocolPlan]:
        """The nested smaller plans. Independent runs: n = 1 .. ``candidate_replicates``, plan n with n candidate
        runs (and as many control and held-out runs) and ``max(2, ceil(n k / m))`` baselines (two at least: their
        spread is the noise). Fork: the first n trunks with all their continuations, n = 1 .. ``trunks``. The last is
        this plan. A run's name does not depend on its role, so a run made for one plan is the same run in every
        other that names it."""
        if self.design == "fork":
            return [dataclasses.replace(self, trunks=n) for n in range(1, self.trunks + 1)]
        k, m = self.replicates, self.candidate_replicates
        return [dataclasses.replace(self, replicates=max(2, -(-n * k // m)), candidate_replicates=n)
                for n in range(1, m + 1)]

    def _runs_by_role(self) -> list[RunSpec]:
        """The paired pair first, the control, then each BF16 replicate next to the candidate's and the control's
        replicates with the same change, then the held-out runs (fork: trunk by trunk, in that order)."""
        if self.design == "fork":
            runs = [r for t in range(1, self.trunks + 1) for r in self._trunk_runs(t)]
        else:
            s, k, m = self.seed, self.replicates, self.candidate_replicates
            pairs = []
            for i in range(1, max(k, m)):
                pairs += [self._replicate(i, "replicate")] if i < k else []
                pairs += [self._replicate(i, "candidate_replicate", self.candidate)] if i < m else []
                pairs += [self._replicate(i, "control_replicate", self.control)] if i < m and self.recipe_control \
                    else []
            runs = [RunSpec("bf16", "baseline", "bf16", s, s),
                    RunSpec(self.candidate, "candidate", self.candidate, s, s),
                    *([RunSpec(self.control, "control", self.control, s, s)] if self.recipe_control else []), *pairs,
                    *(self._replicate(k + j, "heldout") for j in range(m))]
        if not self.null_control:
            return runs
        twin = next(r for r in runs if r.role == "baseline")
        i = runs.index(twin)
        null = dataclasses.replace(twin, name=twin.name.replace("bf16", NULL_RECIPE, 1), role="null_control",
                                   recipe=NULL_RECIPE, deterministic=True)
        return [*runs[:i], dataclasses.replace(twin, deterministic=True), null, *runs[i + 1:]]

    def _trunk_runs(self, t: int) -> list[RunSpec]:
        """Trunk t and the runs that continue it (module docstring): pair j (rows permuted by j) of BF16, the
        candidate and a recipe control, then the held-out BF16 runs (rows permuted by k + j)."""
        s, k, m = self.seed, self.replicates, 0 if self.pilot else self.candidate_replicates
        trunk = RunSpec(f"trunk{t}", "trunk", "bf16", s + t - 1, s, None, stop_at=self.fork_step, deterministic=True)

        def cont(recipe: str, role: str, j: int, change: int, tag: str = "r") -> RunSpec:
            if role != "heldout" and (t, j) != (1, 1):  # the first of each recipe is the paired one
                role = "replicate" if role == "baseline" else f"{role}_replicate"
            data, rows = (s + change, None) if self.fork_change == "data" else (s, change)
            return RunSpec(f"{recipe}_t{t}{tag}{j}", role, recipe, trunk.seed, data, rows, after=trunk.name)

        out = [trunk]
        for j in range(1, max(k, m) + 1):
            out += [cont("bf16", "baseline", j, j)] if j <= k else []
            out += [cont(self.candidate, "candidate", j, j)] if j <= m else []
            out += [cont(self.control, "control", j, j)] if j <= m and self.recipe_control else []
        return out + [cont("bf16", "heldout", j, k + j, "h") for j in range(1, m + 1)]

    @property
    def recipe_control(self) -> bool:
        """Whether the positive control is a recipe's runs (else the planted shift, or none in a pilot)."""
        return self.control != PLANTED and not self.pilot

    def run(self, role: str) -> RunSpec:
        return next(r for r in self.runs() if r.role == role)

    def baselines(self) -> list[RunSpec]:
        """The runs every verdict is judged against: every BF16 run that is not held out (the paired BF16 run and
        its replicates; a fork's BF16 continuations, not its trunks). ``judge`` and notebook 03 both take them from
        here."""
        return [r for r in self.runs() if r.role in ("baseline", "replicate")]

    def verdicts(self) -> dict[str, tuple[tuple[str, ...], str | None, str]]:
        """name -> (roles of the judged runs, what it must come out as, what it shows) for this plan; a pilot has
        none (its result is the spread: ``convergence.protocol.pilot``)."""
        if self.pilot:
            return {}
        if self.legacy:
            return {n: ((role, f"{role}_replicate"), exp, shows) for n, (role, exp, shows) in VERDICTS.items()}
        bad = WORDS[self.test][1]
        control = (("heldout",), bad, f"the held-out BF16 runs made {self.planted_shift:g} x the margin worse "
                   f"(+{self.planted_shift * self.margin:.3%}): a known difference the test must see") \
            if self.control == PLANTED else (("control", "control_replicate"), bad,
                                             f"{self.control}, a recipe known to be worse, must be told apart")
        out = {"verdict": (("candidate", "candidate_replicate"), None,
                           "the candidate against the BF16 baseline and its replicates"),
               "positive_control": control,
               "negative_control": (("heldout",), COVERS_ZERO,
                                    "BF16 runs held out of the baselines: their interval must cover 0")}
        if self.null_control:
            out["null_control"] = (("null_control",), IDENTICAL,
                                   f"{NULL_RECIPE} (the seam, no cast) must train bit-identically to its BF16 twin")
        return out

    def judged(self, verdict: str) -> list[RunSpec]:
        """The runs one verdict judges: the candidate or the control with its replicates, or the held-out runs."""
        roles = self.verdicts()[verdict][0]
        return [r for r in self.runs() if r.role in roles]

    def blocks(self, specs: list[RunSpec]) -> list[str] | None:
        """Each run's block (its trunk) in a fork plan, for ``compare_paths(blocks=...)``; None otherwise."""
        return [s.after for s in specs] if self.design == "fork" else None

    def train_config(self, spec: RunSpec) -> TrainConfig:
        """The run's training configuration; a continuation's ``fork_from`` is its trunk's folder, which only the
        folder knows (``convergence.protocol.forks.train_config``), so here it is left out."""
        d = self.train_defaults()
        if RECIPES[spec.recipe]().mxfp8 is False or spec.recipe in NULL_CONTROLS:
            d["probe_every"] = 0  # probes compare MXFP8 against BF16 on the run's activations: MXFP8 runs only
        ints = {k: (v if k == "lr" else int(v)) for k, v in d.items()}
        kernel = "auto" if spec.recipe in NULL_CONTROLS else self.mxfp8_kernel  # the null control: fast, no cast
        return TrainConfig(model=self.model, recipes=(spec.recipe,), steps=self.steps, seed=spec.seed,
                           device=self.device, mxfp8_kernel=kernel, data_seed=spec.data_seed,
                           row_order=spec.row_order, deterministic=spec.deterministic,
                           fork_step=self.fork_step if spec.after else 0,
                           data=data_mod.DataSpec(path=self.data, val_percent=self.val_percent),
                           **ints)

    def train_command(self, spec: RunSpec, out: str) -> str:
        """The ``python -m convergence train`` command that makes this run on its own (``out``: the plan's folder;
        a continuation forks from its trunk's run there)."""
        cfg = self.train_config(spec)
        argv = ["python", "-m", "convergence", "train", "--model", self.model, "--recipe", spec.recipe,
                "--steps", str(self.steps), "--seed", str(spec.seed), "--data-seed", str(spec.data_seed)]
        if spec.row_order is not None:
            argv += ["--row-order", str(spec.row_order)]
        # a fork's runs each in their own folder (the trunk and its continuations all train bf16)
        argv += ["--device", self.device, "--out", f"{out}/runs/{spec.name}" if self.design == "fork" else out]
        for key in ("batch", "seq", "lr", "warmup", "val_every", "val_batches", "probe_every", "ckpt_every"):
            argv += [f"--{key.replace('_', '-')}", str(getattr(cfg, key))]
        if cfg.mxfp8_kernel != "auto":
            argv += ["--mxfp8-kernel", cfg.mxfp8_kernel]
        if self.data:
            argv += ["--data", self.data]
        if self.val_percent is not None:
            argv += ["--val-percent", str(self.val_percent)]
        if spec.deterministic:
            argv += ["--deterministic"]
        if spec.stop_at is not None:
            argv += ["--stop-at-step", str(spec.stop_at)]
        if spec.after:
            trunk = next(r for r in self._runs_by_role() if r.name == spec.after)
            argv += ["--fork-from", f"{out}/runs/{trunk.name}/{trunk.recipe}", "--fork-step", str(self.fork_step)]
        return shlex.join(argv)

    def command(self, out: str, *, gpus: int = 0, per_gpu: int = 1, stop_after_minutes: float | None = None,
                declare_only: bool = False) -> str:
        """The ``python -m convergence protocol`` command of this plan (repeat it until it says complete)."""
        # a pilot's continuations per trunk are its --pilot N (the command line refuses --replicates beside it)
        runs = ["--pilot", str(self.replicates)] if self.pilot else ["--replicates", str(self.replicates)]
        argv = ["python", "-m", "convergence", "protocol", "--model", self.model, "--steps", str(self.steps),
                "--out", out, "--seed", str(self.seed), *runs,
                *(["--candidate-replicates", str(self.candidate_replicates)] if self.candidate_replicates > 1 else []),
                "--design", self.design,
                *([] if self.pilot else ["--candidate", self.candidate, "--control", self.control]),
                "--device", self.device, "--margin", str(self.margin), "--test", self.test]
        d = ProtocolPlan(model=self.model, steps=self.steps)
        for flag, key in (("--alpha", "alpha"), ("--endpoint", "endpoint"), ("--planted-shift", "planted_shift"),
                          ("--planned-spread", "planned_spread"), ("--fork-change", "fork_change")):
            if getattr(self, key) != getattr(d, key) and not (self.legacy and key != "alpha"):
                argv += [flag, str(getattr(self, key))]
        if self.design == "fork":
            argv += ["--trunks", str(self.trunks), "--fork-step", str(self.fork_step)]
        if self.null_control:
            argv += ["--null-control"]
        for key, value in self.overrides:
            argv += [f"--{key.replace('_', '-')}", str(value if key == "lr" else int(value))]
        for flag, value in (("--mxfp8-kernel", self.mxfp8_kernel if self.mxfp8_kernel != "auto" else None),
                            ("--data", self.data), ("--val-percent", self.val_percent),
                            ("--name", self.name or None), ("--gpus", gpus or None),
                            ("--parallel", per_gpu if per_gpu > 1 else None),
                            ("--stop-after-minutes", stop_after_minutes)):
            if value is not None:
                argv += [flag, str(value)]
        return shlex.join(argv + (["--declare-only"] if declare_only else []))

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["overrides"] = [list(kv) for kv in self.overrides]
        return d


def plan_from_dict(d: dict) -> ProtocolPlan:
    """The plan a protocol.json holds. One without ``test`` was declared before the field: it is judged by the rule
    of its time (``two-ranges``), so a folder made then is judged again exactly as it was."""
    return ProtocolPlan(**({"test": LEGACY} | d | {"overrides": tuple((k, v) for k, v in d.get("overrides", []))}))
