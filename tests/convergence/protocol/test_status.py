"""How far a protocol folder is, as data (convergence.protocol.status): groups, the last whole level judged in
memory, the projection of the whole plan, the pairs, the time left."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from convergence.curves import power
from convergence.protocol.folder import metrics_path, open_protocol, run_dir
from convergence.protocol.judge import judge
from convergence.protocol.plan import ProtocolPlan
from convergence.protocol.render import draw_figures
from convergence.protocol.status import Pairs, pairs, progress, projection


def _tree(root) -> list:
    return sorted(p.relative_to(root) for p in root.rglob("*"))


def test_status_counts_the_runs_done_and_the_time_left_at_the_folders_pace(tmp_path, small_plan, write_pace):
    """Runs done per verdict group; the time left is each recipe's whole-run pace times the runs' worth left
    (a run stopped with its checkpoint counts its steps left), and a recipe with no pace yet is named."""
    plan = small_plan()
    open_protocol(plan, tmp_path)
    assert progress(plan, tmp_path).left.no_pace == [("bf16", 4), ("mxfp8", 1), ("mxfp8-head", 1)]
    first, stopped = plan.runs()[0], plan.runs()[3]  # bf16 and a BF16 replicate
    for spec, steps in ((first, plan.steps), (stopped, 1)):
        log = run_dir(tmp_path, spec) / "metrics.jsonl"
        log.parent.mkdir(parents=True)
        log.write_text("".join(json.dumps({"step": s, "loss": 3.0}) + "\n" for s in range(1, steps + 1)))
    (run_dir(tmp_path, stopped) / "checkpoint.pt").write_bytes(b"a checkpoint")
    write_pace(tmp_path, {"run": first.name, "recipe": "bf16", "per_gpu": 1, "from_step": 0, "to_step": plan.steps,
                          "wall_s": 360.0})
    p = progress(plan, tmp_path)
    assert p.done == 1 and [(g.done, g.runs) for g in p.groups] == [(1, 3), (0, 1), (0, 1), (0, 1)]
    share = 2 + (1 - 1 / plan.steps)  # two BF16 runs whole, the stopped one its steps left
    assert p.left.recipes == [("bf16", 360.0, pytest.approx(share))] and p.left.seconds == pytest.approx(360 * share)
    assert p.left.no_pace == [("mxfp8", 1), ("mxfp8-head", 1)]
    assert p.states[stopped.name].state == "stopped" and p.level is None


def test_status_judges_the_last_whole_level_without_writing_anything(tmp_path, val_loss_protocol):
    """The last whole level's three verdicts, judged in memory (here a control 5 % worse comes out
    not_equivalent, the held-out BF16 runs equivalent), with what the whole plan should resolve at the spread
    of every finished run; before a level is whole there is none (the control); nothing is written but the
    figure asked for."""
    plan, write = val_loss_protocol
    level = plan.levels()[1]  # k = m = 2
    for r in plan.levels()[0].runs()[:-1]:
        write(r)
    fig = tmp_path.parent / f"{tmp_path.name}_status.png"
    p = progress(plan, tmp_path)
    assert p.level is None
    draw_figures(p, fig, None)
    assert not fig.exists()
    for r in level.runs():
        write(r)
    before = _tree(tmp_path)
    lv = progress(plan, tmp_path).level
    assert (lv.replicates, lv.candidate_replicates, lv.whole, lv.error) == (2, 2, False, None)
    assert {n: (r["verdict"], r["protocol"]["as_expected"]) for n, r in lv.verdicts.items()} == {
        "verdict": ("equivalent", None), "positive_control": ("not_equivalent", True),
        "negative_control": ("equivalent", True)}
    assert _tree(tmp_path) == before  # nothing written

    judged = judge(level, tmp_path)  # what the whole plan should resolve at this spread: power's arithmetic
    held_out = judged["negative_control"]["final_window"]["candidate_levels"]
    fw = judged["verdict"]["final_window"]
    spread, _ = power.pooled_spread([fw["replicate_levels"] + held_out, fw["candidate_levels"]])
    want = power.half_width(3, spread, 0.0, m=4)
    assert (lv.projection.k, lv.projection.m, lv.projection.whole) == (3, 4, False)
    assert lv.projection.half_width == pytest.approx(want, rel=1e-12)
    assert want <= plan.margin and lv.projection.needs is None  # resolved: nothing more to ask for

    draw_figures(progress(plan, tmp_path), fig, None)
    assert fig.stat().st_size > 10_000 and _tree(tmp_path) == before

    # a finished run the whole level does not hold (the next level's candidate replicate) joins the planning
    # spread, not the verdicts: 4 BF16 and 3 MXFP8 runs, and a wider spread than the level's own
    extra = plan.levels()[2].judged("verdict")[2]
    write(extra)
    lv = progress(plan, tmp_path).level
    assert (lv.projection.bf16_runs, lv.projection.candidate_runs) == (4, 3) and lv.projection.half_width > want
    assert [r["verdict"] for r in lv.verdicts.values()] == ["equivalent", "not_equivalent", "equivalent"]

    # that run unreadable (finished, without val_loss): the verdicts and the projection from the level's own runs
    # stay, and the planning says why it left it out
    metrics_path(tmp_path, extra).write_text("".join(json.dumps({"step": s, "loss": 2.0}) + "\n"
                                                     for s in range(1, 11)))
    lv = progress(plan, tmp_path).level
    assert lv.error is None and lv.planning_error is not None
    assert lv.projection.half_width == pytest.approx(want, rel=1e-12)

    metrics_path(tmp_path, level.runs()[0]).write_text("".join(json.dumps({"step": s, "loss": 2.0}) + "\n"
                                                               for s in range(1, 11)))  # finished, without val_loss
    lv = progress(plan, tmp_path).level
    assert lv.error is not None and lv.verdicts is None and lv.projection is None


def test_status_of_a_whole_plan_projects_its_own_spread(tmp_path, val_loss_protocol):
    """A whole plan's level is the plan; its projection is its own runs' pooled spread at its own k, m by the
    planning formula."""
    plan, write = val_loss_protocol
    plan = plan.levels()[2]  # k = m = 3, whole: the fixture's runs reach that far
    for r in plan.runs():
        write(r)
    lv = progress(plan, tmp_path).level
    assert lv.whole and lv.projection.whole
    judged = judge(plan, tmp_path)
    fw, held = judged["verdict"]["final_window"], judged["negative_control"]["final_window"]["candidate_levels"]
    spread, _ = power.pooled_spread([fw["replicate_levels"] + held, fw["candidate_levels"]])
    p = lv.projection
    assert (p.bf16_runs, p.candidate_runs, p.k, p.m) == (6, 3, 3, 3)
    assert p.spread == pytest.approx(spread, rel=1e-12) and p.half_width == pytest.approx(
        power.half_width(3, spread, 0.0, m=3), rel=1e-12)


def test_status_names_the_smaller_protocol_that_is_complete(tmp_path):
    plan = ProtocolPlan(model="tiny", control="mxfp8-head", steps=10,
                        overrides=(("val_every", 5),), replicates=3, candidate_replicates=4).check()
    open_protocol(plan, tmp_path)
    for r in {r.name: r for sub in plan.levels()[:2] for r in sub.runs()}.values():
        path = metrics_path(tmp_path, r)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"step": s, "loss": 1.0, "val_loss": 1.0}) + "\n" for s in range(1, 11)))
    lv = progress(plan, tmp_path).level
    assert (lv.replicates, lv.candidate_replicates, lv.whole) == (2, 2, False)


def test_status_says_whether_the_pairs_end_alike(tmp_path, val_loss_protocol):
    """How a judged run and the BF16 baseline with the same change correlate: the verdicts judge the groups apart
    (Welch), which pays unless the pairs end alike. The fixture's runs differ by their noise alone, so the levels
    are affine in it and r is the noise's own correlation: BF16 (0, 1e-4, -1e-4) against MXFP8 (5e-5, -5e-5,
    4e-4) and the control (0.05, 0.0501, 0.0502). The held-out runs have no pairs; a run whose change has no
    baseline (the fourth candidate of k = 3, m = 4) is left out, not paired by position; two pairs say nothing."""
    plan, write = val_loss_protocol
    level = plan.levels()[2]  # k = m = 3: three pairs
    for r in level.runs():
        write(r)
    found = progress(plan, tmp_path).level.pairs
    bf16 = [0.0, 1e-4, -1e-4]
    want = {"mxfp8": np.corrcoef(bf16, [5e-5, -5e-5, 4e-4])[0, 1],
            "mxfp8-head": np.corrcoef(bf16, [0.05, 0.0501, 0.0502])[0, 1]}
    assert [f.recipe for f in found] == list(want)
    for f in found:
        assert set(f.by_range) == {"overall", "final_window"} and f.by_range["overall"]["n"] == 3
        assert math.isclose(f.by_range["overall"]["r"], want[f.recipe], rel_tol=1e-6)
    assert round(want["mxfp8"], 2) == -0.95 and round(want["mxfp8-head"], 6) == -0.5  # each recipe its own

    def verdicts(base, cand):  # levels as the verdicts hold them, in plan.baselines() and plan.judged() order
        part = {"replicate_levels": base, "candidate_levels": cand}
        return {"verdict": {"overall": part}, "positive_control": {}, "negative_control": {"overall": part}}

    wide = ProtocolPlan(model="tiny", control="mxfp8-head", steps=10,
                        overrides=(("val_every", 5),), replicates=3, candidate_replicates=4).check()
    (got,) = pairs(wide, verdicts([0.0, 0.01, 0.02], [0.0, 0.01, 0.02, -5.0]))
    assert isinstance(got, Pairs) and got.recipe == "mxfp8" and got.by_range["overall"]["n"] == 3
    assert got.by_range["overall"]["r"] == pytest.approx(1.0)
    assert pairs(plan.levels()[1], verdicts([0.0, 0.01], [0.0, 0.01])) == []  # k = m = 2


def test_the_projection_says_how_many_runs_the_margin_needs_and_how_sure_that_is():
    """When the whole plan would not resolve the margin, the projection says what would, from the spread pooled
    over every BF16 run and the candidate's runs, with that spread's 95 % interval. Sixteen proxy runs' final-window
    levels (set error 0.064 %): 0.488 % over 10 degrees of freedom, k = m = 60 (31 to 178 over the interval); for
    an identical candidate to be called equivalent 8 times in 10, 512 (the set's error is most of that budget);
    with the candidate's spread (1.66x BF16's, F-test p = 0.24) taken apart, 73. A set error of 0.2 % puts the
    margin out of reach at any k (its floor, 2.24 x 0.2 %, is wider than 0.25 %: the control); one run per group
    measures no spread."""
    plan = ProtocolPlan(model="proxy", control="mxfp8-head", steps=1500, replicates=16, candidate_replicates=16).check()

    def verdicts(se_set, bases=(-0.00172, 0.00609, 0.00161, -0.00599), cand=(0.00061, 0.00765, 0.01469, 0.00137),
                 held=(0.00167, 0.00589, 0.00065, -0.00049)):
        return {"verdict": {"final_window": {"replicate_levels": list(bases), "candidate_levels": list(cand),
                                             "se_set": se_set}},
                "negative_control": {"final_window": {"candidate_levels": list(held)}}}

    p = projection(plan, verdicts(0.00064))
    assert (round(p.spread, 5), p.dof, p.bf16_runs, p.candidate_runs) == (0.00488, 10, 8, 4)
    assert tuple(round(v, 5) for v in p.spread_interval) == (0.00341, 0.00856) and p.range == "final_window"
    n = p.needs
    assert (n.floor, n.k, n.k_low, n.k_high, n.k_equivalent, n.k_apart) == (None, 60, 31, 178, 512, 73)
    r = n.spreads_apart
    assert (round(r["candidate"], 5), round(r["baseline"], 5), round(r["ratio"], 2), round(r["p_equal"], 2)) == (
        0.00655, 0.00395, 1.66, 0.24)
    far = projection(plan, verdicts(0.002)).needs
    assert far.k is None and (far.se_set, round(far.floor, 5)) == (0.002, 0.00448)
    assert projection(plan, verdicts(0.00064, (0.0,), (0.0,), ())) is None
    lo, hi = power.spread_interval(0.01, 3)
    assert round(lo, 5) == 0.00566 and round(hi, 5) == 0.03729  # chi-square with 3 degrees of freedom


def test_the_projection_plans_with_the_range_that_binds_the_verdict():
    """The verdict needs both ranges (whole and final window) inside the margin, and its "resolves +-X" is the wider
    half-width: the projection plans with that range. Runs whose early evaluations spread 2 % and whose last two
    spread 0.5 % (k = m = 8, compared by compare_curves): at the same k = m the projection says what the verdict
    resolves (within 10 %: the projection pools the two groups' spreads, the verdict takes them apart, Welch), in
    the whole range; the final window alone is ~2x narrower (the control: the test above, a final window only)."""
    from convergence.curves.compare import CompareOptions, compare_curves
    from convergence.curves.curve import Curve, CurveMeta

    rng = np.random.default_rng(5)
    steps = np.arange(250, 1501, 250)
    early = np.array([1, 1, 1, 1, 0, 0], dtype=float)  # evaluations 250 (not compared) to 1000 move with the early

    def run(name: str) -> Curve:
        level = rng.normal(0, 0.02) * early + rng.normal(0, 0.005)
        return Curve(steps.copy(), (1.0 + 0.5 * (steps / 250.0) ** -0.7) * (1 + level),
                     CurveMeta(source=f"{name}.jsonl", format="synthetic", run=name, tag="val_loss"))

    bases, cands = [run(f"b{i}") for i in range(8)], [run(f"c{i}") for i in range(8)]
    r = compare_curves(bases, cands[0], CompareOptions(metric="val_loss"), candidate_replicates=cands[1:])
    # the premise, not the property tested: the whole range binds, clearly (planned 2.6x; this draw 1.9x)
    assert r["overall"]["half_width"] > 1.5 * r["final_window"]["half_width"]
    plan = ProtocolPlan(model="proxy", control="mxfp8-head", steps=1500, replicates=8, candidate_replicates=8).check()
    p = projection(plan, {"verdict": r})
    assert p.range == "overall" and set(p.other_ranges) == {"final_window"}
    assert p.half_width == pytest.approx(r["sensitivity"]["half_width"], rel=0.10)
    assert p.other_ranges["final_window"][0] < p.half_width / 1.5
