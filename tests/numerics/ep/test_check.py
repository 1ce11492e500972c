"""``python -m numerics.ep check`` on CPU (gloo): its table, JSON, exit codes and its power to fail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from numerics.ep.__main__ import main as ep_main
from numerics.ep.check import drive, format_table
from numerics.ep.launch import Session
from numerics.ep.strategies import CaseSpec

HERE = Path(__file__).resolve().parent


def test_check_cli_passes_reference_against_simulate_and_writes_json(tmp_path, capsys):
    out = tmp_path / "check.json"
    rc = ep_main(["check", "--world", "2", "--cases", "3", "--max-tokens", "70", "--no-edge", "--hidden", "2048",
                  "--timeout", "30", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "bad_input.topk_out_of_range" in text and "PASS: reference against simulate, 2 ranks (gloo)" in text
    doc = json.loads(out.read_text())
    assert doc["kind"] == "ep-check" and doc["passed"] is True
    assert doc["checks"]["combine"]["cases"] == 3 and doc["environment"]["torch"]
    # an existing report is not overwritten without --force: one line, exit 2
    assert ep_main(["check", "--world", "2", "--json", str(out)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [
    (["check", "--payload", "fp16"], "choose from bf16, fp8"),
    (["check", "--backend", "deepep"], "deep_ep is not importable"),
    (["check", "--backend", "nccl"], "use reference, deepep or package.module:Class"),
    (["check", "--world", "1"], "--world must be >= 2"),
    (["check", "--num-sms", "7"], "even"),
    (["check", "--spec", "{not json"], "--spec is not a case"),
    (["bench", "--shapes", "v4"], "choose from v3, 16b"),
    (["bench", "--backends", "deepep"], "deep_ep is not importable"),
    (["frobnicate"], "unknown subcommand"),
])
def test_ep_cli_bad_input_is_one_line_and_exit_2(argv, words, capsys):
    assert ep_main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err


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
    assert session.exitcodes == [0]


def test_bench_cli_runs_the_reference_on_cpu(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = ep_main(["bench", "--world", "2", "--backends", "reference", "--shapes", "16b", "--payload", "bf16",
                  "--tokens", "32", "--iters", "1", "--warmup", "0", "--timeout", "30", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "NVLink limit: not measured" in text
    doc = json.loads(out.read_text())
    assert doc["kind"] == "ep-bench" and {r["op"] for r in doc["rows"]} == {"dispatch", "dispatch_cached",
                                                                            "combine"}
    combine = next(r for r in doc["rows"] if r["op"] == "combine")
    assert combine["logical_bytes"] >= combine["remote_bytes"] > 0 and combine["vs_reference"] == 1.0
