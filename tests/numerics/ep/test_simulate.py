"""The oracle: named cases derived by hand, and its own laws on drawn routings (one process, no comms)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from numerics.ep import simulate
from numerics.ep.strategies import case_specs, make_combine_input, make_inputs


def _bf16(bits: list[int]) -> torch.Tensor:
    return torch.tensor(bits, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def _rows(bits_per_row: list[int], hidden: int = 8) -> torch.Tensor:
    if not bits_per_row:
        return torch.zeros(0, hidden, dtype=torch.bfloat16)
    return torch.stack([_bf16([b] * hidden) for b in bits_per_row])


def test_simulate_named_two_rank_case():
    # 2 ranks, 4 experts -> experts 0,1 on rank 0 and 2,3 on rank 1; top-2 per token.
    # rank 0 tokens: t0 -> (0, 2) both ranks; t1 -> (1, -1) rank 0 only; t2 -> (3, 2) rank 1 only
    # rank 1 tokens: t0 -> (-1, -1) nowhere;  t1 -> (2, 0) both ranks
    x0, x1 = _rows([0x3F80, 0x7F81, 0x8000]), _rows([0x4000, 0xFFC1])  # 1.0, sNaN, -0.0 | 2.0, -NaN
    i0 = torch.tensor([[0, 2], [1, -1], [3, 2]])
    i1 = torch.tensor([[-1, -1], [2, 0]])
    w0 = torch.tensor([[0.5, 0.25], [1.0, 9.0], [0.125, -0.0]])
    w1 = torch.tensor([[7.0, 7.0], [3.0, 4.0]])
    sim = simulate([x0, x1], [i0, i1], [w0, w1], 4)
    # rank 0 receives, by source rank then token: (0,t0), (0,t1), (1,t1)
    r0 = sim.ranks[0]
    assert r0.recv_src_rank.tolist() == [0, 0, 1] and r0.recv_src_idx.tolist() == [0, 1, 1]
    assert r0.dispatched.recv_x.view(torch.int16)[:, 0].tolist() == [0x3F80, 0x7F81, 0xFFC1 - 0x10000]  # (1,t1) is -NaN
    assert r0.dispatched.recv_topk_idx.tolist() == [[0, -1], [1, -1], [-1, 0]]
    assert r0.dispatched.recv_topk_weights.tolist() == [[0.5, 0.0], [1.0, 0.0], [0.0, 4.0]]
    assert r0.dispatched.num_recv_tokens_per_expert == [2, 1]
    # rank 1 receives (0,t0), (0,t2), (1,t1); local experts 2 -> 0, 3 -> 1
    r1 = sim.ranks[1]
    assert r1.recv_src_rank.tolist() == [0, 0, 1] and r1.recv_src_idx.tolist() == [0, 2, 1]
    assert r1.dispatched.recv_topk_idx.tolist() == [[-1, 0], [1, 0], [0, -1]]
    assert r1.dispatched.num_recv_tokens_per_expert == [3, 1]
    # the -0.0 weight of (0,t2) slot 1 is kept (its expert is on rank 1): bits, not value
    assert r1.dispatched.recv_topk_weights.view(torch.int32)[1, 1] == torch.tensor(0x80000000).to(torch.int32)
    assert sim.layouts[0].num_tokens_per_rank.tolist() == [2, 2]
    assert sim.layouts[1].is_token_in_rank.tolist() == [[False, False], [True, True]]
    assert sim.layouts[0].num_tokens_per_expert.tolist() == [1, 1, 2, 1]


def test_simulate_combine_sums_in_ascending_rank_order():
    # 3 ranks, 3 experts (one each); rank 0's token 0 goes to all three ranks.
    # Rows back: 2^24 from rank 0, 1.0 from rank 1, -2^24 from rank 2. Ascending order in float32:
    # (+0 + 2^24 + 1) rounds to even = 2^24, then - 2^24 = +0.0. Any other order gives 1.0.
    x = [_rows([0x3F80]), _rows([]), _rows([])]
    idx = [torch.tensor([[0, 1, 2]]), torch.zeros(0, 3, dtype=torch.int64), torch.zeros(0, 3, dtype=torch.int64)]
    w = [torch.ones(1, 3), torch.zeros(0, 3), torch.zeros(0, 3)]
    sim = simulate(x, idx, w, 3)
    ys = [_rows([0x4B80]), _rows([0x3F80]), _rows([0xCB80])]  # 2^24, 1.0, -2^24
    for start in ("zero", "first-row"):
        assert sim.combine(ys, start)[0].view(torch.int16)[0, 0] == 0  # +0.0
    # the same three values from other ranks: 2^24 - 2^24 = 0 first, then + 1.0 = 1.0 (order matters)
    ys = [_rows([0x4B80]), _rows([0xCB80]), _rows([0x3F80])]  # 2^24, -2^24, 1.0
    assert sim.combine(ys)[0].view(torch.int16)[0, 0] == 0x3F80


def test_simulate_combine_start_decides_the_sign_of_an_all_negative_zero_sum():
    """One row of -0.0: +0.0 when the sum starts at +0.0 (the contract, DeepEP, torchtitan's
    all-to-all path), -0.0 when it folds from the first row (finding E1's convention); a token sent
    nowhere is +0.0 either way."""
    empty = _rows([])
    idx = [torch.tensor([[0, -1, -1], [-1, -1, -1]]), torch.zeros(0, 3, dtype=torch.int64),
           torch.zeros(0, 3, dtype=torch.int64)]
    sim = simulate([_rows([0x3F80, 0x3F80]), empty, empty], idx, [torch.ones(2, 3), torch.zeros(0, 3),
                                                                torch.zeros(0, 3)], 3)
    ys = [_rows([0x8000]), empty, empty]
    assert sim.combine(ys)[0].view(torch.int16)[:, 0].tolist() == [0, 0]
    assert sim.combine(ys, "zero")[0].view(torch.int16)[:, 0].tolist() == [0, 0]
    assert sim.combine(ys, "first-row")[0].view(torch.int16)[:, 0].tolist() == [-32768, 0]
    with pytest.raises(ValueError, match="choose from zero, first-row"):
        sim.combine(ys, "ieee")


def test_simulate_rejects_inconsistent_inputs():
    with pytest.raises(ValueError, match="divisible"):
        simulate([_rows([1])] * 2, [torch.tensor([[0]])] * 2, [torch.ones(1, 1)] * 2, 3)
    with pytest.raises(ValueError, match="one x, topk_idx and topk_weights per rank"):
        simulate([_rows([1])], [], [], 2)


@settings(max_examples=25)
@given(spec=case_specs(world=2, max_elements=2**14, hiddens=(128,)) | case_specs(world=4, max_elements=2**14,
                                                                                   hiddens=(128,)))
def test_simulate_conserves_tokens_and_bits(spec):
    inputs = [make_inputs(spec, r, "cpu") for r in range(spec.world)]
    sim = simulate(*[list(z) for z in zip(*inputs)], spec.num_experts)
    local = spec.num_experts // spec.world
    for dest, exp in enumerate(sim.ranks):
        d = exp.dispatched
        # every received row is its source row, bit for bit
        for row, (s, t) in enumerate(zip(exp.recv_src_rank.tolist(), exp.recv_src_idx.tolist())):
            src_x = inputs[s][0]
            if isinstance(src_x, tuple):
                assert torch.equal(d.recv_x[0][row].view(torch.uint8), src_x[0][t].view(torch.uint8))
                assert torch.equal(d.recv_x[1][row].view(torch.int32), src_x[1][t].view(torch.int32))
            else:
                assert torch.equal(d.recv_x[row].view(torch.int16), src_x[t].view(torch.int16))
            keep = (inputs[s][1][t] // local == dest) & (inputs[s][1][t] >= 0)
            assert keep.any()  # sent only where it has an expert
            assert torch.equal(d.recv_topk_idx[row], torch.where(keep, inputs[s][1][t] - dest * local, -1))
        # ordered by source rank, then token
        key = exp.recv_src_rank * 10**6 + exp.recv_src_idx
        assert torch.equal(key, key.sort().values)
        assert sum(d.num_recv_tokens_per_expert) == int((d.recv_topk_idx >= 0).sum())
        assert (d.recv_topk_weights[d.recv_topk_idx < 0].view(torch.int32) == 0).all()
    sent = sum(int(lay.num_tokens_per_rank.sum()) for lay in sim.layouts)
    assert sent == sum(sim.num_recv(r) for r in range(spec.world))


@settings(max_examples=15)
@given(spec=case_specs(world=4, max_elements=2**12, hiddens=(128,)), data=st.data())
def test_simulate_combine_of_one_row_is_that_row(spec, data):
    """A token received by exactly one rank combines to that rank's row, bit for bit (NaN aside), when
    the sum folds from the first row; starting at +0.0 it is the row with -0.0 turned into +0.0."""
    inputs = [make_inputs(spec, r, "cpu") for r in range(spec.world)]
    sim = simulate(*[list(z) for z in zip(*inputs)], spec.num_experts)
    ys = [make_combine_input(spec, r, sim.num_recv(r), 128, "cpu") for r in range(spec.world)]
    first_row, zero = sim.combine(ys, "first-row"), sim.combine(ys, "zero")
    for dest, exp in enumerate(sim.ranks):
        for row, (s, t) in enumerate(zip(exp.recv_src_rank.tolist(), exp.recv_src_idx.tolist())):
            if int(sim.layouts[s].is_token_in_rank[t].sum()) == 1:
                a = ys[dest][row]
                plus = torch.where(a.view(torch.int16) == -0x8000, torch.zeros_like(a), a)  # -0.0 -> +0.0
                for want, got in ((a, first_row[s][t]), (plus, zero[s][t])):
                    same = (want.view(torch.int16) == got.view(torch.int16)) | (torch.isnan(want) & torch.isnan(got))
                    assert same.all()
