"""dev/gpu/ab_profile.sh profiles the fast step in this checkout and in carried tarballs of other trees, one after
another, and leaves two files a tree in $OUT (8 at most, no sub-folder). Here on a CPU, small (MODEL=tiny QUICK=1,
the emulated kernel, no env.sh), with a tarball of this checkout's HEAD as the other tree. Development tooling,
outside the product's tests: python -m pytest dev/gpu/tests"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(not (shutil.which("bash") and shutil.which("git")), reason="needs bash and git")


def _env(out: Path) -> dict:
    python_dir = str(Path(sys.executable).parent)  # the script calls python3: this interpreter's
    return os.environ | {"OUT": str(out), "MODEL": "tiny", "DEVICE": "cpu", "KERNEL": "emulated", "QUICK": "1",
                         "ENV_SH": "0", "PATH": f"{python_dir}:{os.environ['PATH']}"}


def test_ab_profile_profiles_each_tree_and_names_its_files(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    tgz = tmp_path / ".head.tgz"
    subprocess.run(["git", "archive", "--format=tar.gz", "-o", str(tgz), "HEAD"], cwd=ROOT, check=True)
    r = subprocess.run(["bash", "dev/gpu/ab_profile.sh", ".", str(tgz)], cwd=ROOT, env=_env(out),
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert {p.name for p in out.iterdir()} == {"main_profile_fast.json", "main_perf.log", "head_profile_fast.json",
                                               "head_perf.log"}
    for name in ("main", "head"):
        assert json.loads((out / f"{name}_profile_fast.json").read_text())["recipe"] == "mxfp8"
    assert r.stdout.count("perf.sh exit: 0") == 2 and r.stdout.count("profile fast:") == 2, r.stdout


@pytest.mark.parametrize("args, match", [
    ([], "1 to 4 trees"), ([".", ".a.tgz", ".b.tgz", ".c.tgz", ".d.tgz"], "1 to 4 trees"),
    (["/nonexistent/.x.tgz"], "no such tarball"), ([".", "."], "two trees named main"),
])
def test_ab_profile_refuses_what_it_cannot_run_before_running_anything(tmp_path, args, match):
    out = tmp_path / "out"
    out.mkdir()
    r = subprocess.run(["bash", "dev/gpu/ab_profile.sh", *args], cwd=ROOT, env=_env(out), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and match in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not any(out.iterdir())
