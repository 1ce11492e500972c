"""The bad-input matrix for python -m convergence compare, calibrate, probes and profile.

{missing file, empty file, truncated file, garbage bytes, a directory, an unwritable output, an existing
output, a wrong type or range} -> one line on stderr, exit 2, no traceback, every existing file unchanged.
"Truncated" here is a file cut inside its first record: a file cut inside a later line is a run still
writing (its last line is skipped with a warning) and a shortened run is judged 'incomplete' (exit 4).
"""

from __future__ import annotations

import hashlib
import json

import pytest

from convergence.__main__ import main


@pytest.fixture()
def runs(tmp_path):
    b, c = tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    for p, drift in ((b, 0.0), (c, 0.001)):
        p.write_text("".join(json.dumps({"step": s, "loss": 3.0 / s ** 0.3 + drift}) + "\n" for s in range(1, 401)))
    (tmp_path / "afile").write_text("x")
    (tmp_path / "existing.json").write_text("mine")
    (tmp_path / "emptydir").mkdir()
    return tmp_path


def _sums(root):
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}


def _candidate(root, kind):
    p = root / f"cand_{kind}.jsonl"
    if kind == "missing":
        return root / "nope.jsonl"
    if kind == "directory":
        return root / "emptydir"
    data = {"empty": b"", "truncated": b'{"step": 1, "lo', "garbage": bytes(range(256)) * 4}[kind]
    p.write_bytes(data)
    return p


CASES = [
    ("missing", None), ("empty", None), ("truncated", None), ("garbage", None), ("directory", None),
    (None, ["--json", "ROOT/afile/v.json"]), (None, ["--json", "ROOT/emptydir"]),
    (None, ["--plot", "ROOT/nodir/cmp.png"]), (None, ["--json", "ROOT/existing.json"]),
    (None, ["--margin", "abc"]), (None, ["--margin", "2"]), (None, ["--confidence", "1.5"]),
    (None, ["--coverage-fraction", "0.7"]), (None, ["--format", "xml"]), (None, ["--json", "ROOT/v.json",
                                                                                  "--plot", "ROOT/v.json"]),
    # a run counted twice; thresholds that would make every point a spike or a divergence
    (None, ["--baseline", "ROOT/b.jsonl"]), (None, ["--baseline", "ROOT/./c.jsonl"]),
    (None, ["--spike-sigma", "0"]), (None, ["--spike-sigma", "-3"]), (None, ["--final-rise", "-1"]),
    (None, ["--final-rise", "nan"]),
    # a TensorBoard tag given for JSONL runs would be ignored in silence
    (None, ["--tag", "loss_metrics/global_avg_loss"]),
]


@pytest.mark.parametrize("bad_input, extra", CASES)
def test_compare_bad_input_is_one_line_exit_2_and_changes_nothing(runs, capsys, bad_input, extra):
    cand = _candidate(runs, bad_input) if bad_input else runs / "c.jsonl"
    before = _sums(runs)
    argv = ["compare", str(runs / "b.jsonl"), str(cand)] + [a.replace("ROOT", str(runs)) for a in extra or []]
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    cap = capsys.readouterr()
    assert code == 2, (cap.out, cap.err)
    assert cap.err.count("\n") == 1 and "Traceback" not in cap.err + cap.out and cap.out == ""
    assert _sums(runs) == before


def test_a_baseline_loss_of_zero_is_refused_a_candidates_is_judged(runs, capsys):
    """The comparison is relative to the baselines' loss: a 0 there would give intervals of nan %, so it is refused;
    the same zeros in the candidate are a difference of -100 %, judged (the control)."""
    zero = runs / "zero.jsonl"
    zero.write_text("".join(json.dumps({"step": s, "loss": 0.0}) + "\n" for s in range(1, 401)))
    assert main(["compare", str(zero), str(runs / "c.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "zero.jsonl: loss 0 at step 41: the comparison is relative" in err
    assert main(["compare", str(runs / "b.jsonl"), str(zero)]) == 1  # not_equivalent
    assert "-100.000%" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    ["--pairs", "abc"], ["--pairs", "0"], ["--bench", "--steps", "10"], ["--bench", "--steps", "2000", "--dir",
                                                                          "ROOT/afile"],
    ["--bench", "--steps", "2000", "--dir", "ROOT"],
    # each mode's options in the other (--dir without --bench would be ignored in silence)
    ["--dir", "ROOT/new"], ["--steps", "2000"], ["--bench", "--pairs", "3", "--steps", "2000"],
])
def test_calibrate_bad_input_is_one_line_exit_2_and_changes_nothing(runs, capsys, argv):
    before = _sums(runs)
    try:
        code = main(["calibrate", *[a.replace("ROOT", str(runs)) for a in argv]])
    except SystemExit as exc:
        code = exc.code
    cap = capsys.readouterr()
    assert code == 2 and cap.err.count("\n") == 1 and "Traceback" not in cap.err + cap.out
    assert _sums(runs) == before


@pytest.mark.parametrize("bad_input, extra", [
    ("missing", None), ("empty", None), ("truncated", None), ("garbage", None), ("directory", None),
    (None, ["--plot", "ROOT/existing.json"]), (None, ["--plot", "ROOT/nodir/p.png"]),
    (None, ["--json", "ROOT/afile/x"]),
    (None, ["--name", "a", "--name", "b"]), ("no-layers", None),
])
def test_probes_bad_input_is_one_line_exit_2_and_changes_nothing(runs, capsys, bad_input, extra):
    good = runs / "probes.jsonl"
    good.write_text(json.dumps({"step": 10, "layers": {"layers.0.attention.wq": {"out_sqnr_db": 30.0}}}) + "\n")
    if bad_input == "no-layers":
        path = runs / "nolayers.jsonl"
        path.write_text(json.dumps({"step": 10, "loss": 2.0}) + "\n")
    else:
        path = _candidate(runs, bad_input) if bad_input else good
    _one_line_exit_2_nothing_changed(runs, capsys, ["probes", str(path), *_extra_args(runs, extra)])


@pytest.mark.parametrize("bad_input, extra", [
    ("missing", None), ("empty", None), ("truncated", None), ("garbage", None), ("directory", None),
    (None, ["--plot", "ROOT/existing.json"]), (None, ["--plot", "ROOT/nodir/p.png"]),
    (None, ["--json", "ROOT/afile/x"]), (None, ["--name", "a", "--name", "b"]), ("not-a-record", None),
])
def test_profile_bad_input_is_one_line_exit_2_and_changes_nothing(runs, capsys, bad_input, extra):
    if bad_input == "not-a-record":
        path = runs / "list.jsonl"
        path.write_text("[1, 2]\n")
    else:
        path = _candidate(runs, bad_input) if bad_input else runs / "b.jsonl"
    _one_line_exit_2_nothing_changed(runs, capsys, ["profile", str(path), *_extra_args(runs, extra)])


def _extra_args(runs, extra):
    return [a.replace("ROOT", str(runs)) for a in extra or []]


def _one_line_exit_2_nothing_changed(runs, capsys, argv):
    before = _sums(runs)
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    cap = capsys.readouterr()
    assert code == 2, (cap.out, cap.err)
    assert cap.err.count("\n") == 1 and "Traceback" not in cap.err + cap.out
    assert _sums(runs) == before

