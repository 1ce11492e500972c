"""python -m convergence profile-step on the CPU: the tiny model's steps profiled, the host's time by group, the GPU
figures null; a kept trace read again gives the same result; outputs are never replaced unasked."""

from __future__ import annotations

import json

import pytest

from convergence.train.perf import profile_step

TINY = ["--model", "tiny", "--device", "cpu", "--batch", "1", "--seq", "32", "--warmup", "1", "--steps", "2"]


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile")
    code = profile_step.main([*TINY, "--json", str(out / "p.json"), "--trace", str(out / "t.json.gz")])
    return code, out


def test_profile_step_on_cpu_reports_host_time_by_group_and_null_gpu_figures(profiled):
    code, out = profiled
    r = json.loads((out / "p.json").read_text())
    assert code == 0 and r["kind"] == profile_step.KIND and r["recipe"] == "bf16" and r["kernel"] is None
    assert r["steps"] == 2 and r["step_ms"] > 0 and r["wall_ms"] > 0
    assert r["gpu"] is None and r["top_kernels"] is None and r["syncs_by_caller"] is None
    # the tiny model's matmuls and AdamW's update run on the host here: their time lands in their groups
    assert r["groups"]["gemm"]["host_self_ms"] > 0 and r["groups"]["optimizer"]["host_self_ms"] > 0
    assert r["groups"]["cast"]["host_self_ms"] == 0  # BF16 casts nothing to MX
    assert r["top_host_ops"] and {"torch", "gpus"} <= r["environment"].keys()


def test_profile_step_reads_a_kept_trace_to_the_same_result(profiled, tmp_path, capsys):
    _, out = profiled
    assert profile_step.main(["--from-trace", str(out / "t.json.gz"), "--json", str(tmp_path / "again.json")]) == 0
    assert json.loads((tmp_path / "again.json").read_text()) == json.loads((out / "p.json").read_text())
    assert "unprofiled" in capsys.readouterr().out


def test_profile_step_keeps_an_existing_output_without_force(profiled, capsys):
    _, out = profiled
    before = (out / "p.json").read_bytes()
    assert profile_step.main([*TINY, "--json", str(out / "p.json")]) == 2
    assert "exists" in capsys.readouterr().err and (out / "p.json").read_bytes() == before


@pytest.mark.parametrize(("argv", "words"), [
    ([*TINY, "--steps", "0"], "must be > 0"),
    ([*TINY, "--recipe", "fp4"], "unknown recipe"),
    ([*TINY, "--recipe", "mxfp8", "--mxfp8-kernel", "real"], "SM100"),
    ([*TINY, "--recipe", "mxfp8-e2m1", "--mxfp8-kernel", "emulated"], "kernel 'fast' only"),
    (["--from-trace", "{tmp}/missing.json.gz"], "--from-trace"),
    (["--from-trace", "{tmp}/other.json"], "not a trace kept"),
])
def test_profile_step_bad_input_is_one_line_and_exit_2(argv, words, tmp_path, capsys):
    (tmp_path / "other.json").write_text(json.dumps({"traceEvents": []}))
    assert profile_step.main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err and "Traceback" not in err
