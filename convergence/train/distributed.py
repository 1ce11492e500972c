"""Distributed training: FSDP2 for the dense parameters, expert parallelism for the routed experts.

``torchrun --nproc-per-node N -m convergence train --model M --steps S --out DIR --ep N
[--ep-backend reference|deepep] [--deterministic] [--device cuda]``

Public: ``check_request(cfg, world)`` (bad input, before any process group), ``run_distributed(cfg, out,
...)``, ``grad_norm_and_clip(...)``.

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
* ``--deterministic``: ``torch.use_deterministic_algorithms(True)`` (``CUBLAS_WORKSPACE_CONFIG`` set
  before CUDA starts), cuDNN benchmarking off, seeds fixed; DeepEP's calls run with
  ``fill_uninitialized_memory`` off (DeepEP issue #589, see numerics.ep.deepep).
Probes (per-layer BF16 vs MXFP8 side runs) are single-process only.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from convergence.train import data as data_mod
from convergence.train import dist_checkpoint as dckpt
from convergence.train.checkpoint import JsonlLog
from convergence.train.ep_dispatch import CommTimer, EPDispatch, combine_width, expert_params, shard_experts
from numerics.cli import CLIError
from numerics.layer.configs import get_config
from numerics.layer.recipes import apply_recipe, get_recipe

BACKENDS = ("reference", "deepep")


class PeerFailed(Exception):
    """Some rank had bad input and rank 0 has printed it; every rank exits quietly with code 2."""


def check_request(cfg, world: int) -> None:
    """Bad input that every rank can see alone (``run_distributed`` still agrees on it collectively)."""
    if cfg.ep != world:
        how = f"torchrun --nproc-per-node {cfg.ep} -m convergence train ..." if cfg.ep > 1 else "python -m"
        raise CLIError(f"--ep {cfg.ep} needs {cfg.ep} processes but the world size is {world}; launch "
                       f"with {how}")
    if cfg.ep not in (1, 2, 4, 8):
        raise CLIError(f"--ep must be 1, 2, 4 or 8, got {cfg.ep}")
    experts = get_config(cfg.model).n_routed_experts
    if experts % cfg.ep:
        raise CLIError(f"--ep {cfg.ep} does not divide the {experts} routed experts of model {cfg.model}")
    if cfg.batch % cfg.ep:
        raise CLIError(f"--batch {cfg.batch} must be divisible by --ep {cfg.ep} (each rank takes an equal "
                       "share of the rows)")
    if cfg.ep_backend not in BACKENDS:
        raise CLIError(f"unknown --ep-backend {cfg.ep_backend!r}; choose from {', '.join(BACKENDS)}")
    if cfg.probe_every:
        raise CLIError("--probe-every is single-process only; drop it (or pass 0) with --ep")
    if cfg.ep_backend == "deepep":
        if cfg.device != "cuda":
            raise CLIError("--ep-backend deepep needs --device cuda (DeepEP runs on NVLink-connected GPUs)")
        from numerics.ep.deepep import import_deep_ep

        try:
            import_deep_ep()
        except ImportError as exc:
            raise CLIError(f"--ep-backend deepep: {exc}") from None


def set_deterministic(device: str) -> None:
    if device == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True


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


def make_backend(cfg, device: torch.device, timeout: datetime.timedelta):
    if cfg.ep_backend == "deepep":
        from numerics.ep.deepep import DeepEPBackend

        model = get_config(cfg.model)
        return DeepEPBackend(max_hidden=max(7168, combine_width(model.dim, model.top_k)), timeout=timeout)
    from numerics.ep.reference import AllToAllReference

    return AllToAllReference(device=device, timeout=timeout)


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


def _mean_over_ranks(x: torch.Tensor, world: int) -> float:
    x = x.detach().float().clone()
    if world > 1:
        dist.all_reduce(x)
        x = x / world
    return float(x)


def _rows(batch: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    b = batch.shape[0] // world
    return batch[rank * b:(rank + 1) * b]


@torch.no_grad()
def _validate(model, val: data_mod.Batches, cfg, device, rank: int, world: int) -> float:
    from convergence.train.loop import _loss

    moes = [m for _, m in model.moe_layers()]
    saved = [m.tokens_per_expert.clone() for m in moes]
    losses = [_mean_over_ranks(_loss(model, _rows(b, rank, world), device), world)
              for b in val.eval_batches(cfg.val_batches)]
    for m, s in zip(moes, saved):
        m.tokens_per_expert.copy_(s)
    return sum(losses) / len(losses)


def _build(cfg, recipe, vocab: int, rank: int, world: int, device: torch.device, backend, timer, mesh):
    from convergence.train.loop import build_model, fingerprint

    model = build_model(cfg, vocab)
    init_fp = fingerprint(model)
    shard_experts(model, rank, world)
    model.to(device)
    applied = apply_recipe(model, recipe, device)
    for _, moe in model.moe_layers():
        moe.dispatcher = EPDispatch(backend, timer)
    experts = expert_params(model)
    ignored = set(experts)
    for block in model.layers:
        fully_shard(block, mesh=mesh, ignored_params=ignored & set(block.parameters()))
    fully_shard(model, mesh=mesh, ignored_params=ignored)
    return model, experts, init_fp, applied


def train_recipe_distributed(cfg, recipe_name: str, run_dir: Path, tokens: data_mod.TokenData, *, ctx: dict,
                             resume: bool, progress: bool = True, stop_after_s: float | None = None) -> bool:
    """One recipe on every rank; returns True when it reached ``cfg.steps``."""
    from convergence.train.loop import _loss, _optimizer, _progress, write_run_config

    rank, world, device, mesh = ctx["rank"], ctx["world"], ctx["device"], ctx["mesh"]
    recipe = get_recipe(recipe_name)
    timer = CommTimer(device)
    model, experts, init_fp, applied = _build(cfg, recipe, tokens.vocab_size, rank, world, device,
                                              ctx["backend"], timer, mesh)
    opt, sched = _optimizer(model, cfg)
    ckpt_dir = run_dir / "checkpoint"
    metrics = JsonlLog(run_dir / "metrics.jsonl")
    start = 0
    if resume and dckpt.exists(ckpt_dir):
        meta = dckpt.load(ckpt_dir, model, opt, expert_params=experts, mesh=mesh)
        sched.load_state_dict(meta["scheduler"])
        for group, lr in zip(opt.param_groups, sched.get_last_lr()):  # load_state_dict does not set them
            group["lr"] = lr
        start = meta["step"]
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        if metrics.path.exists():
            metrics.truncate_after(start)
        write_run_config(run_dir, cfg, recipe, applied, model.cfg, tokens, init_fp, distributed={
            "world_size": world, "ep": cfg.ep, "ep_backend": cfg.ep_backend,
            "backend_class": type(ctx["backend"]).__name__, "comm": dist.get_backend(),
            "fsdp": "fully_shard per transformer block and the root; routed experts ignored (EP)",
            "rows_per_rank": cfg.batch // world, "deterministic": cfg.deterministic,
        })

    batches = data_mod.Batches(tokens.train, batch=cfg.batch, seq=cfg.seq, seed=cfg.seed)
    val = data_mod.Batches(tokens.val, batch=cfg.batch, seq=cfg.seq, seed=cfg.seed)
    moe_layers = model.moe_layers()
    coeff = model.cfg.load_balance_coeff
    t_start = time.monotonic()
    for step in range(start, cfg.steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        timer.take()
        t0 = time.perf_counter()
        loss = _loss(model, _rows(batches.batch_at(step), rank, world), device)
        loss.backward()
        for p in experts:
            if p.grad is not None and world > 1:
                p.grad.mul_(1.0 / world)
        grad_norm = grad_norm_and_clip([p.grad for p in model.parameters()], cfg.grad_clip, world)
        lr = sched.get_last_lr()[0]
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if world > 1:
            counts = torch.stack([m.tokens_per_expert for _, m in moe_layers])
            dist.all_reduce(counts)
            for (_, m), c in zip(moe_layers, counts):
                m.tokens_per_expert.copy_(c)
        shares = {f"layer{i}": m.end_step(coeff) for i, m in moe_layers}
        loss_f = _mean_over_ranks(loss, world)
        if device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        comm = timer.take()
        done = step + 1
        rec = {
            "step": done, "loss": loss_f, "grad_norm": float(grad_norm), "lr": lr,
            "tokens": done * cfg.batch * cfg.seq, "tokens_per_s": cfg.batch * cfg.seq / dt,
            "expert_load_max_share": shares, "dispatch_combine_s": comm, "dispatch_combine_share": comm / dt,
        }
        if cfg.val_every and (done % cfg.val_every == 0 or done == cfg.steps):
            rec["val_loss"] = _validate(model, val, cfg, device, rank, world)
        if not math.isfinite(loss_f):
            rec["diverged"] = True
        if rank == 0:
            metrics.append(rec)
        flag = torch.tensor([stop_after_s is not None and time.monotonic() - t_start > stop_after_s],
                            dtype=torch.int32, device=device)
        if world > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # rank 0's clock is not the others'
        out_of_time = bool(flag)
        if cfg.ckpt_every and (done % cfg.ckpt_every == 0 or done == cfg.steps or out_of_time
                               or not math.isfinite(loss_f)):
            dckpt.save(ckpt_dir, model, opt, {
                "step": done, "scheduler": sched.state_dict(),
                "data_position": {"step": done, "samples": done * cfg.batch, "seed": cfg.seed},
                "config": json.loads(json.dumps(cfg.fields_for_resume(), default=str)), "world_size": world,
            }, expert_params=experts, mesh=mesh)
        if progress and rank == 0:
            _progress(recipe_name, done, cfg.steps, loss_f, rec["tokens_per_s"])
        if not math.isfinite(loss_f):
            return True
        if out_of_time and done < cfg.steps:
            return False
    return True


def run_distributed(cfg, out: Path, *, resume: bool = False, force: bool = False, progress: bool = True,
                    stop_after_s: float | None = None, timeout_s: float = 300.0) -> dict | None:
    """All recipes of ``cfg`` on every rank of the group; rank 0 returns the verdict, others None."""
    from convergence.train.loop import _check_run_dir, compare_and_plot

    if cfg.deterministic:
        set_deterministic(cfg.device)
    torch.manual_seed(cfg.seed)
    timeout = datetime.timedelta(seconds=timeout_s)
    rank, world, device = init_group(cfg, timeout)
    backend = None
    try:
        error = None
        try:
            check_request(cfg, world)
            if rank == 0:
                _check_run_dir(cfg, Path(out), resume, force)
        except CLIError as exc:
            error = str(exc)
        agree(error)
        tokens = data_mod.load_tokens(cfg.data)
        data_mod.Batches(tokens.train, batch=cfg.batch, seq=cfg.seq, seed=cfg.seed)  # fail early: too few
        data_mod.Batches(tokens.val, batch=cfg.batch, seq=cfg.seq, seed=cfg.seed)
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (world,))
        backend = make_backend(cfg, device, timeout)
        ctx = {"rank": rank, "world": world, "device": device, "mesh": mesh, "backend": backend}
        t0 = time.monotonic()
        for name in cfg.recipes:
            left = None if stop_after_s is None else stop_after_s - (time.monotonic() - t0)
            if not train_recipe_distributed(cfg, name, Path(out) / name, tokens, ctx=ctx, resume=resume,
                                            progress=progress, stop_after_s=left):
                return None
        dist.barrier()
        return compare_and_plot(Path(out), cfg.recipes) if rank == 0 else None
    finally:
        if backend is not None:
            backend.close()
        dist.destroy_process_group()
