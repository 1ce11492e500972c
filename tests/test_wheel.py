"""The wheel built from this repository, installed into a fresh environment, passes its own ``python -m golden check``.

The package data in pyproject.toml decides which of golden/'s files ship; the check then finds every file its
manifest lists, with the checksum its sidecar records. The wheel is built offline (no build isolation, no
dependencies) from a copy of the packages, so nothing is written into the checkout, and installed into a venv whose
only other packages are this interpreter's (torch, torchao, ...: a ``.pth`` file names its site-packages, which
``--system-site-packages`` would not reach when this interpreter is itself a venv). The check runs from a folder
outside the repository with no ``PYTHONPATH``, so the installed copy is the one imported.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(args: list, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PIP_REQUIRE_VIRTUALENV")}
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _source_copy(dest: Path) -> Path:
    """The files a wheel is built from: pyproject.toml, the README it names, and the packages it includes."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    tops = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    dest.mkdir()
    for name in ("pyproject.toml", project["project"]["readme"]):
        shutil.copy2(REPO / name, dest / name)
    for top in sorted(tops):
        shutil.copytree(REPO / top, dest / top, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return dest


def _installed_venv(tmp: Path) -> Path:
    """A wheel of this repository installed into a fresh venv under ``tmp``; returns its python."""
    pytest.importorskip("setuptools", reason="building the wheel offline needs setuptools here: pip install setuptools")
    src = _source_copy(tmp / "src")
    built = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                  tmp / "dist", src], cwd=tmp)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp / "dist").glob("mxval-*.whl")
    venv = tmp / "venv"
    made = _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp)
    (Path(purelib.stdout.strip()) / "outer-site-packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    # --ignore-installed: this interpreter's own (often editable) mxval is seen but neither replaced nor removed
    installed = _run([python, "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed", wheel], cwd=tmp)
    assert installed.returncode == 0, installed.stderr
    return python


def test_wheel_installed_passes_its_own_golden_check(tmp_path):
    python = _installed_venv(tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    where = _run([python, "-c", "import golden; print(golden.__file__)"], cwd=outside)
    golden_dir = Path(where.stdout.strip()).parent
    assert golden_dir.is_relative_to(tmp_path / "venv"), f"imported golden from {golden_dir}, not the wheel's"

    check = _run([python, "-m", "golden", "check"], cwd=outside)
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr

    # control: the same installation missing one golden curve (what the wheel shipped when package data left out
    # *.jsonl.gz) fails the check with exit code 2, naming the file
    curve = sorted((golden_dir / "training").glob("*.jsonl.gz"))[0]
    curve.unlink()
    broken = _run([python, "-m", "golden", "check", "--only", "recorded"], cwd=outside)
    assert broken.returncode == 2
    assert f"training/{curve.name}: missing" in broken.stdout
