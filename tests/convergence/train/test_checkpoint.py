"""Atomic checkpoints and torn-line-proof JSONL logs."""

from __future__ import annotations

import gzip
from pathlib import Path

import torch

from convergence.train.checkpoint import JsonlLog, load_checkpoint, plain, save_checkpoint
from convergence.train.model import Transformer
from numerics.layer.configs import tiny
from numerics.layer.recipes import apply_recipe, get_recipe


def test_jsonl_log_ignores_and_repairs_a_torn_last_line(tmp_path):
    log = JsonlLog(tmp_path / "m.jsonl")
    for s in range(1, 5):
        log.append({"step": s, "loss": float(s)})
    with open(log.path, "a") as f:
        f.write('{"step": 5, "lo')  # what a kill in the middle of a buffered write would leave
    assert [r["step"] for r in log.records()] == [1, 2, 3, 4]
    log.truncate_after(3)
    assert log.path.read_text().endswith("\n") and [r["step"] for r in log.records()] == [1, 2, 3]


def test_jsonl_log_reads_a_gzip_log_as_its_plain_one(tmp_path):
    """A finished protocol run's logs are compacted to gzip (convergence.protocol.folder.compact_run) and read back
    through JsonlLog: the same records, the torn last line of the plain file still left out."""
    log = JsonlLog(tmp_path / "m.jsonl")
    for s in range(1, 4):
        log.append({"step": s, "loss": float(s)})
    with open(log.path, "a") as f:
        f.write('{"step": 4, "lo')
    packed = tmp_path / "m.jsonl.gz"
    packed.write_bytes(gzip.compress(log.path.read_bytes(), mtime=0))
    assert JsonlLog(packed).records() == log.records() == [{"step": s, "loss": float(s)} for s in range(1, 4)]


def test_jsonl_log_refuses_damage_other_than_a_torn_last_line(tmp_path):
    """Only the last line may be torn (no newline: a kill leaves it); a whole line that is not a record, a .gz that
    is not gzip, bytes that are not UTF-8 are damage: BadInput naming the file (and line), never a shorter log.
    The control: the whole log, plain and packed, reads as written."""
    import pytest

    from numerics.errors import BadInput

    whole = b"".join(b'{"step": %d, "loss": 1.0}\n' % s for s in range(1, 5))
    plain, packed = tmp_path / "m.jsonl", tmp_path / "m.jsonl.gz"
    plain.write_bytes(whole)
    packed.write_bytes(gzip.compress(whole, mtime=0))
    assert [r["step"] for r in JsonlLog(plain).records()] == [r["step"] for r in JsonlLog(packed).records()] == [
        1, 2, 3, 4]
    cut = whole.replace(b'{"step": 2, "loss": 1.0}', b'{"step": 2, "lo')
    for path, data, where in ((plain, cut, ":2:"), (plain, whole.replace(b"1.0}\n", b"[1]\n", 1), ":1:"),
                              (packed, gzip.compress(cut, mtime=0), ":2:"),
                              (packed, gzip.compress(whole.replace(b"\n", b"}\n", 1), mtime=0), ":1:"),
                              (packed, whole, "not gzip"), (packed, b"", "not gzip"),
                              (plain, b"\xff\xfe" + whole, "not UTF-8")):
        path.write_bytes(data)
        with pytest.raises(BadInput, match="damaged") as e:
            JsonlLog(path).records()
        assert str(path) in str(e.value) and where in str(e.value), (data, e.value)


def test_jsonl_log_writes_no_nan(tmp_path):
    log = JsonlLog(tmp_path / "m.jsonl")
    log.append({"step": 1, "loss": float("nan")})
    assert log.records() == [{"step": 1, "loss": None}]


def test_checkpoint_of_an_mxfp8_model_is_plain_and_atomic(tmp_path):
    m = Transformer(tiny())
    m.init_weights(torch.Generator().manual_seed(0))
    apply_recipe(m, get_recipe("mxfp8"), "cpu")
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, {"model": m.state_dict(), "step": 3})
    assert not (tmp_path / "ckpt.pt.tmp").exists()
    state = load_checkpoint(path)
    assert all(type(t) is torch.Tensor for t in state["model"].values())
    want = plain(m.state_dict())
    assert all(torch.equal(want[k], state["model"][k]) for k in want)


def test_a_damaged_checkpoints_message_holds_torchs_whole_reason_on_one_line():
    """torch's reason for refusing a checkpoint often comes last, after a list of missing keys: the message holds
    all of it, on one line."""
    from convergence.train.placement import damaged

    missing = ", ".join(f'"layers.{i}.attn.wq.weight"' for i in range(12))
    exc = RuntimeError(f"Error(s) in loading state_dict for Transformer:\n\tMissing key(s) in state_dict: {missing}."
                       "\n\tsize mismatch for head.weight: copying a param with shape torch.Size([256, 64]) from "
                       "checkpoint, the shape in current model is torch.Size([260, 64]).")
    message = str(damaged(Path("run/checkpoint.pt"), exc))
    assert "\n" not in message and "\t" not in message
    assert message.count("layers.") == 12 and "the shape in current model is torch.Size([260, 64])." in message
