"""Load a training run's loss curve from any of the formats clusters produce, into one typed ``Curve``.

Public functions
  ``load_curve(path, *, format=None, loss_key=None, step_key=None, tag=None, validation=False) -> Curve``
      auto-detects the format by content (``detect_format``) unless ``format`` is given; ``validation``
      reads the held-out validation loss where no key or tag is named (``VAL_KEYS``, ``VAL_TAGS``).
  ``load_curves(paths, **options) -> list[Curve]``  several files; large ones in parallel processes.
  ``detect_format(path) -> str``  one of ``FORMATS``.
  ``load_csv``, ``load_torchtitan_log``, ``load_torchtitan_losses``; ``load_jsonl`` lives in
  ``convergence.curves.jsonl`` and ``load_tensorboard`` in ``convergence.curves.tbevents``.

Formats
  jsonl              one JSON object per line (``convergence.curves.jsonl`` says what a line may hold).
  csv                a header row, then rows; step and loss columns found by name (configurable); every
                     other numeric column becomes an extra series. A UTF-8 byte-order mark is ignored.
  torchtitan         console/log text; the metric lines ``step: N  loss: X  grad_norm: G ... tps: T`` are
                     read after ANSI colour codes are stripped, the validator's ``validate step: N  loss: X``
                     lines as the validation loss; all other lines are ignored.
  torchtitan_losses  torchtitan's golden loss files (``tests/assets/losses/*.txt`` in pytorch/torchtitan):
                     ``# key: value`` header lines (kept in ``CurveMeta.header``; a ``# step loss grad_norm``
                     line names the columns), then whitespace-separated ``step loss [grad_norm ...]`` rows.
                     Without a column line the third column is ``grad_norm`` (torchtitan's order).
  tensorboard        an event directory (or one event file); see ``convergence.curves.tbevents``.

Every format may come gzip-compressed (``run.jsonl.gz``, ``train.log.gz``): told by the file's first bytes, not
its name, and read as what it holds.

Every format: steps that go back follow ``convergence.curves.curve``'s rule (restarts vs records out of
order); a truncated final line or row (a run still writing) is skipped with a warning; anything else
that cannot be read raises ``CurveError`` with one line naming the file and the line, row or tag.
"""

from __future__ import annotations

import csv
import os
import re
from pathlib import Path

from convergence.curves.curve import (  # noqa: F401 - re-exported: the loaders' public types
    STEP_LIMIT,
    Curve,
    CurveError,
    CurveMeta,
    Restart,
    Series,
    finish,
    read_bytes,
    read_text,
    resolve_steps,
    run_name,
)
from convergence.curves.jsonl import EXTRA_SERIES, load_jsonl  # noqa: F401 - re-exported
from numerics.errors import BadInput
from numerics.files import file_bytes

FORMATS = ("jsonl", "csv", "torchtitan", "torchtitan_losses", "tensorboard")
STEP_KEYS = ("step", "global_step", "iteration", "iter", "Step")
LOSS_KEYS = ("loss", "train_loss", "loss_metrics/global_avg_loss", "train/loss", "Value")
VAL_KEYS = ("val_loss", "validation_loss", "validation_metrics/loss", "val/loss")
# the formats that read each key: a run of another format would be read for its default series in silence (a mixed
# comparison then set one run's named series against another's default)
KEY_READERS = {"loss_key": ("jsonl", "csv"), "step_key": ("jsonl", "csv"), "tag": ("tensorboard",)}
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# torchtitan: f"{color.red}step: {step:2}  {color.green}loss: {loss:7.4f}  {color.orange}grad_norm: ..."
TITAN_RE = re.compile(r"\bstep:\s*(\d+)\s+loss:\s*(\S+)")
# and its validator (MetricsProcessor.log_validation): f"{color.yellow}validate step: {step:2}  {color.green}loss: ..."
TITAN_VAL_RE = re.compile(r"\bvalidate step:\s*(\d+)\s+loss:\s*(\S+)")
TITAN_EXTRA_RE = {
    "grad_norm": re.compile(r"\bgrad_norm:\s*(\S+)"),
    "tps": re.compile(r"\btps:\s*([0-9][0-9,]*(?:\.[0-9]+)?)"),
}
_NUMBER = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|inf|infinity)"
LOSS_ROW_RE = re.compile(rf"\s*[-+]?\d+(?:[ \t]+{_NUMBER})+\s*", re.IGNORECASE)  # "12 2.875 1.5"


def _step(text: str, where: str, col: str) -> int:
    try:
        x = float(text)
    except ValueError:
        raise CurveError(f"{where}: non-numeric {col!r}: {text!r}") from None
    if not x.is_integer():
        raise CurveError(f"{where}: non-integer {col!r}: {text!r}")
    if not -STEP_LIMIT <= x < STEP_LIMIT:
        raise CurveError(f"{where}: {col!r} {text!r} is outside the 64-bit integer range")
    return int(text) if text.strip().lstrip("+-").isdigit() else int(x)


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


def load_csv(path, *, loss_key: str | None = None, step_key: str | None = None, validation: bool = False
             ) -> Curve:
    """``validation``: the loss column is looked for among ``VAL_KEYS`` instead of ``LOSS_KEYS``, and a row
    with that cell empty is a step without an evaluation (a training loss cell may not be empty)."""
    path = Path(path)
    text = read_text(path).replace("\x00", "\ufffd")  # the csv module refuses NUL; it is a garbled cell
    try:
        rows = list(csv.reader(text.splitlines(), dialect="excel-tab" if "\t" in text[:4096] else "excel"))
    except csv.Error as exc:
        raise CurveError(f"{path}: not readable as CSV ({exc})") from None
    while rows and not any(c.strip() for c in rows[-1]):
        rows.pop()
    if not rows:
        raise CurveError(f"{path}: file is empty")
    header = [h.strip() for h in rows[0]]
    step_col = _pick(header, step_key, STEP_KEYS, "step", str(path))
    loss_col = _pick(header, loss_key, VAL_KEYS if validation else LOSS_KEYS,
                     "validation loss" if validation else "loss", str(path))
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
            if validation:
                continue  # no evaluation at this step: a validation loss is logged every N steps
            raise CurveError(f"{where}: missing {loss_col!r}")
        step = _step(row[si], where, step_col)
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
    return finish(path, "csv", loss_col, steps, values, lines, extras, warnings)


def load_torchtitan_log(path, *, validation: bool = False) -> Curve:
    """torchtitan's console log. Its validator prints ``validate step: N  loss: X ...`` (``TITAN_VAL_RE``): those
    lines are the validation loss, the curve itself with ``validation`` and else its ``val_loss`` extra series,
    never training points (read as such they would look like restarts)."""
    path = Path(path)
    text = ANSI_RE.sub("", read_text(path))
    if not text.strip():
        raise CurveError(f"{path}: file is empty")
    raw = text.split("\n")
    last = max(i for i, line in enumerate(raw) if line.strip())
    train: tuple[list, list, list] = ([], [], [])  # steps, values, line numbers
    val: tuple[list, list, list] = ([], [], [])
    warnings: list[str] = []
    extras: dict[str, tuple[list, list]] = {k: ([], []) for k in TITAN_EXTRA_RE}
    for i, line in enumerate(raw):
        is_val = TITAN_VAL_RE.search(line)
        m = is_val or TITAN_RE.search(line)
        if not m:
            continue
        try:
            loss = float(m.group(2))
        except ValueError:
            if i == last:
                warnings.append(f"{path}:{i + 1}: truncated final line skipped (run still writing?)")
                continue
            raise CurveError(f"{path}:{i + 1}: non-numeric loss {m.group(2)!r}") from None
        step = _step(m.group(1), f"{path}:{i + 1}", "step")
        for column, x in zip(val if is_val else train, (step, loss, i + 1)):
            column.append(x)
        if is_val:
            continue
        for key, rx in TITAN_EXTRA_RE.items():
            e = rx.search(line)
            if e:
                try:
                    extras[key][1].append(float(e.group(1).replace(",", "")))
                    extras[key][0].append(step)
                except ValueError:
                    pass  # a truncated extra on the last line; the loss was read
    if validation:
        if not val[0]:
            raise CurveError(f"{path}: no torchtitan validation lines ('validate step: N  loss: X')")
        return finish(path, "torchtitan", "val_loss", *val, {}, warnings)
    if not train[0]:
        raise CurveError(f"{path}: no torchtitan metric lines ('step: N  loss: X')")
    return finish(path, "torchtitan", "loss", *train, extras | {"val_loss": val[:2]}, warnings)


def _header_line(body: str, header: dict[str, str], columns: list[str], seen_rows: bool) -> None:
    key, colon, value = body.partition(":")
    words = body.split()
    if not colon and not seen_rows and words[:2] == ["step", "loss"]:
        columns[:] = words
    elif colon and key.strip():
        header[key.strip()] = value.strip()
    elif body:
        header["comment"] = f"{header['comment']} / {body}" if "comment" in header else body


def load_torchtitan_losses(path) -> Curve:
    path = Path(path)
    raw = read_text(path).split("\n")
    nonblank = [i for i, line in enumerate(raw) if line.strip()]
    if not nonblank:
        raise CurveError(f"{path}: file is empty")
    header: dict[str, str] = {}
    columns: list[str] = []
    steps, values, lines, warnings, rows = [], [], [], [], []
    for i in nonblank:
        line = raw[i].strip()
        if line.startswith("#"):
            _header_line(line[1:].strip(), header, columns, bool(steps))
            continue
        where, tokens = f"{path}:{i + 1}", line.split()
        try:
            if len(tokens) < 2:
                raise CurveError(f"{where}: expected 'step loss ...', got {line[:60]!r}")
            step = _step(tokens[0], where, "step")
            nums = [_float_cell(t, where, "loss" if j == 0 else f"column {j + 2}") for j, t in enumerate(tokens[1:])]
        except CurveError:
            if i == nonblank[-1]:
                warnings.append(f"{where}: truncated final row skipped (run still writing?)")
                continue
            raise
        steps.append(step)
        values.append(nums[0])
        lines.append(i + 1)
        rows.append(nums[1:])
    names = columns[2:] if columns else ["grad_norm"]
    extras: dict[str, tuple[list, list]] = {}
    for s, rest in zip(steps, rows):
        for j, x in enumerate(rest):
            name = names[j] if j < len(names) else f"column{j + 3}"
            extras.setdefault(name, ([], []))
            extras[name][0].append(s)
            extras[name][1].append(x)
    if not steps:
        raise CurveError(f"{path}: no 'step loss' rows after the '#' header lines")
    return finish(path, "torchtitan_losses", "loss", steps, values, lines, extras, warnings, header)


def detect_format(path) -> str:
    """Which loader reads ``path``, decided from its content (see module docstring)."""
    from convergence.curves.tbevents import header_ok

    path = Path(path)
    if path.is_dir() or "tfevents" in path.name:
        return "tensorboard"
    try:
        head = file_bytes(path, limit=1 << 16)  # a compressed log: its format is that of what it holds
    except BadInput as exc:
        raise CurveError(str(exc)) from None
    except OSError as exc:
        raise CurveError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not head.strip():
        raise CurveError(f"{path}: file is empty")
    if header_ok(head):
        return "tensorboard"
    text = ANSI_RE.sub("", head.decode("utf-8-sig", errors="replace"))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise CurveError(f"{path}: file is empty")
    if TITAN_RE.search(text):  # before JSON: torchtitan lines start with "[titan]"; JSON keys are quoted
        return "torchtitan"
    first = lines[0]
    if first.startswith(("{", "[")):
        return "jsonl"
    data = next((line for line in lines if not line.startswith("#")), "")
    if LOSS_ROW_RE.fullmatch(data):
        return "torchtitan_losses"
    if "," in first or "\t" in first:
        return "csv"
    shown = "".join(c if c.isprintable() else "?" for c in first[:60])
    raise CurveError(f"{path}:1: cannot tell the format from {shown!r}; pass --format ({', '.join(FORMATS)})")


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
               tag: str | None = None, validation: bool = False) -> Curve:
    """Load one run (``_load_curve``) as a read-only ``Curve``; within ``numerics.files.reading_once`` each file and
    series is parsed once and the same curve handed to every caller."""
    from numerics.files import once

    options = dict(format=format, loss_key=loss_key, step_key=step_key, tag=tag, validation=validation)
    return once(("curve", Path(path).resolve(), *options.items()), lambda: _read_only(_load_curve(path, **options)),
                _curve_bytes)


def _curve_bytes(c: Curve) -> int:
    """What a curve's arrays hold (its metadata is small beside them)."""
    return sum(a.nbytes for a in _arrays(c))


def _arrays(c: Curve) -> tuple:
    return (c.steps, c.values, *(x for s in c.extras.values() for x in (s.steps, s.values)))


def _read_only(c: Curve) -> Curve:
    """``c`` with its arrays made read-only: a curve shared between callers can no longer be changed by one."""
    for a in _arrays(c):
        a.flags.writeable = False
    return c


def _load_curve(path, *, format: str | None = None, loss_key: str | None = None, step_key: str | None = None,
                tag: str | None = None, validation: bool = False) -> Curve:
    """Load one run. ``loss_key``/``step_key`` name the JSONL keys or CSV columns; ``tag`` the TB tag; a key the
    run's format does not read is refused (``KEY_READERS``).

    ``validation``: the held-out validation loss, not the training loss, where no key or tag names it (JSONL
    ``val_loss``, a CSV column of ``VAL_KEYS``, a TensorBoard tag of ``VAL_TAGS``, torchtitan's ``validate step``
    lines). torchtitan's loss files hold none: asked for validation, they are refused, never read as the training
    loss."""
    path = Path(path)
    if not path.exists():
        raise CurveError(f"{path}: no such file or directory")
    fmt = format or detect_format(path)
    for key, given in (("loss_key", loss_key), ("step_key", step_key), ("tag", tag)):
        if given and fmt not in KEY_READERS[key]:
            raise CurveError(f"--{key.replace('_', '-')} {given!r} is read from {' and '.join(KEY_READERS[key])} runs "
                             f"only: {path} is {fmt} and would be compared on its default series")
    if fmt == "jsonl":
        return load_jsonl(path, loss_key=loss_key or ("val_loss" if validation else "loss"),
                          step_key=step_key or "step")
    if fmt == "csv":
        return load_csv(path, loss_key=loss_key, step_key=step_key, validation=validation)
    if fmt == "torchtitan":
        return load_torchtitan_log(path, validation=validation)
    if fmt == "torchtitan_losses":
        if validation:
            raise CurveError(f"{path}: torchtitan's loss files hold the training loss only; for the validation loss "
                             "give the run's console log or TensorBoard folder")
        return load_torchtitan_losses(path)
    if fmt == "tensorboard":
        from convergence.curves.tbevents import load_tensorboard

        return load_tensorboard(path, tag=tag, validation=validation)
    raise CurveError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
