"""The step the bench times and the profile profiles: each build is a fresh model holding seed 0's initial weights."""

from __future__ import annotations

import pytest
import torch

from convergence.train.model import build_initialised
from convergence.train.perf.step import build_step
from numerics.layer.configs import get_config


def _state(model) -> dict[str, torch.Tensor]:
    return dict(model.named_parameters()) | dict(model.named_buffers())


def test_step_builds_are_fresh_models_with_the_seed_0_weights():
    cfg = get_config("tiny")
    reference = _state(build_initialised(cfg, 0))
    first, second = (build_step(cfg, "bf16", None, batch=1, seq=32, device=torch.device("cpu"), compile_=False)
                     for _ in range(2))
    for step in (first, second):
        got = _state(step.model)
        assert got.keys() == reference.keys() and all(torch.equal(got[k], reference[k]) for k in got)
    first()  # one optimizer step changes the first model only: the second and the cached values are untouched
    changed = [k for k, t in _state(first.model).items() if not torch.equal(t, reference[k])]
    assert changed and all(torch.equal(t, reference[k]) for k, t in _state(second.model).items())
    third = build_step(cfg, "bf16", None, batch=1, seq=32, device=torch.device("cpu"), compile_=False)
    assert all(torch.equal(t, reference[k]) for k, t in _state(third.model).items())


# run in a child process: dynamo's caches keep the compiled step's fake tensors alive past torch._dynamo.reset, and
# later tests in this process count the tensors alive (tests/convergence/train/test_memory.py)
_COUNT_GRAPHS = """
import functools, sys
import torch
from convergence.train.perf.step import build_step
from numerics.layer import deepseek_v3
from numerics.layer.configs import get_config

torch.compile = functools.partial(torch.compile, backend="eager")  # dynamo's count, without AOT's or inductor's work
if sys.argv[1] == "cpu":  # the graphs are the same whatever the casts compute: skip Triton's interpreter (~10 s a step)
    from numerics.layer.fast import kernel

    class Launch:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: None
    kernel.cast_kernel = lambda device_type: Launch()


def graphs(steps):
    step = build_step(get_config("tiny"), "mxfp8", "fast", batch=1, seq=32, device=torch.device(sys.argv[1]),
                      compile_=True)
    for _ in range(steps):
        step()
    return step.compiled_graphs()


whole = graphs(2)  # the second step of a whole graph must compile nothing more
linear = deepseek_v3.linear


def broken(*args, **kwargs):  # the control: every linear breaks the graph, as `op or F.linear` did under torch 2.11
    torch._dynamo.graph_break()
    return linear(*args, **kwargs)


deepseek_v3.linear = broken
print("graphs", whole, graphs(1))
"""


def _compiled_graphs(device: str) -> tuple[int, int]:
    """The dynamo graphs of two compiled fast-MXFP8 steps of the tiny model, and of one with a graph break planted
    in every linear (the control)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-W", "ignore", "-c", _COUNT_GRAPHS, device], capture_output=True, text=True,
                       timeout=600)
    lines = [line for line in r.stdout.splitlines() if line.startswith("graphs ")]
    assert r.returncode == 0 and lines, r.stderr[-3000:]
    whole, broken = lines[-1].split()[1:]
    return int(whole), int(broken)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_compiled_fast_mxfp8_step_is_one_dynamo_graph(device):
    """A graph break in the model leaves the compiled step's forward eager, module by module, and the bench's
    compiled ratio then measures that instead of a compiled step; the control plants a break in every linear and
    must count more than one graph."""
    pytest.importorskip("triton")
    whole, broken = _compiled_graphs(device)
    assert whole == 1 and broken > 1


# a child process, as above; argv: device, then "capture" (CPU: the graph a compiled step hands its backend, checked
# for AOTAutograd's cache inside and outside the step) or "inductor" (two fresh compiled steps, the cache's counts)
_AOT_CACHE = """
import functools, sys
import torch
from torch._dynamo.utils import counters
from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache, check_cacheable
from convergence.train.perf.step import build_step
from numerics.layer.configs import get_config

device, mode = sys.argv[1:]


def build():
    return build_step(get_config("tiny"), "mxfp8", "fast", batch=1, seq=32, device=torch.device(device),
                      compile_=True)


def cacheable(gm):
    try:
        check_cacheable(gm)
        return "cacheable"
    except BypassAOTAutogradCache as e:
        return "bypass:" + str(e).split(".")[0].replace(" ", "_")


if mode == "capture":
    from numerics.layer.fast import kernel

    class Launch:  # the graph is the same whatever the casts compute: skip Triton's interpreter
        def __getitem__(self, grid):
            return lambda *args, **kwargs: None
    kernel.cast_kernel = lambda device_type: Launch()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append((gm, cacheable(gm)))
        return gm.forward

    torch.compile = functools.partial(torch.compile, backend=backend)
    build()()
    (gm, inside), = graphs
    print("aot", inside, cacheable(gm))
else:
    seen = []
    for _ in range(2):
        counters.clear()
        build()()
        seen.append(",".join(sorted(k for k in counters["aot_autograd"] if k.startswith("autograd_cache_"))))
    print("aot", *seen)
"""


def _aot_cache(device: str, mode: str, tmp_path) -> list[str]:
    import os
    import subprocess
    import sys

    env = os.environ | {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}  # a cache of its own, empty
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", _AOT_CACHE, device, mode], capture_output=True,
                       text=True, timeout=600, env=env)
    lines = [line for line in r.stdout.splitlines() if line.startswith("aot ")]
    assert r.returncode == 0 and lines, r.stderr[-3000:]
    return lines[-1].split()[1:]


def test_a_compiled_fast_step_is_a_graph_torch_caches_and_only_inside_the_step(tmp_path):
    """The fast ops are custom autograd functions, which torch's AOTAutograd cache bypasses unless asked: a compiled
    step asks (``compile_cache``), so a second build of a compiled fast step reuses the first's trace. Control: the
    same graph checked outside the step is bypassed, naming the autograd function."""
    pytest.importorskip("triton")
    inside, outside = _aot_cache("cpu", "capture", tmp_path)
    assert inside == "cacheable"
    assert outside.startswith("bypass:") and "autograd_function_apply" in outside


def test_compile_cache_works_in_a_process_that_has_not_compiled_yet():
    """``torch._functorch.config`` is not an attribute of torch until something imports it (dynamo does): the
    context must import it itself, or a caller that enters it before compiling anything fails."""
    import subprocess
    import sys

    code = ("from convergence.train.perf.step import compile_cache\n"
            "with compile_cache():\n    from torch._functorch import config\n"
            "    print(config.autograd_cache_allow_custom_autograd_functions)\n"
            "print(config.autograd_cache_allow_custom_autograd_functions)")
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["True", "False"]  # on inside, torch's default again outside


@pytest.mark.gpu
def test_a_second_compiled_fast_step_on_cuda_is_an_aot_cache_hit(tmp_path):
    """On a GPU, with inductor: the first build of a compiled fast step misses an empty cache and saves its trace,
    the second hits it (without ``compile_cache`` both bypass, as the CPU test's control shows)."""
    first, second = _aot_cache("cuda", "inductor", tmp_path)
    assert "autograd_cache_miss" in first and "autograd_cache_saved" in first
    assert second == "autograd_cache_hit"
