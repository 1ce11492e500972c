"""python -m golden check | regenerate: integrity first, content second; every bad input is one line and exit 2.

The bad-input matrix runs on a small golden tree (``--root``; tests/golden/conftest.py) and checks that no file
changed.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from golden import integrity
from golden.__main__ import main

MISSING, EMPTY, TRUNCATED, GARBAGE, DIRECTORY = "missing", "empty", "truncated", "garbage", "directory"


@pytest.fixture()
def root(small_golden):
    return small_golden


def _sums(root):
    return {p: (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir") for p in root.rglob("*")}


def _run(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse usage errors leave through SystemExit(2), also one line
        code = exc.code
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def _damage(root, what, rel):
    p = root / rel
    if what == MISSING:
        p.unlink()
    elif what == EMPTY:
        p.write_bytes(b"")
    elif what == TRUNCATED:
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    elif what == GARBAGE:
        p.write_bytes(bytes(range(256)) * 3)
    else:
        p.unlink()
        p.mkdir()


@pytest.mark.parametrize("what", [MISSING, EMPTY, TRUNCATED, GARBAGE, DIRECTORY])
@pytest.mark.parametrize("rel", ["layers/layer_stats_tiny__cpu.json", "training/proxy_bf16_seed0__h200.jsonl",
                                 "tensor/mx_vectors__any.meta.json", "MANIFEST.json"])
def test_golden_check_damaged_file_is_one_line_exit_2_and_changes_nothing(root, capsys, what, rel):
    _damage(root, what, rel)
    before = _sums(root)
    code, out, err = _run(["check", "--root", str(root)], capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err + out
    assert rel.split("/")[-1] in err
    assert _sums(root) == before


def test_golden_check_reports_a_deleted_file_and_its_sidecar_and_an_extra_one(root, capsys):
    # a data file and its sidecar both gone: the manifest still names them
    (root / "layers/layer_stats_tiny__cpu.json").unlink()
    (root / "layers/layer_stats_tiny__cpu.meta.json").unlink()
    (root / "ep/stray__h200.json").write_text("{}")
    code, out, err = _run(["check", "--root", str(root)], capsys)
    assert code == 2 and "layers/layer_stats_tiny__cpu.meta.json: missing" in out
    assert "ep/stray__h200.json: not in MANIFEST.json" in out


def test_golden_check_invalid_json_with_a_matching_checksum_is_one_line(root, capsys):
    p = root / "ep/check__v1.2.1__h200x2.json"
    p.write_text('{"cases": [1, 2')
    side = root / "ep/check__v1.2.1__h200x2.json.meta.json"
    meta = json.loads(side.read_text())
    meta["sha256"] = integrity.sha256(p)
    side.write_text(json.dumps(meta))
    code, out, err = _run(["check", "--root", str(root)], capsys)
    assert code == 2 and "ep/check__v1.2.1__h200x2.json: not valid JSON (Expecting" in err and err.count("\n") == 1


@pytest.mark.parametrize("manifest", ["[1]\n", "null\n", '"text"\n'])
def test_golden_check_a_manifest_that_is_json_but_not_an_object_is_one_line(root, capsys, manifest):
    """A manifest of valid JSON that is not an object is one line, as one that is not JSON is (the control: the
    damaged-file test above)."""
    (root / "MANIFEST.json").write_text(manifest)
    code, out, err = _run(["check", "--root", str(root)], capsys)
    assert code == 2 and "MANIFEST.json: not a mxval-golden-manifest-v1 manifest" in err and err.count("\n") == 1
    assert "Traceback" not in err + out


def test_golden_check_a_lowered_statistic_is_caught_by_the_checksum_and_by_the_comparison(root, capsys):
    # a statistic lowered in the golden file (28.46 -> 20.0): the checksum sees the edit, and with the checksum
    # updated too, the comparison with this machine's measurement does
    p = root / "layers/layer_stats_tiny__cpu.json"
    doc = json.loads(p.read_text())
    doc["records"][3]["sqnr_vs_fp32"] = 20.0
    p.write_text(json.dumps(doc, indent=1) + "\n")
    code, _, err = _run(["check", "--root", str(root), "--only", "layer_stats"], capsys)
    assert code == 2 and "layer_stats_tiny__cpu.json: SHA-256" in err
    side = root / "layers/layer_stats_tiny__cpu.meta.json"  # someone also updated the checksum
    meta = json.loads(side.read_text())
    meta["sha256"] = integrity.sha256(p)
    side.write_text(json.dumps(meta))
    code, out, err = _run(["check", "--root", str(root), "--only", "layer_stats"], capsys)
    assert code == 1 and "rise of" in out and "the subject changed" in out and err == ""


def test_golden_check_passes_on_an_intact_copy(root, capsys):
    code, out, err = _run(["check", "--root", str(root), "--only", "recorded"], capsys)
    assert (code, err) == (0, "") and "integrity                OK" in out


def test_golden_check_says_which_files_it_derives_again_and_which_it_only_checksums(root, capsys):
    """A checksum stops accidents, not an edit made with its sidecar updated: the output says which files this
    machine derived again (their content checked) and how many it checked by checksum alone."""
    code, out, _ = _run(["check", "--root", str(root), "--only", "tensor_vectors", "--only", "recorded"], capsys)
    listed = len(integrity.load_manifest(root))
    assert code == 0
    assert "tensor_vectors           OK (re-derived here: tensor/mx_vectors__any.json)" in out
    assert "recorded                 OK (checksummed only here)" in out
    assert f"checksummed only         {listed - 1} of {listed} files: {integrity.PROTECTS}" in out


@pytest.mark.parametrize("argv, match", [
    (["check", "--only", "nope"], "unknown golden artifact nope"),
    (["verify"], "invalid choice"),
    (["check", "--root", "ROOT/missing"], "no such directory"),
    (["check", "--root", "ROOT/MANIFEST.json"], "not a directory"),
    (["regenerate", "--root", "ROOT/MANIFEST.json"], "not a directory"),
    (["regenerate", "--only", "recorded", "--root", "ROOT"], "not regenerated on this machine"),
])
def test_golden_cli_bad_input_is_one_line_exit_2_and_changes_nothing(root, capsys, argv, match):
    before = _sums(root)
    code, out, err = _run([a.replace("ROOT", str(root)) for a in argv], capsys)
    assert code == 2 and match in err and err.count("\n") == 1 and "Traceback" not in err + out
    assert _sums(root) == before


def test_golden_regenerate_recorded_lists_the_command_for_each_file(root, capsys):
    code, out, _ = _run(["regenerate", "--only", "recorded", "--root", str(root)], capsys)
    assert code == 2 and "training/proxy_bf16_seed0__h200.jsonl (h200): CUDA_VISIBLE_DEVICES=0 python3 -m" in out


def test_golden_regenerate_tensor_vectors_keeps_the_set_whole(root, capsys):
    code, out, _ = _run(["regenerate", "--only", "tensor_vectors", "--root", str(root)], capsys)
    assert code == 0 and "no byte changed" in out
    assert integrity.check(root) == []


def test_golden_regenerate_into_an_empty_folder_says_it_writes_a_new_tree(root, tmp_path, capsys):
    """--root at a folder with no MANIFEST.json (a typo, a new checkout's wrong path) is said before anything is
    written, and each kind's file is called new; on a whole tree the line is absent (the control)."""
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    argv = ["regenerate", "--only", "tensor_vectors", "--only", "layer_stats", "--root", str(empty)]
    code, out, _ = _run(argv, capsys)
    assert "layer_stats_tiny__cpu.json: 80 records; new file" in out  # not "80 changed"
    first = f"root                     {empty} has no MANIFEST.json: writing a new golden tree there"
    assert code == 0 and out.splitlines()[0] == first
    assert "new file" in out and integrity.check(empty) == []  # a tree: the file is listed in a new manifest
    code, out, _ = _run(["regenerate", "--only", "tensor_vectors", "--root", str(root)], capsys)
    assert code == 0 and "has no MANIFEST.json" not in out


@pytest.mark.parametrize("field, value", [("data", 5), ("sidecar", None), ("kind", ["x"]), ("data", "")])
def test_golden_check_refuses_a_manifest_entry_that_is_not_a_path(root, capsys, field, value):
    manifest = json.loads((root / "MANIFEST.json").read_text())
    manifest["files"][0][field] = value
    (root / "MANIFEST.json").write_text(json.dumps(manifest))
    before = _sums(root)
    code, out, err = _run(["check", "--root", str(root)], capsys)
    assert code == 2 and err.count("\n") == 1 and f"not a {integrity.FORMAT} manifest" in err, err
    assert "Traceback" not in err + out and _sums(root) == before
