"""Loaders: round trips for every format, content detection, restarts, and bad input."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from convergence.curves.jsonl import load_jsonl
from convergence.curves.load import CurveError, detect_format, load_curve, resolve_steps
from convergence.curves.tbevents import load_tensorboard, write_scalars

STEPS = np.arange(1, 41)
LOSS = 10.0 / np.sqrt(STEPS) + 2.0


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_roundtrip_with_harness_val_lines(tmp_path):
    rows = []
    for s, v in zip(STEPS.tolist(), LOSS.tolist()):
        rows.append({"step": s, "loss": v, "grad_norm": 1.5, "lr": 3e-4, "tokens": 64 * s, "tokens_per_s": 9e3,
                     "layers": {"0": {"loss": 99.0}}})
        if s % 10 == 0:
            rows.append({"step": s, "val_loss": v + 0.1})
    (tmp_path / "bf16").mkdir()
    c = load_curve(_jsonl(tmp_path / "bf16" / "metrics.jsonl", rows))
    assert c.meta.format == "jsonl" and c.meta.run == "bf16" and c.meta.tag == "loss"
    np.testing.assert_array_equal(c.steps, STEPS)
    np.testing.assert_array_equal(c.values, LOSS)  # exact: JSON floats round-trip
    np.testing.assert_array_equal(c.extras["val_loss"].steps, [10, 20, 30, 40])
    assert set(c.extras) == {"val_loss", "grad_norm", "lr", "tokens", "tokens_per_s"}


def test_jsonl_nan_loss_is_data_not_error(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text('{"step": 1, "loss": 2.5}\n{"step": 2, "loss": NaN}\n{"step": 3, "loss": Infinity}\n')
    c = load_curve(p)
    assert np.isnan(c.values[1]) and np.isinf(c.values[2])


def test_jsonl_null_loss_is_a_logged_nan(tmp_path):
    """JSON has no NaN: ``convergence train`` (``JsonlLog``) writes one as null, and it must read back as the NaN it
    was, on both decoders, for the loss key asked for (val_loss too); a null in another series stays absent, and
    a line whose only series is null is not a record of anything (the control: null is not a number elsewhere)."""
    from convergence.train.checkpoint import JsonlLog

    p = tmp_path / "m.jsonl"
    log = JsonlLog(p)
    for step, loss in ((1, 2.5), (2, float("nan")), (3, 2.0)):
        log.append({"step": step, "loss": loss, "val_loss": loss if step == 2 else None})
    assert '"loss": null' in p.read_text()
    for fast in (True, False):
        c = load_jsonl(p, fast=fast)
        assert c.steps.tolist() == [1, 2, 3] and np.isnan(c.values[1]) and c.values[2] == 2.0
        v = load_jsonl(p, loss_key="val_loss", fast=fast)
        assert v.steps.tolist() == [1, 2, 3] and np.isnan(v.values).all()
    q = tmp_path / "q.jsonl"
    q.write_text('{"step": 1, "loss": 2.5}\n{"step": 2, "grad_norm": null}\n')
    with pytest.raises(CurveError, match=r"q.jsonl:2: no 'loss' and no other known series"):
        load_jsonl(q)


def test_jsonl_truncated_final_line_is_skipped_with_warning(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text('{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.4}\n{"step": 3, "lo')
    c = load_curve(p)
    assert len(c) == 2 and "truncated final line" in c.meta.warnings[0] and ":3:" in c.meta.warnings[0]


def test_csv_roundtrip_and_extra_columns(tmp_path):
    p = tmp_path / "run.csv"
    rows = "".join(f"{s},{v!r},0.5,x\n" for s, v in zip(STEPS.tolist(), LOSS.tolist()))
    p.write_text("step,loss,grad_norm,note\n" + rows)
    c = load_curve(p)
    assert c.meta.format == "csv"
    np.testing.assert_array_equal(c.values, LOSS)
    assert set(c.extras) == {"grad_norm"}


def test_csv_configurable_columns(tmp_path):
    p = tmp_path / "run.csv"
    p.write_text("it,x\n" + "".join(f"{s},{v!r}\n" for s, v in zip(STEPS.tolist(), LOSS.tolist())))
    c = load_curve(p, step_key="it", loss_key="x")
    np.testing.assert_array_equal(c.steps, STEPS)


def test_torchtitan_log_with_ansi_colours(tmp_path):
    red, green, orange, blue, reset = "\x1b[31m", "\x1b[32m", "\x1b[33m", "\x1b[34m", "\x1b[39m"
    lines = ["[titan] 2025-01-01 00:00:00,000 - root - INFO - Building model", "some warning: step: foo"]
    for s, v in zip(STEPS.tolist(), LOSS.tolist()):
        lines.append(f"[titan] 2025-01-01 00:00:01,000 - root - INFO - {red}step: {s:2}  {green}loss: {v:8.5f}  "
                     f"{orange}grad_norm: {1.25:7.4f}  memory: 10.00GiB(12.50%)  {blue}tps: {12345:,}  "
                     f"tflops: 1.23  mfu: 0.50%{reset}")
    p = tmp_path / "train.log"
    p.write_text("\n".join(lines) + "\n")
    assert detect_format(p) == "torchtitan"
    c = load_curve(p)
    np.testing.assert_allclose(c.values, LOSS, atol=5e-6)  # printed with 5 decimals
    np.testing.assert_array_equal(c.extras["tps"].values, np.full(len(STEPS), 12345.0))
    np.testing.assert_array_equal(c.extras["grad_norm"].values, np.full(len(STEPS), 1.25))


def test_tensorboard_dir_written_by_tensorboard_writer(tmp_path):
    from tensorboard.summary import Writer

    w = Writer(str(tmp_path / "tb"))
    for s, v in zip(STEPS.tolist(), LOSS.tolist()):
        w.add_scalar("loss_metrics/global_avg_loss", v, s)
        w.add_scalar("grad_norm", 0.75, s)
    w.close()
    assert detect_format(tmp_path / "tb") == "tensorboard"
    c = load_curve(tmp_path / "tb")
    assert c.meta.tag == "loss_metrics/global_avg_loss"
    np.testing.assert_array_equal(c.values, LOSS.astype(np.float32))  # the writer stores float32
    np.testing.assert_array_equal(c.extras["grad_norm"].steps, STEPS)


def test_tensorboard_reader_agrees_with_tensorboards_event_file_loader(tmp_path):
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    f = write_scalars(tmp_path / "events.out.tfevents.1.host", {"loss": (STEPS, LOSS)})
    theirs = [(e.step, v.tensor.float_val[0]) for e in EventFileLoader(str(f)).Load() for v in e.summary.value]
    c = load_tensorboard(f)
    assert list(zip(c.steps.tolist(), c.values.tolist())) == theirs


def test_tensorboard_missing_tag_names_tags_present(tmp_path):
    write_scalars(tmp_path / "events.out.tfevents.1.host", {"accuracy": (STEPS, LOSS)})
    with pytest.raises(CurveError, match="none has the tag 'nope'.*accuracy"):
        load_curve(tmp_path, tag="nope")
    with pytest.raises(CurveError, match="loss_metrics/global_avg_loss.*accuracy"):
        load_curve(tmp_path)


def test_tensorboard_corrupt_record_is_bad_input(tmp_path):
    f = write_scalars(tmp_path / "events.out.tfevents.1.host", {"loss": (STEPS, LOSS)})
    data = bytearray(f.read_bytes())
    data[60] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(CurveError, match="record 1 at byte 31: its contents fail their checksum"):
        load_curve(f)


def test_tensorboard_restart_in_new_subdir_later_wins(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    write_scalars(tmp_path / "a" / "events.out.tfevents.100.h", {"loss": (STEPS[:30], LOSS[:30])})
    write_scalars(tmp_path / "b" / "events.out.tfevents.200.h", {"loss": (STEPS[20:], LOSS[20:] + 1)})
    c = load_curve(tmp_path)
    np.testing.assert_array_equal(c.steps, STEPS)
    np.testing.assert_allclose(c.values[20:], (LOSS[20:] + 1).astype(np.float32))
    assert c.meta.restarts[0].to_step == 21 and c.meta.restarts[0].dropped == 10


def test_restart_later_value_wins_and_is_reported():
    steps = np.array([1, 2, 3, 4, 5, 3, 4, 5, 6])
    vals = np.array([9, 8, 7, 6, 5, 70, 60, 50, 40], dtype=float)
    res = resolve_steps(steps, vals)
    s, v, r = res.steps, res.values, res.restarts
    np.testing.assert_array_equal(s, [1, 2, 3, 4, 5, 6])
    np.testing.assert_array_equal(v, [9, 8, 70, 60, 50, 40])
    assert (r[0].from_step, r[0].to_step, r[0].dropped) == (5, 3, 3)


@pytest.mark.parametrize(
    "name, text, match",
    [
        ("empty.jsonl", "", "file is empty"),
        ("blank.jsonl", "\n\n", "file is empty"),
        ("bad.jsonl", '{"step": 1, "loss": 2}\n{"step": 2, "lo\n{"step": 3, "loss": 2}\n',
         r"bad.jsonl:2: not valid JSON"),
        ("str.jsonl", '{"step": 1, "loss": "abc"}\n', r"str.jsonl:1: non-numeric 'loss'"),
        ("noloss.jsonl", '{"step": 1, "loss": 2}\n{"step": 2, "acc": 0.5}\n', r"noloss.jsonl:2: no 'loss' and no"),
        ("nostep.jsonl", '{"loss": 2}\n', r"nostep.jsonl:1: missing or non-integer 'step'"),
        ("list.jsonl", "[1, 2]\n", r"list.jsonl:1: expected a JSON object"),
        ("tworuns.jsonl", '{"step": 5, "loss": 2}\n{"step": 6, "loss": 2}\n{"step": 0, "loss": 9}\n'
         '{"step": 5, "loss": 9}\n',
         r"tworuns.jsonl:3: step 0 goes below every earlier step"),
        ("onlyval.jsonl", '{"step": 1, "val_loss": 2}\n', r"onlyval.jsonl: no 'loss' values"),
        ("bad.csv", "step,loss\n1,2.0\n2,abc\n3,2.0\n", r"bad.csv:3: non-numeric 'loss'"),
        ("missing.csv", "step,loss\n1,2.0\n2,\n3,2.0\n", r"missing.csv:3: missing 'loss'"),
        ("nocol.csv", "step,acc\n1,2.0\n", r"nocol.csv:1: no loss column"),
        ("nothing.log", "hello\nworld\n", r"nothing.log:1: cannot tell the format"),
    ],
)
def test_bad_input_is_one_line_naming_file_and_line(tmp_path, name, text, match):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(CurveError, match=match) as e:
        load_curve(p)
    assert "\n" not in str(e.value)


def test_csv_truncated_final_row_is_skipped_with_warning(tmp_path):
    p = tmp_path / "run.csv"
    p.write_text("step,loss,grad_norm\n1,2.0,1\n2,1.9,1\n3,1.8")
    c = load_curve(p)
    assert len(c) == 2 and "truncated final row" in c.meta.warnings[0]


def test_curve_error_is_a_library_error_not_a_cli_error():
    from numerics.cli import CLIError
    from numerics.errors import BadInput

    assert issubclass(CurveError, BadInput) and not issubclass(CurveError, CLIError)


def test_jsonl_swapped_lines_are_sorted_not_restarts(tmp_path):
    # steps 51 and 121 swapped: sorted, not read as two restarts (which would drop 70 of 200 points)
    lines = [json.dumps({"step": s, "loss": 5.0 / s}) for s in range(1, 201)]
    lines[50], lines[120] = lines[120], lines[50]
    c = load_curve(_jsonl_text(tmp_path / "swap.jsonl", "\n".join(lines) + "\n"))
    np.testing.assert_array_equal(c.steps, np.arange(1, 201))
    np.testing.assert_array_equal(c.values, 5.0 / np.arange(1, 201))
    assert c.meta.restarts == () and "2 place(s)" in c.meta.warnings[0] and "nothing dropped" in c.meta.warnings[0]


def test_jsonl_genuine_restart_still_drops_the_abandoned_tail(tmp_path):
    # a run logged 1..100, was resumed from its step-80 checkpoint and logged 81..150 again
    rows = [{"step": s, "loss": 1.0} for s in range(1, 101)] + [{"step": s, "loss": 2.0} for s in range(81, 151)]
    c = load_curve(_jsonl(tmp_path / "m.jsonl", rows))
    np.testing.assert_array_equal(c.steps, np.arange(1, 151))
    assert (c.values[80:] == 2.0).all() and (c.values[:80] == 1.0).all()
    assert [(r.from_step, r.to_step, r.dropped) for r in c.meta.restarts] == [(100, 81, 20)]


def test_restart_and_swapped_lines_in_one_file(tmp_path):
    steps = list(range(1, 51)) + [60, 51, 52, 53, 54, 55, 56, 57, 58, 59] + list(range(61, 101)) + list(range(90, 121))
    rows = [{"step": s, "loss": float(i)} for i, s in enumerate(steps)]
    c = load_curve(_jsonl(tmp_path / "m.jsonl", rows))
    np.testing.assert_array_equal(c.steps, np.arange(1, 121))
    assert len(c.meta.restarts) == 1 and c.meta.restarts[0].dropped == 11  # steps 90..100 of the first run


def test_csv_with_a_utf8_byte_order_mark(tmp_path):
    p = tmp_path / "bom.csv"
    p.write_bytes(b"\xef\xbb\xbfstep,loss\n1,2.0\n2,1.9\n")
    c = load_curve(p)
    np.testing.assert_array_equal(c.steps, [1, 2])


def test_jsonl_truncated_line_mid_file_says_why_without_a_bytes_repr(tmp_path):
    p = _jsonl_text(tmp_path / "t.jsonl", '{"step": 1, "loss": 2}\n{"step": 2, "lo\n{"step": 3, "loss": 2}\n')
    with pytest.raises(CurveError) as e:
        load_curve(p)
    msg = str(e.value)
    assert "t.jsonl:2: not valid JSON (Unterminated string" in msg and "b'" not in msg and "\n" not in msg


@pytest.mark.parametrize("data, words", [
    (b"\x00" * 100, "record 0 at byte 0: its length field fails its checksum (not a TensorBoard event file)"),
    (bytes(range(256)), "its length field fails its checksum (not a TensorBoard event file)"),
    (b"", "no complete event records"),
])
def test_tensorboard_corrupt_file_says_what_is_wrong_in_english(tmp_path, data, words):
    f = tmp_path / "events.out.tfevents.1.host"
    f.write_bytes(data)
    with pytest.raises(CurveError, match=re.escape(words)) as e:
        load_curve(f)
    assert "no any" not in str(e.value)


def test_tensorboard_cut_short_in_an_older_file_is_bad_input(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    old = write_scalars(tmp_path / "a" / "events.out.tfevents.100.h", {"loss": (STEPS[:30], LOSS[:30])})
    old.write_bytes(old.read_bytes()[:-5])
    write_scalars(tmp_path / "b" / "events.out.tfevents.200.h", {"loss": (STEPS[30:], LOSS[30:])})
    with pytest.raises(CurveError, match="cut short .* a newer event file follows"):
        load_curve(tmp_path)


def _jsonl_text(path, text):
    path.write_text(text)
    return path


# torchtitan's golden loss files (tests/assets/losses/*.txt in pytorch/torchtitan): "# key: value" header
# lines, a "# step loss grad_norm" column line, then whitespace-separated rows; some have no header at all.
TITAN_LOSSES = (
    "# config: dsv3_debug_mxfp8_fsdp4_ep4\n# ngpu: 8\n# NOTE: recorded on a test machine; regenerate before use\n"
    "# step loss grad_norm\n"
    + "".join(f"{s} {v!r} {1.0 + s / 100!r}\n" for s, v in zip(STEPS.tolist(), LOSS.tolist()))
)


def test_torchtitan_loss_file_is_detected_and_keeps_its_header(tmp_path):
    p = tmp_path / "dsv3_mxfp8_8gpu.txt"
    p.write_text(TITAN_LOSSES)
    assert detect_format(p) == "torchtitan_losses"
    c = load_curve(p)
    assert c.meta.format == "torchtitan_losses" and c.meta.run == "dsv3_mxfp8_8gpu"
    assert c.meta.header == {"config": "dsv3_debug_mxfp8_fsdp4_ep4", "ngpu": "8",
                             "NOTE": "recorded on a test machine; regenerate before use"}
    np.testing.assert_array_equal(c.steps, STEPS)
    np.testing.assert_array_equal(c.values, LOSS)  # repr() round-trips exactly
    np.testing.assert_array_equal(c.extras["grad_norm"].values, 1.0 + STEPS / 100)


def test_torchtitan_loss_file_without_header_two_columns(tmp_path):
    p = tmp_path / "llama3_cuda.txt"
    p.write_text("".join(f"{s} {v!r}\n" for s, v in zip(STEPS.tolist(), LOSS.tolist())))
    c = load_curve(p)
    assert c.meta.format == "torchtitan_losses" and c.meta.header == {} and c.extras == {}
    np.testing.assert_array_equal(c.values, LOSS)


def test_two_torchtitan_loss_files_compare(tmp_path):
    from convergence.curves.compare import compare_paths

    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(TITAN_LOSSES)
    b.write_text(TITAN_LOSSES)
    r = compare_paths([a], b)
    cand = r["inputs"]["candidate"]
    assert cand["header"]["ngpu"] == "8" and cand["format"] == "torchtitan_losses"


@pytest.mark.parametrize("text, match", [
    ("# config: x\n1 2.0 1.0\n2 abc 1.0\n3 2.0 1.0\n", r":3: non-numeric 'loss': 'abc'"),
    ("# config: x\n1 2.0\n2.5 2.0\n3 2.0\n", r":3: non-integer 'step'"),
    ("# config: x\n# step loss grad_norm\n", r"no 'step loss' rows"),
])
def test_torchtitan_loss_file_bad_rows(tmp_path, text, match):
    p = tmp_path / "l.txt"
    p.write_text(text)
    with pytest.raises(CurveError, match=match):
        load_curve(p, format="torchtitan_losses")


def test_torchtitan_loss_file_truncated_final_row_is_skipped(tmp_path):
    p = tmp_path / "l.txt"
    p.write_text(TITAN_LOSSES + "41 2.")
    c = load_curve(p)
    assert len(c) == 41 and not c.meta.warnings
    p.write_text(TITAN_LOSSES + "41")
    c = load_curve(p)
    assert len(c) == 40 and "truncated final row" in c.meta.warnings[0]


def _formats(tmp_path):
    """One small file of each text format, as a cluster would write it: (name, text, format)."""
    pairs = list(zip(STEPS.tolist(), LOSS.tolist()))
    rows = "".join(json.dumps({"step": s, "loss": v, "val_loss": v + 0.1}) + "\n" for s, v in pairs)
    csv = "step,loss\n" + "".join(f"{s},{v!r}\n" for s, v in pairs)
    titan = "".join(f"[titan] 2025-01-01 00:00:01,000 - root - INFO - step: {s:2}  loss: {v:8.5f}  grad_norm: 1.2\n"
                    for s, v in pairs)
    losses = "# ngpu: 8\n" + "".join(f"{s} {v!r} 1.5\n" for s, v in pairs)
    return [("run1/metrics.jsonl", rows, "jsonl"), ("train.csv", csv, "csv"), ("train.log", titan, "torchtitan"),
            ("dsv3.txt", losses, "torchtitan_losses")]


def test_every_text_format_loads_the_same_from_a_gzip_file(tmp_path):
    """A gzip-compressed log (told by its first bytes, whatever its name) loads to the same curve as the plain
    file: format, steps, values, extras and run name; the JSONL's per-step fields too (load_field)."""
    import gzip

    from convergence.curves.jsonl import load_field

    for name, text, fmt in _formats(tmp_path):
        plain = tmp_path / "a" / "run" / name  # both copies in a folder "run": a train.* curve is named by it
        plain.parent.mkdir(parents=True, exist_ok=True)
        plain.write_text(text)
        for packed in (plain.with_name(plain.name + ".gz"), tmp_path / "b" / "run" / name):  # a name need not say gz
            packed.parent.mkdir(parents=True, exist_ok=True)
            packed.write_bytes(gzip.compress(text.encode(), mtime=0))
            assert packed.read_bytes()[:2] == b"\x1f\x8b" and detect_format(packed) == fmt
            a, b = load_curve(plain), load_curve(packed)
            np.testing.assert_array_equal(a.steps, b.steps)
            np.testing.assert_array_equal(a.values, b.values)
            assert a.meta.format == b.meta.format == fmt and a.meta.run == b.meta.run and a.meta.header == b.meta.header
            assert {k: v.values.tolist() for k, v in a.extras.items()} == \
                {k: v.values.tolist() for k, v in b.extras.items()}
            if fmt == "jsonl":
                assert a.meta.run == "run1" and load_field(packed, "val_loss") == load_field(plain, "val_loss")


def test_a_damaged_gzip_file_is_one_line(tmp_path, capsys):
    import gzip

    from convergence.__main__ import main as convergence_main

    good = gzip.compress(_formats(tmp_path)[0][1].encode(), mtime=0)
    for name, raw in (("cut.jsonl.gz", good[: len(good) // 2]), ("crc.jsonl.gz", good[:-8] + b"\0" * 8)):
        p = tmp_path / name
        p.write_bytes(raw)
        with pytest.raises(CurveError, match=rf"{name}: a damaged gzip file \(") as e:
            load_curve(p)
        assert "\n" not in str(e.value)
        assert convergence_main(["compare", str(p), str(p)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "a damaged gzip file" in err


def test_validation_loss_is_read_where_the_format_has_one_and_refused_where_not(tmp_path):
    """``validation=True`` reads the held-out loss: torchtitan's TensorBoard tag, a CSV column; a run that logs
    none is refused, never read as its training loss (a TensorBoard run once was, under --metric val_loss)."""
    val_steps = STEPS[::10]
    tb = tmp_path / "tb"
    tb.mkdir()
    write_scalars(tb / "events.out.tfevents.1.host", {"loss_metrics/global_avg_loss": (STEPS, LOSS),
                                                       "validation_metrics/loss": (val_steps, LOSS[::10] + 0.5)})
    c = load_curve(tb, validation=True)
    assert c.meta.tag == "validation_metrics/loss"
    np.testing.assert_array_equal(c.steps, val_steps)
    np.testing.assert_allclose(c.values, LOSS[::10] + 0.5, rtol=1e-6)  # stored as float32
    train = load_curve(tb)
    assert train.meta.tag == "loss_metrics/global_avg_loss"  # control: the training loss stays the default
    np.testing.assert_array_equal(train.extras["val_loss"].steps, val_steps)  # and keeps torchtitan's val series
    only_train = tmp_path / "train_only"
    only_train.mkdir()
    write_scalars(only_train / "events.out.tfevents.1.host", {"loss_metrics/global_avg_loss": (STEPS, LOSS)})
    with pytest.raises(CurveError, match="validation_metrics/loss, val_loss; tags present: loss_metrics"):
        load_curve(only_train, validation=True)
    csv = tmp_path / "run.csv"
    csv.write_text("step,loss,validation_loss\n" + "".join(f"{s},{v!r},{v + 1!r}\n"
                                                           for s, v in zip(STEPS.tolist(), LOSS.tolist())))
    np.testing.assert_array_equal(load_curve(csv, validation=True).values, LOSS + 1)
    sparse = tmp_path / "sparse.csv"  # evaluated every 10 steps: the other rows' cells are empty
    sparse.write_text("step,loss,val_loss\n" + "".join(f"{s},{v!r},{v + 1 if s % 10 == 0 else ''}\n"
                                                      for s, v in zip(STEPS.tolist(), LOSS.tolist())))
    np.testing.assert_array_equal(load_curve(sparse, validation=True).steps, STEPS[STEPS % 10 == 0])
    with pytest.raises(CurveError, match=r"sparse.csv:2: missing 'val_loss'"):  # control: as the training loss
        load_curve(sparse, loss_key="val_loss")
    train_csv = tmp_path / "train.csv"
    train_csv.write_text("step,loss\n1,2.0\n2,1.5\n")
    with pytest.raises(CurveError, match="no validation loss column"):
        load_curve(train_csv, validation=True)
    losses = tmp_path / "losses.txt"
    losses.write_text("# step loss\n" + "".join(f"{s} {v!r}\n" for s, v in zip(STEPS.tolist(), LOSS.tolist())))
    assert load_curve(losses).values.size == STEPS.size  # control: a torchtitan loss file loads
    with pytest.raises(CurveError, match="loss files hold the training loss only"):
        load_curve(losses, validation=True)


def test_torchtitan_validation_lines_are_the_validation_loss_never_training_points(tmp_path):
    """torchtitan's validator prints 'validate step: N  loss: X  memory: ...  tps: ...' in colour (its
    MetricsProcessor.log_validation); those lines matched the training pattern and replaced the training loss at
    every evaluation, reported as restarts."""
    yellow, green, turquoise, blue, reset = "\x1b[33m", "\x1b[32m", "\x1b[36m", "\x1b[34m", "\x1b[39m"
    lines = []
    for s, v in zip(STEPS.tolist(), LOSS.tolist()):
        lines.append(f"[titan] step: {s:2}  loss: {v:7.4f}  grad_norm: 1.2500  memory: 1.00GiB(1.00%)  tps: 1,000")
        if s % 10 == 0:
            lines.append(f"[titan] {yellow}validate step: {s:2}  {green}loss: {v + 1:7.4f}  {turquoise}memory: "
                         f"1.00GiB(1.00%)  {blue}tps: 2,000{reset}")
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n")
    train = load_curve(log)
    np.testing.assert_allclose(train.values, LOSS, atol=5e-5)  # the training loss at every step, no validation
    assert not train.meta.restarts and not train.meta.warnings
    np.testing.assert_allclose(train.extras["val_loss"].values, LOSS[STEPS % 10 == 0] + 1, atol=5e-5)
    val = load_curve(log, validation=True)
    np.testing.assert_array_equal(val.steps, STEPS[STEPS % 10 == 0])
    np.testing.assert_allclose(val.values, LOSS[STEPS % 10 == 0] + 1, atol=5e-5)
    without = tmp_path / "no_val.log"  # control: a log without validation lines has no validation loss
    without.write_text("\n".join(x for x in lines if "validate" not in x) + "\n")
    assert "val_loss" not in load_curve(without).extras
    with pytest.raises(CurveError, match="no torchtitan validation lines"):
        load_curve(without, validation=True)


def test_a_tag_logged_in_two_split_folders_is_refused_one_split_or_restart_folders_are_read(tmp_path):
    """One writer per split (train/, validation/, as Keras and Lightning lay them out) logging the same tag is
    refused: merged, its validation points would read as restarts; restart folders (torchtitan's timestamped ones)
    and one split's folder given alone are read (the controls)."""
    run = tmp_path / "run"
    for split, off in (("train", 0.0), ("validation", 0.5)):
        (run / split).mkdir(parents=True)
        write_scalars(run / split / "events.out.tfevents.1.host", {"epoch_loss": (STEPS, LOSS + off)})
    with pytest.raises(CurveError, match="logged in the split folders train, validation; give the one to compare"):
        load_curve(run, tag="epoch_loss")
    np.testing.assert_allclose(load_curve(run / "train", tag="epoch_loss").values, LOSS, rtol=1e-6)
    restarts = tmp_path / "tb"
    for stamp, steps in (("20260101-0000", STEPS[:30]), ("20260101-0100", STEPS[20:])):
        (restarts / stamp).mkdir(parents=True)
        write_scalars(restarts / stamp / f"events.out.tfevents.{stamp[-4:]}.host", {"loss": (steps, 10.0 / steps)})
    c = load_curve(restarts)
    np.testing.assert_array_equal(c.steps, STEPS)
    assert len(c.meta.restarts) == 1  # the second folder takes over at step 21


def test_a_curve_loaded_within_reading_once_is_parsed_once_and_shared_read_only(tmp_path):
    """Within ``numerics.files.reading_once`` one file and series is parsed once: every caller gets the same curve,
    whose arrays cannot be written; another series of the file is its own curve; outside, each load is fresh."""
    from numerics.files import reading_once

    rows = [{"step": int(s), "loss": float(v), "val_loss": float(v) + 0.1} for s, v in zip(STEPS, LOSS)]
    (tmp_path / "bf16").mkdir()
    path = _jsonl(tmp_path / "bf16" / "metrics.jsonl", rows)
    assert load_curve(path) is not load_curve(path)  # the control: outside the block
    with reading_once():
        train = load_curve(path)
        assert load_curve(tmp_path / "bf16" / ".." / "bf16" / "metrics.jsonl") is train  # the same file, by any name
        val = load_curve(path, validation=True)
        assert val is not train and val.values[0] == pytest.approx(LOSS[0] + 0.1)
        with pytest.raises(ValueError, match="read-only"):
            train.values[0] = 0.0
    np.testing.assert_array_equal(load_curve(path).values, LOSS)
