"""JSONL loss curves: one JSON object per line, ``{"step": int, "loss": float, ...}``.

Public functions
  ``load_jsonl(path, *, loss_key="loss", step_key="step") -> Curve``
  ``load_field(path, key, *, step_key="step") -> dict``  step -> one field's value (e.g. a list)
  ``is_number(x) -> bool``  a parsed JSON number: an int or a float, not a bool, null or text

What a line may hold. A line without the loss key is accepted only when it carries another known
series (``EXTRA_SERIES``, e.g. the harness's ``{"step": N, "val_loss": x}`` lines, or the training
``loss`` when another key is read, as ``compare --metric val_loss`` does); those values land in
``Curve.extras``. A line with neither, a non-object, a missing/non-integer step, a step
outside int64, or a non-numeric loss is bad input (``CurveError`` naming the line). Nested
objects (per-layer extras) are ignored. ``NaN`` / ``Infinity`` are data, not errors, and so is a null
loss: JSON has no NaN, and writers that keep to it (``convergence train`` among them) log a NaN loss as
null, so it reads as NaN and a diverged run is judged ``diverged`` instead of refused. Blank lines
are skipped; a truncated final line (a run still writing) is skipped with a warning. A UTF-8 byte
order mark at the start is ignored. Steps that go back follow ``convergence.curves.curve``'s rule.

Two decoders, one meaning. ``_reference_records`` parses line by line (orjson, else the standard
library) and diagnoses every bad line; it is the definition. ``_fast_records`` decodes blocks of
lines with msgspec into typed records, skipping unknown and nested fields without building them
(~0.5 us a line instead of ~7 us); any block it cannot take exactly as the reference would (a
blank line, NaN literal, string or null value, float step, anything odd) is handed, whole, to the
reference. ``tests/convergence/curves/test_fuzz.py`` checks that both give the same curve or the
same error on arbitrary and mutated files. Without msgspec (the GPU image) only the reference runs.
"""

from __future__ import annotations

import gc
import json
import math
import operator
from pathlib import Path

import numpy as np

from convergence.curves.curve import STEP_LIMIT, Curve, CurveError, finish, read_bytes

try:  # orjson parses a line ~4x faster than json; the stdlib stays the reference and the fallback
    import orjson as _fastjson
except ImportError:  # pragma: no cover - orjson is a declared dependency
    _fastjson = None
try:
    import msgspec
except ImportError:  # pragma: no cover - declared dependency; without it every block takes the reference
    msgspec = None

# Series other than the loss that a line may carry; a line with one of these and no loss is a
# legitimate partial record (validation loss every K steps, throughput-only lines).
EXTRA_SERIES = (
    "val_loss", "eval_loss", "validation_loss", "grad_norm", "lr", "tokens", "tokens_per_s", "tps",
)
BLOCK_BYTES = 4 << 20  # lines decoded per msgspec call: large enough to amortise, small enough to redo


class _Columns:
    """Records of one block in file order: steps, loss (+ presence), extras (+ presence), line numbers."""

    def __init__(self, steps, loss, has_loss, extras, has_extra, lines):
        self.steps, self.loss, self.has_loss = steps, loss, has_loss
        self.extras, self.has_extra, self.lines = extras, has_extra, lines


def _excerpt(raw: bytes) -> str:
    text = raw[:60].decode("utf-8", errors="replace")
    return "".join(c if c.isprintable() else "?" for c in text)


def _parse(raw: bytes):
    if _fastjson is not None:
        try:
            return _fastjson.loads(raw)
        except _fastjson.JSONDecodeError:
            pass  # NaN / Infinity literals (Python's json.dumps writes them) or a bad line: ask the stdlib
    return json.loads(raw)


def _parse_error(raw: bytes) -> str:
    try:
        json.loads(raw)
    except json.JSONDecodeError as exc:
        return f"{exc.msg} at column {exc.colno}"
    except (ValueError, RecursionError) as exc:  # bad UTF-8; nesting deeper than Python's stack
        return "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else "nested too deeply"
    return "unreadable"


def is_number(x) -> bool:
    """A parsed JSON number (``True`` is an int to Python, not a number in a log)."""
    return type(x) is int or type(x) is float


def _as_float(x) -> float:
    try:
        return float(x)
    except OverflowError:  # an integer literal beyond float range reads as the JSON float 1e999 does
        return math.copysign(math.inf, x)


def _bad_record(where: str, obj, step_key: str, loss_key: str) -> str | None:
    """Why a parsed line is bad input, or None when it is a legitimate record without a loss."""
    if type(obj) is not dict:
        return f"{where}: expected a JSON object, got {type(obj).__name__}"
    step = obj.get(step_key)
    if type(step) is not int and not (type(step) is float and step.is_integer()):
        return f"{where}: missing or non-integer '{step_key}': {step!r}"
    if not -STEP_LIMIT <= step < STEP_LIMIT:
        return f"{where}: '{step_key}' {step!r} is outside the 64-bit integer range"
    if loss_key in obj and obj[loss_key] is not None and not is_number(obj[loss_key]):
        return f"{where}: non-numeric '{loss_key}': {obj[loss_key]!r}"
    if loss_key not in obj and not any(is_number(obj.get(k)) for k in (*EXTRA_SERIES, "loss")):
        return f"{where}: no '{loss_key}' and no other known series ({', '.join(EXTRA_SERIES)})"
    return None


def _reference_records(lines: list[bytes], first_line: int, last_line: int, path: Path, step_key: str,
                       loss_key: str, warnings: list[str]) -> _Columns:
    """Line by line; ``first_line`` is the 1-based number of ``lines[0]``, ``last_line`` the file's last
    non-blank line (a parse error there is a truncated final line, skipped with a warning)."""
    steps, loss, has_loss, extra, present, nums = [], [], [], [], [], []
    for i, raw in enumerate(lines, start=first_line):
        if not raw.strip():
            continue
        try:
            obj = _parse(raw)
        except (ValueError, RecursionError):
            if i == last_line:
                warnings.append(f"{path}:{i}: truncated final line skipped (run still writing?)")
                continue
            raise CurveError(f"{path}:{i}: not valid JSON ({_parse_error(raw)}); the line reads "
                             f"{_excerpt(raw)!r}") from None
        why = _bad_record(f"{path}:{i}", obj, step_key, loss_key)
        if why:
            raise CurveError(why)
        v = obj.get(loss_key)
        xs = [obj.get(k) for k in EXTRA_SERIES]
        steps.append(int(obj[step_key]))
        has_loss.append(loss_key in obj)  # a null loss is a logged NaN (module docstring)
        loss.append(_as_float(v) if v is not None else math.nan)
        present.append([is_number(x) for x in xs])
        extra.append([_as_float(x) if is_number(x) else math.nan for x in xs])
        nums.append(i)
    k = len(EXTRA_SERIES)
    return _Columns(np.array(steps, dtype=np.int64), np.array(loss, dtype=np.float64),
                    np.array(has_loss, dtype=bool), np.array(extra, dtype=np.float64).reshape(-1, k),
                    np.array(present, dtype=bool).reshape(-1, k), np.array(nums, dtype=np.int64))


def _decoder(step_key: str, loss_key: str):
    """A msgspec decoder of exactly the fields read (every known series: searching the bytes for the keys
    costs more than decoding them); unknown and nested fields are skipped without being built. A JSON
    null fails the float type, so its block goes to the reference, which reads a null loss as NaN and a null
    other series as absent. When the loss
    key is itself a known series (``val_loss``, as ``compare --metric val_loss`` reads), its column is the
    loss's (``_fast_records`` copies it), and the training ``loss``, which then makes a line legitimate without
    being read, is decoded for its presence alone."""
    fields = [("f_step", int), ("f_loss", float, math.nan)]
    rename = {"f_step": step_key, "f_loss": loss_key}
    for j, k in enumerate(EXTRA_SERIES):
        if k != loss_key:
            fields.append((f"f{j}", float, math.nan))
            rename[f"f{j}"] = k
    if loss_key != "loss":
        fields.append(("f_train", float, math.nan))
        rename["f_train"] = "loss"
    return msgspec.json.Decoder(msgspec.defstruct("Record", fields, rename=rename))


def _fast_records(block: bytes, first_line: int, decoder) -> _Columns | None:
    """The block's records, or None when the reference must read it (see the module docstring)."""
    try:
        recs = decoder.decode_lines(block)
        n = len(recs)
        if n != block.count(b"\n") + (not block.endswith(b"\n")):
            return None  # msgspec skipped blank lines: the reference keeps the line numbers right
        steps = np.fromiter(map(operator.attrgetter("f_step"), recs), dtype=np.int64, count=n)
    except (msgspec.DecodeError, msgspec.ValidationError, OverflowError):
        return None  # not JSON, a NaN literal, a value of another type, a step outside int64
    loss = np.fromiter(map(operator.attrgetter("f_loss"), recs), dtype=np.float64, count=n)
    extras = np.full((n, len(EXTRA_SERIES)), math.nan)
    fields = decoder.type.__struct_fields__
    for j in range(len(EXTRA_SERIES)):
        field = f"f{j}" if f"f{j}" in fields else "f_loss"  # the loss key's own series: the loss
        extras[:, j] = np.fromiter(map(operator.attrgetter(field), recs), np.float64, n)
    has_loss = ~np.isnan(loss)  # msgspec never yields NaN (the literal is not JSON): NaN means absent
    has_extra = ~np.isnan(extras)
    legit = has_loss | has_extra.any(axis=1)
    if "f_train" in fields:  # the training loss makes a line legitimate when another key is read
        legit |= ~np.isnan(np.fromiter(map(operator.attrgetter("f_train"), recs), np.float64, n))
    if not legit.all():
        return None  # a line with neither: the reference names it
    return _Columns(steps, loss, has_loss, extras, has_extra, np.arange(first_line, first_line + n))


def _blocks(raw: bytes) -> list[tuple[int, int]]:
    """(start, end) byte ranges of about BLOCK_BYTES, cut after a newline."""
    out, start, n = [], 0, len(raw)
    while start < n:
        end = raw.find(b"\n", min(start + BLOCK_BYTES, n))
        end = n if end < 0 else end + 1
        out.append((start, end))
        start = end
    return out


def read_columns(raw: bytes, path: Path, *, step_key: str, loss_key: str, fast: bool = True
                 ) -> tuple[_Columns, list[str]]:
    """Every record of a JSONL file in file order; ``fast=False`` forces the reference decoder."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    end = len(raw)
    while end and raw[end - 1:end].isspace():  # bytes.isspace, as bytes.strip in the reference
        end -= 1
    if not end:
        raise CurveError(f"{path}: file is empty")
    last_line = raw.count(b"\n", 0, end) + 1
    warnings: list[str] = []
    use_fast = fast and msgspec is not None and step_key not in {loss_key, "loss", *EXTRA_SERIES}
    decoder = _decoder(step_key, loss_key) if use_fast else None
    parts, line = [], 1
    gc_was_on = gc.isenabled()
    gc.disable()  # a million small objects would trigger ~1,000 useless cyclic collections; restored below
    try:
        for start, end in _blocks(raw):
            block = raw[start:end]
            cols = _fast_records(block, line, decoder) if use_fast else None
            lines = block.split(b"\n") if cols is None else None
            if cols is None:
                cols = _reference_records(lines, line, last_line, path, step_key, loss_key, warnings)
            parts.append(cols)
            line += len(lines) - 1 if lines is not None else len(cols.steps)
    finally:
        if gc_was_on:
            gc.enable()
    cat = [np.concatenate([getattr(c, a) for c in parts]) for a in ("steps", "loss", "has_loss", "lines")]
    extras = np.concatenate([c.extras for c in parts])
    has_extra = np.concatenate([c.has_extra for c in parts])
    return _Columns(cat[0], cat[1], cat[2], extras, has_extra, cat[3]), warnings


def load_field(path, key: str, *, step_key: str = "step") -> dict[int, object]:
    """step -> the value of ``key`` (any JSON value, e.g. a list of per-batch losses) on the lines that have
    it; a step logged twice keeps its later value, as the curve does. Lines that are not JSON objects with
    an integer step (a torn last line) are skipped: ``load_jsonl`` is the one that judges a file."""
    out: dict[int, object] = {}
    for raw in read_bytes(Path(path)).splitlines():
        if key.encode() not in raw:
            continue
        try:
            obj = _parse(raw)
        except (ValueError, RecursionError):
            continue
        if type(obj) is dict and type(obj.get(step_key)) is int and key in obj:
            out[obj[step_key]] = obj[key]
    return out


def load_jsonl(path, *, loss_key: str = "loss", step_key: str = "step", fast: bool = True) -> Curve:
    path = Path(path)
    cols, warnings = read_columns(read_bytes(path), path, step_key=step_key, loss_key=loss_key, fast=fast)
    extras = {k: (cols.steps[cols.has_extra[:, j]], cols.extras[cols.has_extra[:, j], j])
              for j, k in enumerate(EXTRA_SERIES) if cols.has_extra[:, j].any()}
    h = cols.has_loss
    return finish(path, "jsonl", loss_key, cols.steps[h], cols.loss[h], cols.lines[h], extras, warnings)
