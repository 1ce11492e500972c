"""Hardware gates and Hypothesis profiles, in one place.

Markers (registered in pyproject.toml) become skips with a reason that says how to enable the test:
``gpu`` needs CUDA, ``multigpu`` needs two or more GPUs, ``sm100`` needs MXFP8 tensor cores (B200/GB200),
``slurm`` needs submitit and a Slurm answering ``sinfo`` (``.ci/slurm.sh start`` runs one on this machine),
``torchao_quantize_api`` needs a torch on which torchao accepts ``quantize_(MXFP8TrainingOpConfig)``
(torchao 0.18.0 refuses torch 2.11; FINDINGS.md C1). A test parametrized with a tensor-level subject
(``numerics.tensor.subjects.Subject`` as the parameter ``subject``) is skipped when that subject's library
is not importable, with its install hint. Where the installed torchao lacks the MXFP8 training API the
layer and training levels build on (torchao < 0.18, the version matrix in tox.ini), their tests, and any
test module whose import fails for that reason, are skipped with it.

Hypothesis profiles, chosen with ``--hypothesis-profile NAME``:
``ci`` (default) derandomized and database-free so a CI failure reproduces exactly;
``dev`` randomized with the example database, for local bug hunting;
``thorough`` thousands of examples, for nightly and GPU runs.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# OpenMP threads that wait for work sleep instead of spinning: the suite's subprocesses with two torch threads share 2
# cores with the xdist workers, where a spinning thread burns the core another process needs (measured: the
# two-fresh-processes training test 22.8 -> 16.7 s of CPU). How threads wait changes no computed bit.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    print_blob=True,
    deadline=None,  # CI machines are shared; timing is not a property under test
    max_examples=60,  # keeps the whole CPU tier within its 5-minute budget on 2 cores
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", max_examples=200, deadline=None, print_blob=True)
settings.register_profile(
    "thorough",
    max_examples=3000,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("ci")  # the hypothesis plugin replaces this when --hypothesis-profile is given


@functools.cache
def _hardware() -> dict:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return {"cuda": False, "gpus": 0, "capability": None}
    if not torch.cuda.is_available():
        return {"cuda": False, "gpus": 0, "capability": None}
    return {
        "cuda": True,
        "gpus": torch.cuda.device_count(),
        "capability": torch.cuda.get_device_capability(0),
    }


def hardware_skip_reason(markers: set[str], hw: dict) -> str | None:
    """The reason a test with these markers cannot run on this hardware, or None."""
    if {"gpu", "multigpu", "sm100"} & markers and not hw["cuda"]:
        return "needs a CUDA GPU (none visible); run `pytest -m gpu` on a GPU machine"
    if "multigpu" in markers and hw["gpus"] < 2:
        return f"needs >= 2 GPUs, found {hw['gpus']}; run under a 2-GPU machine"
    if "sm100" in markers and (hw["capability"] is None or hw["capability"][0] != 10):
        return (
            f"needs MXFP8 tensor cores (compute capability 10.x, B200/GB200), found {hw['capability']}; "
            "the same comparison runs emulated-vs-emulated in the CPU tier"
        )
    return None


@functools.cache
def slurm_unreachable() -> str | None:
    """Why the ``slurm`` tests cannot run here (no submitit, no Slurm answering ``sinfo``), or None."""
    import importlib.util
    import shutil
    import subprocess

    if importlib.util.find_spec("submitit") is None:
        return "needs submitit: pip install 'mxval[slurm]'"
    if shutil.which("sinfo") is None:
        return ("needs a Slurm (no sinfo on PATH): run one on this machine with `.ci/slurm.sh install` and "
                "`.ci/slurm.sh start` (root, Debian/Ubuntu)")
    try:
        r = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "needs a Slurm: sinfo did not answer within 30 s; start one with `.ci/slurm.sh start`"
    if r.returncode != 0 or not r.stdout.strip():
        err = " ".join(r.stderr.split())[:200] or "no nodes"
        return f"needs a Slurm: sinfo failed ({err}); start one with `.ci/slurm.sh start`"
    return None


@functools.cache
def _quantize_api_refusal() -> str | None:
    from numerics.layer.mxfp8 import quantize_api_refusal

    reason = quantize_api_refusal()
    return None if reason is None else reason + " (FINDINGS.md C1); the functional route is tested regardless"


@pytest.fixture
def torch_without_mxfp8_dtensor_apis(monkeypatch):
    """Torch as torchao 0.18 sees torch 2.11: without the two DTensor APIs whose absence makes it refuse
    ``quantize_(MXFP8TrainingOpConfig)`` (FINDINGS.md C1), so CI exercises the GPU machines' case."""
    from torch.distributed.tensor import _dispatch, _ops

    monkeypatch.delattr(_ops, "scaled_mm_single_dim_strategy", raising=False)
    monkeypatch.delattr(_dispatch, "is_pinned_handler", raising=False)


@pytest.fixture
def fake_validate_folder():
    """``make(out, steps=200)``: a ``mxval validate --quick`` results folder at ``out`` holding only its training
    level as validate leaves it (the quick plan's ``training/protocol.json``, each finished run's
    ``runs/<run>/<recipe>/metrics.jsonl.gz``), with synthetic losses instead of training: seconds, not minutes. It
    returns the run names in the plan's order. Shared by the notebook helper's tests and notebook 03's."""
    import gzip
    import json

    import numpy as np

    from convergence.protocol.folder import open_protocol, run_dir
    from mxval.validate.ladder import make_plan
    from mxval.validate.levels import protocol_plan

    def make(out, steps: int = 200) -> list[str]:
        plan = protocol_plan(make_plan(gpus=0, deep_ep=False, quick=True))
        training = out / "training"
        open_protocol(plan, training)
        rng = np.random.default_rng(0)
        for spec in plan.runs():
            lines = "".join(json.dumps({"step": s, "loss": 3.0 / s ** 0.3 * (1 + 0.002 * rng.standard_normal())})
                            + "\n" for s in range(1, steps + 1))
            path = run_dir(training, spec) / "metrics.jsonl.gz"
            path.parent.mkdir(parents=True)
            path.write_bytes(gzip.compress(lines.encode(), mtime=0))
        return [spec.name for spec in plan.runs()]

    return make


@pytest.fixture
def val_loss_protocol(tmp_path):
    """``(plan, write)``: a tiny protocol opened in ``tmp_path`` (k = 3, m = 4, 10 steps, evaluated every 5) and
    ``write(spec)``, which writes that run's finished log with a synthetic validation loss: the BF16 and MXFP8 runs
    within 4e-4 of each other, the ``mxfp8-head`` control 5 % above them, so its levels judge as equivalent /
    not_equivalent / equivalent. Seconds instead of training; shared by ``--status``'s tests and the notebook
    helper's."""
    import json

    from convergence.protocol.folder import metrics_path, open_protocol
    from convergence.protocol.plan import ProtocolPlan

    plan = ProtocolPlan(model="tiny", control="mxfp8-head", steps=10,
                        overrides=(("val_every", 5),), replicates=3, candidate_replicates=4).check()
    open_protocol(plan, tmp_path)
    noise = {"bf16": 0.0, "bf16_rounding1": 1e-4, "bf16_rounding2": -1e-4, "bf16_rounding3": 2e-4,
             "mxfp8": 5e-5, "mxfp8_rounding1": -5e-5, "mxfp8-head": 0.05, "mxfp8-head_rounding1": 0.0501,
             "mxfp8_rounding2": 4e-4, "mxfp8-head_rounding2": 0.0502, "bf16_rounding4": -2e-4, "bf16_rounding5": 1.5e-4}

    def write(spec):
        path = metrics_path(tmp_path, spec)
        path.parent.mkdir(parents=True, exist_ok=True)
        level = 1 + noise[spec.name]
        path.write_text("".join(json.dumps({"step": s, "loss": 2.0, "val_loss": (2.0 - s / 20) * level}) + "\n"
                                for s in range(1, 11)))

    return plan, write


@pytest.fixture
def interrupt_writes_in(monkeypatch):
    """``interrupt_writes_in(folder)``: from then on, a file opened for writing in ``folder`` gets the first half
    of its first write and then Ctrl-C (``KeyboardInterrupt``), as a kill mid-write would leave it. A writer that
    writes in place leaves a torn file; one that writes a temporary and renames it leaves the old file whole."""
    import builtins
    import io
    from pathlib import Path

    real_open = builtins.open

    class HalfThenInterrupt(io.RawIOBase):
        def __init__(self, f):
            self.f = f

        def writable(self):
            return True

        def write(self, b):
            self.f.write(bytes(b)[: len(b) // 2])
            self.f.flush()
            raise KeyboardInterrupt

        def close(self):
            self.f.close()
            super().close()

    def install(folder):
        def interrupted_open(file, mode="r", *args, **kwargs):
            if "w" in mode and isinstance(file, (str, Path)) and Path(file).parent == Path(folder):
                raw = HalfThenInterrupt(real_open(file, "wb"))
                return raw if "b" in mode else io.TextIOWrapper(io.BufferedWriter(raw), encoding="utf-8")
            return real_open(file, mode, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", interrupted_open)
        monkeypatch.setattr(io, "open", interrupted_open)

    return install


# what numerics.layer and convergence.train import from torchao at module level (MXFP8TrainingOpConfig, the
# functional ops, KernelPreference): torchao 0.15 and 0.16 have no moe_training.config, 0.17 no mxfp8_linear
TORCHAO_TRAINING_API = ("torchao.quantization.quantize_.common", "torchao.prototype.moe_training.config",
                        "torchao.prototype.moe_training.mxfp8_linear")


@functools.cache
def torchao_training_api_missing() -> str | None:
    """Why this torchao cannot serve the layer and training levels, or None."""
    import importlib

    try:
        import torchao
    except ImportError as exc:
        return f"torchao is not importable ({exc})"
    for name in TORCHAO_TRAINING_API:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            return (f"torchao {torchao.__version__} has no usable {name} ({exc}); the layer and training levels "
                    "need torchao >= 0.18")
    return None


class _TorchaoGatedModule(pytest.Module):
    """A test module whose import fails for want of torchao's MXFP8 training API is skipped with the reason."""

    def collect(self):
        try:
            return super().collect()
        except self.CollectError:
            reason = torchao_training_api_missing()
            if reason is None:
                raise
            pytest.skip(reason, allow_module_level=True)


# the levels built on torchao's MXFP8 training API: skipped as a whole where it is missing
TORCHAO_TRAINING_LEVELS = ("tests/numerics/layer/", "tests/convergence/train/")


def _in_training_levels(item) -> bool:
    path = item.path.as_posix()
    return any(f"/{level}" in path for level in TORCHAO_TRAINING_LEVELS)


def pytest_pycollect_makemodule(module_path, parent):
    if module_path.name.startswith("test_") and torchao_training_api_missing() is not None:
        return _TorchaoGatedModule.from_parent(parent, path=module_path)
    return None


def pytest_configure(config):
    """One intra-op thread per xdist worker: ``-n 2`` on 2 cores otherwise runs 4 spinning OpenMP
    threads (measured: the CPU tier took 3:00 wall / 83 s CPU, and 0:44 / 16 s with one thread)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


@functools.cache
def _subject_unavailable(name: str) -> str | None:
    from numerics.tensor.subjects import get

    reason = get(name).unavailable()
    return None if reason is None else f"subject {name} unavailable: {reason}"


def _subject_of(item) -> str | None:
    params = getattr(getattr(item, "callspec", None), "params", {})
    subject = params.get("subject")
    return getattr(subject, "name", None)


def pytest_collection_modifyitems(config, items):
    hw = _hardware()
    for item in items:
        markers = {m.name for m in item.iter_markers()}
        reason = hardware_skip_reason(markers, hw)
        if reason is None and ("torchao_quantize_api" in markers or _in_training_levels(item)):
            reason = torchao_training_api_missing()
        if reason is None and "torchao_quantize_api" in markers:
            reason = _quantize_api_refusal()
        if reason is None and "slurm" in markers:
            reason = slurm_unreachable()
        if reason is None and _subject_of(item):
            reason = _subject_unavailable(_subject_of(item))
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def shared_artifact(tmp_path_factory):
    """``shared_artifact(name, make) -> Path``: ``make(path)`` run once per test session, not once per xdist worker:
    the first worker to ask makes it under the session's base folder (a file lock keeps the others waiting), every
    later caller gets the path. For deterministic artifacts that several tests only read (a test that changes one
    copies it first)."""
    import shutil

    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base

    def get(name: str, make) -> Path:
        out = root / name
        with FileLock(str(root / f"{name}.lock")):
            if not (root / f"{name}.done").exists():
                shutil.rmtree(out, ignore_errors=True)
                make(out)
                (root / f"{name}.done").write_text("")
        return out

    return get


@pytest.fixture(scope="session")
def stdlib_corpus():
    """``stdlib_corpus(path, *modules) -> path``: a small training corpus, the standard library's ``modules`` (default
    argparse.py and typing.py, ~0.2 MB) in one file: tokenized in milliseconds where the default corpus takes seconds
    in every fresh process. What is trained on does not matter to the properties the tests using it check."""
    import sysconfig

    lib = Path(sysconfig.get_paths()["stdlib"])

    def write(path: Path, *modules: str) -> Path:
        path.write_text("".join((lib / m).read_text(encoding="utf-8") for m in modules or ("argparse.py", "typing.py")))
        return path

    return write


@pytest.fixture(scope="session")
def cpu_ep_bench(shared_artifact) -> tuple[Path, dict, str]:
    """``(bench.json, its document, what the bench printed)``: ``python -m numerics.ep bench`` of the NCCL
    reference's code path on 2 gloo ranks, CPU-sized (16b shapes, 32 tokens, 3 timed calls); read by the bench's
    CLI test and notebook 04's."""
    import contextlib
    import io
    import json

    def make(out: Path) -> None:
        from numerics.ep import bench

        out.mkdir(parents=True)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            code = bench.main(["--world", "2", "--backends", "nccl,reference", "--shapes", "16b", "--payload", "bf16",
                               "--tokens", "32", "--iters", "3", "--warmup", "1", "--timeout", "30",
                               "--json", str(out / "bench.json")])
        assert code == 0, printed.getvalue()
        (out / "printed.txt").write_text(printed.getvalue())

    out = shared_artifact("cpu-ep-bench", make)
    return out / "bench.json", json.loads((out / "bench.json").read_text()), (out / "printed.txt").read_text()
