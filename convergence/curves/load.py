"""Load a training run's loss curve from any of the formats clusters produce, into one typed ``Curve``.

Public functions
  ``load_curve(path, *, format=None, loss_key=None, step_key=None, tag=None) -> Curve``
      auto-detects the format by content (``detect_format``) unless ``format`` is given.
  ``detect_format(path) -> str``  one of ``FORMATS``.
  ``load_jsonl``, ``load_csv``, ``load_torchtitan_log``; ``load_tensorboard`` lives in
  ``convergence.curves.tbevents`` and is re-exported here.

Formats
  jsonl        one JSON object per line, ``{"step": int, "loss": float, ...}`` (what
               ``python -m convergence train`` writes). A line without ``loss`` is accepted only
               when it carries another known series (``EXTRA_SERIES``, e.g. the harness's
               ``{"step": N, "val_loss": x}`` lines); those values land in ``extras``. A line with
               neither, a non-object, a missing/non-integer step or a non-numeric loss is bad input.
               Nested objects (per-layer extras) are ignored. ``NaN``/``Infinity`` are data, not errors.
  csv          a header row, then rows; step and loss columns found by name (configurable);
               every other numeric column becomes an extra series.
  torchtitan   console/log text; the metric lines ``step: N  loss: X  grad_norm: G ... tps: T``
               are read after ANSI colour codes are stripped; all other lines are ignored.
  tensorboard  an event directory (or one event file); see ``convergence.curves.tbevents``.

Steps and restarts
  Steps must increase. A step that goes back to S (a job resumed from a checkpoint) starts a new
  segment: every earlier point with step >= S is dropped, so the later value wins and the
  abandoned tail is discarded; each restart is recorded in ``Curve.restarts``. A step that goes
  back below the curve's first step (two runs in one file) is bad input.

Bad input raises ``CurveError`` with one line naming the file and the line or tag; a truncated
final line (a run still writing) is skipped and recorded in ``Curve.warnings``.
"""

from __future__ import annotations

import csv
import gc
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from numerics.cli import CLIError

try:  # orjson parses a line ~4x faster than json; the stdlib stays the reference and the fallback
    import orjson as _fastjson
except ImportError:  # pragma: no cover - orjson is a declared dependency
    _fastjson = None

FORMATS = ("jsonl", "csv", "torchtitan", "tensorboard")

# Series other than the loss that a line or column may carry; a JSONL line with one of these and no
# loss is a legitimate partial record (validation loss every K steps, throughput-only lines).
EXTRA_SERIES = (
    "val_loss", "eval_loss", "validation_loss", "grad_norm", "lr", "tokens", "tokens_per_s", "tps",
)
STEP_KEYS = ("step", "global_step", "iteration", "iter", "Step")
LOSS_KEYS = ("loss", "train_loss", "loss_metrics/global_avg_loss", "train/loss", "Value")
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# torchtitan: f"{color.red}step: {step:2}  {color.green}loss: {loss:7.4f}  {color.orange}grad_norm: ..."
TITAN_RE = re.compile(r"\bstep:\s*(\d+)\s+loss:\s*(\S+)")
TITAN_EXTRA_RE = {
    "grad_norm": re.compile(r"\bgrad_norm:\s*(\S+)"),
    "tps": re.compile(r"\btps:\s*([0-9][0-9,]*(?:\.[0-9]+)?)"),
}


class CurveError(CLIError):
    """Bad input in a curve file: one line naming the file and the line or tag."""


@dataclass(frozen=True)
class Restart:
    index: int  # position in the file's record order where the step went back
    from_step: int  # last step before the restart
    to_step: int  # first step after it
    dropped: int  # earlier points discarded (step >= to_step)


@dataclass(frozen=True)
class CurveMeta:
    source: str  # path as given
    format: str  # one of FORMATS
    tag: str  # loss key / column / TensorBoard tag that was read
    run: str  # run name: the parent directory for metrics.jsonl, else the file stem
    restarts: tuple[Restart, ...] = ()
    warnings: tuple[str, ...] = ()


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
        if len(self.steps) > 1 and not np.all(np.diff(self.steps) > 0):
            raise ValueError("Curve steps must be strictly increasing")

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def name(self) -> str:
        return self.meta.run


def run_name(path: Path) -> str:
    return path.parent.name if path.stem in ("metrics", "log", "train", "events") else path.stem


def resolve_restarts(steps: np.ndarray, values: np.ndarray, *, where: str = "", lines: np.ndarray | None = None,
                     strict: bool = True) -> tuple[np.ndarray, np.ndarray, tuple[Restart, ...]]:
    """Apply the restart rule (module docstring) to records in file order; vectorised when none."""
    steps = np.asarray(steps, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    if len(steps) < 2:
        return steps, values, ()
    back = np.flatnonzero(steps[1:] <= steps[:-1]) + 1
    if len(back) == 0:
        return steps, values, ()
    keep = np.ones(len(steps), dtype=bool)
    restarts = []
    for i in back:
        s = int(steps[i])
        if s < steps[0]:
            if not strict:
                keep[:i] = False
                continue
            line = f":{int(lines[i])}" if lines is not None else f" record {i}"
            raise CurveError(
                f"{where}{line}: step {s} goes below the first step {int(steps[0])} "
                "(two runs in one file?); split the file"
            )
        stale = keep[:i] & (steps[:i] >= s)
        keep[:i] &= ~stale
        restarts.append(Restart(int(i), int(steps[i - 1]), s, int(stale.sum())))
    return steps[keep], values[keep], tuple(restarts)


def _series(pairs: dict[str, tuple[list, list]], where: str) -> dict[str, Series]:
    out = {}
    for key, (st, va) in pairs.items():
        if len(st):
            s, v, _ = resolve_restarts(np.asarray(st), np.asarray(va), where=where, strict=False)
            out[key] = Series(s, v)
    return out


def _finish(path: Path, fmt: str, tag: str, steps, values, lines, extras, warnings) -> Curve:
    where = str(path)
    if len(steps) == 0:
        raise CurveError(f"{where}: no '{tag}' values found")
    s, v, restarts = resolve_restarts(np.asarray(steps), np.asarray(values), where=where,
                                      lines=None if lines is None else np.asarray(lines))
    meta = CurveMeta(where, fmt, tag, run_name(path), restarts, tuple(warnings))
    return Curve(s, v, meta, _series(extras, where))


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _parse_line(raw: bytes):
    if _fastjson is not None:
        try:
            return _fastjson.loads(raw)
        except _fastjson.JSONDecodeError:
            pass  # NaN / Infinity literals (Python's json.dumps writes them) or a bad line: ask the stdlib
    return json.loads(raw)


def _bad_jsonl_record(path: Path, lineno: int, obj, step_key: str, loss_key: str) -> str | None:
    """Why a parsed line is bad input, or None when it is a legitimate record without a loss."""
    if type(obj) is not dict:
        return f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}"
    step = obj.get(step_key)
    if type(step) is not int and not (type(step) is float and step.is_integer()):
        return f"{path}:{lineno}: missing or non-integer '{step_key}': {step!r}"
    if loss_key in obj:
        loss = obj[loss_key]
        return f"{path}:{lineno}: {'null' if loss is None else 'non-numeric'} '{loss_key}': {loss!r}"
    if not any(_is_number(obj.get(k)) for k in EXTRA_SERIES):
        return f"{path}:{lineno}: no '{loss_key}' and no other known series ({', '.join(EXTRA_SERIES)})"
    return None


def _column(col: list) -> tuple[np.ndarray, np.ndarray]:
    """(present, values) for a list of JSON scalars; None and non-numbers (str, bool, dict) are absent."""
    arr = np.array(col, dtype=object)
    present = np.not_equal(arr, None)
    if not set(map(type, col)) <= {int, float, type(None)}:
        present &= np.array([type(x) is int or type(x) is float for x in col], dtype=bool)
    return present, arr[present].astype(np.float64)


def load_jsonl(path, *, loss_key: str = "loss", step_key: str = "step") -> Curve:
    path = Path(path)
    raw_lines = path.read_bytes().split(b"\n")
    last = len(raw_lines) - 1
    while last >= 0 and not raw_lines[last].strip():
        last -= 1
    if last < 0:
        raise CurveError(f"{path}: file is empty")
    rec_steps, rec_loss, rec_lines, rec_extra, warnings = [], [], [], [], []
    add_s, add_l, add_n, add_x = rec_steps.append, rec_loss.append, rec_lines.append, rec_extra.append
    parse, keys = _parse_line, EXTRA_SERIES
    gc_was_on = gc.isenabled()
    gc.disable()  # a million small tuples would trigger ~1,000 useless cyclic collections; restored below
    try:
        _jsonl_records(raw_lines, last, path, step_key, loss_key, parse, keys, add_s, add_l, add_n, add_x, warnings)
        all_steps = np.array(rec_steps, dtype=np.int64)
        has_loss, values = _column(rec_loss)
        columns = list(zip(*rec_extra))
    finally:
        if gc_was_on:
            gc.enable()
    extras = {}
    for k, col in zip(keys, columns):
        present, vals = _column(list(col))
        if present.any():
            extras[k] = (all_steps[present], vals)
    return _finish(path, "jsonl", loss_key, all_steps[has_loss], values, np.array(rec_lines)[has_loss],
                   extras, warnings)


def _jsonl_records(raw_lines, last, path, step_key, loss_key, parse, keys, add_s, add_l, add_n, add_x, warnings):
    for i in range(last + 1):
        raw = raw_lines[i]
        try:
            obj = parse(raw)
        except (ValueError, UnicodeDecodeError):
            if not raw.strip():
                continue
            if i == last:
                warnings.append(f"{path}:{i + 1}: truncated final line skipped (run still writing?)")
                continue
            raise CurveError(f"{path}:{i + 1}: not valid JSON: {raw[:60]!r}") from None
        # hot path (1e6 lines): exact type checks here, the full diagnosis only on a miss
        try:
            step = obj[step_key]
            loss = obj.get(loss_key)
        except (KeyError, TypeError, AttributeError):
            step = loss = None
        if type(step) is not int or (type(loss) is not float and type(loss) is not int):
            why = _bad_jsonl_record(path, i + 1, obj, step_key, loss_key)
            if why:
                raise CurveError(why)
            step, loss = int(step), None
        add_s(step)
        add_l(loss)
        add_n(i + 1)
        add_x(tuple(map(obj.get, keys)))


def _pick(names: list[str], wanted: str | None, candidates: tuple[str, ...], what: str, where: str) -> str:
    if wanted is not None:
        if wanted not in names:
            raise CurveError(f"{where}:1: no {what} column {wanted!r}; columns: {', '.join(names)}")
        return wanted
    for c in candidates:
        if c in names:
            return c
    raise CurveError(f"{where}:1: no {what} column (tried {', '.join(candidates)}); columns: {', '.join(names)}")


def _float_cell(cell: str, where: str, col: str) -> float:
    try:
        return float(cell)
    except ValueError:
        raise CurveError(f"{where}: non-numeric {col!r}: {cell!r}") from None


def load_csv(path, *, loss_key: str | None = None, step_key: str | None = None) -> Curve:
    path = Path(path)
    text = path.read_text(errors="replace")
    rows = [r for r in csv.reader(text.splitlines(), dialect="excel-tab" if "\t" in text[:4096] else "excel")]
    while rows and not any(c.strip() for c in rows[-1]):
        rows.pop()
    if not rows:
        raise CurveError(f"{path}: file is empty")
    header = [h.strip() for h in rows[0]]
    step_col = _pick(header, step_key, STEP_KEYS, "step", str(path))
    loss_col = _pick(header, loss_key, LOSS_KEYS, "loss", str(path))
    si, li = header.index(step_col), header.index(loss_col)
    others = [(j, h) for j, h in enumerate(header) if j not in (si, li) and h]
    steps, values, lines, warnings = [], [], [], []
    extras: dict[str, tuple[list, list]] = {h: ([], []) for _, h in others}
    for n, row in enumerate(rows[1:], start=2):
        where = f"{path}:{n}"
        if len(row) < len(header):
            if n == len(rows) and row:
                warnings.append(f"{where}: truncated final row skipped (run still writing?)")
                continue
            raise CurveError(f"{where}: {len(row)} fields, header has {len(header)}")
        if not row[li].strip():
            raise CurveError(f"{where}: missing {loss_col!r}")
        step_f = _float_cell(row[si], where, step_col)
        if not step_f.is_integer():
            raise CurveError(f"{where}: non-integer {step_col!r}: {row[si]!r}")
        step = int(step_f)
        steps.append(step)
        values.append(_float_cell(row[li], where, loss_col))
        lines.append(n)
        for j, h in others:
            try:
                x = float(row[j])
            except ValueError:
                continue  # text columns (timestamps, run names) are not series
            extras[h][0].append(step)
            extras[h][1].append(x)
    return _finish(path, "csv", loss_col, steps, values, lines, extras, warnings)


def load_torchtitan_log(path) -> Curve:
    path = Path(path)
    text = ANSI_RE.sub("", path.read_text(errors="replace"))
    if not text.strip():
        raise CurveError(f"{path}: file is empty")
    raw = text.split("\n")
    last = max(i for i, line in enumerate(raw) if line.strip())
    steps, values, lines, warnings = [], [], [], []
    extras: dict[str, tuple[list, list]] = {k: ([], []) for k in TITAN_EXTRA_RE}
    for i, line in enumerate(raw):
        m = TITAN_RE.search(line)
        if not m:
            continue
        try:
            loss = float(m.group(2))
        except ValueError:
            if i == last:
                warnings.append(f"{path}:{i + 1}: truncated final line skipped (run still writing?)")
                continue
            raise CurveError(f"{path}:{i + 1}: non-numeric loss {m.group(2)!r}") from None
        step = int(m.group(1))
        steps.append(step)
        values.append(loss)
        lines.append(i + 1)
        for key, rx in TITAN_EXTRA_RE.items():
            e = rx.search(line)
            if e:
                try:
                    extras[key][1].append(float(e.group(1).replace(",", "")))
                    extras[key][0].append(step)
                except ValueError:
                    pass  # a truncated extra on the last line; the loss was read
    if not steps:
        raise CurveError(f"{path}: no torchtitan metric lines ('step: N  loss: X')")
    return _finish(path, "torchtitan", "loss", steps, values, lines, extras, warnings)


def _looks_like_tfrecord(head: bytes) -> bool:
    from convergence.curves.tbevents import header_ok

    return header_ok(head)


def detect_format(path) -> str:
    """Which loader reads ``path``, decided from its content (see module docstring)."""
    path = Path(path)
    if path.is_dir():
        return "tensorboard"
    if "tfevents" in path.name:
        return "tensorboard"
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    if not head.strip():
        raise CurveError(f"{path}: file is empty")
    if _looks_like_tfrecord(head):
        return "tensorboard"
    text = ANSI_RE.sub("", head.decode("utf-8", errors="replace"))
    first = next(line for line in text.splitlines() if line.strip()).strip()
    if TITAN_RE.search(text):  # before JSON: torchtitan lines start with "[titan]"; JSON keys are quoted
        return "torchtitan"
    if first.startswith(("{", "[")):
        return "jsonl"
    if "," in first or "\t" in first:
        return "csv"
    raise CurveError(f"{path}:1: cannot tell the format from {first[:60]!r}; pass --format ({', '.join(FORMATS)})")


def load_curves(paths, **options) -> list[Curve]:
    """``load_curve`` for several files; large files load in parallel processes (one per CPU core)."""
    paths = [Path(p) for p in paths]
    sizes = [p.stat().st_size if p.is_file() else sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
             for p in paths if p.exists()]
    workers = min(len(paths), os.cpu_count() or 1)
    if workers < 2 or len(sizes) < len(paths) or sum(sizes) < (64 << 20):
        return [load_curve(p, **options) for p in paths]
    import functools
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(functools.partial(load_curve, **options), paths))


def load_curve(path, *, format: str | None = None, loss_key: str | None = None, step_key: str | None = None,
               tag: str | None = None) -> Curve:
    """Load one run. ``loss_key``/``step_key`` name the JSONL keys or CSV columns; ``tag`` the TB tag."""
    path = Path(path)
    if not path.exists():
        raise CurveError(f"{path}: no such file or directory")
    fmt = format or detect_format(path)
    if fmt == "jsonl":
        return load_jsonl(path, loss_key=loss_key or "loss", step_key=step_key or "step")
    if fmt == "csv":
        return load_csv(path, loss_key=loss_key, step_key=step_key)
    if fmt == "torchtitan":
        return load_torchtitan_log(path)
    if fmt == "tensorboard":
        from convergence.curves.tbevents import load_tensorboard

        return load_tensorboard(path, tag=tag)
    raise CurveError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
