"""dev/gpu/perf.sh runs its stages and leaves what a GPU call may send back: at most 8 files directly in $OUT, none
over 16 MiB, each result readable by its command's own reader. Here on a CPU, small (MODEL=tiny QUICK=1, the
emulated kernel, one repeat, no env.sh). Development tooling, outside the product's tests: python -m pytest
dev/gpu/tests"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
MAX_FILES, MAX_BYTES = 8, 16 * 2**20  # what one GPU call brings back from $OUT

pytestmark = pytest.mark.skipif(not shutil.which("bash"), reason="needs bash")


def test_perf_script_leaves_each_stage_result_within_the_call_limits(tmp_path):
    from convergence.train.perf import bench, profile_step
    from numerics.files import file_bytes
    from numerics.layer.fast import bench as fast_bench

    out = tmp_path / "out"
    out.mkdir()
    python_dir = str(Path(sys.executable).parent)  # the script calls python3: this interpreter's
    env = os.environ | {"OUT": str(out), "MODEL": "tiny", "DEVICE": "cpu", "KERNEL": "emulated", "REPEATS": "1",
                        "QUICK": "1", "ENV_SH": "0", "PYTHONPATH": str(ROOT),
                        "PATH": f"{python_dir}:{os.environ['PATH']}"}
    r = subprocess.run(["bash", "dev/gpu/perf.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count(": exit 0 after") == 4, r.stdout  # every stage ran and succeeded
    made = sorted(out.rglob("*"))
    assert all(p.is_file() and p.parent == out for p in made) and len(made) <= MAX_FILES
    assert all(p.stat().st_size <= MAX_BYTES for p in made)
    assert {p.name for p in made} == {"perf.log", "profile_bf16.json", "trace_bf16.json.gz", "profile_fast.json",
                                      "trace_fast.json.gz", "fast_bench.json", "bench_proxy.json"}  # + env.json there
    fast = json.loads((out / "profile_fast.json").read_text())
    assert fast["recipe"] == "mxfp8" and fast["kernel"] == "emulated" and fast["with_stacks"] is not None
    assert profile_step.reanalyse(json.loads(file_bytes(out / "trace_fast.json.gz"))) == fast
    assert bench.load_report(out / "bench_proxy.json")["repeats_done"] == 1
    assert fast_bench.load_report(out / "fast_bench.json")["repeats"] == 1
    assert "bench: 1 of 1 rounds" in r.stdout


def test_perf_script_runs_only_the_stages_asked_for(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    python_dir = str(Path(sys.executable).parent)
    env = os.environ | {"OUT": str(out), "MODEL": "tiny", "DEVICE": "cpu", "KERNEL": "emulated", "QUICK": "1",
                        "ENV_SH": "0", "STAGES": "profile-fast", "PYTHONPATH": str(ROOT),
                        "PATH": f"{python_dir}:{os.environ['PATH']}"}
    r = subprocess.run(["bash", "dev/gpu/perf.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count(": exit 0 after") == 1 and "profile bf16: none" in r.stdout, r.stdout
    assert {p.name for p in out.iterdir()} == {"perf.log", "profile_fast.json", "trace_fast.json.gz"}
