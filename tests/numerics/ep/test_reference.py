"""AllToAllReference on gloo with 2 and 4 processes, held against simulate on drawn routings.

One process group per test: rank 0 is this pytest process and draws the examples (Hypothesis runs
here only); ranks 1..W-1 are spawned children that run whatever case rank 0 broadcasts. Bad input
runs in the same group, which must stay usable after it. Every collective has a timeout, so a broken
rank fails the test instead of hanging it.
"""

from __future__ import annotations

from hypothesis import example, given, settings

from numerics.ep.check import BAD_INPUTS, BadInputSpec, bad_input_specs, judge_bad_input
from numerics.ep.launch import Session
from numerics.ep.strategies import CaseSpec, case_specs

RUNNER = "numerics.ep.check:CaseRunner"


def _assert_all_pass(spec, results):
    for rank, res in enumerate(results):
        assert "error" not in res, f"rank {rank} raised on {spec}: {res.get('traceback', res['error'])}"
        failed = {k: v for k, v in res["checks"].items() if v}
        assert not failed, f"rank {rank}, {spec.to_json()}: {failed}"


def _assert_bad_input_contained(session, world):
    specs = bad_input_specs(world)
    assert {s.defect for s in specs} == set(BAD_INPUTS)
    for spec in specs:
        results = session.run(spec)
        assert judge_bad_input(spec, results) is None, (spec, results)


def test_reference_2_ranks_matches_simulate_and_contains_bad_input():
    with Session(2, RUNNER, {"timeout_s": 30.0}, timeout_s=30.0) as session:
        _assert_bad_input_contained(session, 2)

        # tokens x hidden per rank capped at 2**16 (32 tokens at hidden 2048, 9 at 7168) for the CPU
        # budget; larger and odd token counts come from the pinned examples
        @settings(max_examples=30)
        @given(spec=case_specs(world=2, max_elements=2**16))
        @example(spec=CaseSpec(world=2, seed=5, tokens=(1025, 0), hidden=2048, topk=6, num_experts=64,
                               routing="zipf", specials=0.01))  # large odd count; a rank with no tokens
        @example(spec=CaseSpec(world=2, seed=6, tokens=(129, 33), hidden=2048, topk=8, num_experts=256,
                               routing="starve_rank", starved=0, payload="fp8", specials=0.2))
        @example(spec=CaseSpec(world=2, seed=8, tokens=(20, 3), hidden=7168, topk=8, num_experts=64,
                               routing="masked", specials=0.2))
        def matches_simulate(spec):
            _assert_all_pass(spec, session.run(spec))

        matches_simulate()
    assert session.exitcodes == [0]


def test_reference_4_ranks_matches_simulate_and_contains_bad_input():
    with Session(4, RUNNER, {"timeout_s": 30.0}, timeout_s=30.0) as session:
        _assert_bad_input_contained(session, 4)

        @settings(max_examples=10)
        @given(spec=case_specs(world=4, max_elements=2**14))
        @example(spec=CaseSpec(world=4, seed=9, tokens=(0, 31, 129, 1), hidden=2048, topk=8, num_experts=64,
                               routing="one_expert", payload="fp8"))
        def matches_simulate(spec):
            _assert_all_pass(spec, session.run(spec))

        matches_simulate()
    assert session.exitcodes == [0, 0, 0]


def test_judge_bad_input_rejects_a_silent_or_vague_rank():
    spec = BadInputSpec(world=2, defect="topk_dtype", bad_rank=1)
    assert "expected ValueError, got no error" in judge_bad_input(
        spec, [{"raised": "PeerInputError", "message": ""}, {"raised": None, "message": ""}])
    assert "does not name" in judge_bad_input(
        spec, [{"raised": "PeerInputError", "message": ""}, {"raised": "ValueError", "message": "bad"}])
