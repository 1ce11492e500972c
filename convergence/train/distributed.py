"""Distributed training: FSDP2 for the dense parameters, expert parallelism for the routed experts.

``torchrun --nproc-per-node N -m convergence train --model M --steps S --out DIR --ep N
[--ep-backend reference|deepep] [--deterministic] [--device cuda]``

Public: ``Distributed`` (the placement the training loop runs on, see ``convergence.train.placement``),
``open_group(cfg, timeout_s, check)`` (joins the group, agrees on bad input, yields the placement, tears
down), ``check_request(cfg, world)`` (bad input, before any process group), ``grad_norm_and_clip(...)``.

One process per rank, ``N = --ep = WORLD_SIZE`` (1, 2, 4, 8; gloo on CPUs, NCCL on GPUs):
* every rank builds the full model from ``--seed`` (the same initial weights as the single-process run,
  same fingerprint), keeps its ``E / N`` routed experts (``ep_dispatch.shard_experts``), applies the
  recipe, then shards every other parameter with ``fully_shard`` (per block, then the root; the experts
  are ``ignored_params``), all on one 1-D device mesh;
* the global batch (``--batch`` rows) is split by rows: rank ``r`` trains on rows ``[r b, (r + 1) b)``
  with ``b = batch / N``; FSDP averages the dense gradients over ranks; the routed experts' gradients,
  which the dispatch backward already sums over every rank's tokens, are scaled by ``1 / N`` (exact
  for N a power of two), so every gradient is that of the global-batch mean loss;
* MoE dispatch / combine go through ``numerics.ep`` (``AllToAllReference`` or ``DeepEPBackend``) via
  ``ep_dispatch.EPDispatch``; expert-load counters are summed over ranks before the bias update;
* the logged loss is the mean over ranks of the rank-local mean losses (equal row counts: the global
  mean); gradient norm over all shards; metrics and ``config.json`` are written by rank 0 only, in the
  single-process format plus ``dispatch_combine_s`` / ``dispatch_combine_share`` (time inside backend
  calls: CUDA events on GPUs) so ``python -m convergence compare`` reads the runs unchanged;
* checkpoints: ``DIR/<recipe>/checkpoint/``, sharded with torch.distributed.checkpoint
  (``dist_checkpoint``), resumable with ``--resume`` on the same N;
* ``--deterministic``: ``placement.deterministic_mode`` (as on one process), seeds fixed; DeepEP's calls run
  with ``fill_uninitialized_memory`` off (DeepEP issue #589, see numerics.ep.deepep).
Probes (per-layer BF16 vs MXFP8 side runs) run on every rank (FSDP2-sharded weights gathered whole for the
layer's twin); rank 0 writes its own rows' and experts' figures.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from convergence.train import dist_checkpoint as dckpt
from convergence.train.ep_dispatch import CommTimer, EPDispatch, combine_width, expert_params, shard_experts
from convergence.train.placement import Single, damaged
from numerics.ep.backend import MAX_TOKENS
from numerics.ep.backends import DEEPEP, DEFAULT_MAX_HIDDEN, make_backend, require
from numerics.errors import BadInput
from numerics.layer.configs import get_config


class PeerFailed(Exception):
    """Some rank had bad input and rank 0 has printed it; every rank exits quietly with code 2."""


def check_request(cfg, world: int) -> None:
    """Bad input that every rank can see alone (``run_distributed`` still agrees on it collectively)."""
    if cfg.ep != world:
        how = f"torchrun --nproc-per-node {cfg.ep} -m convergence train ..." if cfg.ep > 1 else "python -m"
        raise BadInput(f"--ep {cfg.ep} needs {cfg.ep} processes but the world size is {world}; launch "
                       f"with {how}")
    if cfg.ep not in (1, 2, 4, 8):
        raise BadInput(f"--ep must be 1, 2, 4 or 8, got {cfg.ep}")
    experts = get_config(cfg.model).n_routed_experts
    if experts % cfg.ep:
        raise BadInput(f"--ep {cfg.ep} does not divide the {experts} routed experts of model {cfg.model}")
    if cfg.batch % cfg.ep:
        raise BadInput(f"--batch {cfg.batch} must be divisible by --ep {cfg.ep} (each rank takes an equal "
                       "share of the rows)")
    if cfg.ep_backend in DEEPEP and cfg.device != "cuda":
        raise BadInput(f"--ep-backend {cfg.ep_backend} needs --device cuda (DeepEP runs on NVLink-connected GPUs)")
    try:
        require(cfg.ep_backend)
    except BadInput as exc:
        raise BadInput(f"--ep-backend: {exc}") from None


def init_group(cfg, timeout: datetime.timedelta) -> tuple[int, int, torch.device]:
    """Join torchrun's group (or make a one-rank group without torchrun)."""
    comm = "nccl" if cfg.device == "cuda" else "gloo"
    if "WORLD_SIZE" in os.environ:
        from numerics.ep.launch import init_from_env

        return init_from_env(timeout, comm)
    device = torch.device("cuda", 0) if comm == "nccl" else torch.device("cpu")
    if comm == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(comm, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return 0, 1, device


def agree(error: str | None) -> None:
    """Collective: if any rank has an error, rank 0 prints the first as one line, and every rank raises
    PeerFailed after a barrier (so torchrun, which ends the others when one rank exits, cannot end
    rank 0 before it has printed)."""
    errors: list = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    first = next((e for e in errors if e), None)
    if first is not None:
        if dist.get_rank() == 0:
            sys.stderr.write(f"error: {first}\n")
            sys.stderr.flush()
        dist.barrier()
        raise PeerFailed(first)


def load_tokens_everywhere(spec):
    """Collective: every rank reads and tokenizes the data itself, and they must end with the same tokens. The
    default corpus is each host's own Python's standard library, a ``--data`` file each host's own copy: a rank
    that cannot read its data stops every rank with its error (instead of leaving the others waiting in the next
    collective), and ranks that read different tokens stop too, rank 0 naming which read what (instead of one
    model trained on two texts, silently). Errors: ``PeerFailed`` on every rank, rank 0 having printed them."""
    from convergence.train import data as data_mod

    tokens, error = None, None
    try:
        tokens = data_mod.load_tokens(spec)
    except BadInput as exc:
        error = f"rank {dist.get_rank()}: {exc}"
    agree(error)
    seen: list = [None] * dist.get_world_size()
    dist.all_gather_object(seen, {k: tokens.meta.get(k) for k in ("source", "python", "digest")})
    error = None
    if any(m != seen[0] for m in seen):
        error = "the ranks read different tokens: " + "; ".join(
            f"rank {i} {data_mod.describe_tokens(m)}" for i, m in enumerate(seen)) + \
            " (give every host the same data: the same Python for the default corpus, or the same --data file)"
    agree(error)
    return tokens


def backend_for(cfg, device: torch.device, timeout: datetime.timedelta):
    """The run's EP backend from the one factory, sized for the widest row training sends (the backward
    combine, ``combine_width``) and the tokens one rank holds."""
    model = get_config(cfg.model)
    return make_backend(cfg.ep_backend, device=device, timeout=timeout,
                        max_hidden=max(DEFAULT_MAX_HIDDEN, combine_width(model.dim, model.top_k)),
                        max_tokens=max(MAX_TOKENS, cfg.batch // cfg.ep * cfg.seq))


def grad_norm_and_clip(grads: list[torch.Tensor | None], max_norm: float, world: int) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ over sharded gradients (every parameter is sharded: dense ones by
    FSDP, experts by EP): per-tensor 2-norms (over all ranks' shards), the 2-norm of their stack in
    parameter order, then every gradient times min(1, max_norm / (norm + 1e-6)). With one rank the
    arithmetic is clip_grad_norm_'s, operation for operation."""
    grads = [g for g in grads if g is not None]
    local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    norms = torch.stack([torch.linalg.vector_norm(g) for g in local])
    if world > 1:
        sq = norms * norms
        dist.all_reduce(sq)
        norms = sq.sqrt()
    total = torch.linalg.vector_norm(norms)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in local:
        g.mul_(coef.to(g.device))
    return total


class Distributed(Single):
    """FSDP2 for the dense parameters, expert parallelism for the routed experts, over ``mesh``."""

    def __init__(self, cfg, rank: int, world: int, device: torch.device, mesh, backend):
        super().__init__(device)
        self.cfg, self.rank, self.world, self.mesh, self.backend = cfg, rank, world, mesh, backend
        self.timer = CommTimer(device)

    def place(self, model: nn.Module) -> list[nn.Parameter]:
        shard_experts(model, self.rank, self.world)
        model.to(self.device)
        return expert_params(model)

    def after_recipe(self, model: nn.Module, experts: list[nn.Parameter]) -> None:
        for _, moe in model.moe_layers():
            moe.dispatcher = EPDispatch(self.backend, self.timer)
        ignored = set(experts)
        for block in model.layers:
            fully_shard(block, mesh=self.mesh, ignored_params=ignored & set(block.parameters()))
        fully_shard(model, mesh=self.mesh, ignored_params=ignored)
        self._experts = experts

    def rows(self, batch: torch.Tensor) -> torch.Tensor:
        b = batch.shape[0] // self.world
        return batch[self.rank * b:(self.rank + 1) * b]

    def mean(self, x: torch.Tensor) -> float:
        x = x.detach().float().clone()
        if self.world > 1:
            dist.all_reduce(x)
            x = x / self.world
        return float(x)

    def scale_expert_grads(self, experts: list[nn.Parameter]) -> None:
        # the dispatch backward already sums expert gradients over every rank's tokens; FSDP averages
        if self.world > 1:
            for p in experts:
                if p.grad is not None:
                    p.grad.mul_(1.0 / self.world)

    def clip(self, params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
        return grad_norm_and_clip([p.grad for p in params], max_norm, self.world)

    def sum_counts(self, counts: list[torch.Tensor]) -> None:
        if self.world > 1 and counts:
            total = torch.stack(counts)
            dist.all_reduce(total)
            for c, t in zip(counts, total):
                c.copy_(t)

    def any(self, flag: bool) -> bool:
        t = torch.tensor([flag], dtype=torch.int32, device=self.device)
        if self.world > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # rank 0's clock is not the others'
        return bool(t)

    def max(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        if self.world > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return [float(v) for v in t]

    def comm_seconds(self) -> float:
        return self.timer.take()

    def load_tokens(self, spec):
        return load_tokens_everywhere(spec)

    def extra_config(self) -> dict:
        cfg = self.cfg
        return {"distributed": {
            "world_size": self.world, "ep": cfg.ep, "ep_backend": cfg.ep_backend,
            "backend_class": type(self.backend).__name__, "comm": dist.get_backend(),
            "fsdp": "fully_shard per transformer block and the root; routed experts ignored (EP)",
            "rows_per_rank": cfg.batch // self.world, "deterministic": cfg.deterministic,
        }}

    def checkpoint_path(self, run_dir: Path) -> Path:
        return run_dir / "checkpoint"

    def has_checkpoint(self, run_dir: Path) -> bool:
        return dckpt.exists(self.checkpoint_path(run_dir))

    def save(self, run_dir: Path, model: nn.Module, opt, sched, meta: dict) -> None:
        dckpt.save(self.checkpoint_path(run_dir), model, opt, meta | {"scheduler": sched.state_dict(),
                                                                      "world_size": self.world},
                   expert_params=self._experts, mesh=self.mesh)

    def load(self, run_dir: Path, model: nn.Module, opt, sched) -> dict:
        try:
            meta = dckpt.load(self.checkpoint_path(run_dir), model, opt, expert_params=self._experts, mesh=self.mesh)
            sched.load_state_dict(meta["scheduler"])
        except Exception as exc:
            raise damaged(self.checkpoint_path(run_dir), exc) from None
        for group, lr in zip(opt.param_groups, sched.get_last_lr()):  # load_state_dict does not set them
            group["lr"] = lr
        return meta

    def barrier(self) -> None:
        dist.barrier()


@contextlib.contextmanager
def open_group(cfg, timeout_s: float, check: Callable[[], None]):
    """Join torchrun's group (or make a one-rank group without torchrun), check the request on every rank
    and ``check()`` (the run directory) on rank 0, agree on any error (``PeerFailed`` everywhere, rank 0
    having printed it), and yield the ``Distributed`` placement; the backend and the group are torn down
    on the way out, whatever happened."""
    torch.manual_seed(cfg.seed)
    timeout = datetime.timedelta(seconds=timeout_s)
    rank, world, device = init_group(cfg, timeout)
    backend = None
    try:
        error = None
        try:
            check_request(cfg, world)
            if rank == 0:
                check()
        except BadInput as exc:
            error = str(exc)
        agree(error)
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (world,))
        backend = backend_for(cfg, device, timeout)
        yield Distributed(cfg, rank, world, device, mesh, backend)
    finally:
        if backend is not None:
            backend.close()
        dist.destroy_process_group()
