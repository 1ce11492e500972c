"""What produced a result: library versions and hardware, recorded in every result file."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import subprocess
import sys
from pathlib import Path


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _deep_ep_version() -> str | None:
    for dist in ("deep_ep", "deep-ep", "DeepEP"):
        v = _version(dist)
        if v:
            return v
    try:
        import deep_ep  # noqa: F401
    except Exception:
        return None
    return getattr(deep_ep, "__version__", "unknown")


CHECKOUT = Path(__file__).resolve().parents[1]  # the folder holding the numerics package: mxval's checkout, or
#                                                 site-packages when mxval is installed from a wheel


def _git_commit(checkout: Path = CHECKOUT) -> str | None:
    """The commit of the mxval checkout this code runs from: git asked in ``checkout`` (never the current
    directory, which may be another repository), and only when ``checkout`` is that repository's top (a wheel
    installed inside someone's repository is not a checkout of mxval): None otherwise. ``MXVAL_COMMIT``
    overrides it where the copy's git metadata is not the checkout's (a GPU machine that receives a working tree)."""
    if os.environ.get("MXVAL_COMMIT"):
        return os.environ["MXVAL_COMMIT"]
    try:
        out = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--show-toplevel", "HEAD"],
                             capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.split()
    if out.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != checkout.resolve():
        return None
    return lines[1]


def cpu_model() -> str | None:
    """The host CPU's model name: machines of one GPU image can sit on different hosts, and emulated MX steps,
    many small kernels, ran ~16 % slower on one H200 machine than on another while BF16 steps did not
    (docs/studies/proxy-protocol.md)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def describe() -> dict:
    """Versions of every library the suite tests or depends on, and the hardware it ran on."""
    import torch

    info = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torchao": _version("torchao"),
        "numpy": _version("numpy"),
        "ml_dtypes": _version("ml_dtypes"),
        "hypothesis": _version("hypothesis"),
        "deep_ep": _deep_ep_version(),
        "cuda": torch.version.cuda,
        "nccl": None,
        "driver": None,
        "gpus": [],
        "cpu_threads": torch.get_num_threads(),
        "cpu": cpu_model(),
        "mxval_commit": _git_commit(),
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["capability"] = list(torch.cuda.get_device_capability(0))
        try:
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            pass
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10, check=False,
            )
            info["driver"] = out.stdout.strip().splitlines()[0] if out.stdout.strip() else None
        except (OSError, subprocess.TimeoutExpired):
            pass
    return info


def hardware_tag() -> str:
    """Short tag used in golden file names: ``cpu``, ``h200``, ``b200``..."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    return gpu_tag(torch.cuda.get_device_name(0))


def gpu_tag(name: str) -> str:
    """The tag of a GPU by its name as ``describe()["gpus"]`` records it (a result judged on another machine)."""
    name = name.lower()
    for tag in ("gb200", "b200", "h200", "h100", "h800", "a100"):
        if tag in name:
            return tag
    return re.sub(r"[^a-z0-9_.-]+", "-", name).strip("-._") or "gpu"


def check_hardware_tag(tag: str, flag: str = "--hardware") -> str:
    """``tag`` when it can name a result file (h200, h200x2, cpu: lower-case letters, digits, . _ -, no path
    separator), else BadInput in one line."""
    from numerics.errors import BadInput

    if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", tag):
        raise BadInput(f"{flag} {tag!r}: a tag such as h200 or h200x2 (lower-case letters, digits, . _ -)")
    return tag
