"""Where a training run's model and state live: one process (``Single``), or FSDP2 + expert parallelism
over a process group (``convergence.train.distributed.Distributed``, the same interface).

The training loop (``convergence.train.loop``) is written once against this interface; world size 1
without a process group is ``Single``. What differs between the two is only what this interface says:
how the model is built and sharded, which rows of a batch a rank takes, how losses, gradient norms and
expert counts are reduced over ranks, and how checkpoints are written.

``Single``: the whole model on ``device``; ``torch.nn.utils.clip_grad_norm_``; ``DIR/checkpoint.pt``
(weights, AdamW, scheduler, RNG, data position), written atomically by ``checkpoint.save_checkpoint``.

``deterministic_mode(enabled, device)``: what ``--deterministic`` means on either placement, for the
duration of a run.

``HostStateAdamW`` (``--optimizer-state host``; ``OPTIMIZER_STATES``): where AdamW's two moments wait between
steps. AdamW keeps two FP32 moments per parameter, 8 of the 16 bytes per parameter the loop holds
(``convergence.train.memory``): for the 16b over two H200s, 63 GB per GPU. ``HostStateAdamW`` keeps them in
pinned host memory and brings one parameter's moments to its device for that parameter's update, then copies
them back: the update is ``torch.optim.AdamW``'s own step (single-tensor, on the parameter's device, the same
kernels), so the run is bit-identical to one with the moments on the device, and only the largest parameter's
moments are on the GPU at a time. The price is moving them across PCIe twice a step.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from convergence.train.checkpoint import CHECKPOINT_FILE, load_checkpoint, save_checkpoint
from numerics.errors import BadInput


@contextlib.contextmanager
def deterministic_mode(enabled: bool, device: str) -> Iterator[None]:
    """``torch.use_deterministic_algorithms(True)`` with cuDNN benchmarking off while a ``--deterministic``
    run trains, the previous settings restored after it, so a run repeats bit for bit and nothing else in
    the process (a test, validate's other levels) changes mode. ``CUBLAS_WORKSPACE_CONFIG`` is set (unless
    the user set it) for cuBLAS's deterministic workspace; it takes effect where cuBLAS has not started."""
    if not enabled:
        yield
        return
    if device == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = False, True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[2], saved[3]


class Single:
    """One process, the whole model on one device."""

    rank, world = 0, 1

    def __init__(self, device: torch.device):
        self.device = torch.device(device)

    @property
    def writer(self) -> bool:
        """Whether this rank writes metrics, config.json and the verdict."""
        return self.rank == 0

    def place(self, model: nn.Module) -> list[nn.Parameter]:
        """Move (and shard) the built model; returns the routed-expert parameters (none to treat apart here)."""
        model.to(self.device)
        return []

    def after_recipe(self, model: nn.Module, experts: list[nn.Parameter]) -> None:
        """Called once the recipe's MXFP8 ops are in place (where sharding happens on several ranks)."""

    def rows(self, batch: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a global batch."""
        return batch

    def mean(self, x: torch.Tensor) -> float:
        """The mean over ranks of a per-rank scalar."""
        return float(x.detach().float())

    def scale_expert_grads(self, experts: list[nn.Parameter]) -> None:
        """Make expert gradients those of the global-batch mean loss (a no-op on one rank)."""

    def clip(self, params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)

    def sum_counts(self, counts: list[torch.Tensor]) -> None:
        """Sum the MoE layers' routed-token counters over ranks, in place."""

    def any(self, flag: bool) -> bool:
        """Whether any rank's flag is set (clocks differ between ranks)."""
        return flag

    def max(self, values: list[float]) -> list[float]:
        """Each value's largest over ranks (peak memory, a phase's seconds)."""
        return list(values)

    def comm_seconds(self) -> float | None:
        """Seconds spent in dispatch / combine since the last call; None without expert parallelism."""
        return None

    def load_tokens(self, spec):
        """The run's tokens (``convergence.train.data.load_tokens``); on several ranks, the same on every rank."""
        from convergence.train import data as data_mod

        return data_mod.load_tokens(spec)

    def extra_config(self) -> dict:
        return {}

    # ---- checkpoints
    def checkpoint_path(self, run_dir: Path) -> Path:
        return run_dir / CHECKPOINT_FILE

    def has_checkpoint(self, run_dir: Path) -> bool:
        return self.checkpoint_path(run_dir).exists()

    def save(self, run_dir: Path, model: nn.Module, opt, sched, meta: dict) -> None:
        state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                 "rng": _rng_state()} | meta
        save_checkpoint(self.checkpoint_path(run_dir), state)

    def load(self, run_dir: Path, model: nn.Module, opt, sched, *, what: str = "--resume") -> dict:
        """Restore model, optimizer, scheduler and RNG in place; returns the saved meta (step, ...). ``what``: the
        flag that asked (``--resume``, or ``--fork-from``: another run's checkpoint, ``train.checkpoint.begin``)."""
        path = self.checkpoint_path(run_dir)
        try:  # truncated, garbage, empty, or another model's: torch raises many kinds of error
            ckpt = load_checkpoint(path)
            int(ckpt["step"])
            model.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["optimizer"])
            sched.load_state_dict(ckpt["scheduler"])
            _set_rng_state(ckpt["rng"])
        except Exception as exc:
            raise damaged(path, exc, what) from None
        return ckpt

    def barrier(self) -> None:
        """Wait for every rank (nothing to wait for on one)."""


def damaged(path: Path, exc: Exception, what: str = "--resume") -> BadInput:
    """The one message for a checkpoint that cannot be resumed (or forked) from."""
    detail = " ".join(str(exc).split())  # whole, on one line: torch's reason is often in its last words
    if what != "--resume":
        return BadInput(f"{what}: {path} cannot be loaded into this run ({type(exc).__name__}: {detail}); it is "
                        "damaged or another model's checkpoint")
    return BadInput(f"--resume: {path} cannot be loaded ({type(exc).__name__}: {detail}); it is damaged or not "
                    "this run's checkpoint: restore it, or pass --force to start again")


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ------------------------------------------------------------------ where AdamW's moments wait
OPTIMIZER_STATES = ("auto", "device", "host")  # auto: device when the memory check says it fits, else host
MOMENTS = ("exp_avg", "exp_avg_sq")


def _home(on_device: torch.Tensor, home: torch.Tensor | None) -> torch.Tensor:
    """``on_device``'s values (its local shard, for an FSDP2 DTensor) in pinned host memory: into ``home`` when
    there is one (no new allocation). On a CPU nothing moves."""
    from torch.distributed.tensor import DTensor

    local = on_device.to_local() if isinstance(on_device, DTensor) else on_device
    if local.device.type == "cpu":
        return on_device
    if home is None:
        home = torch.empty(local.shape, dtype=local.dtype, pin_memory=True)
    home.copy_(local, non_blocking=True)
    return home


def _to_device(home: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """A moment from host memory on ``param``'s device, laid out as ``param`` (a DTensor's local shard is
    wrapped with its mesh and placements, as AdamW's own state would be)."""
    from torch.distributed.tensor import DTensor

    if isinstance(param, DTensor) and not isinstance(home, DTensor):
        return DTensor.from_local(home.to(param.device, non_blocking=True), param.device_mesh, param.placements,
                                  run_check=False, shape=param.shape, stride=param.stride())
    return home.to(param.device, non_blocking=True)


class HostStateAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` (``foreach=False``) whose moments stay in host memory between steps."""

    def __init__(self, params, **kwargs):
        if kwargs.get("foreach") or kwargs.get("fused"):
            raise ValueError("HostStateAdamW steps one parameter at a time: foreach and fused do not apply")
        super().__init__(params, **(kwargs | {"foreach": False}))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        groups, devices = self.param_groups, set()
        try:
            for group in groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    state = self.state[p]
                    home = {k: state[k] for k in MOMENTS if k in state}
                    for k, t in home.items():
                        state[k] = _to_device(t, p)
                    self.param_groups = [{**group, "params": [p]}]  # AdamW's own step, for this parameter only
                    super().step()
                    for k in MOMENTS:
                        state[k] = _home(state[k], home.get(k))
                    devices.add(p.device)
        finally:
            self.param_groups = groups
        for d in devices:
            if d.type == "cuda":
                torch.cuda.synchronize(d)  # the copies home are done before anyone reads them
        return loss

    def settle(self) -> None:
        """Move moments that are on a device (a checkpoint just loaded them there) to host memory."""
        for state in self.state.values():
            for k in MOMENTS:
                if k in state:
                    state[k] = _home(state[k], None)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def load_state_dict(self, state_dict) -> None:
        super().load_state_dict(state_dict)  # torch puts each moment on its parameter's device
        self.settle()
