"""The check's comparison finds one flipped bit and says where it is (one process)."""

from __future__ import annotations

import copy

import torch

from numerics.ep import simulate
from numerics.ep.check import CheckRow, compare_outputs, drive, format_table
from numerics.ep.compare import diff
from numerics.ep.strategies import CaseSpec, make_combine_input, make_inputs

SPEC = CaseSpec(world=2, seed=3, tokens=(40, 33), hidden=128, topk=6, num_experts=64, specials=0.05)


def _expected(spec: CaseSpec, rank: int):
    inputs = [make_inputs(spec, r, "cpu") for r in range(spec.world)]
    sim = simulate(*[list(z) for z in zip(*inputs)], spec.num_experts)
    ys = [make_combine_input(spec, r, sim.num_recv(r), None, "cpu") for r in range(spec.world)]
    exp = sim.ranks[rank]
    return sim, {"layout": exp.layout, "dispatch": exp.dispatched, "cached": exp.dispatched.recv_x,
                 "combine": sim.combine(ys)[rank]}


def test_compare_outputs_passes_identical_results():
    sim, exp = _expected(SPEC, 1)
    assert all(v is None for v in compare_outputs(exp, copy.deepcopy(exp), rank=1, sim_rank=sim.ranks[1]).values())


def test_compare_outputs_locates_a_flipped_payload_bit_by_source_token():
    sim, exp = _expected(SPEC, 1)
    got = copy.deepcopy(exp)
    got["dispatch"].recv_x.view(torch.int16)[5, 17] ^= 1
    src_rank, src_tok = int(sim.ranks[1].recv_src_rank[5]), int(sim.ranks[1].recv_src_idx[5])
    msg = compare_outputs(exp, got, rank=1, sim_rank=sim.ranks[1])["dispatch.recv_x.bf16"]
    assert msg.startswith(f"rank 1, row 5, col 17 (from rank {src_rank} token {src_tok}): expected 0x")
    assert "[1 of " in msg


def test_compare_outputs_combine_tells_zero_signs_apart_but_not_nan_payloads():
    sim, exp = _expected(SPEC, 0)
    got = copy.deepcopy(exp)
    out = got["combine"].view(torch.int16)
    nan_at = torch.isnan(exp["combine"]).nonzero()
    assert len(nan_at), "the case should produce NaN sums (specials=0.05)"
    r, c = nan_at[0].tolist()
    out[r, c] = 0x7FFF if int(out[r, c]) != 0x7FFF else 0x7FC0  # another NaN encoding: allowed
    assert compare_outputs(exp, got, rank=0, sim_rank=sim.ranks[0])["combine"] is None
    out[3, 4] ^= -0x8000  # flip the sign bit, e.g. +0.0 -> -0.0
    msg = compare_outputs(exp, got, rank=0, sim_rank=sim.ranks[0])["combine"]
    assert msg.startswith("rank 0, token 3, col 4 (sum of the rows back from ranks")


def test_diff_reports_dtype_shape_and_list_mismatches():
    a = torch.zeros(3, 2, dtype=torch.int32)
    assert "dtype" in diff(a, a.long(), rank=0)
    assert "shape" in diff(a, a[:2], rank=0)
    assert "expected [1, 2]" in diff([1, 2], [1, 3], rank=2)
    nan = torch.tensor([float("nan")]).view(torch.int32) | 1
    assert diff(nan.view(torch.float32), torch.tensor([float("nan")]), rank=0) is not None  # payload bits count


def test_drive_and_table_report_the_first_failure_with_its_case():
    def run(spec):
        return [{"checks": {"combine": None}}, {"checks": {"combine": "rank 1, token 2, col 0: x"}}]

    rows = drive(run, [SPEC, SPEC])
    assert rows["combine"] == CheckRow(cases=2, failures=2, first="rank 1, token 2, col 0: x",
                                       first_case=SPEC.to_json())
    assert rows["case.completed"].failures == 0
    table = format_table(rows)
    assert "FAIL" in table and "case: {" in table
    assert CaseSpec.from_json(SPEC.to_json()) == SPEC


def test_compare_outputs_counts_lost_negative_zero_as_known_finding_E1_only():
    """-0.0 expected, +0.0 got is E1 (a zero-initialised sum against the first-row convention): counted,
    not failed; the reverse (+0.0 expected, -0.0 got) still fails combine."""
    sim, exp = _expected(SPEC, 0)
    exp["combine"].view(torch.int16)[2, 7] = -0x8000  # the first-row expectation summed only -0.0 rows here
    got = copy.deepcopy(exp)
    got["combine"].view(torch.int16)[2, 7] = 0  # ... and the backend started its sum at +0.0
    found = {}
    checks = compare_outputs(exp, got, rank=0, sim_rank=sim.ranks[0], known_out=found)
    assert checks["combine"] is None
    e1 = found["combine"]["E1"]
    assert e1["values"] == 1 and e1["first"].startswith("rank 0, token 2, col 7")
    exp["combine"].view(torch.int16)[2, 7], got["combine"].view(torch.int16)[2, 7] = 0, -0x8000
    found = {}
    checks = compare_outputs(exp, got, rank=0, sim_rank=sim.ranks[0], known_out=found)
    assert checks["combine"].startswith("rank 0, token 2, col 7") and found == {}


def test_split_known_counts_only_values_that_differ_and_leaves_others_failing():
    from numerics.ep.compare import split_known
    from numerics.ep.known import KNOWN

    e = torch.tensor([-0.0, -0.0, 1.0, 2.0]).to(torch.bfloat16)
    a = torch.tensor([0.0, -0.0, 1.0, 3.0]).to(torch.bfloat16)
    msg, found = split_known(e, a, rank=3, known=KNOWN)
    assert found["E1"]["values"] == 1  # index 1 is -0.0 on both sides: not a difference at all
    assert msg.startswith("rank 3, index (3,)") and "[1 of 4 differ]" in msg
    msg, found = split_known(e, e.clone(), rank=3, known=KNOWN)
    assert msg is None and found == {}
