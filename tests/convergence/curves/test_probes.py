"""convergence.curves.probes: a run's per-layer probe SQNRs summarised and drawn, checked against numbers
worked out by hand and against the committed proxy probes."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from convergence.__main__ import main
from convergence.curves import probes

GOLDEN = Path(__file__).resolve().parents[3] / "golden" / "training"


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_summary_takes_each_modules_median_over_steps_then_the_layers_median_and_lowest(tmp_path):
    def rec(step, wq, w1, experts):
        return {"step": step, "layers": {
            "layers.0.attention.wq": {"out_sqnr_db": wq, "dx_sqnr_db": wq - 5, "dweight_sqnr_db": wq - 3},
            "layers.0.feed_forward.w1": {"out_sqnr_db": w1, "dx_sqnr_db": w1 - 5, "dweight_sqnr_db": w1 - 3},
            "layers.1.moe.experts.w1": {"out_sqnr_db": experts, "dx_sqnr_db": experts - 5, "dweight_sqnr_db": 40.0}},
            "rank": 0, "ranks": 2}  # an FSDP2 + EP run's record names its rank: ignored here

    recs = probes.load_probes(_write(tmp_path / "probes.jsonl", [rec(10, 30, 36, 20), rec(20, 34, 38, 26),
                                                                  rec(30, 35, 37, 23)]))
    s = probes.summarise(recs, "run")
    assert s["modules"]["layers.0.attention.wq"]["out_sqnr_db"] == 34  # median of 30, 34, 35
    assert s["layers"][0]["out_sqnr_db"] == {"median": 35.5, "lowest": 34, "lowest_module": "layers.0.attention.wq"}
    assert s["layers"][1]["dx_sqnr_db"]["median"] == 18  # experts: median 23, minus 5
    assert s["overall"]["out_sqnr_db"] == statistics.median([30, 36, 20, 34, 38, 26, 35, 37, 23])
    assert s["worst"]["out_sqnr_db"] == {"sqnr_db": 20, "module": "layers.1.moe.experts.w1", "step": 10}
    text = probes.report(s)
    assert "3 probe steps (10-30), 3 modules" in text
    assert "lowest output: 20.0 dB, layers.1.moe.experts.w1 at step 10" in text


def test_the_committed_proxy_probes_give_the_readme_figures_and_tell_fp4_from_fp8(tmp_path, capsys):
    """The lr 3e-4 protocol's probes: MXFP8's medians are README's 36.5 / 30.7 / 32.5 dB, E2M1's 23.5 / 17.2 /
    17.7; at every layer E2M1 sits 10-16 dB below MXFP8 (the layer test's 12.7 dB per GEMM), so the summary
    separates the two elements layer by layer, not only on average."""
    runs = [GOLDEN / f"proxy_long_lr3e-4_{r}_probes__h200.jsonl.gz" for r in ("mxfp8", "mxfp8-e2m1")]
    out = tmp_path / "probes.png"
    assert main(["probes", *map(str, runs), "--name", "e4m3", "--name", "e2m1", "--plot", str(out),
                 "--json", str(tmp_path / "p.json")]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fp8, fp4 = json.loads((tmp_path / "p.json").read_text())
    assert [round(fp8["overall"][q], 1) for q in probes.QUANTITIES] == [36.5, 30.7, 32.5]
    assert [round(fp4["overall"][q], 1) for q in probes.QUANTITIES] == [23.5, 17.2, 17.7]
    assert len(fp8["layers"]) == 6 and len(fp8["modules"]) == 57 and len(fp8["steps"]) == 15
    for layer in fp8["layers"]:
        for q in probes.QUANTITIES:
            gap = fp8["layers"][layer][q]["median"] - fp4["layers"][layer][q]["median"]
            assert 10 < gap < 17, (layer, q, gap)  # E2M1 has 2 mantissa bits fewer: ~12 dB less
    assert "e4m3: 15 probe steps (100-1500), 57 modules" in capsys.readouterr().out
    capsys.readouterr()
    assert main(["probes", str(runs[0]), "--plot", str(out)]) == 2  # an existing figure is kept
    assert "exists" in capsys.readouterr().err


def test_a_run_folder_is_read_for_its_probes(tmp_path):
    _write(tmp_path / "probes.jsonl", [{"step": 5, "layers": {"layers.2.attention.wo": {"out_sqnr_db": 31.0}}}])
    s = probes.summarise(probes.load_probes(tmp_path), "run")
    wo = "layers.2.attention.wo"
    assert s["layers"] == {2: {"out_sqnr_db": {"median": 31.0, "lowest": 31.0, "lowest_module": wo}}}
    assert list(s["overall"]) == ["out_sqnr_db"]


def test_records_without_any_sqnr_are_refused(tmp_path):
    with pytest.raises(Exception, match="no SQNR values"):
        probes.summarise(probes.load_probes(_write(tmp_path / "p.jsonl", [{"step": 1, "layers": {}}])), "run")


def test_a_gzip_probes_file_reads_as_the_plain_one(tmp_path):
    """golden keeps a protocol's probes as .jsonl.gz (numerics.files.file_bytes): the same records."""
    import gzip

    plain = _write(tmp_path / "probes.jsonl", [{"step": 5, "layers": {"layers.0.attention.wq": {"out_sqnr_db": 30}}}])
    packed = tmp_path / "probes.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes(), mtime=0))
    assert probes.load_probes(packed) == probes.load_probes(plain)


def test_a_compacted_run_folder_is_read_for_its_gzip_probes(tmp_path):
    """A finished protocol run's folder holds probes.jsonl.gz (convergence.protocol.folder.compact_run); where a crash
    left both, the gzip wins (numerics.files.gzip_or_plain); the plain file alone is still read (the control)."""
    import gzip

    rec = {"step": 5, "layers": {"layers.0.attention.wq": {"out_sqnr_db": 30.0}}}
    (tmp_path / "probes.jsonl.gz").write_bytes(gzip.compress((json.dumps(rec) + "\n").encode(), mtime=0))
    assert probes.load_probes(tmp_path) == [rec]
    _write(tmp_path / "probes.jsonl", [rec | {"step": 4}])
    assert probes.load_probes(tmp_path) == [rec]
    (tmp_path / "probes.jsonl.gz").unlink()
    assert probes.load_probes(tmp_path) == [rec | {"step": 4}]
