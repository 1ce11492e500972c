"""The tensor-level report: its JSON shape, its block accounting, its CLI's exit codes and files."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from numerics.tensor import families, report
from numerics.tensor import subjects as registry

KEYS = {"subject", "elem", "mode", "family", "sqnr_db", "max_abs_err", "blocks", "blocks_bit_exact",
        "blocks_known_findings", "blocks_unexplained"}
MICROXCALING_MISSING = registry.get("microxcaling").unavailable()


@pytest.fixture(scope="module")
def tiny():
    return report.tensor_report(size="tiny", seed=0, subjects=["torchao"])


def test_report_has_one_record_per_elem_mode_family(tiny):
    assert {"size", "seed", "device", "torch", "torchao", "subjects"} <= set(tiny["header"])
    assert tiny["header"]["size"] == "tiny"
    combos = {(r["elem"], r["mode"], r["family"]) for r in tiny["records"]}
    assert len(tiny["records"]) == len(combos) == 3 * 4 * len(families.FAMILIES)  # torchao: E4M3, E5M2, E2M1
    json.loads(json.dumps(tiny))  # serialisable as is


def test_report_blocks_are_accounted_for(tiny):
    n = int(np.prod(families.SHAPES["tiny"])) // 32
    for r in tiny["records"]:
        assert KEYS <= set(r), r
        assert r["blocks"] == n
        assert r["blocks_bit_exact"] + sum(r["blocks_known_findings"].values()) + r["blocks_unexplained"] == n
        assert r["blocks_unexplained"] == 0, r
    # the gradients family holds an fp32-subnormal block: F1 claims it in every mode
    grads = [r for r in tiny["records"] if r["family"] == "gradients"]
    assert all(r["blocks_known_findings"].get("F1", 0) >= 1 for r in grads)


def test_report_sqnr_of_normal_bf16_activations_matches_the_tensor_floor(tiny):
    from numerics.tolerances import floor

    for r in tiny["records"]:
        if r["family"] == "normal":
            tol = floor("tensor", r["elem"], "roundtrip", "sqnr_db")
            assert r["sqnr_db"] >= tol.floor, tol.describe(r["sqnr_db"])


def test_report_agreement_flags_a_changed_byte():
    x = families.generate("normal", (2, 64), 0)
    from numerics.tensor import mx

    s, e = mx.quantize(x, "e4m3", "floor")
    assert report.agreement(x, "e4m3", "floor", s, e)["blocks_bit_exact"] == 4
    e = e.copy()
    e[1, 40] ^= 1
    got = report.agreement(x, "e4m3", "floor", s, e)
    assert got["blocks_bit_exact"] == 3 and got["blocks_unexplained"] == 1


def test_report_cli_writes_files_and_refuses_to_overwrite(tmp_path, capsys):
    out = tmp_path / "r"
    assert report.main(["--size", "tiny", "--subject", "torchao", "--out", str(out)]) == 0
    data = json.loads((out / "report.json").read_text())
    assert len(data["records"]) == 48 and "| family |" in (out / "report.md").read_text()
    assert "### torchao" in capsys.readouterr().out
    (out / "report.md").write_text("mine")
    assert report.main(["--size", "tiny", "--subject", "torchao", "--out", str(out)]) == 2
    assert (out / "report.md").read_text() == "mine"
    assert "--force" in capsys.readouterr().err
    assert report.main(["--size", "tiny", "--subject", "torchao", "--out", str(out), "--force"]) == 0
    assert (out / "report.md").read_text() != "mine"


@pytest.mark.skipif(MICROXCALING_MISSING is not None,
                    reason=f"subject microxcaling unavailable: {MICROXCALING_MISSING}")
def test_report_shows_one_table_per_subject(tmp_path, capsys):
    assert report.main(["--size", "tiny", "--out", str(tmp_path / "r")]) == 0
    printed = capsys.readouterr().out
    assert printed.count("### ") == 2 and "### torchao" in printed and "### microxcaling" in printed
    recs = json.loads((tmp_path / "r" / "report.json").read_text())["records"]
    assert {r["subject"] for r in recs} == {"torchao", "microxcaling"}
    assert all(r["mode"] == "floor" for r in recs if r["subject"] == "microxcaling")


def test_report_cli_unimportable_subject_exits_2_before_writing(tmp_path, monkeypatch, capsys):
    broken = dataclasses.replace(registry.get("torchao"), unavailable=lambda: "not here; pip install it")
    monkeypatch.setitem(registry.SUBJECTS, "torchao", broken)
    assert report.main(["--size", "tiny", "--subject", "torchao", "--out", str(tmp_path / "r")]) == 2
    assert "pip install it" in capsys.readouterr().err and not (tmp_path / "r").exists()


def _exit_code(argv) -> int:
    """report.main's return value, or the code argparse exits with (as python -m numerics gives)."""
    try:
        return report.main(argv)
    except SystemExit as exc:
        return int(exc.code)


@pytest.mark.parametrize("argv", [["--size", "huge"], ["--seed", "-1"], ["--seed", "x"], ["--bogus"]])
def test_report_cli_bad_arguments_exit_2_with_one_line(argv, tmp_path, capsys):
    assert _exit_code([*argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err and len(err.splitlines()) == 1


def test_report_cli_unwritable_out_exits_2(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert report.main(["--size", "tiny", "--out", str(blocker / "sub")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_report_cli_exits_1_on_an_unexplained_block(tmp_path, monkeypatch):
    real = registry.get("torchao")

    def corrupt(x, elem, mode, block=32, **kw):
        s, e = real.quantize(x, elem, mode, block, **kw)
        s = s.copy()
        s.flat[1] ^= 1  # one scale byte off: not a known finding
        return s, e

    monkeypatch.setitem(registry.SUBJECTS, "torchao", dataclasses.replace(real, quantize=corrupt))
    assert report.main(["--size", "tiny", "--subject", "torchao", "--out", str(tmp_path / "r")]) == 1
    data = json.loads((tmp_path / "r" / "report.json").read_text())
    assert all(r["blocks_unexplained"] == 1 for r in data["records"])


def test_families_are_deterministic_per_seed():
    for fam in families.FAMILIES:
        a, b = families.generate(fam, (2, 64), 3), families.generate(fam, (2, 64), 3)
        assert a.dtype == np.float32 and np.array_equal(a.view(np.uint32), b.view(np.uint32))
        assert not np.array_equal(a, families.generate(fam, (2, 64), 4))


@pytest.mark.parametrize("family", families.FAMILIES)
def test_families_take_any_leading_dims(family):
    """A family's tensor of shape (2, 3, 64) is its (6, 64) tensor reshaped, for the same seed: leading dims are
    rows, whatever their number (and a single row works)."""
    flat = families.generate(family, (6, 64), 5)
    assert np.array_equal(families.generate(family, (2, 3, 64), 5).reshape(6, 64).view(np.uint32), flat.view(np.uint32))
    assert families.generate(family, (64,), 5).shape == (64,)
