"""What ``mxval validate`` runs on this machine (the ladder): the levels, their sizes, and the result records.

Public: ``LEVELS`` (the ladder, in order), ``LadderPlan`` / ``make_plan(...)`` (sizes chosen from the
hardware: CPU -> the tiny model's layers and the tiny model, a GPU -> 16B shapes and the proxy model, two GPUs
with deep_ep -> DeepEP against NCCL), ``Check`` and ``LevelResult`` (what each level returns; the
report and ``summary.json`` are written from these alone), ``level_status(checks)``.

Statuses: ``pass``, ``fail``, ``inconclusive`` (ran, and the evidence is too weak to decide either
way: a short loss curve against a 0.25 % margin), ``skipped`` (with the reason and how to enable it).
Only ``fail`` makes the exit code non-zero.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

LEVELS: dict[str, str] = {
    "tensor": "MXFP8 cast: torchao against the exact MX oracle",
    "layer": "layers: MXFP8 against BF16 and FP32, forward and backward",
    "communication": "expert-parallel dispatch / combine, bit for bit",
    "training": "paired BF16 / MXFP8 pretraining run",
    "curves": "loss-curve verdict: is the MXFP8 run equivalent to BF16?",
}
STATUSES = ("pass", "fail", "inconclusive", "skipped")


@dataclass(frozen=True)
class LadderPlan:
    device: str  # "cpu" or "cuda"
    gpus: int
    deep_ep: bool  # deep_ep importable
    quick: bool
    tensor_size: str  # numerics.tensor.report size
    layer_config: str  # numerics.layer.configs name
    ep_world: int
    ep_cases: int  # sampled routings after the named edge cases
    ep_backend: str  # "reference" (against simulate) or "deepep" (against the NCCL reference)
    train_model: str  # convergence.train.model config name
    train_steps: int
    seed: int = 0
    train_replicates: int = 3  # BF16 baselines of the convergence protocol (the paired one included)
    train_design: str = "rounding"  # what a replicate changes (convergence.protocol.plan.DESIGNS)
    strict: bool = False  # known findings (FINDINGS.md) fail a level instead of passing it as "known"
    mxfp8_kernel: str = "auto"  # training's MXFP8 kernel: fast on a GPU where it runs (bit-identical, ~6x)
    # validation batches an evaluation of training reads, or None for the model's protocol default. --quick reads
    # 8 of the tiny model's 32: its evaluations are otherwise half of a quick run's time, and a smoke run's verdict
    # is not read for its resolution
    train_val_batches: int | None = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def make_plan(*, gpus: int, deep_ep: bool, quick: bool = False, steps: int | None = None, seed: int = 0,
              strict: bool = False) -> LadderPlan:
    """Sizes for this machine. CPU numbers are chosen so the whole ladder fits in a few minutes on
    2 cores (measured: docs/validate.md); ``quick`` shrinks every level further (tests, smoke runs).
    """
    gpu = gpus >= 1
    kernel = "auto"
    if gpu:
        from numerics.layer.mxfp8 import kernel_problem

        kernel = "fast" if kernel_problem("fast", "cuda") is None else "auto"
        # the convergence protocol's 6 proxy runs (4 BF16, 2 MXFP8 through the fast kernel), one per GPU at a time.
        # Measured on 2 x H200 at 1,500 steps (golden/training/proxy_long_*): a BF16 run 240 s wall, an MXFP8 run
        # 373 s, each ~60 s of it start-up and evaluations -> 1,000 steps: 4 x 180 s + 2 x 270 s over two GPUs,
        # ~10.5 min; one GPU runs all six in turn -> 300 steps in ~10 min
        default_steps = 40 if quick else 1000 if gpus >= 2 else 300
    else:
        # tiny on 2 CPU cores, six protocol runs: ~0.05 s (bf16) + ~0.3 s (emulated mxfp8) per step -> ~4 min for
        # 200 steps (docs/validate.md)
        default_steps = 20 if quick else 200
    return LadderPlan(
        device="cuda" if gpu else "cpu", gpus=gpus, deep_ep=deep_ep, quick=quick,
        tensor_size="quick",
        layer_config="16b" if gpu and not quick else "tiny",
        ep_world=2,
        ep_cases=10 if quick else 120,
        ep_backend="deepep" if gpus >= 2 and deep_ep else "reference",
        train_model="proxy" if gpu and not quick else "tiny",
        train_steps=steps or default_steps,
        train_val_batches=8 if quick and not gpu else None,
        seed=seed,
        strict=strict,
        mxfp8_kernel=kernel,
    )


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # one of STATUSES
    detail: str = ""


@dataclass(frozen=True)
class LevelResult:
    level: str
    status: str
    summary: str  # one line: what was found
    checks: tuple[Check, ...] = ()
    numbers: dict = field(default_factory=dict)  # the key figures (JSON-able)
    table: tuple[tuple[str, ...], ...] = ()  # first row is the header
    figures: tuple[str, ...] = ()  # PNG paths relative to the results folder
    artifacts: tuple[str, ...] = ()  # other files written, relative to the results folder
    enable: str | None = None  # how to run what was skipped
    seconds: float = 0.0

    def record(self) -> dict:
        d = dataclasses.asdict(self)
        d["checks"] = [dataclasses.asdict(c) for c in self.checks]
        d["table"] = [list(r) for r in self.table]
        d["title"] = LEVELS[self.level]
        return d


def level_status(checks: tuple[Check, ...] | list[Check]) -> str:
    """fail if any check failed; skipped if all were skipped; inconclusive if any was; else pass."""
    statuses = {c.status for c in checks}
    if "fail" in statuses:
        return "fail"
    if not statuses or statuses == {"skipped"}:
        return "skipped"
    if "inconclusive" in statuses:
        return "inconclusive"
    return "pass"


def skipped(level: str, reason: str, enable: str | None) -> LevelResult:
    return LevelResult(level, "skipped", reason, checks=(Check(level, "skipped", reason),), enable=enable)
