"""What a plan declares before any run (its test, alpha, endpoint and controls), how its controls are judged by their
own checks, what its verdict lines say, and its projection: judged from the session's finished folder's runs, so
no training here."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from convergence.__main__ import main as convergence_main
from convergence.curves.compare import compare_paths
from convergence.curves.decision.equivalence import LEGACY, chance
from convergence.protocol import cli
from convergence.protocol.folder import metrics_path
from convergence.protocol.judge import control_outcome, judge_logs, null_identity
from convergence.protocol.plan import PLANTED, VERDICTS, ProtocolPlan, plan_from_dict
from convergence.protocol.projection import COSTS, PLANNED, projection
from convergence.protocol.render import verdict_line
from numerics.errors import BadInput

K16 = str(Path(__file__).resolve().parents[3] / "golden" / "training" / "proxy_long_lr3e-4_k16_{}__h200.json")


def test_plan_declares_equivalence_on_the_final_window_with_the_planted_control_by_default():
    plan = ProtocolPlan(model="tiny", steps=20).check()
    assert (plan.test, plan.alpha, plan.endpoint, plan.control, plan.planted_shift) == (
        "equivalence", 0.05, "final", PLANTED, 2.0)
    assert [r.role for r in plan.runs()].count("control") == 0  # the planted control has no runs of its own
    assert plan.verdicts()["positive_control"][:2] == (("heldout",), "not_equivalent")
    assert plan.verdicts()["negative_control"][1] == "covers_zero"
    ni = dataclasses.replace(plan, test="non-inferiority").check()
    assert ni.verdicts()["positive_control"][1] == "inferior"


def test_a_plan_recorded_without_a_test_is_judged_by_the_rule_it_was_made_under():
    """A protocol.json from before the fields: two-ranges, its recipe control not_equivalent and its held-out runs
    equivalent (VERDICTS), as the golden k16 plan was judged. The control: the same dict with a test keeps it."""
    d = ProtocolPlan(model="tiny", steps=20, control="mxfp8-head").as_dict()
    old = {k: v for k, v in d.items() if k not in ("test", "alpha", "endpoint", "planted_shift", "null_control",
                                                   "trunks", "fork_step", "pilot", "planned_spread", "fork_change")}
    plan = plan_from_dict(old)
    assert plan.test == LEGACY and plan.legacy
    assert {n: (roles[0], exp) for n, (roles, exp, _) in plan.verdicts().items()} == {
        n: (role, exp) for n, (role, exp, _) in VERDICTS.items()}
    assert plan_from_dict(d).test == "equivalence"


@pytest.mark.parametrize("bad, match", [
    (dict(test="two-ranges"), "two-ranges"), (dict(planted_shift=0.5), "--planted-shift"),
    (dict(planted_shift=3.5), "--planted-shift"), (dict(alpha=0.5), "--alpha"), (dict(endpoint="last"), "--endpoint"),
    (dict(control="mxfp8-null"), "--control"), (dict(candidate="mxfp8-null"), "--candidate"),
    (dict(pilot=True), "--design fork"), (dict(design="fork"), "--fork-step"),
    (dict(design="fork", fork_step=20), "--fork-step"), (dict(planned_spread=0.0), "--planned-spread"),
])
def test_plan_refuses_an_undeclarable_plan(bad, match):
    with pytest.raises(BadInput, match=match):
        dataclasses.replace(ProtocolPlan(model="tiny", steps=20), **bad).check()


def test_a_folders_declared_rule_and_control_hold_when_the_command_leaves_them_out(tmp_path):
    """An older folder (no test, recipe control) continued by a command that names neither keeps them; a new folder
    gets the new defaults."""
    old = ProtocolPlan(model="tiny", steps=20, control="mxfp8-e5m2").as_dict()
    for key in ("test", "alpha", "endpoint"):
        old.pop(key)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "protocol.json").write_text(json.dumps(old))
    parser = cli._protocol_parser()
    for out, want in ((tmp_path / "old", (LEGACY, "mxfp8-e5m2")), (tmp_path / "new", ("equivalence", PLANTED))):
        plan = cli._plan_of(parser.parse_args(["--model", "tiny", "--steps", "20", "--out", str(out)]))
        assert (plan.test, plan.control) == want


@pytest.fixture(scope="module")
def planted(finished_protocol):
    """The finished folder's runs judged as a plan with the planted control (its recipe control's runs unused)."""
    plan = dataclasses.replace(finished_protocol["plan"], control=PLANTED).check()
    out = finished_protocol["out"]
    return plan, judge_logs(plan, lambda spec: metrics_path(out, spec))


def test_the_planted_control_is_the_held_out_runs_made_a_known_amount_worse(planted):
    """Its runs are the negative control's, and each run's level against the baselines' mean becomes
    (1 + level)(1 + shift) - 1: exactly, since the shift multiplies every validation loss the level averages."""
    plan, verdicts = planted
    pc, nc = verdicts["positive_control"], verdicts["negative_control"]
    shift = plan.planted_shift * plan.margin
    assert pc["protocol"]["judged_runs"] == nc["protocol"]["judged_runs"] == ["bf16_seed3"]
    assert pc["planted_shift"] == shift and "planted_shift" not in nc
    for part in ("overall", "final_window"):
        assert 1 + pc[part]["estimate"] == pytest.approx((1 + nc[part]["estimate"]) * (1 + shift), rel=1e-12)
    outcome = pc["protocol"]["outcome"]
    assert outcome["passed"] == (pc["verdict"] in ("not_equivalent", "diverged"))
    assert outcome["planned_chance"] is None  # no measured spread for the tiny model: no chance in advance


def test_the_negative_control_passes_when_its_interval_covers_0_and_fails_on_a_planted_difference(planted,
                                                                                                   finished_protocol):
    """Covers 0 is the two-sided test of no difference at alpha: p >= alpha, the 1 - alpha interval around the
    estimate holding 0. The control: the same held-out run made 30 % worse is far from 0 and fails."""
    plan, verdicts = planted
    out = finished_protocol["out"]
    got = verdicts["negative_control"]["protocol"]["outcome"]
    lo, hi = got["interval"]
    assert got["covers_zero"] == (lo <= 0 <= hi) == (got["p_no_difference"] >= plan.alpha) == got["passed"]
    base = [metrics_path(out, r) for r in plan.baselines()]
    far = compare_paths(base, metrics_path(out, plan.judged("negative_control")[0]), margin=plan.margin,
                        metric="val_loss", planted_shift=0.3, test=plan.test, alpha=plan.alpha)
    bad = control_outcome(plan, "negative_control", far)
    assert bad["covers_zero"] is False and bad["passed"] is False and bad["interval"][0] > 0


def test_every_verdict_line_states_estimate_interval_p_values_and_resolution(planted):
    plan, verdicts = planted
    line = verdict_line("verdict", verdicts["verdict"])
    r = verdicts["verdict"]
    fw = r["final_window"]
    for said in (f"{fw['estimate']:+.3%}", f"[{fw['interval'][0]:+.3%}, {fw['interval'][1]:+.3%}]",
                 f"p = {fw['p_no_difference']:.3g} against no difference", f"TOST p = {fw['p_test']:.3g}",
                 f"resolves +-{fw['half_width']:.3%}", "secondary, the whole range (never decides)"):
        assert said in line, said
    assert (r["p_no_difference"], r["p_test"], r["half_width"]) == (fw["p_no_difference"], fw["p_test"],
                                                                    fw["half_width"])
    assert "COVERS 0: " in verdict_line("negative_control", verdicts["negative_control"])
    assert "[control: detected (not_equivalent): " in verdict_line("positive_control", verdicts["positive_control"])


def test_null_identity_holds_for_a_copy_and_names_the_first_difference_of_a_nudged_log(tmp_path, finished_protocol):
    out, plan = finished_protocol["out"], finished_protocol["plan"]
    twin = metrics_path(out, plan.run("baseline"))
    copy = tmp_path / "copy.jsonl.gz"
    shutil.copy(twin, copy)
    assert null_identity(twin, copy)["verdict"] == "identical"
    import gzip

    rows = [json.loads(x) for x in gzip.decompress(copy.read_bytes()).decode().splitlines()]
    rows[2]["grad_norm"] = rows[2]["grad_norm"] * (1 + 1e-7)
    nudged = tmp_path / "nudged.jsonl"
    nudged.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = null_identity(twin, nudged)
    assert r["verdict"] == "not_identical" and r["first_difference"]["step"] == 3
    assert r["first_difference"]["field"] == "grad_norm"


def test_projection_planned_spread_is_the_k16_plans_measured_one():
    """PLANNED's proxy spread and set error are the golden k16 plan's final window: its 32 BF16 runs (the baselines
    and the held-out ones) and 16 MXFP8 runs, each group around its own mean, on 46 degrees of freedom."""
    from convergence.curves.power import pooled_spread

    v, n = (json.loads(Path(K16.format(name)).read_text()) for name in ("verdict", "negative_control"))
    bf16 = v["final_window"]["replicate_levels"] + n["final_window"]["candidate_levels"]
    spread, dof = pooled_spread([bf16, v["final_window"]["candidate_levels"]])
    assert (round(spread, 7), dof) == (PLANNED["proxy"]["spread"], 46)
    assert round(v["final_window"]["se_set"], 8) == PLANNED["proxy"]["se_set"]


def test_projection_gives_the_tests_and_the_controls_chances_by_the_exact_formula():
    """k = m = 16 independent runs on the proxy: the favourable verdict's chance at 0 and at +margin, and the
    planted control's chance of being called not_equivalent, are ``chance`` at c = 2/16 on 30 degrees of freedom;
    a fork plan's per trunk, over its trunks. The type-I point is at most alpha; more runs raise the power."""
    plan = ProtocolPlan(model="proxy", steps=1500, replicates=16, candidate_replicates=16).check()
    p = projection(plan)
    s, e = PLANNED["proxy"]["spread"], PLANNED["proxy"]["se_set"]
    kw = dict(alpha=0.05, sigma=s, c=2 / 16, dof=30.0, se_set=e)
    assert p["verdict"]["chance_equivalent_at_0"] == pytest.approx(chance("equivalence", 0.0, 0.0025, **kw)[
        "favourable"], rel=1e-12)
    assert p["verdict"]["chance_equivalent_at_margin"] <= 0.05
    assert p["positive_control"]["chance_detected"] == pytest.approx(
        chance("equivalence", 0.005, 0.0025, **kw)["unfavourable"], rel=1e-12)
    assert [lv["candidate_replicates"] for lv in p["levels"]] == list(range(1, 17))
    assert p["levels"][-1]["gpu_hours"] == pytest.approx(64 * 371.25 / 3600 - 16 * 371.25 / 3600)  # no control runs
    fork = ProtocolPlan(model="proxy", steps=1500, design="fork", trunks=4, fork_step=500, replicates=8,
                        candidate_replicates=8).check()
    f = projection(fork)
    assert f["spread_source"].startswith("measured") and f["levels"][-1]["dof"] == 4 * 14
    assert f["spread"] == PLANNED["proxy"]["fork"]["spread"]
    assert f["verdict"]["chance_equivalent_at_0"] > f["levels"][0]["verdict"]["chance_equivalent_at_0"]
    elsewhere = projection(ProtocolPlan(model="proxy", steps=1500, design="fork", trunks=4, fork_step=250,
                                        replicates=8, candidate_replicates=8).check())
    assert "assumed" in elsewhere["spread_source"]  # the pilot's spread is for a fork at its step only


def test_the_proxy_fork_spread_is_the_fork_pilots():
    """PLANNED's within-trunk spread for the proxy is the golden fork pilot's final-window spread, at its fork step
    and length, to the five significant figures it is written with."""
    from convergence.curves.decision.designs import pilot_spread

    golden = Path(__file__).resolve().parents[3] / "golden" / "training" / "proxy_fork_h100_pilot__h100.json"
    r = json.loads(golden.read_text())
    spread, dof = pilot_spread(r)
    mine = PLANNED["proxy"]["fork"]
    assert (mine["fork_step"], mine["steps"], dof) == (r["fork_step"], r["steps"], 7)
    assert mine["spread"] == pytest.approx(spread, abs=5e-8)


def test_a_pilots_projection_gives_its_runs_and_their_cost_and_no_chances():
    """A fork pilot decides nothing: its projection counts its trunk and continuations and what they cost (the trunk
    to the fork step at the deterministic pace, each continuation from it, a start-up each), and names no chance;
    without a deterministic pace, the trunk's steps cost what a continuation's do."""
    pilot = ProtocolPlan(model="proxy", steps=1500, design="fork", fork_step=500, replicates=8, pilot=True).check()
    p = projection(pilot)
    run_s, up, pace = 371.25, 60.0, 1.41
    assert p["runs"] == 9 and "verdict" not in p
    conts = 8 * (up + 2 * (run_s - up) / 3)
    assert p["gpu_hours"] == pytest.approx((up + pace * (run_s - up) / 3 + conts) / 3600)
    plain = {k: v for k, v in COSTS["proxy"].items() if k != "deterministic_pace"}
    assert projection(pilot, plain)["gpu_hours"] == pytest.approx((up + (run_s - up) / 3 + conts) / 3600)


def test_the_confirmatory_plan_in_docs_is_what_its_command_declares_and_projects():
    """docs/studies/confirmatory/: its protocol.json is the plan the Slurm command in confirmatory.md declares (that
    command parsed by the protocol's own parser, less where and how it runs), and its projection.json's whole-plan
    numbers (runs, GPU-hours, the test's and the controls' chances) are what the code projects for that plan now:
    the fork design at the fork pilot's measured spread, the fewest trunks that give 80 % power."""
    import re
    import shlex

    from convergence.protocol import cli
    from convergence.protocol.projection import COSTS, _chances, plan_cost_s, planning_spread

    docs = Path(__file__).resolve().parents[3] / "docs" / "studies"
    plan = plan_from_dict(json.loads((docs / "confirmatory" / "protocol.json").read_text())).check()
    block = re.search(r"```bash\n(python -m convergence protocol .*?--executor slurm.*?)\n[^ ]",
                      (docs / "confirmatory.md").read_text(), re.S).group(1)
    argv = shlex.split(block.replace("\\\n", " "))[4:]
    assert argv[argv.index("--executor") + 1] == "slurm"
    out = argv.index("--out")
    argv[out + 1] = "/nonexistent/confirmatory"  # not a folder that holds a plan
    assert cli._plan_of(cli._protocol_parser().parse_args(argv)) == plan
    committed = json.loads((docs / "confirmatory" / "projection.json").read_text())
    spread, se_set, _ = planning_spread(plan)
    now = _chances(plan, spread, se_set)
    assert (committed["runs"], committed["spread"], committed["test"]) == (len(plan.runs()), spread, plan.test)
    assert committed["gpu_hours"] == pytest.approx(plan_cost_s(plan, COSTS["proxy"]) / 3600, rel=1e-12)
    for key in ("verdict", "positive_control", "negative_control"):
        assert committed[key].keys() == now[key].keys(), key
        for name, value in now[key].items():
            assert committed[key][name] == (value if isinstance(value, str) else pytest.approx(value, rel=1e-9))
    assert plan.design == "fork" and committed["spread_source"].startswith("measured")
    assert committed["levels"][-1]["runs"] == committed["runs"] == 76
    assert committed["verdict"]["chance_non_inferior_at_0"] >= 0.8 > committed["levels"][-2]["verdict"][
        "chance_non_inferior_at_0"]  # the fewest trunks for 80 % power, as `convergence power` says (3 of 8 pairs)


def test_declare_only_writes_the_plan_and_its_projection_and_trains_nothing(tmp_path, capsys):
    out = tmp_path / "plan"
    argv = ["protocol", "--model", "proxy", "--steps", "1500", "--replicates", "8", "--candidate-replicates", "8",
            "--device", "cuda", "--out", str(out), "--declare-only"]
    assert convergence_main(argv) == 0
    assert sorted(p.name for p in out.iterdir()) == ["projection.json", "protocol.json"]
    p = json.loads((out / "projection.json").read_text())
    assert p == json.loads(json.dumps(projection(ProtocolPlan(model="proxy", steps=1500, replicates=8,
                                                              candidate_replicates=8, device="cuda").check())))
    assert "positive control" in capsys.readouterr().out


def test_status_gives_the_runs_each_design_and_test_needs_at_the_folders_spread_and_pace(finished_protocol):
    """--status's table: independent runs at the spread of the folder's BF16 runs (baselines and held-out) and
    candidate runs over the final window, pooled, each group around its own mean; GPU-hours at the folder's pace
    (designs.pace_costs); at no true difference and at twice the margin (a worse candidate detected)."""
    from convergence.curves import power
    from convergence.curves.decision import designs
    from convergence.protocol.schedule import STARTUP_S
    from convergence.protocol.status import progress

    out, plan = finished_protocol["out"], finished_protocol["plan"]
    lv = progress(plan, out).level
    v = lv.verdicts
    bf16 = v["verdict"]["final_window"]["replicate_levels"] + v["negative_control"]["final_window"]["candidate_levels"]
    spread, _ = power.pooled_spread([bf16, v["verdict"]["final_window"]["candidate_levels"]])
    costs = designs.pace_costs(out)
    for row in lv.designs:
        assert row["true_difference"] in (0.0, 2 * plan.margin)
        if row["design"] == "independent" and row["runs_per_arm"]:
            assert row["spread"] == pytest.approx(spread, rel=1e-12)
            n = row["runs_per_arm"]
            assert row["gpu_hours"] == pytest.approx(designs.independent(spread).cost_s(
                n, costs["bf16"], costs["mxfp8"], STARTUP_S["tiny"]) / 3600)
    assert {r["design"] for r in lv.designs} == {"independent", "fork"}
