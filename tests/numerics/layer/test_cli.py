"""python -m numerics layers: table, JSON and Markdown outputs, bad input, no silent overwrite."""

from __future__ import annotations

import json

import pytest

from numerics.__main__ import main as numerics_main
from numerics.layer import cli as layers_cli
from numerics.layer import harness


@pytest.fixture(scope="module")
def run_small(tmp_path_factory):
    d = tmp_path_factory.mktemp("layers")
    rc = numerics_main(["layers", "--device", "cpu", "--json", str(d / "l.json"), "--markdown", str(d / "l.md")])
    return rc, d


def test_layers_cli_writes_the_json_contract(run_small):
    rc, d = run_small
    assert rc == 0
    data = json.loads((d / "l.json").read_text())
    assert data["header"]["config"]["name"] == "tiny" and data["header"]["versions"]["torchao"]
    assert data["header"]["device"] == "cpu"
    rec = data["records"][0]
    assert set(rec) >= {"layer", "recipe", "tensor", "sqnr_vs_fp32", "sqnr_vs_bf16", "rel_err", "max_abs_err",
                        "cosine", "shape"}
    assert {r["layer"] for r in data["records"]} == {"linear", "grouped_mm", "moe", "mla"}
    assert {r["recipe"] for r in data["records"]} == set(harness.RECIPES)
    assert all(r["sqnr_vs_bf16"] is None for r in data["records"] if r["recipe"] == "bf16")


def test_layers_cli_markdown_is_a_table(run_small):
    _, d = run_small
    lines = (d / "l.md").read_text().splitlines()
    assert lines[2].startswith("| layer |") and lines[3].startswith("|---|")


def test_layers_cli_refuses_to_overwrite(run_small, capsys):
    _, d = run_small
    assert layers_cli.main(["--device", "cpu", "--json", str(d / "l.json")]) == 2
    assert "--force" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--config", "huge"], ["--device", "tpu"], ["--json", "/no/such/dir/x.json"]])
def test_layers_cli_bad_input_is_one_line_exit_2(argv, capsys):
    try:
        rc = layers_cli.main(argv)
    except SystemExit as exc:  # argparse usage errors exit from inside parse_args
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err and len(err.splitlines()) == 1
