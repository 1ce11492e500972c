"""TensorBoard event files: read a scalar tag into a ``Curve``; write scalars fast (for the benchmark).

Public functions
  ``load_tensorboard(path, *, tag=None) -> Curve``  a run directory or one ``events.out.tfevents.*`` file.
  ``event_files(path) -> list[Path]``  the files read, in order.
  ``write_scalars(path, series, *, wall_time=0.0)``  one event file with ``{tag: (steps, values)}``.

Reading. Events are decoded with the tensorboard package's own schema (``tensorboard.compat.proto.
event_pb2.Event``) from the TFRecord framing (length, masked CRC32C of the length, payload, masked
CRC32C of the payload); both CRCs are verified. The framing loop is ours rather than tensorboard's
``EventFileLoader`` because, without TensorFlow installed, that loader checks CRCs in pure Python
at ~17 us per record (measured, tensorboard 2.21, this 2-core CPU): ~29 s for 1,000,000 loss events
before any other tag is counted. A test checks that both readers agree on the same file.

Scalars written as ``simple_value`` (``torch.utils.tensorboard``, what torchtitan uses) and as
scalar tensors (``tensorboard.summary.Writer``, TF2) are both read.

Tags. ``tag=None`` tries ``DEFAULT_TAGS`` in order (torchtitan's ``loss_metrics/global_avg_loss``
first); an explicit ``tag`` is used alone. ``EXTRA_TAGS`` become extra series when present.

Directories. Every event file below the directory is read (torchtitan starts a new timestamped
sub-directory on each restart), ordered by the creation time in the file name
(``events.out.tfevents.<unix time>.<host>...``) then by name; steps that go back are restarts
(``convergence.curves.load``). A truncated final record in the newest file (a run still writing) is
skipped with a warning; a truncated or corrupt record anywhere else is bad input.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from convergence.curves.load import Curve, CurveError, CurveMeta, Series, resolve_restarts

DEFAULT_TAGS = ("loss_metrics/global_avg_loss", "loss", "train/loss", "train_loss", "Loss/train", "loss/train")
EXTRA_TAGS = {"grad_norm": "grad_norm", "throughput(tps)": "tps", "lr": "lr", "val_loss": "val_loss"}

_MASK_DELTA = 0xA282EAD8  # TFRecord's CRC mask constant (tensorflow/core/lib/hash/crc32c.h)


def _crc32c(data: bytes) -> int:
    try:
        import google_crc32c

        return google_crc32c.value(data)
    except ImportError:  # pragma: no cover - declared dependency; the stub is correct but slow
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c

        return crc32c(data)


def _masked(data: bytes) -> int:
    crc = _crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def header_ok(head: bytes) -> bool:
    """True when ``head`` starts with a well-framed TFRecord header (used by format detection)."""
    if len(head) < 12:
        return False
    (length,) = struct.unpack_from("<Q", head, 0)
    (crc,) = struct.unpack_from("<I", head, 8)
    return 0 < length < (1 << 40) and _masked(head[:8]) == crc


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
        raise CurveError(f"{path}: no TensorBoard event files (events.out.tfevents.*) in this directory")
    return sorted(files, key=lambda p: (_timestamp(p), str(p)))


def _records(p: Path, data: bytes, *, newest: bool, warnings: list[str]):
    from tensorboard.compat.proto.event_pb2 import Event

    unpack, parse, masked, n = struct.unpack_from, Event.FromString, _masked, len(data)
    pos, index = 0, 0
    while pos < n:
        if pos + 12 > n or pos + 16 + unpack("<Q", data, pos)[0] > n:
            if newest:
                warnings.append(f"{p}: record {index}: truncated final record skipped (run still writing?)")
                return
            raise CurveError(f"{p}: record {index}: truncated (file cut short)")
        (length,) = unpack("<Q", data, pos)
        if masked(data[pos:pos + 8]) != unpack("<I", data, pos + 8)[0]:
            raise CurveError(f"{p}: record {index}: length CRC mismatch (corrupt event file)")
        payload = data[pos + 12:pos + 12 + length]
        if masked(payload) != unpack("<I", data, pos + 12 + length)[0]:
            raise CurveError(f"{p}: record {index}: payload CRC mismatch (corrupt event file)")
        pos += 16 + length
        index += 1
        yield parse(payload)


def _scalar(value) -> float:
    if value.HasField("simple_value"):
        return value.simple_value
    t = value.tensor
    if t.float_val:
        return t.float_val[0]
    if t.double_val:
        return t.double_val[0]
    from tensorboard.util import tensor_util

    return float(tensor_util.make_ndarray(t).reshape(-1)[0])


def load_tensorboard(path, *, tag: str | None = None) -> Curve:
    path = Path(path)
    files = event_files(path)
    wanted = (tag,) if tag else DEFAULT_TAGS
    collect = {t: ([], []) for t in (*wanted, *EXTRA_TAGS)}
    seen: set[str] = set()
    warnings: list[str] = []
    for k, p in enumerate(files):
        for ev in _records(p, p.read_bytes(), newest=k == len(files) - 1, warnings=warnings):
            if not ev.HasField("summary"):
                continue
            for v in ev.summary.value:
                seen.add(v.tag)
                slot = collect.get(v.tag)
                if slot is not None:
                    slot[0].append(ev.step)
                    slot[1].append(_scalar(v))
    found = next((t for t in wanted if collect[t][0]), None)
    if found is None:
        tried = f"tag {tag!r}" if tag else f"any of the tags {', '.join(wanted)}"
        have = ", ".join(sorted(seen)[:12]) or "no scalars at all"
        raise CurveError(f"{path}: no {tried}; tags present: {have} (pass --tag)")
    s, v, restarts = resolve_restarts(np.array(collect[found][0]), np.array(collect[found][1]), where=str(path))
    extras = {}
    for t, name in EXTRA_TAGS.items():
        if collect[t][0] and t != found:
            es, ev_, _ = resolve_restarts(np.array(collect[t][0]), np.array(collect[t][1]), strict=False)
            extras[name] = Series(es, ev_)
    run = path.name if path.is_dir() else path.parent.name
    return Curve(s, v, CurveMeta(str(path), "tensorboard", found, run, restarts, tuple(warnings)), extras)


def write_scalars(path, series: dict[str, tuple[np.ndarray, np.ndarray]], *, wall_time: float = 0.0) -> Path:
    """Write one event file (one event per step and tag, ``simple_value`` like torch's SummaryWriter).

    Used by the benchmark to build million-step files in seconds; ``tensorboard.summary.Writer``
    takes ~70 us per scalar. Refuses to overwrite an existing file.
    """
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary

    path = Path(path)
    if path.exists():
        raise FileExistsError(f"{path} exists; not overwriting")
    pack, masked = struct.pack, _masked
    with open(path, "wb") as f:
        def put(payload: bytes):
            head = pack("<Q", len(payload))
            f.write(head + pack("<I", masked(head)) + payload + pack("<I", masked(payload)))

        put(Event(wall_time=wall_time, file_version="brain.Event:2").SerializeToString())
        tags = list(series)
        steps = np.asarray(series[tags[0]][0])
        cols = [np.asarray(series[t][1], dtype=np.float64) for t in tags]
        for i, step in enumerate(steps.tolist()):
            for t, col in zip(tags, cols):
                ev = Event(wall_time=wall_time, step=step,
                           summary=Summary(value=[Summary.Value(tag=t, simple_value=float(col[i]))]))
                put(ev.SerializeToString())
    return path
