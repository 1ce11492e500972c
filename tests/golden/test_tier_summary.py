"""golden.tier_summary: a GPU tier's pytest log recorded with its counts, reasons and environment."""

from __future__ import annotations

import json

import pytest

from golden import integrity, recorded, tier_summary
from numerics.errors import BadInput

# The shape of a real tier log (one H200), shortened.
GREEN = """\
.........................................................x........ss.... [ 70%]
..................ssssssssssxx                                           [100%]
=========================== short test summary info ============================
SKIPPED [1] tests/numerics/ep/test_deepep.py:15: deep_ep is not installed: build DeepEP v1.2.1
SKIPPED [10] tests/numerics/tensor/test_subjects.py:65: subject microxcaling unavailable: not importable
XFAIL tests/numerics/tensor/test_fast_cast.py::test_fast_cast_torchao_rceil_rounds_alike_on_cpu_and_cuda - F5: torchao
XFAIL tests/numerics/tensor/test_torchao_findings.py::test_rceil_F5[e4m3] - F5: device dependent
87 passed, 14 skipped, 951 deselected, 3 xfailed in 101.09s (0:01:41)
"""
RED = """\
F.x
=========================== short test summary info ============================
FAILED tests/convergence/train/test_train.py::test_check_memory_on_cuda - ValueError: Expected a specified index
ERROR tests/numerics/ep/test_deepep.py::test_dispatch - RuntimeError: NCCL error
XFAIL tests/a.py::test_b
======== 1 failed, 83 passed, 1 xfailed, 2 warnings, 1 error in 80.01s (0:01:20) =========
"""


def test_a_green_log_gives_its_counts_and_every_reason():
    doc = tier_summary.parse(GREEN)
    assert doc["counts"] == {"passed": 87, "skipped": 14, "deselected": 951, "xfailed": 3}
    assert doc["summary"].startswith("87 passed") and doc["summary"].endswith("(0:01:41)")
    assert [s["count"] for s in doc["skipped"]] == [1, 10] and "microxcaling" in doc["skipped"][1]["reason"]
    assert doc["skipped"][0]["where"] == "tests/numerics/ep/test_deepep.py:15"
    assert [x["test"].split("::")[1] for x in doc["xfailed"]] == [
        "test_fast_cast_torchao_rceil_rounds_alike_on_cpu_and_cuda", "test_rceil_F5[e4m3]"]
    assert doc["failed"] == doc["errors"] == []


def test_a_red_log_lists_its_failures():
    doc = tier_summary.parse(RED)
    assert doc["counts"] == {"failed": 1, "passed": 83, "xfailed": 1, "warnings": 2, "errors": 1}
    assert doc["failed"][0]["test"].endswith("test_check_memory_on_cuda") and "index" in doc["failed"][0]["reason"]
    assert doc["errors"][0]["reason"] == "RuntimeError: NCCL error" and doc["xfailed"][0]["reason"] == ""


def test_a_log_cut_short_is_refused():
    with pytest.raises(BadInput, match="no pytest counts line"):
        tier_summary.parse(GREEN.rsplit("87 passed", 1)[0])


@pytest.fixture()
def scratch_root(small_golden):
    return small_golden


def test_record_writes_the_file_and_its_sidecar_and_replaces_only_when_asked(scratch_root, tmp_path):
    log, env = tmp_path / "tier.log", tmp_path / "config.json"
    log.write_text(GREEN)
    env.write_text(json.dumps({"train": {}, "environment": {"torch": "2.11.0+cu130", "gpus": ["NVIDIA H200"],
                                                            "mxval_commit": "abc123"}}))
    out = tier_summary.record(log, hardware="h200test", command="pytest -m gpu", note="n", environment_from=env,
                              root=scratch_root)
    data = json.loads(out.read_text())
    meta = json.loads(recorded._meta_path(out).read_text())
    assert data["counts"]["passed"] == 87 and data["environment"]["torch"] == "2.11.0+cu130"
    assert meta["commit"] == "abc123" and meta["hardware"] == "h200test" and meta["versions"] == data["environment"]
    assert integrity.check(scratch_root) == [] and recorded.check(scratch_root) == []
    log.write_text(RED)
    with pytest.raises(BadInput, match="--force"):
        tier_summary.record(log, hardware="h200test", command="c", note="n", environment_from=env, root=scratch_root)
    assert json.loads(out.read_text())["counts"]["passed"] == 87  # untouched
    tier_summary.record(log, hardware="h200test", command="c", note="n", environment_from=env, root=scratch_root,
                        force=True)
    assert json.loads(out.read_text())["counts"]["failed"] == 1 and integrity.check(scratch_root) == []


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_a_cpu_machines_environment_is_not_taken_for_the_tiers(scratch_root, tmp_path):
    (tmp_path / "tier.log").write_text(GREEN)
    with pytest.raises(BadInput, match="--environment-from"):
        tier_summary.record(tmp_path / "tier.log", hardware="h200", command="c", note="n", root=scratch_root)


def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path):
    (tmp_path / "env.json").write_text("{}")
    (tmp_path / "tier.log").write_text(GREEN)
    for argv, words in (([str(tmp_path / "missing.log")], "missing.log"),
                        ([str(tmp_path / "tier.log"), "--environment-from", str(tmp_path / "env.json")],
                         "mxval_commit"),
                        ([str(tmp_path / "tier.log"), "--hardware", "../ep/x"], "a tag such as h200")):
        assert tier_summary.main(["--hardware", "h200", *argv, "--command", "c", "--note", "n"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, err
