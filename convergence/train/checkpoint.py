"""Atomic checkpoints and torn-line-proof JSONL logs for training runs, and forks: runs started from another run's
checkpoint.

Public: ``save_checkpoint(path, state)``, ``load_checkpoint(path)``, ``plain(obj)``, ``JsonlLog``, ``CHECKPOINT_FILE``;
forks (below): ``FORK_MAY_DIFFER``, ``trunk_config(trunk)``, ``inherit(trunk_train, data_seed, row_order)``,
``checkpoint_step(path)``, ``check_fork(cfg)`` (before any work), ``begin(cfg, run_dir, model, opt, sched, tokens,
place, init_fp)`` (at the fork's first piece), ``fork_section(cfg, run_dir, windows)``.

A checkpoint is written to ``<path>.tmp`` and renamed over ``<path>`` (``os.replace`` is atomic on
POSIX), so a run killed at any instant leaves either the previous or the new checkpoint, never a torn
one. Tensors are stored as plain ``torch.Tensor`` (torchao's MXFP8 weight wrapper is unwrapped), so a
checkpoint loads without torchao and into either recipe.

Forks. A trunk is an ordinary run trained with the whole run's ``--steps`` (the learning-rate schedule is the whole
run's) and stopped at the fork step with ``--stop-at-step S``: its ``checkpoint.pt`` is then at exactly S (a
single-process run keeps only its latest checkpoint, so a trunk continued past S can no longer be forked at S).
A fork (``--fork-from TRUNK/<recipe> --fork-step S``) loads that checkpoint (weights, AdamW, the schedule's
position, the RNG), copies the trunk's metrics records up to S into its own ``metrics.jsonl`` (curves align and
``compare`` reads a fork as any run), names its trunk in ``config.json`` (``fork``: folder, step, recipe, the
digest of the trunk's training config, its initial weights), and trains S+1..steps. Its own checkpoints make it
resumable as any run; a fork killed before its first one starts again from the trunk.

What a fork may change (``FORK_MAY_DIFFER``): the recipe, and the replicate perturbation from the fork on:
``--row-order`` (each batch's rows in another order: the same tokens, one rounding apart per sum; what a
continuation should take) and ``--data-seed`` (the remaining training windows drawn from another shuffle: about
``S x batch / windows`` of them are windows the trunk already trained on, a repeat the fork's config records).
Without either flag a fork keeps the trunk's. Placement and bookkeeping may differ too (kernel choice, probes,
checkpoint cadence, activation checkpointing, deterministic algorithms). Everything else that shapes the curve
must be the trunk's (model, steps, seed, batch, sequence, learning rate and schedule, evaluations, data): a fork of
another configuration is refused, as is one under ``--ep`` (a distributed checkpoint is per rank).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

import torch

from numerics.errors import BadInput
from numerics.files import GZIP_MAGIC, atomic_write, file_bytes, gzip_or_plain

CHECKPOINT_FILE = "checkpoint.pt"  # a single-process run's checkpoint in its run folder


def _unwrap(t: torch.Tensor) -> torch.Tensor:
    inner = getattr(t, "_data", None)  # torchao TrainingWeightWrapperBaseTensor keeps its data here
    while isinstance(inner, torch.Tensor):
        t, inner = inner, getattr(inner, "_data", None)
    return t.detach().clone().cpu()


def plain(obj: Any) -> Any:
    """A copy of a (nested) state dict with every tensor a plain CPU tensor."""
    if isinstance(obj, torch.Tensor):
        return _unwrap(obj)
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(plain(v) for v in obj)
    return obj


def save_checkpoint(path: Path, state: dict) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(plain(state), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict:
    return torch.load(Path(path), map_location="cpu", weights_only=False)


def _json_safe(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else (1e308 if x > 0 else -1e308)
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


class JsonlLog:
    """Append-only JSONL where every record is one ``write`` syscall of a whole line.

    ``truncate_after(step)`` (used on resume) drops records past a checkpoint's step and any torn last
    line left by a kill, by rewriting the file atomically.
    """

    def __init__(self, path: Path):
        self.path = Path(path)

    def append(self, record: dict) -> None:
        line = (json.dumps(_json_safe(record), allow_nan=False) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def records(self) -> list[dict]:
        """Every whole record, up to a torn last line. A gzip file (a finished protocol run's log, compacted:
        ``convergence.protocol.folder.compact_run``) is read too, told by its magic bytes (``file_bytes``);
        ``append`` and ``truncate_after`` are for the plain file training writes.

        Only the last line may be torn (no newline: what a kill leaves); any whole line that is not a JSON record,
        a ``.gz`` that is not gzip, or bytes that are not UTF-8 are damage, and a ``BadInput`` naming the file and
        line: read as the end of the log, it made a finished protocol run look unfinished, and the protocol trained
        it again over the user's log (``convergence.protocol.folder.run_state`` also refuses a compacted log that
        ends short)."""
        if not self.path.exists():
            return []
        if self.path.name.endswith(".gz"):
            with open(self.path, "rb") as f:
                if f.read(len(GZIP_MAGIC)) != GZIP_MAGIC:
                    raise BadInput(f"{self.path}: named .gz but not gzip (damaged; restore it, e.g. from git)")
        raw = file_bytes(self.path)
        try:
            lines = raw.decode("utf-8").splitlines(keepends=True)
        except UnicodeDecodeError as exc:
            raise BadInput(f"{self.path}: not UTF-8 text ({exc.reason} at byte {exc.start}): damaged") from None
        out = []
        for i, line in enumerate(lines, 1):
            if not line.endswith("\n"):
                break  # torn last line (only the last can lack its newline)
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                rec = None
            if not isinstance(rec, dict):
                raise BadInput(f"{self.path}:{i}: not a JSON record (only a last line without its newline may be "
                               f"torn, as a kill leaves it): the log is damaged; restore it, e.g. from git")
            out.append(rec)
        return out

    def truncate_after(self, step: int) -> None:
        kept = [r for r in self.records() if r.get("step", -1) <= step]
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
        os.replace(tmp, self.path)


# ------------------------------------------------------------------ forks
# TrainConfig fields a fork may set apart from its trunk's (the rest of fields_for_resume must match)
FORK_MAY_DIFFER = ("data_seed", "row_order", "fork_from", "fork_step", "mxfp8_kernel", "probe_every", "ckpt_every",
                   "activation_checkpointing", "deterministic")


def trunk_config(trunk: Path) -> dict:
    """The trunk's ``config.json`` (what it trained with), or one line saying why there is none."""
    path = Path(trunk) / "config.json"
    if not path.is_file():
        hint = " (give the trunk's run folder, e.g. OUT/bf16)" if Path(trunk).is_dir() else ""
        raise BadInput(f"--fork-from {trunk}: no run there (no config.json){hint}")
    try:
        config = json.loads(path.read_text())
        config["train"]["steps"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BadInput(f"--fork-from {trunk}: its config.json cannot be read ({type(exc).__name__}): damaged") from None
    return config


def inherit(trunk_train: dict, data_seed: int | None, row_order: int | None) -> tuple[int | None, int | None]:
    """The fork's data seed and row order: the ones given, else the trunk's (a fork continues its trunk's order
    unless told to perturb it)."""
    return (trunk_train.get("data_seed") if data_seed is None else data_seed,
            trunk_train.get("row_order") if row_order is None else row_order)


def _digest(train: dict) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(train, sort_keys=True, default=str).encode()).hexdigest()[:16]


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint was written at, read without loading its tensors (memory-mapped)."""
    try:
        return int(torch.load(path, map_location="cpu", weights_only=False, mmap=True)["step"])
    except Exception as exc:  # truncated, garbage, another format: torch raises many kinds of error
        raise BadInput(f"--fork-from: {path} cannot be read as a checkpoint ({type(exc).__name__}): damaged") from None


def check_fork(cfg) -> dict:
    """Before any work: the fork step is inside the run, the trunk has a checkpoint at exactly that step, and it
    trained with this run's configuration except ``FORK_MAY_DIFFER``. Returns the trunk's config."""
    if not 0 < cfg.fork_step < cfg.steps:
        raise BadInput(f"--fork-step must be inside the run, from 1 to {cfg.steps - 1} (--steps {cfg.steps}), got "
                       f"{cfg.fork_step}")
    if cfg.ep:
        raise BadInput("--fork-from starts a run on one process (a distributed checkpoint is per rank): drop --ep")
    trunk = Path(cfg.fork_from)
    config = trunk_config(trunk)
    ckpt = trunk / CHECKPOINT_FILE
    if not ckpt.is_file():
        raise BadInput(f"--fork-from {trunk}: no {CHECKPOINT_FILE} (a trunk is a run stopped at the fork step: train "
                       f"it with --steps {cfg.steps} --stop-at-step {cfg.fork_step})")
    step = checkpoint_step(ckpt)
    if step != cfg.fork_step:
        raise BadInput(f"--fork-from {trunk}: its checkpoint is at step {step}, not {cfg.fork_step} (a run keeps its "
                       f"latest checkpoint only: train a trunk with --stop-at-step {cfg.fork_step})")
    want = json.loads(json.dumps(cfg.fields_for_resume(), default=str))
    # a field added since the trunk ran is absent from its config: it ran with that field's default
    defaults = json.loads(json.dumps(dataclasses.asdict(type(cfg)(cfg.model, cfg.recipes, cfg.steps)), default=str))
    have = config["train"]
    for key, value in want.items():
        if key in FORK_MAY_DIFFER:
            continue
        theirs = have.get(key, defaults.get(key))
        if isinstance(value, dict) and isinstance(theirs, dict):
            theirs = defaults[key] | theirs
        if theirs != value:
            raise BadInput(f"--fork-from {trunk}: the trunk ran with {key}={have.get(key)!r}, this run has "
                           f"{key}={value!r}: a fork continues its trunk's configuration (only "
                           f"{', '.join(k for k in FORK_MAY_DIFFER if not k.startswith('fork'))} may differ)")
    return config


def begin(cfg, run_dir: Path, model, opt, sched, tokens, place, init_fp: str) -> int:
    """Load the trunk's checkpoint into this run's model, optimizer, schedule and RNG; check its data and initial
    weights are this run's; copy the trunk's metrics up to the fork step (rank 0). Returns the fork step."""
    from convergence.train import data as data_mod

    trunk = Path(cfg.fork_from)
    config = check_fork(cfg)
    data_mod.check_same_data(trunk / "config.json", tokens.meta)
    if config.get("init_fingerprint") not in (None, init_fp):
        raise BadInput(f"--fork-from {trunk}: the trunk started from other initial weights "
                       f"({config['init_fingerprint']}, here {init_fp}): another seed, model or library version")
    meta = place.load(trunk, model, opt, sched, what="--fork-from")
    if int(meta["step"]) != cfg.fork_step:  # changed since check_fork: a trunk still training
        raise BadInput(f"--fork-from {trunk}: its checkpoint moved to step {meta['step']} while this run started")
    if place.writer:
        log = gzip_or_plain(trunk / "metrics.jsonl")  # compacted where the trunk's record was kept (protocol.forks)
        records = [r for r in JsonlLog(log).records() if r.get("step", -1) <= cfg.fork_step]
        if not records or records[-1].get("step") != cfg.fork_step:
            raise BadInput(f"--fork-from {trunk}: its metrics.jsonl does not reach step {cfg.fork_step}, where its "
                           "checkpoint is: damaged")
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(run_dir / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in records), force=True)
        (run_dir / "probes.jsonl").unlink(missing_ok=True)  # the fork's own, from a start before its first checkpoint
    return cfg.fork_step


def fork_section(cfg, run_dir: Path, windows: int) -> dict | None:
    """The ``fork`` section of a fork's config.json: its trunk (folder, step, recipe, the digest of its training
    config, its initial weights), what the fork perturbs, and the share of its remaining windows the trunk already
    trained on when it draws them from another shuffle. Kept as first written when the fork continues."""
    if not cfg.fork_from:
        return None
    try:
        before = json.loads((run_dir / "config.json").read_text()).get("fork")
    except (OSError, ValueError, AttributeError):
        before = None
    if isinstance(before, dict):
        return before
    trunk = trunk_config(Path(cfg.fork_from))
    train = trunk["train"]
    order_seed = train["seed"] if train.get("data_seed") is None else train["data_seed"]
    reshuffled = order_seed != cfg.order_seed
    return {"trunk": str(cfg.fork_from), "step": cfg.fork_step, "trunk_recipe": (trunk.get("recipe") or {}).get("name"),
            "trunk_train_digest": _digest(train), "trunk_init_fingerprint": trunk.get("init_fingerprint"),
            "perturbation": {"data_seed": [train.get("data_seed"), cfg.data_seed],
                             "row_order": [train.get("row_order"), cfg.row_order]},
            "repeated_window_share": min(1.0, cfg.fork_step * cfg.batch / windows) if reshuffled else 0.0}
