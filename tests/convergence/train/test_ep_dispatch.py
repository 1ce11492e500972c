"""The expert-parallel MoE dispatcher, in one process: the exact float32 <-> bf16-pieces split, the
one-rank equivalence with the local dispatcher (forward and every gradient, bit for bit), and the
request checks that run before any process group exists."""

from __future__ import annotations

import dataclasses
import datetime
import importlib.util

import pytest
import torch
import torch.distributed as dist
from hypothesis import example, given
from hypothesis import strategies as st

from convergence.train import distributed
from convergence.train.ep_dispatch import EPDispatch, join_exact, split_exact
from convergence.train.loop import TrainConfig
from numerics.ep.reference import AllToAllReference
from numerics.errors import BadInput
from numerics.layer.configs import get_config
from numerics.layer.deepseek_v3 import MoE

# float32 values that a router-weight gradient can take, down to where the third piece is still normal
finite_f32 = st.floats(width=32, allow_nan=False, allow_infinity=False).filter(lambda v: v == 0 or abs(v) >= 2**-102)


def _bits(t: torch.Tensor) -> list[int]:
    return t.view(torch.int32).tolist()


@given(st.lists(finite_f32, min_size=1, max_size=64))
@example([1.0 + 2**-23])  # last significand bit: needs the third piece
@example([3.4028234663852886e38, -3.4028234663852886e38])  # float32 max: a rounds to itself, no overflow
@example([2**-102 * (1 + 2**-23)])  # smallest magnitude claimed exact
@example([0.1, -0.3, 1e-30, 12345.678])
def test_split_exact_pieces_sum_back_bit_for_bit(values):
    v = torch.tensor(values, dtype=torch.float32)
    pieces = split_exact(v)
    assert pieces.dtype == torch.bfloat16 and pieces.shape == (len(values), 3)
    back = join_exact(pieces)
    # +0.0 and -0.0 both come back as a zero; every other value bit for bit
    assert _bits(torch.where(v == 0, torch.zeros_like(v), back)) == _bits(torch.where(v == 0, torch.zeros_like(v), v))


def test_split_exact_survives_a_combine_with_zeros():
    """A combine adds +0.0 rows (slots owned by another rank) to each piece: nothing may change."""
    v = torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 1e-3
    p = split_exact(v).float()
    summed = (torch.zeros_like(p) + p + torch.zeros_like(p)).to(torch.bfloat16)
    assert _bits(join_exact(summed)) == _bits(v)


@pytest.fixture
def one_rank_group():
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
    try:
        yield
    finally:
        dist.destroy_process_group()


def _moe(seed: int) -> MoE:
    moe = MoE(get_config("tiny"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return moe


def _fwd_bwd(moe: MoE, x: torch.Tensor, grad: torch.Tensor):
    x = x.to(torch.bfloat16).requires_grad_(True)  # what the model's RMSNorm hands the MoE
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = moe(x)
    y.backward(grad)
    return y.detach(), x.grad.detach(), {n: p.grad.detach().clone() for n, p in moe.named_parameters()}


def test_ep_dispatch_one_rank_equals_local_dispatch_bit_for_bit(one_rank_group):
    x = torch.randn(2, 64, 64, generator=torch.Generator().manual_seed(1))
    grad = torch.randn(2, 64, 64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    local, ep = _moe(0), _moe(0)
    ep.dispatcher = EPDispatch(AllToAllReference(device="cpu"))
    y_l, dx_l, g_l = _fwd_bwd(local, x, grad)
    y_e, dx_e, g_e = _fwd_bwd(ep, x, grad)
    assert torch.equal(y_l.view(torch.int16), y_e.view(torch.int16))
    assert torch.equal(dx_l.view(torch.int16), dx_e.view(torch.int16))
    for name in g_l:  # router gate (through the split weight gradients), experts, shared experts
        assert torch.equal(g_l[name].view(torch.int32), g_e[name].view(torch.int32)), name
    assert torch.equal(local.tokens_per_expert, ep.tokens_per_expert)


def _cfg(**kw) -> TrainConfig:
    base = TrainConfig(model="tiny", recipes=("bf16",), steps=1, probe_every=0, ep=2)
    return dataclasses.replace(base, **kw)


def test_check_request_ep_must_divide_experts(monkeypatch):
    six = dataclasses.replace(get_config("tiny"), n_routed_experts=6)
    monkeypatch.setattr(distributed, "get_config", lambda name: six)
    with pytest.raises(BadInput, match=r"--ep 4\b.*\b6\b"):  # the option and the experts it must divide
        distributed.check_request(_cfg(ep=4), world=4)


@pytest.mark.parametrize(("kw", "match"), [
    ({"batch": 7}, "--batch 7"),
    ({"ep_backend": "nccl"}, "'nccl'"),
    ({"ep_backend": "deepep", "device": "cpu"}, "--device cuda"),
    ({"ep": 3}, "--ep"),
    ({"ep": 4, "world": 2}, "--ep 4"),
])
def test_check_request_bad_input(kw, match):
    """BadInput, in a line naming the option (and value) at fault."""
    world = kw.pop("world", kw.get("ep", 2))
    with pytest.raises(BadInput, match=match):
        distributed.check_request(_cfg(**kw), world=world)


@pytest.mark.parametrize("kw", [{}, {"probe_every": 5}, {"ep": 4, "batch": 8}])
def test_check_request_accepts_the_requests_the_refusals_above_vary(kw):
    """The control of the refusals above: the request each of them changes in one field is accepted, with probes
    too (every rank probes under --ep; test_distributed runs them), so each refusal is its field's."""
    cfg = _cfg(**kw)
    distributed.check_request(cfg, world=cfg.ep)  # raises BadInput on a refusal


@pytest.mark.skipif(importlib.util.find_spec("deep_ep") is not None, reason="deep_ep is importable here")
def test_check_request_deepep_not_importable():
    with pytest.raises(BadInput, match="deep_ep is not importable"):
        distributed.check_request(_cfg(ep_backend="deepep", device="cuda"), world=2)


def test_backward_combine_rows_are_a_multiple_of_256_columns_for_deepep_E3():
    """DeepEP's combine is wrong for bf16 rows not a multiple of 256 wide (FINDINGS.md E3): the padded
    width of the backward combine must be one, for the shipped models' hidden sizes and top-k."""
    from convergence.train.ep_dispatch import combine_width

    for name in ("tiny", "proxy", "16b"):
        cfg = get_config(name)
        width = combine_width(cfg.dim, cfg.top_k)
        assert width % 256 == 0 and width >= cfg.dim + 3 * cfg.top_k, (name, width)


class _WidthRecorder(AllToAllReference):
    """The reference, recording the width of every combine it is given."""

    widths: list[int]

    def combine(self, y, handle):
        self.widths.append(int(y.shape[1]))
        return super().combine(y, handle)


def test_every_combine_is_a_multiple_of_256_columns_for_deepep_E3(one_rank_group):
    """Forward and backward combines both reach DeepEP padded (the tiny model's 64-wide forward rows were
    what made its EP=2 DeepEP run differ from the reference, FINDINGS.md E3), and padding changes nothing."""
    x = torch.randn(2, 64, 64, generator=torch.Generator().manual_seed(1))
    grad = torch.randn(2, 64, 64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    backend = _WidthRecorder(device="cpu")
    backend.widths = []
    local, ep = _moe(0), _moe(0)
    ep.dispatcher = EPDispatch(backend)
    y_l, dx_l, _ = _fwd_bwd(local, x, grad)
    y_e, dx_e, _ = _fwd_bwd(ep, x, grad)
    assert len(backend.widths) == 2 and all(w % 256 == 0 for w in backend.widths), backend.widths
    assert torch.equal(y_l.view(torch.int16), y_e.view(torch.int16))
    assert torch.equal(dx_l.view(torch.int16), dx_e.view(torch.int16))
