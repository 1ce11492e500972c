"""How much GPU and host memory a training run needs, known before its first step: one clear line when it
cannot fit.

Public: ``MemoryNeed``, ``state_bytes(model_cfg, ranks, ep, optimizer_state)``, ``activation_bytes_per_token(
model_cfg, seq, device)``, ``estimate(model_cfg, *, batch, seq, ranks, ep, device, checkpointing, activations,
optimizer_state)``, ``check_fits(need, gpu_bytes, where)``, ``check_host(need, host_bytes_per_rank)``,
``pinned_moment_bytes(model_cfg, ranks, ep)``, ``host_bytes()``.

* **Model states, exact.** FP32 master weights (4 bytes), their FP32 gradients (4) and AdamW's two moments
  (8): 16 bytes per parameter (``convergence.train.loop``'s mixed precision). Dense parameters are sharded
  over the FSDP2 ranks, routed experts over the expert-parallel ranks (``convergence.train.distributed``).
  FSDP2 also gathers one block's dense weights (FP32) at a time, two with prefetching. With the moments in
  host memory (``optimizer_state="host"``, ``convergence.train.placement``) the GPU keeps 8 bytes per
  parameter plus the largest parameter's moments during its update, and each rank's host memory the 8.
* **Host memory, exact.** Every rank builds the whole FP32 model on its CPU (4 bytes per parameter: the same
  initial weights everywhere) before placing it; with the moments in host memory a rank then pins its
  moments, each rounded up to a power of two by torch's pinned allocator (+44 % at 16b, EP=2). The peak is
  the larger of the two (``MemoryNeed.host_peak``).
* **Activations, measured.** What autograd saves for backward, counted with ``saved_tensors_hooks`` on
  the model's own blocks (``numerics.layer.deepseek_v3``) at the run's widths and sequence length, on the run's
  device (the attention kernel decides what attention saves), for one and two sequences: the difference is
  the cost of one more sequence, weights and their casts cancel out. Routed experts are reduced to
  ``2 * top_k`` for the measurement: the expert rows a token adds (``top_k`` of them) do not depend on how
  many experts there are.

What is not counted: the allocator's fragmentation, NCCL / DeepEP buffers, the CUDA context, and the
transient peak of the output head's cross-entropy beyond its saved tensors; ``check_fits`` keeps a
``HEADROOM`` for them.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from numerics.errors import BadInput
from numerics.layer.configs import ModelConfig, param_count

GIB = 2**30
STATE_BYTES_PER_PARAM = 4 + 4 + 8  # FP32 weight, FP32 gradient, AdamW exp_avg and exp_avg_sq
MOMENT_BYTES_PER_PARAM = 8  # AdamW's exp_avg and exp_avg_sq, FP32: what optimizer_state="host" moves off the GPU
HEADROOM = 0.10  # of the GPU kept free for what is not counted (module docstring); a guess, to be measured
RESIDUAL_BYTES = 4  # the residual stream between blocks is FP32 (FP32 embedding plus BF16 block outputs)


@dataclass(frozen=True)
class MemoryNeed:
    params_dense: int
    params_experts: int
    ranks: int
    ep: int
    tokens_per_rank: int
    states: float  # bytes per GPU
    gathered: float  # FSDP2's gathered block weights, bytes per GPU
    activations: float  # bytes per GPU
    activation_per_token: float
    checkpointing: bool = False
    measured: bool = True  # False: activations not measured (estimate(activations=False)), counted as 0
    optimizer_state: str = "device"  # where AdamW's moments wait between steps (device or host)
    host_states: float = 0.0  # bytes per rank in host memory (the moments, with optimizer_state="host")
    host_pinned: float = 0.0  # what pinning host_states takes: torch rounds each pinned block up to a power of two
    host_build: float = 0.0  # bytes per rank: the whole FP32 model, which every rank builds before placing it

    @property
    def host_peak(self) -> float:
        """A rank's host memory at its peak: the model it builds leaves for the GPU before the moments arrive
        (measured on the 16b, 2 x H200: 90.1 GiB per rank against the 84.5 GiB of pinned moments here)."""
        return max(self.host_build, self.host_pinned)

    @property
    def total(self) -> float:
        return self.states + self.gathered + self.activations


def _param_split(cfg: ModelConfig) -> tuple[int, int, int]:
    """(dense parameters, routed-expert parameters, the largest block's dense parameters), from
    ``numerics.layer.configs.param_count``: what FSDP2 shards, what expert parallelism shards, and what
    FSDP2 gathers for one block (its attention, its two norms, and its dense FFN or shared experts + router)."""
    parts = param_count(cfg)
    experts = parts["routed_experts"]
    per_layer = parts["attention"] // cfg.n_layers + 2 * cfg.dim
    dense_ffn = parts["dense_ffn"] // cfg.n_dense_layers if cfg.n_dense_layers else 0
    moe = (parts["shared_experts"] + parts["router"]) // cfg.n_moe_layers if cfg.n_moe_layers else 0
    return parts["total"] - experts, experts, per_layer + max(dense_ffn, moe)


def state_bytes(cfg: ModelConfig, ranks: int = 1, ep: int = 1,
                optimizer_state: str = "device") -> tuple[float, float, int, int]:
    """(model-state bytes per GPU, gathered-weights bytes per GPU, dense params, expert params). With the
    moments in host memory the GPU holds, besides weights and gradients, one parameter's moments at a time:
    the largest, a routed-expert weight of one layer ([experts / ep, out, in], three per MoE layer)."""
    dense, experts, block = _param_split(cfg)
    local = dense / ranks + experts / ep
    states = STATE_BYTES_PER_PARAM * local
    if optimizer_state == "host":
        largest = max(experts / ep / max(3 * cfg.n_moe_layers, 1), block)
        states -= MOMENT_BYTES_PER_PARAM * (local - largest)
    gathered = 0.0 if ranks == 1 else 2 * 4 * block
    return states, gathered, dense, experts


@functools.lru_cache(maxsize=8)  # the start-up's memory check asks twice per placement; the 16b on meta takes 1.3 s
def pinned_moment_bytes(cfg: ModelConfig, ranks: int = 1, ep: int = 1) -> tuple[float, float]:
    """(bytes of one rank's AdamW moments, bytes they pin). torch's caching host allocator rounds every pinned
    allocation up to the next power of two (``ATen/core/CachingHostAllocator.h``: ``PowerOf2Ceil``), and each
    moment of each local parameter is one allocation: a routed-expert weight's local [experts / ep, 1408, 2048]
    (369 MB at 16b, EP=2) pins 512 MiB. Local shards as ``convergence.train.distributed`` cuts them: experts
    over ``ep``, every other parameter's first dimension over ``ranks`` (the largest shard, rank 0's)."""
    from convergence.train.model import build_on_meta

    exact = pinned = 0
    for name, p in build_on_meta(cfg).named_parameters():
        rows = p.shape[0] // ep if ".moe.experts." in name else -(-p.shape[0] // ranks)
        nbytes = 4 * rows * (p.numel() // p.shape[0])
        for _ in range(MOMENT_BYTES_PER_PARAM // 4):  # exp_avg, exp_avg_sq
            exact += nbytes
            pinned += 1 << max(nbytes - 1, 0).bit_length()
    return float(exact), float(pinned)


def _saved_bytes(fn, *args) -> int:
    """Bytes of the distinct non-parameter tensors autograd saves while ``fn(*args)`` runs (the graph, hence
    every saved storage, stays alive until it returns: no address is reused while counting)."""
    seen: dict[tuple[int, int], int] = {}

    def pack(t: torch.Tensor):
        if not isinstance(t, torch.nn.Parameter):
            s = t.untyped_storage()
            seen[(s.data_ptr(), s.nbytes())] = s.nbytes()
        # detached: an op's saved output returned as it is, with its grad_fn, closes a cycle inside autograd (grad_fn,
        # its saved tensor, that tensor's grad_fn) that gc cannot collect: every graph measured would stay alive
        return t.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    del out
    return sum(seen.values())


def activation_bytes_per_token(cfg: ModelConfig, seq: int, device: torch.device | str = "cpu") -> dict[str, float]:
    """Saved bytes per token of one dense block, one MoE block and the head + loss, measured (module doc)."""
    from numerics.layer.deepseek_v3 import rope_frequencies

    dev = torch.device(device)
    small = dataclasses.replace(cfg, n_routed_experts=min(cfg.n_routed_experts, max(2 * cfg.top_k, 8)))
    cos, sin = (t.to(dev) for t in rope_frequencies(small, seq))
    # the measurement draws its own weights and inputs on a forked RNG: the run that asked keeps its stream
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        torch.manual_seed(0)
        return _measure(cfg, small, seq, dev, cos, sin)


def _measure(cfg: ModelConfig, small: ModelConfig, seq: int, dev: torch.device, cos, sin) -> dict[str, float]:
    from convergence.train.model import Block
    from numerics.layer.deepseek_v3 import Linear, RMSNorm

    parts = {}
    with torch.device(dev):
        dense = Block(small, 0) if cfg.n_dense_layers else None
        moe = Block(dataclasses.replace(small, n_dense_layers=0), 0) if cfg.n_moe_layers else None
        head = torch.nn.ModuleDict({"norm": RMSNorm(cfg.dim, cfg.norm_eps),
                                    "output": Linear(cfg.dim, cfg.vocab_size)})
    for m in (dense, moe, head):
        if m is not None:
            for p in m.parameters():
                torch.nn.init.normal_(p, std=0.02)

    def block(m):
        return lambda x, _t: m(x, cos, sin)

    def loss(x, t):
        logits = head["output"](head["norm"](x))
        return F.cross_entropy(logits.float().flatten(0, 1), t.flatten())

    runs = [("dense_block", block(dense) if dense else None), ("moe_block", block(moe) if moe else None),
            ("head", loss)]
    for name, f in runs:
        if f is None:
            continue
        sizes = []
        for b in (1, 2):
            x = torch.randn(b, seq, cfg.dim, device=dev, requires_grad=True)
            t = torch.randint(0, cfg.vocab_size, (b, seq), device=dev)
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                sizes.append(_saved_bytes(f, x, t))
        parts[name] = max(0.0, (sizes[1] - sizes[0]) / seq)
    return parts


def estimate(cfg: ModelConfig, *, batch: int, seq: int, ranks: int = 1, ep: int = 1,
             device: torch.device | str = "cpu", checkpointing: bool = False, activations: bool = True,
             optimizer_state: str = "device") -> MemoryNeed:
    """Per-GPU bytes of a run whose ``batch`` sequences are split over ``ranks``. With activation checkpointing
    a block keeps only its input (the FP32 residual stream: ``RESIDUAL_BYTES`` per width) until backward runs
    it again, when one block's activations live at a time: the largest one's. ``activations=False``: the
    model states only, exact and instant (the measurement takes half a minute at 16B widths on a CPU)."""
    states, gathered, dense, experts = state_bytes(cfg, ranks, ep, optimizer_state)
    place = dict(optimizer_state=optimizer_state, host_build=4.0 * (dense + experts))
    if optimizer_state == "host":
        exact, pinned = pinned_moment_bytes(cfg, ranks, ep)
        place |= dict(host_states=exact, host_pinned=pinned)
    tokens = -(-batch // ranks) * seq
    if not activations:
        return MemoryNeed(dense, experts, ranks, ep, tokens, states, gathered, 0.0, 0.0, checkpointing, False,
                          **place)
    per = activation_bytes_per_token(cfg, seq, device)
    blocks = {"dense_block": cfg.n_dense_layers, "moe_block": cfg.n_moe_layers}
    if checkpointing:
        per_token = (cfg.n_layers * RESIDUAL_BYTES * cfg.dim
                     + max(per.get(b, 0.0) for b, n in blocks.items() if n) + per["head"])
    else:
        per_token = sum(n * per.get(b, 0.0) for b, n in blocks.items()) + per["head"]
    return MemoryNeed(dense, experts, ranks, ep, tokens, states, gathered, per_token * tokens, per_token,
                      checkpointing, **place)


def host_bytes() -> int:
    """The machine's physical memory (what a CPU run's processes share)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_fits(need: MemoryNeed, gpu_bytes: float, *, model: str = "the model", where: str = "GPU") -> None:
    """BadInput with one line (how much is needed, what the GPU has, what would fit) when ``need`` does not fit
    in ``gpu_bytes`` less ``HEADROOM``. ``where="CPU process"``: ``gpu_bytes`` is a process's share of the
    host's memory, and a model whose states do not fit is sent to GPUs."""
    usable = gpu_bytes * (1 - HEADROOM)
    if need.total <= usable:
        return
    params = (need.params_dense + need.params_experts) / 1e9
    adamw = "AdamW state" if need.optimizer_state == "device" else "AdamW state of one parameter (the rest in host)"
    what = (f"{model} needs about {need.total / GIB:.0f} GiB per {where} ({need.states / GIB:.0f} GiB of FP32 "
            f"weights, gradients and {adamw} for {params:.2f}B parameters over {need.ranks} rank(s), "
            f"expert-parallel {need.ep}; " + (f"{need.activations / GIB:.0f} GiB of activations for "
            f"{need.tokens_per_rank} tokens" if need.measured else "activations not counted")
            + f"), the {where} has {gpu_bytes / GIB:.0f} GiB")
    fixed = need.states + need.gathered
    if fixed <= usable and need.activation_per_token > 0:
        fit = int((usable - fixed) // need.activation_per_token)
        hint = (f"about {fit} tokens per GPU fit: lower --batch or --seq" if fit else
                "its model states fit but no activations do")
        if not need.checkpointing:
            hint += ", or pass --activation-checkpointing"
        if need.optimizer_state == "device":
            hint += ", or --optimizer-state host (AdamW's moments in host memory)"
    elif where != "GPU":
        hint = "its model states alone do not fit: train it on GPUs (--device cuda, torchrun with --ep N)"
    else:
        gpus, per = 1, STATE_BYTES_PER_PARAM - (MOMENT_BYTES_PER_PARAM if need.optimizer_state == "host" else 0)
        while per * (need.params_dense + need.params_experts) / gpus > usable and gpus < 4096:
            gpus *= 2
        hint = f"its model states alone need {gpus} GPUs or more (torchrun --nproc-per-node N with --ep N)"
        if need.optimizer_state == "device":
            hint += ", or --optimizer-state host (AdamW's moments in host memory)"
    raise BadInput(f"{what}: {hint}")


def check_host(need: MemoryNeed, host_bytes_per_rank: float) -> None:
    """BadInput with one line when a rank's host-memory peak (``MemoryNeed.host_peak``) does not fit its share of
    the host, less ``HEADROOM`` (the process itself, its staging buffers and the data need some too)."""
    usable = host_bytes_per_rank * (1 - HEADROOM)
    if need.host_peak <= usable:
        return
    share = f"each rank's share of the host is {host_bytes_per_rank / GIB:.0f} GiB"
    if need.host_pinned >= need.host_build:
        raise BadInput(f"--optimizer-state host keeps {need.host_states / GIB:.0f} GiB of AdamW moments in host memory "
                       f"per rank, {need.host_pinned / GIB:.0f} GiB once pinned (torch rounds each pinned block up to "
                       f"a power of two), and {share}: use more GPUs (torchrun --nproc-per-node N with --ep N)")
    raise BadInput(f"every rank builds the whole FP32 model in host memory before sharding it, "
                   f"{need.host_build / GIB:.0f} GiB, and {share}: run fewer ranks per host")
