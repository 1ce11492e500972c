"""numerics.files: a file is replaced whole or not at all, and nothing is overwritten unasked."""

from __future__ import annotations

import os
import stat

import pytest

from numerics.errors import BadInput
from numerics.files import atomic_path, atomic_write, check_writable


def test_atomic_write_replaces_whole_and_leaves_no_temporary(tmp_path):
    p = tmp_path / "out.json"
    atomic_write(p, "one\n")
    atomic_write(p, b"two\n", force=True)
    assert p.read_text() == "two\n" and sorted(os.listdir(tmp_path)) == ["out.json"]
    assert stat.S_IMODE(p.stat().st_mode) == 0o644  # not mkstemp's 0o600


def test_an_interrupted_write_keeps_the_old_file(tmp_path):
    p = tmp_path / "out.png"
    p.write_bytes(b"old")
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(p, force=True) as tmp:
            tmp.write_bytes(b"half a fi")
            raise KeyboardInterrupt
    assert p.read_bytes() == b"old" and sorted(os.listdir(tmp_path)) == ["out.png"]


@pytest.mark.parametrize("where, match", [
    ("exists", "exists; pass --force"), ("dir", "is a directory"), ("under_file", "is not a directory"),
    ("no_parent", "does not exist"),
])
def test_refusals_are_bad_input_and_change_nothing(tmp_path, where, match):
    (tmp_path / "f").write_text("keep")
    target = {"exists": tmp_path / "f", "dir": tmp_path, "under_file": tmp_path / "f" / "x",
              "no_parent": tmp_path / "a" / "x"}[where]
    for call in (lambda: check_writable(target), lambda: atomic_write(target, "new")):
        with pytest.raises(BadInput, match=match):
            call()
    assert (tmp_path / "f").read_text() == "keep" and sorted(os.listdir(tmp_path)) == ["f"]


def test_json_lines_skip_a_torn_last_line_and_refuse_a_torn_one_inside(tmp_path):
    """A killed run's metrics.jsonl ends in a line without its newline: this reader (profile, ep-identity, probes)
    skips that torn last line, as resume does; the same bytes inside the file, or a whole last line that is not
    JSON, stay damage (controls)."""
    from numerics.files import read_json_lines

    good = '{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n'
    kwargs = {"what": "metrics", "hint": "a run's metrics.jsonl", "need": {"step": int}}
    (tmp_path / "torn.jsonl").write_text(good + '{"step": 3, "lo')
    assert [r["step"] for r in read_json_lines(tmp_path / "torn.jsonl", **kwargs)] == [1, 2]
    (tmp_path / "inside.jsonl").write_text('{"step": 1, "lo\n' + good)
    with pytest.raises(BadInput, match="inside.jsonl:1: not a JSON line"):
        read_json_lines(tmp_path / "inside.jsonl", **kwargs)
    (tmp_path / "whole.jsonl").write_text(good + '{"step": 3, "lo\n')
    with pytest.raises(BadInput, match="whole.jsonl:3: not a JSON line"):
        read_json_lines(tmp_path / "whole.jsonl", **kwargs)


def test_removed_if_left_empty_removes_only_the_empty_folders_it_made(tmp_path):
    from numerics.files import removed_if_left_empty

    (tmp_path / "there").mkdir()
    with pytest.raises(BadInput), removed_if_left_empty(tmp_path / "there" / "a" / "b") as out:
        out.mkdir(parents=True)
        raise BadInput("refused after making --out")
    assert (tmp_path / "there").is_dir() and not (tmp_path / "there" / "a").exists()  # what was there stays
    with pytest.raises(KeyboardInterrupt), removed_if_left_empty(tmp_path / "c" / "d") as out:
        out.mkdir(parents=True)
        (out / "metrics.jsonl").write_text("{}\n")  # work done: kept, with the folders holding it
        raise KeyboardInterrupt
    assert (tmp_path / "c" / "d" / "metrics.jsonl").is_file()


def test_reading_once_hands_every_reader_the_first_read_and_ends_with_its_block(tmp_path):
    """Within ``reading_once`` a file is read once: a later reader gets the same bytes (whole, or their first
    ``limit``, as a read outside would give them, gzip or not) even after the file changed; after the block the
    file is read again (the control: without the block every read sees the change)."""
    import gzip

    from numerics.files import file_bytes, reading_once

    plain, packed = tmp_path / "a.jsonl", tmp_path / "b.jsonl.gz"
    text = b'{"step": 1, "loss": 2.0}\n' * 40
    plain.write_bytes(text)
    packed.write_bytes(gzip.compress(text, mtime=0))
    for path in (plain, packed):
        assert [file_bytes(path, 7), file_bytes(path)] == [text[:7], text]
        with reading_once():
            first = [file_bytes(path, 7), file_bytes(path)]
            path.write_bytes(b"changed\n")
            with reading_once():  # a nested block shares the outer one's reads
                assert [file_bytes(path, 7), file_bytes(path)] == first == [text[:7], text]
        assert file_bytes(path) == b"changed\n"
    with reading_once():
        with pytest.raises(OSError):
            file_bytes(tmp_path / "absent")  # a failed read is raised as before and remembers nothing
        (tmp_path / "absent").write_bytes(b"now here")
        assert file_bytes(tmp_path / "absent") == b"now here"


def test_reading_once_keeps_no_more_than_its_budget(tmp_path, monkeypatch):
    """A file that would take ``reading_once`` past its budget is read as outside it, each time (it sees a change);
    the files kept before it still give their first read."""
    from numerics import files

    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    first.write_bytes(b"a" * 60)
    second.write_bytes(b"b" * 60)
    monkeypatch.setattr(files, "_ONCE_BUDGET", 100)
    with files.reading_once():
        assert files.file_bytes(first) == b"a" * 60  # kept: 60 of 100 bytes
        assert files.file_bytes(second) == b"b" * 60  # 120 would pass the budget: not kept
        first.write_bytes(b"changed")
        second.write_bytes(b"changed")
        assert files.file_bytes(first) == b"a" * 60 and files.file_bytes(second) == b"changed"



def test_once_keeps_what_it_makes_within_the_budget_the_bytes_share(tmp_path, monkeypatch):
    """What ``once`` makes counts against ``reading_once``'s budget with the files' bytes: a value that would pass
    it is made each time (the control: one that fits is made once)."""
    from numerics import files

    (tmp_path / "log").write_bytes(b"a" * 60)
    monkeypatch.setattr(files, "_ONCE_BUDGET", 100)
    made = []

    def make(tag, size):
        made.append(tag)
        return b"x" * size

    with files.reading_once():
        files.file_bytes(tmp_path / "log")  # 60 of 100 bytes
        assert files.once("small", lambda: make("s", 30), len) is files.once("small", lambda: make("s", 30), len)
        files.once("big", lambda: make("b", 20), len)  # 60 + 30 + 20 would pass 100: not kept
        files.once("big", lambda: make("b", 20), len)
    assert made == ["s", "b", "b"]


def test_once_makes_each_key_once_within_reading_once_and_each_time_outside():
    """``once`` hands every caller within ``reading_once`` (nested blocks too) the first made value of a key; a
    failed make is raised and remembered as nothing; outside a block, and after it, every call makes afresh."""
    from numerics.files import once, reading_once

    made = []

    def make(tag):
        made.append(tag)
        return [tag]

    assert once("k", lambda: make("a"), len) is not once("k", lambda: make("a"), len)  # the control: outside, twice
    assert made == ["a", "a"]
    with reading_once():
        first = once("k", lambda: make("b"), len)
        with reading_once():
            assert once("k", lambda: make("c"), len) is first
        assert once("other", lambda: make("d"), len) == ["d"]
        with pytest.raises(ZeroDivisionError):
            once("bad", lambda: 1 / 0, len)
        assert once("bad", lambda: make("e"), len) == ["e"]
    assert made == ["a", "a", "b", "d", "e"]
    assert once("k", lambda: make("f"), len) == ["f"]
