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
