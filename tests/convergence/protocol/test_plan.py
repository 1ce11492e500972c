"""The protocol's plan (convergence.protocol.plan): its runs, their levels, and the commands that make them."""

from __future__ import annotations

import dataclasses
import shlex

import pytest

from convergence.protocol.plan import ProtocolPlan, plan_from_dict
from convergence.train.cli import config_from_args, train_parser
from numerics.errors import BadInput


def test_plan_pairs_the_candidate_and_the_control_and_varies_one_thing_per_replicate():
    for design, varied in (("init", "seed"), ("data", "data_seed"), ("rounding", "row_order")):
        plan = ProtocolPlan(model="tiny", steps=20, seed=3, replicates=4, design=design, control="mxfp8-head").check()
        runs = {r.role: [] for r in plan.runs()}
        for r in plan.runs():
            runs[r.role].append(r)
        (base,), (cand,), (ctrl,), (held,) = runs["baseline"], runs["candidate"], runs["control"], runs["heldout"]
        assert (base.recipe, cand.recipe, ctrl.recipe) == ("bf16", "mxfp8", "mxfp8-head")
        same = (base.seed, base.data_seed, base.row_order)
        assert (cand.seed, cand.data_seed, cand.row_order) == same == (ctrl.seed, ctrl.data_seed, ctrl.row_order)
        reps = runs["replicate"] + [held]
        assert len(runs["replicate"]) == 3 and all(r.recipe == "bf16" for r in reps)
        for r in reps:  # exactly one field differs from the paired baseline, and differently for each replicate
            diff = {f for f in ("seed", "data_seed", "row_order") if getattr(r, f) != getattr(base, f)}
            assert diff == {varied}, (design, r)
        assert len({getattr(r, varied) for r in reps}) == len(reps)


def test_plan_candidate_replicates_carry_the_replicates_changes_and_the_negative_control_gets_as_many_runs():
    plan = ProtocolPlan(model="tiny", steps=20, replicates=3, candidate_replicates=4, design="rounding",
                        control="mxfp8-head").check()
    names = [r.name for r in plan.runs()]
    assert names == ["bf16", "mxfp8", "mxfp8-head", "bf16_rounding1", "bf16_rounding2",  # k = 2, m = 1
                     "mxfp8_rounding1", "mxfp8-head_rounding1", "bf16_rounding3",  # k = 2, m = 2
                     "mxfp8_rounding2", "mxfp8-head_rounding2", "bf16_rounding4", "bf16_rounding5",  # k = 3, m = 3
                     "mxfp8_rounding3", "mxfp8-head_rounding3", "bf16_rounding6"]  # k = 3, m = 4: the plan
    by = {r.name: r for r in plan.runs()}
    for i in (1, 2):  # candidate and control replicate i have BF16 replicate i's change, nothing else differs
        for recipe in ("mxfp8", "mxfp8-head"):
            assert dataclasses.replace(by[f"{recipe}_rounding{i}"], name="x", role="x", recipe="x") == \
                dataclasses.replace(by[f"bf16_rounding{i}"], name="x", role="x", recipe="x")
    assert [r.name for r in plan.judged("verdict")] == ["mxfp8", "mxfp8_rounding1", "mxfp8_rounding2",
                                                        "mxfp8_rounding3"]
    assert [r.name for r in plan.judged("negative_control")] == ["bf16_rounding3", "bf16_rounding4",
                                                                 "bf16_rounding5", "bf16_rounding6"]
    assert [r.name for r in plan.judged("positive_control")] == ["mxfp8-head", "mxfp8-head_rounding1",
                                                                 "mxfp8-head_rounding2", "mxfp8-head_rounding3"]
    assert "--candidate-replicates 4" in plan.command("OUT")
    one = ProtocolPlan(model="tiny", steps=20, replicates=3, control="mxfp8-head").check()
    assert "--candidate-replicates" not in one.command("OUT") and len(one.judged("negative_control")) == 1
    assert [r.name for r in one.judged("positive_control")] == ["mxfp8-head"]


@pytest.mark.parametrize("k, m", [(16, 16), (3, 4), (4, 1), (2, 5)])
def test_plan_every_prefix_of_the_schedule_at_a_level_is_a_whole_smaller_protocol(k, m):
    """The runs are ordered level by level, so the first runs up to each level are exactly the runs of a smaller
    valid plan, held-out runs and controls included: a plan cut short can still be judged. The control: the
    plan's own role order, which puts every held-out run last, is not."""
    plan = ProtocolPlan(model="tiny", steps=20, replicates=k, candidate_replicates=m).check()
    order = [r.name for r in plan.runs()]
    assert sorted(order) == sorted(r.name for r in plan._runs_by_role())  # the same runs, another order
    for sub in plan.levels():
        sub.check()
        names = {r.name for r in sub.runs()}
        assert set(order[:len(names)]) == names, (sub.replicates, sub.candidate_replicates)
        assert sum(r.role == "heldout" for r in sub.runs()) == sub.candidate_replicates
    assert plan.levels()[-1] == plan
    if m > 1:
        by_role = [r.name for r in plan._runs_by_role()]
        first = {r.name for r in plan.levels()[0].runs()}
        assert set(by_role[:len(first)]) != first


def test_plan_held_out_share_reaches_every_run_and_its_command():
    plan = ProtocolPlan(model="tiny", steps=20, val_percent=20).check()
    assert all(plan.train_config(r).data.val_percent == 20 for r in plan.runs())
    assert "--val-percent 20" in plan.train_command(plan.runs()[0], "OUT") and "--val-percent 20" in plan.command("O")
    assert plan_from_dict(plan.as_dict()) == plan
    default = ProtocolPlan(model="tiny", steps=20).check()
    assert "--val-percent" not in default.command("O")
    assert default.train_config(default.runs()[0]).data.val_percent is None
    with pytest.raises(BadInput, match="--val-percent must be from 1 to 50"):
        ProtocolPlan(model="tiny", steps=20, val_percent=80).check()


def test_plan_train_commands_reproduce_the_runs_it_makes():
    """The command in each curve's sidecar, parsed by convergence train, is the configuration the piece ran."""
    plan = ProtocolPlan(model="tiny", steps=40, replicates=3, design="rounding", mxfp8_kernel="emulated",
                        overrides=(("lr", 0.002), ("val_batches", 7))).check()
    for spec in plan.runs():
        argv = shlex.split(plan.train_command(spec, "OUT"))
        assert argv[:4] == ["python", "-m", "convergence", "train"]
        got = config_from_args(train_parser().parse_args(argv[4:]))
        assert got == plan.train_config(spec), spec.name


@pytest.mark.parametrize("kw", [
    dict(),
    dict(replicates=5, candidate_replicates=3, test="non-inferiority", endpoint="whole", null_control=True,
         overrides=(("lr", 0.0003), ("val_every", 250.0))),
    dict(design="fork", trunks=2, fork_step=500, candidate_replicates=2, fork_change="data"),
    dict(design="fork", fork_step=500, replicates=8, pilot=True),
])
def test_plan_command_is_accepted_by_the_command_line_as_the_same_plan(kw):
    """The command a plan prints ("run it with", and every result's sidecar) declares that plan again: parsed by
    ``python -m convergence protocol``'s own parser it gives an equal plan (a pilot's continuations as --pilot N,
    which the command line refuses beside --replicates)."""
    from convergence.protocol import cli

    plan = ProtocolPlan(model="proxy", steps=1500, device="cuda", val_percent=20, **kw).check()
    argv = shlex.split(plan.command("/nonexistent/plan"))
    assert argv[:4] == ["python", "-m", "convergence", "protocol"]
    assert cli._plan_of(cli._protocol_parser().parse_args(argv[4:])) == plan


def test_plan_command_names_the_gpus_and_the_runs_per_gpu(small_plan):
    plan = small_plan(device="cuda")
    assert plan.command("OUT", gpus=1, per_gpu=3).endswith("--gpus 1 --parallel 3")
    assert "--parallel" not in plan.command("OUT", gpus=2)


def test_plan_probes_only_the_mxfp8_runs(small_plan):
    """Probes compare MXFP8 against BF16 on the run's own activations: a BF16 run has none to take."""
    plan = small_plan(probe_every=2)
    assert {s.recipe: plan.train_config(s).probe_every for s in plan.runs()} == {"bf16": 0, "mxfp8": 2,
                                                                                 "mxfp8-head": 2}


@pytest.mark.parametrize("bad, match", [
    (dict(replicates=1), "--replicates"), (dict(design="weather"), "--design"), (dict(candidate="bf16"), "--candidate"),
    (dict(control="mxfp8"), "same recipe"), (dict(model="huge"), "unknown model"), (dict(steps=1), "--steps"),
    (dict(candidate_replicates=0), "--candidate-replicates"),
    (dict(overrides=(("val_every", 50.0),)), "--val-every"), (dict(overrides=(("batch", 0.0),)), "--batch"),
    (dict(name="../x"), "--name"), (dict(overrides=(("lr", float("nan")),)), "--lr"),
])
def test_plan_refuses_nonsense(bad, match):
    with pytest.raises(BadInput, match=match):
        dataclasses.replace(ProtocolPlan(model="tiny", steps=20), **bad).check()


@pytest.mark.parametrize("design", [dict(), dict(design="fork", fork_step=15)])
def test_plan_refuses_runs_that_evaluate_once(design):
    """A run evaluates every --val-every steps and at its last; a verdict compares two evaluations at the least, so
    --val-every equal to --steps (one evaluation) is refused before any run trains, and one step fewer (two: at
    19 and 20) is accepted (the control)."""
    with pytest.raises(BadInput, match="--steps 20 with --val-every 20: .* at step 20 only"):
        ProtocolPlan(model="tiny", steps=20, overrides=(("val_every", 20),), **design).check()
    ProtocolPlan(model="tiny", steps=20, overrides=(("val_every", 19),), **design).check()
