"""mxval validate's communication level reads numerics.ep check's verdict: known findings pass it as
known (and say how many values they touched), --strict fails them, and the summary never contradicts
the status (no "every check bit-exact" while a KNOWN row fails the level)."""

from __future__ import annotations

from mxval.validate.ladder import make_plan
from mxval.validate.levels import communication_result
from numerics.ep.check import CheckRow, verdict


def _doc(rows: dict[str, CheckRow], *, strict: bool) -> dict:
    import dataclasses

    v = verdict(rows, strict=strict)
    return {"status": v.status, "passed": v.status == "pass", "verdict": v.line, "summary": f"{v.line}: deepep",
            "strict": strict, "known": v.known, "checks": {n: dataclasses.asdict(r) for n, r in rows.items()},
            "backend": "deepep", "against": "reference", "world": 2, "comm_backend": "nccl", "seconds": 1.0,
            "combine_start": "first-row"}


ROWS = {"dispatch.recv_topk_idx": CheckRow(cases=152),
        "combine": CheckRow(cases=152, known={"E1": {"cases": 88, "values": 1234, "first": "rank 1, token 9"}})}


def test_communication_level_passes_known_findings_as_known_and_says_how_many_values():
    plan = make_plan(gpus=2, deep_ep=True)
    res = communication_result(_doc(ROWS, strict=False), 0, "DeepEP against the NCCL all-to-all, 2 GPUs", plan)
    assert res.status == "pass"
    assert res.summary.endswith("152 cases, bit-exact except known findings: E1 on 1234 values in 88 cases")
    combine = next(c for c in res.checks if c.name == "combine")
    assert combine.status == "pass" and "known E1 on 1234 values in 88 cases" in combine.detail
    assert res.numbers["known"]["E1"]["values"] == 1234


def test_communication_level_fails_known_findings_under_strict_and_says_so():
    plan = make_plan(gpus=2, deep_ep=True, strict=True)
    res = communication_result(_doc(ROWS, strict=True), 1, "DeepEP against the NCCL all-to-all, 2 GPUs", plan)
    assert res.status == "fail" and "bit-exact" not in res.summary
    assert res.summary.endswith("FAIL (--strict, known findings fail): E1 on 1234 values in 88 cases")


def test_communication_level_summary_matches_status_for_a_real_mismatch():
    bad = CheckRow(cases=152, failures=1, first="rank 1, row 2", first_case="{}")
    res = communication_result(_doc(dict(ROWS, **{"dispatch.recv_x.bf16": bad}), strict=False), 1, "what",
                               make_plan(gpus=2, deep_ep=True))
    assert res.status == "fail"
    assert res.summary.startswith("what: 152 cases, FAIL: 1 check differ (dispatch.recv_x.bf16)")
    clean = communication_result(_doc({"combine": CheckRow(cases=5)}, strict=False), 0, "what",
                                 make_plan(gpus=0, deep_ep=False))
    assert clean.status == "pass" and clean.summary == "what: 5 cases, every check bit-exact"
