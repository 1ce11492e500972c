"""The cast benchmark runs and reports its ratio (no timed assertion: the numbers are the output)."""

from __future__ import annotations

import pytest

from numerics.tensor import bench


def test_bench_cast_reports_a_ratio_per_mode():
    rows = bench.cast(elements=4096, modes=("floor", "rceil"), repeat=1)
    assert [r["mode"] for r in rows] == ["floor", "rceil"]
    assert all(r["ratio"] > 0 and r["oracle_elem_per_s"] > 0 for r in rows)


def test_bench_cli_tiny_run_and_bad_input(capsys):
    assert bench.main(["cast", "--elements", "4096", "--repeat", "1", "--mode", "even"]) == 0
    assert "oracle/torchao" in capsys.readouterr().out
    assert bench.main(["--elements", "100"]) == 2
    with pytest.raises(SystemExit) as exc:
        bench.main(["cast", "--mode", "nosuch"])
    assert exc.value.code == 2
    assert bench.main(["nosuch"]) == 2
