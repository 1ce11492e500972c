"""Fuzzing every curve loader: random bytes and mutations of valid files give a Curve or one CurveError.

And the two fast decoders (msgspec blocks for JSONL, vectorised scalar events for TensorBoard) agree
exactly with their references (line-by-line JSON; tensorboard's protobuf) on the same inputs.
"""

from __future__ import annotations

import functools
import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from convergence.curves import jsonl
from convergence.curves.load import (
    Curve,
    CurveError,
    load_csv,
    load_curve,
    load_torchtitan_log,
    load_torchtitan_losses,
)
from convergence.curves.tbevents import load_tensorboard, write_scalars

LOADERS = {
    "auto": load_curve,
    "auto_validation": functools.partial(load_curve, validation=True),
    "jsonl": jsonl.load_jsonl,
    "csv": load_csv,
    "torchtitan": load_torchtitan_log,
    "torchtitan_losses": load_torchtitan_losses,
    "tensorboard": load_tensorboard,
}


def _load(loader, data: bytes, name: str = "events.out.tfevents.1.host", *more):
    """Write ``data`` to a fresh file and load it with each loader; the one allowed failure is CurveError."""
    out = []
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / name
        p.write_bytes(data)
        for f in (loader, *more):
            try:
                out.append(f(p))
            except CurveError as exc:
                assert "\n" not in str(exc)
                out.append(exc)
    return out[0] if not more else out


@st.composite
def mutated(draw, *, base: bytes) -> bytes:
    """``base`` with a few edits of the kinds damage takes: flipped bytes, cuts, insertions, duplicated or
    swapped stretches, truncation."""
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 4))):
        n = len(data)
        op = draw(st.sampled_from(["flip", "cut", "insert", "dup", "swap", "truncate"]))
        i = draw(st.integers(0, max(n - 1, 0)))
        j = draw(st.integers(i, min(n, i + 64)))
        if op == "flip" and n:
            data[i] ^= draw(st.integers(1, 255))
        elif op == "cut":
            del data[i:j]
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=16))
        elif op == "dup":
            data[j:j] = data[i:j]
        elif op == "swap":
            k = draw(st.integers(j, max(j, n)))
            data[i:k] = data[j:k] + data[i:j]
        else:
            data = data[:i]
    return bytes(data)


def _jsonl_bytes(n: int = 30) -> bytes:
    rows = []
    for s in range(1, n + 1):
        rows.append(json.dumps({"step": s, "loss": 3.0 / s, "grad_norm": 1.5, "tokens": 64 * s,
                                "layers": {"0": {"loss": 9.0}}}))
        if s % 10 == 0:
            rows.append(json.dumps({"step": s, "val_loss": 2.0}))
    return ("\n".join(rows) + "\n").encode()


VALID = {
    "jsonl": _jsonl_bytes(),
    "csv": ("step,loss,grad_norm,note,val_loss\n"  # a validation loss every 5th step, empty cells between
            + "".join(f"{s},{3.0 / s!r},0.5,x,{3.1 / s if s % 5 == 0 else ''}\n" for s in range(1, 31))).encode(),
    "torchtitan": "".join(f"[titan] \x1b[31mstep: {s:2}  \x1b[32mloss: {3.0 / s:7.4f}  grad_norm: 1.2500  "
                          f"tps: 12,345\x1b[39m\n" for s in range(1, 31)).encode(),
    "torchtitan_losses": ("# config: debug\n# ngpu: 8\n# step loss grad_norm\n"
                          + "".join(f"{s} {3.0 / s!r} 1.5\n" for s in range(1, 31))).encode(),
}


def _tb_bytes() -> bytes:
    with tempfile.TemporaryDirectory() as d:
        steps = np.arange(1, 21)
        every5 = steps[4::5]  # a validation loss every 5th step
        f = write_scalars(Path(d) / "events.out.tfevents.1.h", {"loss": (steps, 3.0 / steps),
                                                                "grad_norm": (steps, np.ones(20)),
                                                                "validation_metrics/loss": (every5, 3.1 / every5)})
        return f.read_bytes()


VALID["tensorboard"] = _tb_bytes()


@settings(max_examples=40)
@given(data=st.binary(max_size=400), loader=st.sampled_from(sorted(LOADERS)))
@example(data=b"\xef\xbb\xbfstep,loss\n1,2\n", loader="auto")
@example(data=b'{"step": 99999999999999999999, "loss": 1}\n', loader="jsonl")
@example(data=b"step,loss\n1e300,2\n", loader="csv")
@example(data=b"1 2\n" + b"[" * 5000 + b"\n", loader="auto")
def test_loaders_on_random_bytes_give_a_curve_or_one_curve_error(data, loader):
    out = _load(LOADERS[loader], data)
    assert isinstance(out, (Curve, CurveError))


@pytest.mark.parametrize("fmt", sorted(VALID))
@settings(max_examples=30)
@given(data=st.data())
def test_loaders_on_mutated_valid_files_give_a_curve_or_one_curve_error(fmt, data):
    damaged = data.draw(mutated(base=VALID[fmt]))
    for loader in (LOADERS[fmt], load_curve, LOADERS["auto_validation"]):
        out = _load(loader, damaged)
        assert isinstance(out, (Curve, CurveError)), out


def _same(a, b):
    if isinstance(a, CurveError) or isinstance(b, CurveError):
        assert type(a) is type(b) and str(a) == str(b)
        return
    np.testing.assert_array_equal(a.steps, b.steps)
    np.testing.assert_array_equal(a.values, b.values)
    assert a.meta == b.meta and sorted(a.extras) == sorted(b.extras)
    for k in a.extras:
        np.testing.assert_array_equal(a.extras[k].steps, b.extras[k].steps)
        np.testing.assert_array_equal(a.extras[k].values, b.extras[k].values)


_SCALAR = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=True), st.none(), st.text(max_size=3),
                    st.booleans())


@st.composite
def jsonl_files(draw) -> bytes:
    """Harness-like lines with every irregularity the reference must diagnose or accept."""
    lines = []
    for _ in range(draw(st.integers(0, 25))):
        kind = draw(st.sampled_from(["row", "row", "row", "val", "blank", "odd", "restart"]))
        step = draw(st.integers(-3, 40))
        if kind == "row":
            obj = {"step": step, "loss": draw(st.floats(0.1, 10) | _SCALAR)}
            for k in draw(st.lists(st.sampled_from(jsonl.EXTRA_SERIES), max_size=3)):
                obj[k] = draw(st.floats(0, 1e6) | _SCALAR)
            line = json.dumps(obj)
        elif kind == "val":
            line = json.dumps({"step": step, "val_loss": draw(st.floats(0, 5))})
        elif kind == "blank":
            line = draw(st.sampled_from(["", "  ", "\r"]))
        elif kind == "restart":
            line = json.dumps({"step": max(step - 20, 1), "loss": 1.0})
        else:
            line = draw(st.sampled_from(['{"step": 1.0, "loss": 2}', '{"step": 2, "loss": null}', "[1]",
                                         '{"st\\u0065p": 3, "loss": 1}', '{"step": 4, "loss": 1, "loss": 2}',
                                         '{"step": 5, "loss": NaN}', '{"step": 6}', '{"step": 7, "lo']))
        lines.append(line)
    sep = draw(st.sampled_from(["\n", "\r\n"]))
    return (draw(st.sampled_from(["", "\ufeff"])) + sep.join(lines) + draw(st.sampled_from(["", sep]))).encode()


@settings(max_examples=60)
@given(data=jsonl_files() | st.binary(max_size=200), block=st.sampled_from([32, 100, 1 << 20]),
       key=st.sampled_from(["loss", "val_loss"]))
@example(data=b'{"step": 1, "loss": 1e999}\n{"step": 2, "loss": 100000000000000000000000000000}\n', block=1 << 20,
         key="loss")
@example(data=b'{"step": 1, "loss": 1}\n\n{"step": 1, "loss": 2}\n', block=16, key="loss")
@example(data=b'{"step": 1, "loss": 2}\n{"step": 1, "val_loss": 1, "lr": 3}\n{"step": 2, "val_loss": 4}\n',
         block=1 << 20, key="val_loss")
def test_jsonl_fast_decoder_agrees_with_the_reference(data, block, key):
    """Both loss keys the suite reads: ``val_loss`` (``compare --metric val_loss``, the protocol) is itself a
    known series, and a line with only the training ``loss`` is then legitimate without being read."""
    old = jsonl.BLOCK_BYTES
    jsonl.BLOCK_BYTES = block  # small blocks put block boundaries everywhere
    try:
        fast, ref = _load(lambda p: jsonl.load_jsonl(p, loss_key=key), data, "m.jsonl",
                          lambda p: jsonl.load_jsonl(p, loss_key=key, fast=False))
    finally:
        jsonl.BLOCK_BYTES = old
    _same(fast, ref)


def test_a_validation_loss_curve_is_read_by_the_fast_decoder():
    """``--metric val_loss`` reads a training log with the fast decoder (it once fell to the line-by-line
    reference for every block: the loss key is also a known series); the control: a block the fast decoder
    cannot take (a null value) still goes to the reference, with the same curve."""
    lines = [json.dumps({"step": s, "loss": 1.0 / s, "lr": 1e-3} | ({"val_loss": 2.0 / s} if s % 4 == 0 else {}))
             for s in range(1, 41)]
    decoder = jsonl._decoder("step", "val_loss")
    cols = jsonl._fast_records("\n".join(lines).encode() + b"\n", 1, decoder)
    assert cols is not None and int(cols.has_loss.sum()) == 10
    np.testing.assert_array_equal(cols.loss[cols.has_loss], [2.0 / s for s in range(4, 41, 4)])
    assert jsonl._fast_records((lines[0][:-1] + ', "tps": null}\n').encode(), 1, decoder) is None


@st.composite
def event_files(draw) -> bytes:
    """Scalar events in torch's layout and in others (several values, tensors, no step, no wall time)."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.compat.proto.tensor_pb2 import TensorProto

    from convergence.curves.tbwire import masker

    masked = masker()
    out = bytearray()

    def put(ev):
        payload = ev.SerializeToString()
        head = len(payload).to_bytes(8, "little")
        out.extend(head + masked(head).to_bytes(4, "little") + payload + masked(payload).to_bytes(4, "little"))

    put(Event(wall_time=1.0, file_version="brain.Event:2"))
    tags = st.sampled_from(["loss", "grad_norm", "train/loss", "lr", "x" * 130, "é"])
    for _ in range(draw(st.integers(0, 30))):
        values = []
        for _ in range(draw(st.sampled_from([1, 1, 1, 2]))):
            v = draw(st.floats(width=32, allow_nan=True))
            if draw(st.booleans()):
                values.append(Summary.Value(tag=draw(tags), simple_value=v))
            else:
                values.append(Summary.Value(tag=draw(tags), tensor=TensorProto(dtype=1, float_val=[v])))
        put(Event(wall_time=draw(st.sampled_from([0.0, 1.7e9])), step=draw(st.integers(-2**63, 2**63 - 1)),
                  summary=Summary(value=values)))
    return bytes(out)


@settings(max_examples=60)
@given(data=event_files())
def test_tensorboard_fast_decoder_agrees_with_protobuf(data):
    for tag in (None, "lr", "x" * 130):
        fast, ref = _load(lambda p, t=tag: load_tensorboard(p, tag=t), data, "events.out.tfevents.1.h",
                          lambda p, t=tag: load_tensorboard(p, tag=t, fast=False))
        _same(fast, ref)


def test_fuzz_controls_detect_a_planted_difference():
    """The comparison helper used above can fail: a curve with one value changed is not 'the same'."""
    a, b = _load(jsonl.load_jsonl, _jsonl_bytes(), "m.jsonl", jsonl.load_jsonl)
    _same(a, b)
    b = _load(jsonl.load_jsonl, _jsonl_bytes().replace(b'"loss": 3.0,', b'"loss": 3.5,'), "m.jsonl")
    b = type(b)(b.steps, b.values, a.meta, b.extras)
    with pytest.raises(AssertionError):
        _same(a, b)
    assert math.isclose(a.values[0], 3.0)
