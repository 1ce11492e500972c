"""The one interface every expert-parallel (EP) communication backend implements, and its input rules.

Public names: ``EPBackend`` (the interface), ``Dispatched`` (what a dispatch returns), ``Layout``
(what a layout computation returns), payload helpers (``is_fp8``, ``payload_rows``, ``row_bytes``),
``validate_dispatch`` / ``validate_payload`` (collective input checks) with ``Limits`` (what a
backend's buffers hold), ``finish`` (wait for a collective), ``COMBINE_START`` / ``COMBINE_STARTS``,
``PeerInputError``.

Semantics (DeepEP V1, ``deep_ep.Buffer`` in intranode normal mode), stated once here and implemented
independently by ``numerics.ep.reference`` (over torch.distributed) and ``numerics.ep.simulate``
(one process, every rank at once):

* ``W`` ranks, ``E`` experts, ``L = E / W`` local experts; expert ``e`` lives on rank ``e // L``.
* ``x`` is a bf16 ``[T, H]`` tensor, or the FP8 pair ``(float8_e4m3fn [T, H], float32 [T, H / 128])``
  (data and one scale per 128 channels); ``topk_idx`` is int64 ``[T, K]`` with -1 for a masked slot and
  no expert twice in a row; ``topk_weights`` is float32 ``[T, K]``. ``T`` may differ between ranks.
* Layout (per source rank): ``is_token_in_rank[t, j]`` is true when token ``t`` selects at least one
  expert on rank ``j``; ``num_tokens_per_rank[j]`` counts those tokens; ``num_tokens_per_expert[e]``
  counts the tokens that select ``e``. All int32 except the bool matrix.
* Dispatch: rank ``j`` receives token ``t`` of rank ``s`` once iff ``is_token_in_rank_s[t, j]``; the
  received rows are ordered by source rank, then by source token index. ``recv_x`` rows carry the
  payload bits unchanged (both FP8 tensors too). ``recv_topk_idx[r, k]`` is the local expert index
  ``e - j * L`` where expert ``e`` is on rank ``j``, else -1; ``recv_topk_weights[r, k]`` is the sent
  weight where the index is kept, else +0.0. ``num_recv_tokens_per_expert[l]`` (a list of int) is the
  number of received tokens that select local expert ``l``.
* Combine: rank ``j`` holds ``y`` (bf16, one row per received row); rank ``s`` gets, for each of its
  tokens ``t``, the sum without weights of the rows that came back for ``t``: a float32 accumulator
  that starts at +0.0, each row widened to float32 exactly and added (IEEE round-to-nearest-even after
  every addition) in ascending order of the rank it came back from, rounded once to bf16
  (round-to-nearest-even). A token sent to no rank combines to +0.0. A NaN sum may come back as any NaN
  encoding (IEEE 754 fixes no payload for arithmetic, and CUDA and x86 differ); every other bit, the
  sign of a zero included, is part of the contract.

  Why the sum starts at +0.0 (``COMBINE_START = "zero"``): it is what the path users switch away from
  computes (torchtitan's all-to-all token dispatcher, ``models/common/token_dispatcher.py``, scatter-adds
  the returned rows into ``torch.zeros_like``), what DeepEP's V1 intranode combine kernel does (its
  float32 accumulator starts from the bias sum, +0.0 without bias) and what DeepEP V2's own reference
  (``deep_ep.utils.refs.combine``) does. Starting at +0.0 differs from folding from the first row only
  where every row is -0.0: +0.0 + (-0.0) is +0.0, so such a sum is +0.0, not -0.0. The reference and
  ``simulate`` also offer the other convention (``"first-row"``, the IEEE sum of the rows alone); under
  it every zero-initialised combine differs on those values, which FINDINGS.md records as E1 (first
  reported as a DeepEP defect, withdrawn: it is this convention).

Bad input raises ``ValueError`` on the rank that has it, naming the tensor and the constraint; the
other ranks raise ``PeerInputError``. Both happen after one small all-gather, before any payload moves,
so no rank waits for a peer that has given up.
"""

from __future__ import annotations

import abc
import datetime
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

FP8_BLOCK = 128  # channels per float32 scale in the FP8 pair (DeepSeek-V3's 1x128 activation blocks)
DEFAULT_TIMEOUT = datetime.timedelta(seconds=120)
MAX_TOKENS = 8192  # tokens per rank a check case may hold (2x DeepSeek-V3's 4096); buffers are sized for it
COMBINE_STARTS = ("zero", "first-row")  # how a combine sum starts; "zero" is the contract (see above)
COMBINE_START = "zero"


class PeerInputError(RuntimeError):
    """Another rank had bad input (it raised the ValueError); this rank stops without moving data."""


@dataclass
class Dispatched:
    """What ``EPBackend.dispatch`` returns on one rank."""

    recv_x: Any  # bf16 [R, H], or (float8_e4m3fn [R, H], float32 [R, H / 128])
    recv_topk_idx: torch.Tensor  # int64 [R, K]: local expert index or -1
    recv_topk_weights: torch.Tensor  # float32 [R, K]: weight, 0 where the index is -1
    num_recv_tokens_per_expert: list[int]  # [L]
    handle: Any  # backend-specific; pass to combine / dispatch_cached


@dataclass
class Layout:
    """Which ranks and experts each local token goes to (DeepEP's ``get_dispatch_layout``)."""

    num_tokens_per_rank: torch.Tensor  # int32 [W]
    num_tokens_per_expert: torch.Tensor  # int32 [E]
    is_token_in_rank: torch.Tensor  # bool [T, W]


def is_fp8(x: Any) -> bool:
    return isinstance(x, tuple)


def payload_rows(x: Any) -> int:
    return int((x[0] if is_fp8(x) else x).shape[0])


def payload_hidden(x: Any) -> int:
    return int((x[0] if is_fp8(x) else x).shape[1])


def row_bytes(hidden: int, fp8: bool) -> int:
    """Bytes one token occupies on the wire: data, plus the scales for FP8."""
    return hidden + 4 * (hidden // FP8_BLOCK) if fp8 else 2 * hidden


class EPBackend(abc.ABC):
    """dispatch / combine with DeepEP V1 intranode semantics (see the module docstring).

    ``validate = False`` skips the collective input checks (one all-gather and a few host syncs per
    call); only benchmarks do that, after a validating call with the same inputs. ``has_layout`` is
    False for a backend whose subject offers no layout computation (``layout`` then raises)."""

    group: Any
    timeout: datetime.timedelta
    validate: bool = True
    has_layout: bool = True

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group)

    @property
    def world_size(self) -> int:
        return dist.get_world_size(self.group)

    @abc.abstractmethod
    def layout(self, topk_idx: torch.Tensor, num_experts: int) -> Layout:
        """The layout of this rank's tokens; purely local."""

    @abc.abstractmethod
    def dispatch(self, x: Any, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                 num_experts: int) -> Dispatched:
        """Send every token once to each rank that owns one of its experts."""

    @abc.abstractmethod
    def dispatch_cached(self, x: Any, handle: Any) -> Any:
        """Dispatch new payload along the routing of an earlier dispatch; returns ``recv_x``."""

    @abc.abstractmethod
    def combine(self, y: torch.Tensor, handle: Any) -> torch.Tensor:
        """Send rows back and sum them per source token (float32, ascending rank, one bf16 rounding)."""

    def close(self) -> None:  # noqa: B027 - optional hook: backends without resources keep the no-op
        """Release backend resources (communication buffers)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---------------------------------------------------------------------------------------------
# Input rules, checked collectively
# ---------------------------------------------------------------------------------------------

_KIND = {"bf16": 0, "fp8": 1}


def _payload_error(x: Any, what: str = "x") -> str | None:
    if is_fp8(x):
        if len(x) != 2 or not all(isinstance(t, torch.Tensor) for t in x):
            return f"{what} as a tuple must be (data float8_e4m3fn [T, H], scales float32 [T, H/128])"
        data, scales = x
        if data.dtype != torch.float8_e4m3fn or data.dim() != 2:
            return (f"{what}[0] (FP8 data) must be a 2-D float8_e4m3fn tensor, "
                    f"got {data.dtype} {tuple(data.shape)}")
        if data.shape[1] % FP8_BLOCK:
            return f"{what}[0] (FP8 data) hidden size {data.shape[1]} must be a multiple of {FP8_BLOCK}"
        want = (data.shape[0], data.shape[1] // FP8_BLOCK)
        if scales.dtype != torch.float32 or tuple(scales.shape) != want:
            return (f"{what}[1] (FP8 scales) must be float32 of shape {want} (one per {FP8_BLOCK} "
                    f"channels), got {scales.dtype} {tuple(scales.shape)}")
        return None
    if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16 or x.dim() != 2:
        got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        return f"{what} must be a 2-D bfloat16 tensor or the FP8 pair, got {got}"
    if x.shape[1] % 8:
        return f"{what} hidden size {x.shape[1]} must be a multiple of 8 (rows move in 16-byte units)"
    return None


@dataclass(frozen=True)
class Limits:
    """What a backend's buffers were sized for; checked collectively with the other input rules."""

    max_tokens: int | None = None  # tokens per rank
    max_hidden: int | None = None
    max_topk: int | None = None

    def error(self, tokens: int, hidden: int, topk: int, backend: str) -> str | None:
        for what, value, limit, arg in (("tokens per rank", tokens, self.max_tokens, "max_tokens"),
                                        ("hidden size", hidden, self.max_hidden, "max_hidden"),
                                        ("top-k", topk, self.max_topk, "max_topk")):
            if limit is not None and value > limit:
                return (f"{what} {value} exceeds the {limit} this {backend} buffer was sized for; construct "
                        f"it with a larger {arg}")
        return None


def _local_dispatch_error(x: Any, topk_idx: Any, topk_weights: Any, num_experts: Any,
                          world: int, device: torch.device) -> str | None:
    if not isinstance(num_experts, int) or isinstance(num_experts, bool) or num_experts <= 0:
        return f"num_experts={num_experts!r} must be a positive int"
    if num_experts % world:
        return f"num_experts={num_experts} is not divisible by the world size {world}"
    error = _payload_error(x)
    if error:
        return error
    tokens = payload_rows(x)
    if not isinstance(topk_idx, torch.Tensor) or topk_idx.dtype != torch.int64 or topk_idx.dim() != 2:
        got = f"{topk_idx.dtype} {tuple(topk_idx.shape)}" if isinstance(topk_idx, torch.Tensor) else type(topk_idx)
        return f"topk_idx must be a 2-D int64 tensor, got {got}"
    if topk_idx.shape[0] != tokens:
        return f"topk_idx has {topk_idx.shape[0]} rows but x has {tokens} tokens"
    if not isinstance(topk_weights, torch.Tensor) or topk_weights.dtype != torch.float32:
        got = topk_weights.dtype if isinstance(topk_weights, torch.Tensor) else type(topk_weights).__name__
        return f"topk_weights must be a float32 tensor, got {got}"
    if topk_weights.shape != topk_idx.shape:
        return f"topk_weights shape {tuple(topk_weights.shape)} must equal topk_idx shape {tuple(topk_idx.shape)}"
    if topk_idx.numel():
        lo, hi = int(topk_idx.min()), int(topk_idx.max())
        if lo < -1 or hi >= num_experts:
            bad = lo if lo < -1 else hi
            return f"topk_idx holds {bad}, outside [-1, num_experts={num_experts})"
        s = topk_idx.sort(dim=1).values
        dup = (s[:, 1:] == s[:, :-1]) & (s[:, 1:] >= 0)
        if bool(dup.any()):
            row = int(dup.any(dim=1).nonzero()[0])
            return f"topk_idx row {row} selects one expert twice; a router's top-k is duplicate-free"
    return _device_error(device, x=x, topk_idx=topk_idx, topk_weights=topk_weights)


def _device_error(device: torch.device, **tensors: Any) -> str | None:
    for name, t in tensors.items():
        for i, part in enumerate(t if isinstance(t, tuple) else (t,)):
            if part.device.type != device.type:
                label = f"{name}[{i}]" if isinstance(t, tuple) else name
                return f"{label} is on {part.device} but this backend communicates on {device.type}"
    return None


def finish(work: Any, timeout: datetime.timedelta, device: torch.device) -> None:
    """Wait for an asynchronous collective without adding latency.

    On CPU (gloo) ``work.wait(timeout)`` blocks until done or raises after ``timeout``. On CUDA the
    current stream waits (``work.wait()``) and the process group's own timeout, enforced by its
    watchdog, ends a hung collective: ``work.wait(timeout)`` there makes the CPU poll the collective
    with 1 ms sleeps (PyTorch's ``WorkNCCL::wait``, ``kSynchronizeBusyWaitMillis = 1``), which adds up
    to a millisecond to every call a benchmark times."""
    if device.type == "cuda":
        work.wait()
    else:
        work.wait(timeout)


def _agree(group: Any, device: torch.device, error: str | None, signature: list[int],
           names: list[str], timeout: datetime.timedelta) -> None:
    """All ranks learn whether any rank had bad input, and check that their signatures match rank 0's."""
    world = dist.get_world_size(group)
    mine = torch.tensor([0 if error is None else 1, *signature], dtype=torch.int64, device=device)
    gathered = [torch.empty_like(mine) for _ in range(world)]
    finish(dist.all_gather(gathered, mine, group=group, async_op=True), timeout, device)
    table = [g.tolist() for g in gathered]
    me = dist.get_rank(group)
    if error is not None:
        raise ValueError(error)
    bad = [r for r, row in enumerate(table) if row[0]]
    if bad:
        raise PeerInputError(f"rank(s) {bad} had bad input and raised ValueError; rank {me} stopped cleanly")
    for i, name in enumerate(names):
        if table[me][1 + i] != table[0][1 + i]:
            raise ValueError(f"{name} is {table[me][1 + i]} on rank {me} but {table[0][1 + i]} on rank 0; "
                             "every rank must use the same value")
    odd = [r for r, row in enumerate(table) if row[1:] != table[0][1:]]
    if odd:
        raise PeerInputError(f"rank(s) {odd} disagree with rank 0 on {', '.join(names)} and raised "
                             f"ValueError; rank {me} stopped cleanly")


def validate_dispatch(backend: EPBackend, x: Any, topk_idx: Any, topk_weights: Any, num_experts: Any,
                      device: torch.device, limits: Limits | None = None) -> None:
    """Collective: ValueError on the rank with bad input, PeerInputError on the others."""
    error = _local_dispatch_error(x, topk_idx, topk_weights, num_experts, backend.world_size, device)
    if error is None and limits is not None:
        error = limits.error(payload_rows(x), payload_hidden(x), int(topk_idx.shape[1]), type(backend).__name__)
    if error is None:
        sig = [payload_hidden(x), int(topk_idx.shape[1]), num_experts, _KIND["fp8" if is_fp8(x) else "bf16"]]
    else:
        sig = [0, 0, 0, 0]
    _agree(backend.group, device, error, sig, ["x hidden size", "topk_idx width (top-k)", "num_experts",
                                               "payload kind (0 bf16, 1 fp8)"], backend.timeout)


def validate_payload(backend: EPBackend, x: Any, rows: int, hidden: int | None, what: str,
                     device: torch.device, *, bf16_only: bool = False) -> None:
    """Collective check of a payload sent along an existing handle (cached dispatch, combine)."""
    if is_fp8(x) and bf16_only:
        error = f"{what} must be a bfloat16 tensor (combine sums in float32 and returns bf16), got the FP8 pair"
    else:
        error = _payload_error(x, what) or _device_error(device, **{what: x})
    if error is None and payload_rows(x) != rows:
        error = f"{what} has {payload_rows(x)} rows but the handle expects {rows}"
    if error is None and hidden is not None and payload_hidden(x) != hidden:
        error = f"{what} hidden size {payload_hidden(x)} differs from the dispatched hidden size {hidden}"
    sig = [0, 0] if error else [payload_hidden(x), _KIND["fp8" if is_fp8(x) else "bf16"]]
    _agree(backend.group, device, error, sig, [f"{what} hidden size", f"{what} kind (0 bf16, 1 fp8)"],
           backend.timeout)
