"""numerics.environment: the tags that name hardware in result files."""

from __future__ import annotations

import pytest

from numerics.environment import check_hardware_tag, gpu_tag
from numerics.errors import BadInput


def test_a_gpu_is_tagged_by_its_recorded_name():
    assert [gpu_tag(n) for n in ("NVIDIA H200", "NVIDIA GB200", "NVIDIA B200", "NVIDIA H100 80GB HBM3")] == [
        "h200", "gb200", "b200", "h100"]  # GB200's name holds "B200": the longer name is tried first
    assert gpu_tag("NVIDIA RTX 6000 Ada") == "nvidia-rtx-6000-ada"
    assert gpu_tag("Vendor X/Y (rev 2)") == "vendor-x-y-rev-2"  # a name that could not name a file, made one


def test_a_hardware_tag_that_is_not_a_file_name_is_one_line():
    assert check_hardware_tag("h200x2") == "h200x2"
    for bad in ("../x", "H200", "a/b", "", ".hidden"):
        with pytest.raises(BadInput, match="a tag such as h200"):
            check_hardware_tag(bad)


def test_the_host_cpu_model_is_recorded(tmp_path, monkeypatch):
    """Every result records the host CPU's model, read from /proc/cpuinfo where there is one (GPU
    machines' hosts differ, and emulated MX steps are host-bound enough to show it)."""
    from pathlib import Path

    from numerics import environment

    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [ln.split(":", 1)[1].strip() for ln in cpuinfo.read_text().splitlines() if ln.startswith("model name")]
        assert environment.describe()["cpu"] == (names[0] if names else environment.platform.processor() or None)
    real_open = open

    def no_cpuinfo(path, *a, **kw):  # a host without /proc: platform's answer, or None, never an error
        if str(path) == "/proc/cpuinfo":
            raise FileNotFoundError(path)
        return real_open(path, *a, **kw)

    monkeypatch.setattr("builtins.open", no_cpuinfo)
    monkeypatch.setattr(environment.platform, "processor", lambda: "")
    assert environment.cpu_model() is None


def _git(*args, cwd) -> str:
    import subprocess

    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def _another_repository(path):
    """A git repository with one commit of its own, as a user's project would be."""
    path.mkdir()
    _git("init", "-q", cwd=path)
    _git("-c", "user.name=u", "-c", "user.email=u@example.com", "commit", "-q", "--allow-empty", "-m", "theirs",
         cwd=path)
    return _git("rev-parse", "HEAD", cwd=path)


def _mxval_commit() -> str | None:
    """What git says of the checkout the numerics package is in (None where it is not the top of one)."""
    import subprocess

    from numerics import environment

    out = subprocess.run(["git", "-C", str(environment.CHECKOUT), "rev-parse", "--show-toplevel", "HEAD"],
                         capture_output=True, text=True)
    top, _, head = out.stdout.strip().partition("\n")
    return head if out.returncode == 0 and top == str(environment.CHECKOUT) else None


def test_the_recorded_commit_is_mxvals_own_from_inside_another_repository_and_outside_any(tmp_path, monkeypatch):
    """The commit is the checkout's that numerics runs from, wherever the command starts: not the commit of a
    repository around the current directory, and not None outside any."""
    from numerics import environment

    monkeypatch.delenv("MXVAL_COMMIT", raising=False)
    theirs = _another_repository(tmp_path / "project")
    monkeypatch.chdir(tmp_path / "project")
    inside = environment.describe()["mxval_commit"]
    assert inside != theirs and inside == _mxval_commit()
    monkeypatch.chdir(tmp_path)  # under /tmp: no repository
    assert environment.describe()["mxval_commit"] == _mxval_commit()
    monkeypatch.setenv("MXVAL_COMMIT", "abc123")  # a copy without git metadata says which commit it is
    assert environment.describe()["mxval_commit"] == "abc123"


def test_an_installed_copy_records_no_commit_even_inside_another_repository(tmp_path):
    """numerics installed outside a checkout of mxval (a wheel's site-packages, here inside the user's own
    repository) has no mxval commit to record: None, never the repository around it."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import numerics

    _another_repository(tmp_path / "project")
    site = tmp_path / "project" / "venv" / "site-packages"
    shutil.copytree(Path(numerics.__file__).parent, site / "numerics")
    for cwd in (tmp_path / "project", tmp_path):
        out = subprocess.run([sys.executable, "-c", "from numerics.environment import _git_commit; "
                              "print(_git_commit())"], cwd=cwd, capture_output=True, text=True,
                             env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site)})
        assert out.returncode == 0 and out.stdout.strip() == "None", (cwd, out.stdout, out.stderr)
