"""``python -m numerics.ep check`` and ``bench`` on CPU (gloo): tables, JSON, exit codes, refusals, power to fail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from numerics.ep.__main__ import main as ep_main
from numerics.ep.check import CheckRow, drive, format_table, verdict
from numerics.ep.launch import Session
from numerics.ep.strategies import CaseSpec, edge_specs, sample_specs

# E1's minimal input with 33 instead of 129 tokens (CPU time): every token of rank 1 goes to rank 0
# alone and 5% of combine values are specials (-0.0 among them), so many sums hold one row of -0.0
E1_SPEC = CaseSpec(world=2, seed=2, tokens=(0, 33), hidden=2048, topk=6, num_experts=64,
                   routing="starve_rank", starved=1, specials=0.05)

HERE = Path(__file__).resolve().parent


def test_check_cli_passes_reference_against_simulate_and_writes_json(tmp_path, capsys):
    out = tmp_path / "new" / "folder" / "check.json"  # the folders it names are made (a file there is refused)
    rc = ep_main(["check", "--world", "2", "--cases", "3", "--max-tokens", "70", "--no-edge", "--hidden", "2048",
                  "--timeout", "30", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "bad_input.topk_out_of_range" in text and "PASS: reference against simulate, 2 ranks (gloo)" in text
    doc = json.loads(out.read_text())
    assert doc["kind"] == "ep-check" and doc["passed"] is True and doc["status"] == "pass"
    assert doc["summary"].startswith("PASS: reference against simulate") and doc["known"] == {}
    assert doc["checks"]["combine"]["cases"] == 3 and doc["environment"]["torch"]
    # an existing report is not overwritten without --force: one line, exit 2
    assert ep_main(["check", "--world", "2", "--json", str(out)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err


def test_check_json_interrupted_while_written_leaves_the_old_report_whole(tmp_path, interrupt_writes_in, capsys):
    """--json is written to a temporary and renamed: a kill or Ctrl-C during the write leaves the old report whole
    (mxval validate reads check.json back as its communication level), and no temporary behind."""
    out = tmp_path / "check.json"
    out.write_text('{"old": true}\n')
    interrupt_writes_in(tmp_path)
    rc = ep_main(["check", "--world", "2", "--cases", "0", "--no-edge", "--no-bad-input", "--timeout", "30",
                  "--json", str(out), "--force"])
    assert rc == 130 and "interrupted" in capsys.readouterr().err
    assert json.loads(out.read_text()) == {"old": True}  # the old report, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["check.json"]  # no temporary left behind


@pytest.mark.parametrize("argv, words", [
    (["check", "--payload", "fp16"], "'fp16'"),
    (["check", "--backend", "deepep"], "deep_ep"),
    (["check", "--backend", "deepep-v2"], "deep_ep"),
    (["check", "--backend", "nccl"], "'nccl'"),
    (["check", "--backend", "no_such_module:Backend"], "no_such_module:Backend"),
    (["check", "--world", "1"], "--world 1"),
    (["check", "--world", "3"], "--world 3"),
    (["check", "--world", "6"], "--world 6"),
    (["check", "--num-sms", "7"], "--num-sms 7"),
    (["check", "--max-tokens", "9000"], "--max-tokens 9000"),
    (["check", "--max-elements", "0"], "--max-elements 0"),
    (["check", "--cases", "-1"], "--cases"),
    (["check", "--hidden", "100"], "'100'"),
    (["check", "--spec", "{not json"], "--spec"),
    (["check", "--spec", '{"world":2,"seed":1,"tokens":[4,4],"hidden":100,"topk":2,"num_experts":8}'],
     "hidden 100 must be a positive multiple of 8"),
    (["check", "--spec", '{"world":3,"seed":1,"tokens":[4,4,4],"hidden":128,"topk":2,"num_experts":8}'],
     "num_experts 8 is not a positive multiple of the world size 3"),
    (["check", "--world", "4", "--spec", '{"world":2,"seed":1,"tokens":[4,4],"hidden":128,"topk":2,"num_experts":8}'],
     "--spec"),
    # a --spec missing a field, or with a value of the wrong type or outside its range: one line, exit 2, not a
    # traceback (exit 1, which reads as a FAIL)
    (["check", "--spec", "{}"], "missing 6 required positional arguments"),
    (["check", "--spec", '{"world":2,"seed":0,"tokens":[4,4],"hidden":1073741824,"topk":2,"num_experts":64}'],
     "hidden 1073741824 is more than the 7168 the check's buffers are sized for"),  # it tried the allocation
    (["check", "--spec", "[4, 4]"], "not a JSON object"),
    (["check", "--spec", '{"world":"2","seed":0,"tokens":[4,4],"hidden":2048,"topk":2,"num_experts":64}'],
     "world must be an integer, got '2'"),
    (["check", "--spec", '{"world":2,"seed":0,"tokens":[4,4],"hidden":2048,"topk":true,"num_experts":64}'],
     "topk must be an integer, got True"),
    (["check", "--spec", '{"world":2,"seed":0,"tokens":[4,4],"hidden":2048.0,"topk":2,"num_experts":64}'],
     "hidden must be an integer, got 2048.0"),
    (["check", "--spec", '{"world":2,"seed":0,"tokens":[4,"4"],"hidden":2048,"topk":2,"num_experts":64}'],
     "tokens must be a list of integers"),
    (["check", "--spec", '{"world":2,"seed":0,"tokens":8,"hidden":2048,"topk":2,"num_experts":64}'],
     "tokens must be a list of integers"),
    (["check", "--spec", '{"world":2,"seed":0,"tokens":[4,4],"hidden":2048,"topk":2,"num_experts":64,"specials":NaN}'],
     "specials must be a fraction in [0, 1], got nan"),
    (["check", "--spec", '{"world":2,"seed":0,"tokens":[4,4],"hidden":2048,"topk":2,"num_experts":64,"mask":"0.1"}'],
     "mask must be a fraction in [0, 1]"),
    (["check", "--spec", '{"world":2,"seed":100000000000000000000,"tokens":[4,4],"hidden":2048,"topk":2,'
                         '"num_experts":64}'], "seed 100000000000000000000 must be from 0 to 4294967295"),
    (["check", "--spec", '{"world":2,"seed":0,"tokens":[4,4],"hidden":2048,"topk":2,"num_experts":64,'
                         '"routing":"starve_rank","starved":null}'], "starved must be an integer, got None"),
    # the sampled case space's options beside a --spec (the case given whole) would be ignored: refused
    (["check", "--payload", "fp8", "--cases", "5", "--spec",
      '{"world":2,"seed":1,"tokens":[4,4],"hidden":128,"topk":2,"num_experts":8}'],
     "--cases, --payload"),
    (["bench", "--shapes", "v4"], "--shapes 'v4'"),
    (["bench", "--backends", "deepep"], "deep_ep"),
    (["bench", "--backends", "nccl,deepep-v2"], "deep_ep"),
    (["bench", "--world", "3"], "--world 3"),
    (["bench", "--tokens", "0"], "--tokens"),
    (["bench", "--num-sms", "20,7"], "--num-sms '20,7'"),
    (["frobnicate"], "'frobnicate'"),
])
def test_ep_cli_bad_input_is_one_line_and_exit_2(argv, words, capsys, monkeypatch):
    """Refused before any process starts (a Session would fail the test), in one line that names what is at fault:
    the option and value, the missing package, or for a --spec the field and the rule it breaks."""
    def no_session(*a, **k):
        raise AssertionError("bad input reached the process launch")

    monkeypatch.setattr("numerics.ep.launch.Session.__enter__", no_session)
    assert ep_main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_case_spec_problem_accepts_every_case_of_the_space_and_its_json():
    """Control for the type checks of a --spec: no case that check draws itself is refused, before or after JSON
    (which turns the token tuple into a list and may spell a fraction as an int)."""
    specs = edge_specs(world=2) + sample_specs(20, world=2, seed=0)
    for spec in specs:
        assert spec.problem() is None, spec
        assert CaseSpec.from_json(spec.to_json()) == spec
    assert CaseSpec.from_json('{"world":2,"seed":0,"tokens":[0,4],"hidden":2048,"topk":6,"num_experts":64,'
                              '"specials":0,"mask":1}').problem() is None


@pytest.mark.parametrize("rank, printed", [("0", 1), ("1", 0)])
def test_check_under_torchrun_refuses_a_bad_world_before_joining_a_group(rank, printed, capsys, monkeypatch):
    """torchrun --nproc-per-node 3: every rank exits 2 before init_process_group; only rank 0 prints."""
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setattr("torch.distributed.init_process_group", lambda *a, **k: pytest.fail("joined a group"))
    assert ep_main(["check"]) == 2
    assert ep_main(["bench", "--backends", "nccl"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 2 * printed and err.count("--world 3 does not divide") == 2 * printed


def test_check_option_outside_its_choices_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        ep_main(["check", "--combine-start", "ieee"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "invalid choice: 'ieee'" in err and len(err.strip().splitlines()) == 1


def test_check_json_is_a_directory_or_existing_file_is_refused(tmp_path, capsys):
    assert ep_main(["check", "--json", str(tmp_path), "--force"]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_check_finds_and_locates_a_faulty_backend(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))  # spawned ranks inherit sys.path, so they can import ep_faulty
    spec = CaseSpec(world=2, seed=4, tokens=(64, 64), hidden=2048, topk=8, num_experts=64, specials=0.05)
    with Session(2, "numerics.ep.check:CaseRunner", {"backend": "ep_faulty:FaultyBackend", "timeout_s": 30.0},
                 timeout_s=30.0) as session:
        rows = drive(session.run, [spec])
    assert rows["layout.num_tokens_per_rank"].failures == 0
    payload = rows["dispatch.recv_x.bf16"]
    assert payload.failures == 1 and payload.first.startswith("rank 1, row 2, col 5 (from rank 0 token ")
    assert rows["combine"].failures == 1 and "(sum of the rows back from ranks" in rows["combine"].first
    assert rows["dispatch_cached.recv_x.bf16"].failures == 0  # the fault is in dispatch only
    assert "FAIL" in format_table(rows)
    v = verdict(rows)
    assert v.status == "fail" and v.line.startswith("FAIL: ") and set(v.failed) == {"dispatch.recv_x.bf16", "combine"}
    assert session.exitcodes == [0]


def test_check_reports_only_known_differences_as_pass_known_and_strict_fails_them(tmp_path, capsys):
    """The reference (its sum starts at +0.0, as DeepEP's) against the first-row convention: the only
    differences are E1's, so the run passes as known and counts the values; --strict fails it; the
    summary line and the status come from the same verdict."""
    argv = ["check", "--world", "2", "--spec", E1_SPEC.to_json(), "--no-bad-input", "--timeout", "30",
            "--combine-start", "first-row"]
    out = tmp_path / "known.json"
    assert ep_main(argv + ["--json", str(out)]) == 0
    text = capsys.readouterr().out
    doc = json.loads(out.read_text())
    values = doc["known"]["E1"]["values"]
    assert values > 0 and doc["known"]["E1"]["cases"] == 1 and doc["status"] == "pass" and doc["passed"]
    line = f"PASS (known: E1 on {values} values in 1 case): reference against simulate"
    assert line in text and doc["summary"].startswith(line)
    assert doc["checks"]["combine"]["failures"] == 0 and "KNOWN" in text
    assert ep_main(argv + ["--strict", "--json", str(out), "--force"]) == 1
    text = capsys.readouterr().out
    assert f"FAIL (--strict, known findings fail): E1 on {values} values in 1 case" in text
    assert json.loads(out.read_text())["status"] == "fail"
    # under the contract's convention the same case has no difference at all
    assert ep_main(["check", "--world", "2", "--spec", E1_SPEC.to_json(), "--no-bad-input", "--timeout", "30"]) == 0
    assert "\nPASS: reference against simulate" in capsys.readouterr().out


def test_verdict_line_never_contradicts_its_status():
    ok, known = CheckRow(cases=3), CheckRow(cases=3, known={"E1": {"cases": 2, "values": 44, "first": "x"}})
    bad = CheckRow(cases=3, failures=1, first="rank 0: y")
    assert verdict({"combine": ok}).line == "PASS"
    v = verdict({"combine": known})
    assert (v.status, v.line) == ("pass", "PASS (known: E1 on 44 values in 2 cases)")
    v = verdict({"combine": known}, strict=True)
    assert v.status == "fail" and v.line.startswith("FAIL (--strict")
    v = verdict({"combine": known, "dispatch.recv_topk_idx": bad})
    assert v.status == "fail"
    assert v.line == "FAIL: 1 check differ (dispatch.recv_topk_idx); known: E1 on 44 values in 2 cases"
    for rows in ({"a": ok}, {"a": known}, {"a": bad}):
        for strict in (False, True):
            v = verdict(rows, strict=strict)
            assert v.line.startswith("PASS") == (v.status == "pass")
    assert "KNOWN" in format_table({"combine": known}) and "FAIL" in format_table({"combine": known}, strict=True)


def test_bench_cli_times_the_floor_and_the_reference_on_cpu(cpu_ep_bench):
    """The bench of tests/conftest.py's cpu_ep_bench (2 gloo ranks, 3 timed calls): it says what it did not measure
    and that 3 calls are a smoke run; every row times an op against its floor."""
    _, doc, text = cpu_ep_bench
    assert "NVLink limit: not measured" in text and "3 timed calls per op (< 50)" in text
    assert doc["kind"] == "ep-bench" and doc["version"] == 2 and doc["peer_copy"] is None
    ops = {(r["backend"], r["op"]) for r in doc["rows"]}
    assert ops == {("nccl", "dispatch_cached"), ("nccl", "combine"), ("reference", "dispatch"),
                   ("reference", "dispatch_cached"), ("reference", "combine")}
    for r in doc["rows"]:
        assert r["logical_bytes"] >= r["remote_bytes"] > 0 and r["ms"] > 0 and r["mean_ms"] > 0
        floor = next(f["ms"] for f in doc["rows"] if f["backend"] == "nccl"
                     and f["op"] == ("combine" if r["op"] == "combine" else "dispatch_cached"))
        # the JSON rounds vs_floor to 3 decimals (error <= 5e-4) and ms to 4 (both sides: ~2e-3 relative)
        assert r["vs_floor"] == pytest.approx(r["ms"] / floor, rel=2e-3, abs=5e-4)


def test_ctrl_c_in_a_session_stays_ctrl_c_when_its_ranks_are_gone():
    """Ctrl-C reaches every rank of the process group; the session's exit, telling ranks that are already gone to
    stop, must not replace the KeyboardInterrupt with its own error ('connection closed by peer'), or mxval
    validate would record a failed communication level and go on instead of stopping as interrupted."""
    with pytest.raises(KeyboardInterrupt):
        with Session(2, "numerics.ep.check:CaseRunner", {"backend": "reference", "timeout_s": 10.0},
                     timeout_s=10.0) as session:
            for p in session.children:  # what SIGINT to the group does to the ranks
                p.kill()
                p.join(timeout=10)
            raise KeyboardInterrupt


@pytest.mark.parametrize("backend,line", [
    ("DyingBackend", "error: rank 1 exited with code 1 during the run"),
    ("SetUpFailsBackend", "error: set-up failed on rank 1: RuntimeError: no buffer on rank 1"),
])
def test_a_rank_that_fails_is_one_line_naming_it_and_exit_1(backend, line, monkeypatch, capsys):
    """Rank 1 ending in the middle of the all-to-all, or failing its set-up: one line naming rank 1, exit 1, no
    traceback (gloo's own error, 'Connection reset by peer [127.0.0.1]:PORT', names no rank)."""
    monkeypatch.syspath_prepend(str(HERE))  # spawned ranks inherit sys.path, so they can import ep_faulty
    rc = ep_main(["check", "--world", "2", "--backend", f"ep_faulty:{backend}", "--cases", "0", "--no-edge",
                  "--timeout", "30"])
    err = capsys.readouterr().err
    assert rc == 1
    assert err.splitlines()[-1].startswith(line), err
    assert "Traceback" not in err
