"""Token streams: the embedded corpus, user formats, deterministic batching, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from convergence.train.data import Batches, DataSpec, default_corpus_documents, load_tokens
from numerics.errors import BadInput


def test_default_corpus_is_deterministic_and_split_disjointly():
    a, b = load_tokens(DataSpec()), load_tokens(DataSpec())
    assert a.meta["digest"] == b.meta["digest"]
    assert a.vocab_size == 256 and a.train.max() < 256
    assert a.meta["documents"]["val"] > 0 and len(a.train) > 1_000_000
    docs = list(default_corpus_documents())
    assert not any("/test/" in f"/{k}" or "\r" in t for k, t in docs)


def test_batches_are_a_function_of_seed_and_step():
    tokens = np.arange(10_000, dtype=np.uint16)  # distinct values: a window is named by its first
    a, b = Batches(tokens, batch=4, seq=16, seed=3), Batches(tokens, batch=4, seq=16, seed=3)
    assert all(np.array_equal(a.batch_at(s), b.batch_at(s)) for s in (0, 7, 200, 5))
    c = Batches(tokens, batch=4, seq=16, seed=4)
    assert not np.array_equal(a.batch_at(0), c.batch_at(0))
    epoch = np.concatenate([a.batch_at(s)[:, 0] for s in range(a.windows // 4)])
    assert len(set(epoch.tolist())) == len(epoch)  # one epoch visits each window once


def test_a_larger_held_out_share_holds_out_a_superset_of_the_documents_and_trains_on_the_rest(tmp_path):
    import re

    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": f"document <{i:04d}> ends\n"}) + "\n"
                                              for i in range(400)))

    def split(percent):
        t = load_tokens(DataSpec(path=str(tmp_path / "d.jsonl"), val_percent=percent))
        ids = [set(re.findall(r"<(\d{4})>", bytes(part.astype(np.uint8)).decode())) for part in (t.train, t.val)]
        return t, *ids

    default, train2, val2 = split(None)
    _, _, explicit2 = split(2)
    large, train20, val20 = split(20)
    assert val2 == explicit2 and default.meta["documents"]["val"] == len(val2)  # None is the default 2 %
    assert val2 < val20 and 60 <= len(val20) <= 100  # a larger share holds out a superset
    assert not train20 & val20 and len(train20 | val20) == 400 and not train2 & val2
    ids = np.arange(10_000, dtype=np.uint32)
    ids.tofile(tmp_path / "t.bin")
    b = load_tokens(DataSpec(path=str(tmp_path / "t.bin"), bin_dtype="uint32", val_percent=10))
    assert len(b.val) == 1000 and np.array_equal(b.val, ids[-1000:])


def test_validation_batches_are_spread_over_the_held_out_split_and_the_same_every_time():
    tokens = np.arange(100 * 16 + 1, dtype=np.uint16)  # 100 windows of 16: 25 batches of 4
    val = Batches(tokens, batch=4, seq=16, seed=0)
    every = list(val.eval_batches(1000))
    assert len(every) == 25 and [int(b[0, 0]) for b in every] == [16 * 4 * i for i in range(25)]  # all, in order
    five = list(val.eval_batches(5))
    assert [int(b[0, 0]) // 64 for b in five] == [0, 5, 10, 15, 20]  # spread, not the first five
    assert all(np.array_equal(x, y) for x, y in zip(five, val.eval_batches(5)))


def test_too_few_tokens_is_reported():
    with pytest.raises(BadInput, match="fewer than one batch"):
        Batches(np.zeros(100, np.uint16), batch=4, seq=32, seed=0)


def test_user_text_jsonl_and_bin(tmp_path):
    (tmp_path / "a.txt").write_text("hello world\r\n" * 50)
    t = load_tokens(DataSpec(path=str(tmp_path / "a.txt")))
    assert bytes(t.train.astype(np.uint8)[:13]) + bytes(t.val.astype(np.uint8)[:13]) != b""
    assert b"\r" not in bytes(np.concatenate([t.train, t.val]).astype(np.uint8))
    with open(tmp_path / "d.jsonl", "w") as f:
        for i in range(200):
            f.write(json.dumps({"text": f"document {i} " * 5}) + "\n")
    j = load_tokens(DataSpec(path=str(tmp_path / "d.jsonl")))
    assert j.meta["documents"]["train"] + j.meta["documents"]["val"] == 200 and j.meta["documents"]["val"]
    ids = (np.arange(5000) % 1000).astype(np.uint32)
    ids.tofile(tmp_path / "t.bin")
    b = load_tokens(DataSpec(path=str(tmp_path / "t.bin"), bin_dtype="uint32"))
    assert b.vocab_size == 1000 and np.array_equal(np.concatenate([b.train, b.val]), ids)


def test_bad_data_inputs_are_one_line_errors(tmp_path):
    with pytest.raises(BadInput, match="does not exist"):
        load_tokens(DataSpec(path=str(tmp_path / "missing.txt")))
    (tmp_path / "bad.jsonl").write_text('{"txt": 1}\n')
    with pytest.raises(BadInput, match="bad.jsonl:1"):
        load_tokens(DataSpec(path=str(tmp_path / "bad.jsonl")))
    with pytest.raises(BadInput, match="unknown tokenizer"):
        load_tokens(DataSpec(tokenizer="wordpiece"))


def test_bpe_is_trained_once_and_cached(tmp_path):
    pytest.importorskip("tokenizers", reason="optional: pip install 'mxval[bpe]'")
    (tmp_path / "c.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 400)
    spec = DataSpec(path=str(tmp_path / "c.txt"), tokenizer="bpe", bpe_vocab=300, cache_dir=str(tmp_path))
    a = load_tokens(spec)
    cached = sorted(tmp_path.glob("bpe-300-*.json"))
    assert len(cached) == 1
    mtime = cached[0].stat().st_mtime_ns
    b = load_tokens(spec)
    assert cached[0].stat().st_mtime_ns == mtime and np.array_equal(a.train, b.train)
    assert len(a.train) < 0.5 * len("the quick brown fox jumps over the lazy dog\n" * 400)


def test_the_16b_tokenizes_with_bpe_by_default_and_says_how_to_do_without(monkeypatch, tmp_path, capsys):
    """The 16b trains on a BPE tokenizer (as many ids as its 102,400 rows the corpus yields) unless
    --tokenizer says otherwise; other models keep bytes. Without the tokenizers package the default is one line
    naming both ways out, exit 2, before any model is built."""
    import sys

    from convergence.__main__ import main as convergence_main
    from convergence.train.cli import config_from_args, train_parser

    def spec(*argv):
        return config_from_args(train_parser().parse_args(["--steps", "1", "--out", str(tmp_path), *argv])).data

    assert (spec("--model", "16b").tokenizer, spec("--model", "16b").bpe_vocab) == ("bpe", 102400)
    assert spec("--model", "16b", "--tokenizer", "byte").tokenizer == "byte"
    assert spec("--model", "proxy").tokenizer == "byte"
    assert spec("--model", "tiny", "--tokenizer", "bpe").bpe_vocab == 4096
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import fails as if it were not installed
    rc = convergence_main(["train", "--model", "16b", "--steps", "1", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "mxval[bpe]" in err and "--tokenizer byte" in err
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())  # nothing written


def test_a_single_text_file_holds_out_its_tail_not_its_training_text(tmp_path):
    """A text file is one document, and documents are held out whole: a single file holds out its tail, from a
    line start, rather than validate on its own training text; a file of several documents is split by document
    (the control)."""
    lines = [f"line {i} of the only document\n" for i in range(1000)]
    (tmp_path / "one.txt").write_text("".join(lines))
    for percent, share in ((None, 2), (20, 20)):
        t = load_tokens(DataSpec(path=str(tmp_path / "one.txt"), val_percent=percent))
        train, val = (bytes(x.astype(np.uint8)).decode() for x in (t.train, t.val))
        assert train + val == "".join(lines) and val.startswith("line ")  # cut at a line start, nothing lost
        assert abs(len(val) / (len(train) + len(val)) - share / 100) < 0.01  # the asked share, to a line
        assert t.meta["digest"]["train"] != t.meta["digest"]["val"] and "held_out" in t.meta
    (tmp_path / "one.jsonl").write_text(json.dumps({"text": "".join(lines)}) + "\n")
    j = load_tokens(DataSpec(path=str(tmp_path / "one.jsonl")))
    assert len(j.val) and not np.array_equal(j.train[: len(j.val)], j.val)
    (tmp_path / "two.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in ("a" * 300, "b" * 300)))
    two = load_tokens(DataSpec(path=str(tmp_path / "two.jsonl")))
    assert "held_out" not in two.meta and two.meta["documents"] == {"train": 1, "val": 1}
    (tmp_path / "short.txt").write_text("x")
    with pytest.raises(BadInput, match="too short to hold out"):
        load_tokens(DataSpec(path=str(tmp_path / "short.txt")))


def test_a_bin_of_the_other_dtype_is_refused_not_read_as_halves_or_pairs_of_ids(tmp_path):
    """A .bin read as the wrong --data-dtype trained in silence: uint32 ids as uint16 on their halves (every
    second id 0), uint16 ids as uint32 on pairs (ids in the billions), a stray byte dropped. Each is refused
    with one line naming --data-dtype; the right dtype reads as before (the control)."""
    ids = (np.arange(5000) % 1000).astype(np.uint32)
    ids.tofile(tmp_path / "u32.bin")
    with pytest.raises(BadInput, match="--data-dtype uint32"):
        load_tokens(DataSpec(path=str(tmp_path / "u32.bin")))
    (ids.astype(np.uint16) + 1).tofile(tmp_path / "u16.bin")
    with pytest.raises(BadInput, match="more than any tokenizer's"):
        load_tokens(DataSpec(path=str(tmp_path / "u16.bin"), bin_dtype="uint32"))
    (tmp_path / "odd.bin").write_bytes(bytes(range(1, 100)) * 3)
    with pytest.raises(BadInput, match="not a whole number of uint16 ids"):
        load_tokens(DataSpec(path=str(tmp_path / "odd.bin")))
    assert load_tokens(DataSpec(path=str(tmp_path / "u16.bin"))).vocab_size == 1001  # ids 1..1000
    assert load_tokens(DataSpec(path=str(tmp_path / "u32.bin"), bin_dtype="uint32")).vocab_size == 1000
