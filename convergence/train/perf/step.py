"""The training step that ``bench`` times and ``profile_step`` profiles: one implementation of both.

Public: ``TrainingStep``, ``build_step(cfg, recipe, kernel, *, batch, seq, device, compile_)``,
``seconds_per_step(step, steps, device)``, ``peak_gib(device)``, ``free(device)``, ``graphs_note(graphs)``,
``compile_cache()``.

A step is the model with seed 0's initial weights (drawn once per process on the CPU and copied into each fresh
model: the same values as ``build_initialised(cfg, 0)``, without drawing a billion normals again for every
measurement), its recipe applied with its MXFP8 kernel, fused AdamW on a GPU, optionally
``torch.compile``d, on one fixed batch of random tokens: forward under BF16 autocast, cross-entropy, backward,
optimizer step, gradients dropped, the MoE token counts reset. Nothing reads a value back to the host, so any
host-device synchronisation a profile finds comes from the model and its ops. It is not the training loop's step
(no schedule, clipping, metrics or evaluation): the bench and the profile measure the model's own cost.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from convergence.train.model import Transformer, build_initialised, build_on_meta
from numerics.layer.configs import ModelConfig
from numerics.layer.recipes import apply_recipe, get_recipe


@dataclass
class TrainingStep:
    model: Transformer
    opt: torch.optim.Optimizer
    forward: Callable[[torch.Tensor], torch.Tensor]  # the model, or its compiled wrapper
    tokens: torch.Tensor  # [batch, seq + 1]
    device: torch.device
    graphs_before: int | None = None  # dynamo's count of compiled graphs when a compiled step was built

    def compiled_graphs(self) -> int | None:
        """Graphs dynamo compiled for this step since it was built (None when eager). A compiled step traced
        whole is 1 graph (its backward is compiled with it); more means the model breaks the graph or
        recompiles, and those parts run eagerly or dynamo's recompile limit stops compiling them:
        ``TORCH_LOGS=graph_breaks,recompiles`` says where."""
        return None if self.graphs_before is None else _dynamo_graphs() - self.graphs_before

    def __call__(self) -> None:
        with compile_cache() if self.graphs_before is not None else contextlib.nullcontext():
            with torch.autocast(self.device.type, dtype=torch.bfloat16):
                logits = self.forward(self.tokens[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), self.tokens[:, 1:].flatten())
            loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        for _, m in self.model.moe_layers():
            m.tokens_per_expert.zero_()


def build_step(cfg: ModelConfig, recipe: str, kernel: str | None, *, batch: int, seq: int, device: torch.device,
               compile_: bool) -> TrainingStep:
    """A fresh model, optimizer and batch: every call builds its own, so two calls are independent measurements.
    A compiled step starts from an empty dynamo cache: each compilation is whole (and dynamo's limit of
    recompilations per function, past which it would silently run eagerly, is never reached)."""
    model = build_on_meta(cfg)
    model.to_empty(device=device)
    initial = _initial_values(cfg)
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            t.copy_(initial[name])
    apply_recipe(model, get_recipe(recipe), device, kernel=kernel)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    if compile_:
        torch._dynamo.reset()
    forward = torch.compile(model) if compile_ else model
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1), device=device,
                           generator=torch.Generator(device=device).manual_seed(0))
    return TrainingStep(model, opt, forward, tokens, device, _dynamo_graphs() if compile_ else None)


def compile_cache():
    """A context in which torch's AOTAutograd cache takes graphs with custom autograd functions: the fast MXFP8 ops
    (``numerics.layer.fast.ops``) are such functions, and torch bypasses the cache for them unless asked (its opt-in
    ``autograd_cache_allow_custom_autograd_functions``, pytorch/pytorch#149751), so every fresh build of a compiled
    fast step traced and partitioned its forward and backward again (its warm-up took 41-45 s in every bench round
    on an H100, BF16's 2.7 s after the first, whose graphs hit the cache). The cache key hashes the traced graph, the
    functions' forward and backward bodies included, so a changed op misses the cache."""
    from torch._functorch import config  # not an attribute of torch._functorch until imported

    return config.patch(autograd_cache_allow_custom_autograd_functions=True)


def graphs_note(graphs: int) -> str:
    """What a compiled step's count of dynamo graphs (``TrainingStep.compiled_graphs``) tells, for a report line."""
    if graphs == 1:
        return "1 dynamo graph"
    return (f"{graphs} dynamo graphs, not one: parts of its step run eagerly (graph breaks or recompilations; "
            "TORCH_LOGS=graph_breaks,recompiles says where)")


def _dynamo_graphs() -> int:
    """Graphs dynamo has compiled in this process (its counters survive ``torch._dynamo.reset``)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@functools.lru_cache(maxsize=1)
def _initial_values(cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Every parameter and buffer (non-persistent ones too) of ``build_initialised(cfg, 0)``, on the CPU."""
    model = build_initialised(cfg, 0)
    return {name: t.detach() for name, t in [*model.named_parameters(), *model.named_buffers()]}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds_per_step(step: Callable[[], None], steps: int, device: torch.device) -> float:
    """Mean seconds of ``steps`` back-to-back steps: CUDA events around them on a GPU (the queue drained first),
    a wall clock on a CPU."""
    sync(device)
    if device.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        return (time.perf_counter() - t0) / steps
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        step()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / steps


def peak_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def free(device: torch.device) -> None:
    """After the caller dropped its step: return the cached memory and restart the peak, so the next step's peak
    is its own."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
