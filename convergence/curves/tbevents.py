"""TensorBoard event files: read a scalar tag into a ``Curve``; write scalars fast (for the benchmark).

Public functions
  ``load_tensorboard(path, *, tag=None, validation=False, fast=True) -> Curve``  a run directory or one
      ``events.out.tfevents.*`` file.
  ``event_files(path) -> list[Path]``  the files read, in order.
  ``write_scalars(path, series, *, wall_time=0.0)``  one event file with ``{tag: (steps, values)}``.

Reading. The TFRecord framing (length, masked CRC32C of the length, payload, masked CRC32C of the
payload) is walked by ``tbwire.frame``, both CRCs verified. Scalar events in the layout torch's
SummaryWriter writes are decoded for all records at once by ``tbwire.decode_scalars``; every other
record is decoded with the tensorboard package's own schema (``tensorboard.compat.proto.event_pb2.
Event``), the reference (``fast=False`` uses it for every record; a property test holds the two
equal). The framing loop is ours rather than tensorboard's ``EventFileLoader`` because, without
TensorFlow installed, that loader checks CRCs in pure Python at ~17 us per record (measured,
tensorboard 2.21, this 2-core CPU): ~29 s for 1,000,000 loss events before any other tag is counted.
A test checks that both readers agree on the same file.

Scalars written as ``simple_value`` (``torch.utils.tensorboard``, what torchtitan uses) and as
scalar tensors (``tensorboard.summary.Writer``, TF2) are both read.

Tags. ``tag=None`` tries ``DEFAULT_TAGS`` in order (torchtitan's ``loss_metrics/global_avg_loss``
first), or with ``validation`` ``VAL_TAGS`` (torchtitan's validator writes ``validation_metrics/loss``);
an explicit ``tag`` is used alone. ``EXTRA_TAGS`` become extra series when present.

Directories. Every event file below the directory is read (torchtitan starts a new timestamped
sub-directory on each restart), ordered by the creation time in the file name
(``events.out.tfevents.<unix time>.<host>...``) then by name; steps that go back are restarts
(``convergence.curves.curve``'s rule: restarts vs records out of order).

Damage. A final record cut short in the newest file (a run still writing) is skipped with a warning.
Anything else is bad input, said in words: a record cut short in an older file; a length whose
checksum fails (corrupt, or not a TensorBoard file at all); a payload whose checksum fails; a payload
that is not an Event; a file with no records.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from convergence.curves.curve import Curve, CurveError, CurveMeta, Series, read_bytes, resolve_steps
from convergence.curves.tbwire import Scalars, decode_scalars, frame, masker, tag_is

DEFAULT_TAGS = ("loss_metrics/global_avg_loss", "loss", "train/loss", "train_loss", "Loss/train", "loss/train")
VAL_TAGS = ("validation_metrics/loss", "val_loss")
# folders that hold one split's writer: a tag found in two of them is two series, not one run with restarts
SPLIT_FOLDERS = {"train", "training", "val", "valid", "validation", "eval", "evaluation", "test"}
EXTRA_TAGS = {"grad_norm": "grad_norm", "throughput(tps)": "tps", "lr": "lr", "val_loss": "val_loss",
              "validation_metrics/loss": "val_loss"}  # torchtitan's name wins when a run logs both



def header_ok(head: bytes) -> bool:
    """True when ``head`` starts with a well-framed TFRecord header (used by format detection)."""
    if len(head) < 12:
        return False
    (length,) = struct.unpack_from("<Q", head, 0)
    (crc,) = struct.unpack_from("<I", head, 8)
    return 0 < length < (1 << 40) and masker()(head[:8]) == crc


def _timestamp(p: Path) -> float:
    parts = p.name.split(".")
    try:
        return float(parts[3])
    except (IndexError, ValueError):
        return 0.0


def event_files(path) -> list[Path]:
    path = Path(path)
    if path.is_file():
        return [path]
    files = [p for p in path.rglob("*") if p.is_file() and "tfevents" in p.name]
    if not files:
        logs = sorted(p for p in path.glob("*metrics.jsonl*") if p.is_file()) or sorted(
            p for p in path.glob("*/metrics.jsonl*") if p.is_file())
        hint = f"; it holds a run's log: pass the file, e.g. {logs[0]}" if logs else ""
        raise CurveError(f"{path}: no TensorBoard event files (events.out.tfevents.*) in this directory{hint}")
    return sorted(files, key=lambda p: (_timestamp(p), str(p)))


def _protobuf_scalars(p: Path, data: bytes, starts, ends, records) -> list[tuple[int, int, str, object]]:
    """(record, step, tag, Value) of every summary value in ``records``, read by tensorboard's protobuf."""
    from google.protobuf.message import DecodeError
    from tensorboard.compat.proto.event_pb2 import Event

    out = []
    for i in records.tolist():
        try:
            ev = Event.FromString(data[starts[i]:ends[i]])
        except DecodeError:
            raise CurveError(f"{p}: record {i} at byte {int(starts[i]) - 12}: not a TensorBoard event "
                             "(a TFRecord file of something else?)") from None
        if ev.HasField("summary"):
            out += [(i, ev.step, v.tag, v) for v in ev.summary.value]
    return out


def read_file(p: Path, data: bytes, tags: tuple[str, ...], *, newest: bool, warnings: list[str], fast: bool = True
              ) -> tuple[int, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """(number of records, {tag: (steps, values)} in record order, for those of ``tags`` present).

    ``fast``: scalar events in torch's layout are decoded by ``tbwire.decode_scalars``, the rest by
    protobuf; ``fast=False`` reads every record with protobuf (the reference)."""
    starts, ends = frame(p, data, newest=newest, warnings=warnings)
    u = np.frombuffer(data, dtype=np.uint8)
    if fast and len(starts):
        sc = decode_scalars(u, starts, ends)
    else:
        sc = Scalars(*(np.zeros(len(starts), dtype=t) for t in (bool, np.int64, np.int64, np.int64, np.float64)))
    slow = _protobuf_scalars(p, data, starts, ends, np.flatnonzero(~sc.ok))
    out = {}
    for tag in tags:
        hit = np.flatnonzero(tag_is(u, sc, tag.encode()))
        extra = [(i, step, _scalar(v, str(p))) for i, step, t, v in slow if t == tag]
        idx = np.concatenate([hit, np.array([e[0] for e in extra], dtype=np.int64)])
        order = np.argsort(idx, kind="stable")
        steps = np.concatenate([sc.step[hit], np.array([e[1] for e in extra], dtype=np.int64)])[order]
        values = np.concatenate([sc.value[hit], np.array([e[2] for e in extra], dtype=np.float64)])[order]
        if len(idx):
            out[tag] = (steps, values)
    return len(starts), out


def _scalar(value, where: str) -> float:
    if value.HasField("simple_value"):
        return value.simple_value
    t = value.tensor
    if t.float_val:
        return t.float_val[0]
    if t.double_val:
        return t.double_val[0]
    from tensorboard.util import tensor_util

    try:
        return float(tensor_util.make_ndarray(t).reshape(-1)[0])
    except (ValueError, TypeError, IndexError, OverflowError):
        raise CurveError(f"{where}: the value of tag {value.tag!r} is not a scalar number") from None


def _tags_present(files: list[Path]) -> str:
    """Every scalar tag in the files (the error path only: reads every record with protobuf)."""
    seen: set[str] = set()
    for p in files:
        data = read_bytes(p)
        starts, ends = frame(p, data, newest=True, warnings=[])
        seen |= {t for _, _, t, _ in _protobuf_scalars(p, data, starts, ends, np.arange(len(starts)))}
    return ", ".join(sorted(seen)[:12]) or "no scalars at all"


def load_tensorboard(path, *, tag: str | None = None, validation: bool = False, fast: bool = True) -> Curve:
    path = Path(path)
    files = event_files(path)
    wanted = (tag,) if tag else VAL_TAGS if validation else DEFAULT_TAGS
    tags = tuple(dict.fromkeys((*wanted, *EXTRA_TAGS)))
    collect: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {t: [] for t in tags}
    where: dict[str, set[Path]] = {t: set() for t in tags}  # the folders each tag was found in
    warnings: list[str] = []
    records = 0
    for k, p in enumerate(files):
        n, got = read_file(p, read_bytes(p), tags, newest=k == len(files) - 1, warnings=warnings, fast=fast)
        records += n
        for t, series in got.items():
            collect[t].append(series)
            where[t].add(p.parent)
    found = next((t for t in wanted if collect[t]), None)
    folders = where.get(found, set())
    splits = sorted(d.name for d in folders if d.name.lower() in SPLIT_FOLDERS)
    if len(folders) > 1 and splits:  # a writer per split (Keras, Lightning): train/ and validation/ log one tag
        raise CurveError(f"{path}: the tag {found!r} is logged in the split folders {', '.join(splits)}; give the "
                         "one to compare (e.g. its train folder)")
    if found is None:
        if not records:
            raise CurveError(f"{path}: no complete event records ({'; '.join(warnings) or 'empty file'})")
        tried = f"the tag {tag!r}" if tag else f"any of the tags {', '.join(wanted)}"
        raise CurveError(f"{path}: read {records} event records; none has {tried}; tags present: "
                         f"{_tags_present(files)} (pass --tag)")
    joined = {t: (np.concatenate([s for s, _ in v]), np.concatenate([x for _, x in v]))
              for t, v in collect.items() if v}
    r = resolve_steps(*joined[found], where=str(path))
    if r.reordered:
        warnings.append(f"{path}: the steps go back in {r.reordered} place(s) without any step logged twice: "
                        "read as records out of order and sorted (nothing dropped)")
    extras = {}
    for t, name in EXTRA_TAGS.items():
        if t in joined and t != found:
            e = resolve_steps(*joined[t], strict=False)
            extras[name] = Series(e.steps, e.values)
    run = path.name if path.is_dir() else path.parent.name
    return Curve(r.steps, r.values, CurveMeta(str(path), "tensorboard", found, run, r.restarts, tuple(warnings)),
                 extras)


def write_scalars(path, series: dict[str, tuple[np.ndarray, np.ndarray]], *, wall_time: float = 0.0) -> Path:
    """Write one event file (one event per step and tag, ``simple_value`` like torch's SummaryWriter; each tag
    has its own steps, as a validation loss logged every N steps has).

    Used by the benchmark to build million-step files in seconds; ``tensorboard.summary.Writer``
    takes ~70 us per scalar. Refuses to overwrite an existing file.
    """
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary

    path = Path(path)
    if path.exists():
        raise CurveError(f"{path} exists; not overwriting")
    pack, masked = struct.pack, masker()
    with open(path, "wb") as f:
        def put(payload: bytes):
            head = pack("<Q", len(payload))
            f.write(head + pack("<I", masked(head)) + payload + pack("<I", masked(payload)))

        put(Event(wall_time=wall_time, file_version="brain.Event:2").SerializeToString())
        tags = list(series)
        steps = np.concatenate([np.asarray(series[t][0], dtype=np.int64) for t in tags])
        which = np.concatenate([np.full(len(series[t][0]), k) for k, t in enumerate(tags)])
        values = np.concatenate([np.asarray(series[t][1], dtype=np.float64) for t in tags])
        for i in np.lexsort((which, steps)).tolist():  # by step, then in the tags' order, as a trainer logs
            ev = Event(wall_time=wall_time, step=int(steps[i]),
                       summary=Summary(value=[Summary.Value(tag=tags[which[i]], simple_value=float(values[i]))]))
            put(ev.SerializeToString())
    return path
