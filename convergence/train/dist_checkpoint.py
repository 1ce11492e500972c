"""Sharded checkpoints of a distributed run with torch.distributed.checkpoint (DCP).

Public: ``save(path, model, opt, meta, world)``, ``load(path, model, opt) -> meta``, ``exists(path)``,
``read_meta(path)``.

What is saved, as one DCP state dict of tensor *views* (no copies; loading writes into them in place):
* ``model.<fqn>`` — FSDP2-sharded parameters as their own DTensors; routed-expert weights (plain local
  ``[L, out, in]`` slices) as ``Shard(0)`` DTensors of the global ``[E, out, in]``; buffers (the
  replicated expert bias) plain;
* ``optim.<fqn>.<step|exp_avg|exp_avg_sq>`` — AdamW state laid out like its parameter;
* ``meta.json`` (rank 0): step, scheduler state, data position, the resume-relevant config.
torchao's MXFP8 weight wrapper is looked through to its plain data, so a checkpoint holds plain
tensors whatever the recipe.

Atomicity: DCP writes ``<path>.tmp/``; after every rank is done, rank 0 moves the old checkpoint to
``<path>.old/``, renames ``.tmp`` to ``<path>`` and removes ``.old``; a run killed in between resumes
from ``<path>.old`` (``exists`` / ``load`` look there when ``<path>`` is missing).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.tensor import DTensor, Shard

OPT_KEYS = ("step", "exp_avg", "exp_avg_sq")  # AdamW (foreach=False) per-parameter state


def _inner(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor holding ``t``'s values (DTensor local shard, torchao wrapper data), not a copy."""
    if isinstance(t, DTensor):
        t = t._local_tensor
    while isinstance(getattr(t, "_data", None), torch.Tensor):
        t = t._data
    return t


def _view(t: torch.Tensor, param: torch.Tensor, experts: set[int], mesh) -> torch.Tensor:
    if t.dim() == 0:
        return _inner(t)  # AdamW's step: the same on every rank
    if isinstance(param, DTensor):
        return DTensor.from_local(_inner(t), param.device_mesh, param.placements, run_check=False,
                                  shape=param.shape, stride=param.stride())
    if id(param) in experts:
        local = _inner(t)
        shape = (local.shape[0] * mesh.size(), *local.shape[1:])
        stride = torch.empty(shape, device="meta").stride()
        return DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=shape, stride=stride)
    return _inner(t)


def _buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for mname, mod in model.named_modules():
        for bname, b in mod._buffers.items():
            if b is not None and bname not in mod._non_persistent_buffers_set:
                out[f"{mname}.{bname}" if mname else bname] = b
    return out


def _state(model: nn.Module, opt: torch.optim.Optimizer, expert_params: list, mesh) -> dict:
    experts = {id(p) for p in expert_params}
    sd: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        sd[f"model.{name}"] = _view(p, p, experts, mesh)
        st = opt.state.get(p)
        if st:
            for key in OPT_KEYS:
                sd[f"optim.{name}.{key}"] = _view(st[key], p, experts, mesh)
    for name, b in _buffers(model).items():
        sd[f"model.{name}"] = _inner(b)
    return sd


def _where(path: Path) -> Path | None:
    path = Path(path)
    for p in (path, path.with_name(path.name + ".old")):
        if (p / "meta.json").exists():
            return p
    return None


def exists(path: Path) -> bool:
    return _where(path) is not None


def read_meta(path: Path) -> dict:
    found = _where(path)
    if found is None:
        raise FileNotFoundError(f"no checkpoint at {path}")
    return json.loads((found / "meta.json").read_text())


def save(path: Path, model: nn.Module, opt: torch.optim.Optimizer, meta: dict, *, expert_params: list,
         mesh) -> None:
    path = Path(path)
    tmp, old = path.with_name(path.name + ".tmp"), path.with_name(path.name + ".old")
    rank = dist.get_rank()
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier()
    dcp.save(_state(model, opt, expert_params, mesh), checkpoint_id=str(tmp))
    dist.barrier()
    if rank == 0:
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        if path.exists():
            shutil.rmtree(old, ignore_errors=True)
            path.rename(old)
        tmp.rename(path)
        shutil.rmtree(old, ignore_errors=True)
    dist.barrier()


def init_optimizer_state(opt: torch.optim.Optimizer) -> None:
    """Create AdamW's per-parameter state as its first step would (so a load has tensors to fill)."""
    for group in opt.param_groups:
        for p in group["params"]:
            opt.state[p] = {
                "step": torch.tensor(0.0, dtype=torch.float32),
                "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
            }


def load(path: Path, model: nn.Module, opt: torch.optim.Optimizer, *, expert_params: list, mesh) -> dict:
    """Fill the model and optimizer in place from the checkpoint at ``path``; returns its meta."""
    found = _where(path)
    if found is None:
        raise FileNotFoundError(f"no checkpoint at {path}")
    init_optimizer_state(opt)
    dcp.load(_state(model, opt, expert_params, mesh), checkpoint_id=str(found))
    getattr(opt, "settle", lambda: None)()  # HostStateAdamW: the loaded moments go to host memory
    return json.loads((found / "meta.json").read_text())
