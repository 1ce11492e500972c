"""Atomic checkpoints and torn-line-proof JSONL logs for training runs.

Public: ``save_checkpoint(path, state)``, ``load_checkpoint(path)``, ``plain(obj)``, ``JsonlLog``.

A checkpoint is written to ``<path>.tmp`` and renamed over ``<path>`` (``os.replace`` is atomic on
POSIX), so a run killed at any instant leaves either the previous or the new checkpoint, never a torn
one. Tensors are stored as plain ``torch.Tensor`` (torchao's MXFP8 weight wrapper is unwrapped), so a
checkpoint loads without torchao and into either recipe.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import torch

from numerics.errors import BadInput
from numerics.files import GZIP_MAGIC, file_bytes


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
