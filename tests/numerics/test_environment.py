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
