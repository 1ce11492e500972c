"""The typed loss curve every loader returns, its error, and the rule for steps that go back.

Public API
  ``Curve``, ``CurveMeta``, ``Series``, ``Restart``  frozen dataclasses (steps strictly increasing).
  ``CurveError``  bad input in a curve file: one line naming the file and the line, record or tag.
  ``resolve_steps(steps, values, *, where="", lines=None, strict=True) -> Resolved``  the rule below.
  ``finish(path, fmt, tag, steps, values, lines, extras, warnings, header=None) -> Curve``.

Steps that go back (records in file order)
  * A *restart* is a job resumed from a checkpoint: it logs again steps that were already logged.
    Evidence of a restart is a step logged twice. Each record whose step is logged twice, at a later
    position, supersedes every earlier record with a step at or above it: the later run wins and the
    abandoned tail is dropped. Each restart (the place where the steps went back) is recorded in
    ``CurveMeta.restarts`` with the number of records it dropped.
  * Records that are only *out of order* (the steps go back, but no step is logged twice; e.g. two
    lines swapped by a buffered writer) are sorted by step. Nothing is dropped; a warning says how
    many places went back.
  * A restart that goes below every step logged before it is two runs in one file: bad input
    (``strict``), or, for extra series (``strict=False``), everything before it is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from numerics.errors import BadInput

STEP_LIMIT = 2**63  # steps are int64; a larger number in a file is bad input, not an overflow


class CurveError(BadInput):
    """Bad input in a curve file: one line naming the file and the line or tag."""


@dataclass(frozen=True)
class Restart:
    index: int  # position in the file's record order where the step went back
    from_step: int  # last step before the restart
    to_step: int  # first step after it
    dropped: int  # earlier records discarded (superseded by the resumed run)


@dataclass(frozen=True)
class CurveMeta:
    source: str  # path as given
    format: str  # one of convergence.curves.load.FORMATS, or "synthetic"
    tag: str  # loss key / column / TensorBoard tag that was read
    run: str  # run name: the parent directory for metrics.jsonl, else the file stem
    restarts: tuple[Restart, ...] = ()
    warnings: tuple[str, ...] = ()
    header: dict[str, str] = field(default_factory=dict)  # "# key: value" lines of a loss file


@dataclass(frozen=True)
class Series:
    steps: np.ndarray  # int64, strictly increasing
    values: np.ndarray  # float64; NaN/Inf kept (they are data)


@dataclass(frozen=True)
class Curve:
    steps: np.ndarray  # int64, strictly increasing
    values: np.ndarray  # float64 loss
    meta: CurveMeta
    extras: dict[str, Series] = field(default_factory=dict)

    def __post_init__(self):
        if self.steps.shape != self.values.shape or self.steps.ndim != 1:
            raise ValueError("steps and values must be 1-D arrays of equal length")
        if len(self.steps) > 1 and not np.all(self.steps[1:] > self.steps[:-1]):  # no diff: it overflows
            raise ValueError("Curve steps must be strictly increasing")

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def name(self) -> str:
        return self.meta.run


@dataclass(frozen=True)
class Resolved:
    steps: np.ndarray
    values: np.ndarray
    restarts: tuple[Restart, ...]
    reordered: int  # places where the steps went back without a step logged twice


def read_bytes(path: Path) -> bytes:
    """The file's bytes (gunzipped when it is gzip: ``numerics.files.file_bytes``), or a ``CurveError`` saying in
    English why it cannot be read."""
    from numerics.files import file_bytes

    try:
        return file_bytes(path)
    except BadInput as exc:
        raise CurveError(str(exc)) from None
    except IsADirectoryError:
        raise CurveError(f"{path}: is a directory, not a file (a TensorBoard run directory needs "
                         "--format tensorboard or no --format)") from None
    except OSError as exc:
        raise CurveError(f"{path}: cannot read: {exc.strerror or exc}") from None


def read_text(path: Path) -> str:
    """UTF-8 text (a byte-order mark dropped; undecodable bytes shown as U+FFFD, never an exception)."""
    return read_bytes(path).decode("utf-8-sig", errors="replace")


def run_name(path: Path) -> str:
    path = path.with_suffix("") if path.suffix == ".gz" else path  # metrics.jsonl.gz is a metrics.jsonl
    return path.parent.name if path.stem in ("metrics", "log", "train", "events") else path.stem


def _logged_before(steps: np.ndarray) -> np.ndarray:
    """True where the same step occurs at an earlier position."""
    order = np.argsort(steps, kind="stable")
    ordered = steps[order]
    seen = np.zeros(len(steps), dtype=bool)
    seen[order[1:][ordered[1:] == ordered[:-1]]] = True
    return seen


def resolve_steps(steps, values, *, where: str = "", lines=None, strict: bool = True) -> Resolved:
    """Apply the module docstring's rule; vectorised (O(n log n)), so a million records take milliseconds."""
    steps = np.asarray(steps, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    n = len(steps)
    if n < 2 or bool(np.all(steps[1:] > steps[:-1])):
        return Resolved(steps, values, (), 0)
    relog = _logged_before(steps)
    back = np.flatnonzero(steps[1:] <= steps[:-1]) + 1
    keep = np.ones(n, dtype=bool)
    restart_at = []
    if relog.any():
        # record j is superseded when a later record re-logs a step <= steps[j]
        later_min = np.minimum.accumulate(np.where(relog, steps, np.iinfo(np.int64).max)[::-1])[::-1]
        later_any = np.logical_or.accumulate(relog[::-1])[::-1]
        keep[:-1] = ~(later_any[1:] & (steps[:-1] >= later_min[1:]))
        seg_end = np.append(back[1:], n)
        relog_count = np.concatenate([[0], np.cumsum(relog)])
        restart_at = [int(i) for i, e in zip(back, seg_end) if relog_count[e] > relog_count[i]]
    restarts, prev = [], 0
    lowest = np.minimum.accumulate(steps)
    for i in restart_at:
        if steps[i] < lowest[i - 1]:
            if strict:
                line = f":{int(lines[i])}" if lines is not None else f" record {i}"
                raise CurveError(f"{where}{line}: step {int(steps[i])} goes below every earlier step "
                                 f"(from {int(lowest[i - 1])}): two runs in one file? Split the file")
            keep[:i] = False
        restarts.append(Restart(i, int(steps[i - 1]), int(steps[i]), int((~keep[prev:i]).sum())))
        prev = i
    s, v = steps[keep], values[keep]
    if len(s) > 1 and not bool(np.all(s[1:] > s[:-1])):
        order = np.argsort(s, kind="stable")
        s, v = s[order], v[order]
    return Resolved(s, v, tuple(restarts), len(back) - len(restart_at))


def finish(path: Path, fmt: str, tag: str, steps, values, lines, extras: dict, warnings: list,
           header: dict | None = None) -> Curve:
    """A ``Curve`` from records in file order: the step rule applied to the loss and to each extra series."""
    where = str(path)
    if len(steps) == 0:
        raise CurveError(f"{where}: no '{tag}' values found")
    r = resolve_steps(steps, values, where=where, lines=None if lines is None else np.asarray(lines))
    warnings = list(warnings)
    if r.reordered:
        warnings.append(f"{where}: the steps go back in {r.reordered} place(s) without any step logged twice: "
                        "read as records out of order and sorted (nothing dropped)")
    out = {}
    for key, (st, va) in extras.items():
        if len(st):
            e = resolve_steps(st, va, where=where, strict=False)
            out[key] = Series(e.steps, e.values)
    meta = CurveMeta(where, fmt, tag, run_name(path), r.restarts, tuple(warnings), dict(header or {}))
    return Curve(r.steps, r.values, meta, out)
