"""How fast a protocol's replicates drift from their paired run, and the spread at each evaluation
(convergence.protocol.replicate_drift), on metrics files written by hand: the numbers are known in closed form, so
the bins, the medians and the spreads are checked exactly."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from convergence.protocol import replicate_drift
from convergence.protocol.folder import compact_run, metrics_path, open_protocol, run_dir
from convergence.protocol.plan import ProtocolPlan
from convergence.protocol.render import draw_figures, drift_lines, spread_line, status_lines
from convergence.protocol.status import progress
from numerics.errors import BadInput

STEPS = 20
# relative change of each replicate from its recipe's paired run, per step: BF16's 100x smaller than MXFP8's
SCALE = {"bf16": 1e-5, "mxfp8": 1e-3, "mxfp8-head": 1e-3}


def _paired_loss(s: int) -> float:
    return 3.0 - s / 20


def _write(out, plan, *, scale=SCALE, skip=()):
    """Every run of ``plan``: the paired runs at ``_paired_loss``, replicate i of a recipe ``(1 + a i s)`` times it."""
    status = {}
    for r in plan.runs():
        i = 0 if r.role in replicate_drift.PAIRED_ROLES else int(r.name.rsplit(plan.design, 1)[1])
        path = metrics_path(out, r)
        path.parent.mkdir(parents=True, exist_ok=True)
        steps = [s for s in range(1, STEPS + 1) if s not in (skip if i else ())]
        path.write_text("".join(json.dumps({"step": s, "loss": _paired_loss(s) * (1 + scale[r.recipe] * i * s)})
                                + "\n" for s in steps))
        status[r.name] = "done"
    return status


def _plan(**kw) -> ProtocolPlan:
    return ProtocolPlan(model="tiny", control="mxfp8-head", steps=STEPS, replicates=4, candidate_replicates=3,
                        **kw).check()


def test_drift_bins_and_medians_are_the_closed_form(tmp_path):
    """Replicate i of a recipe with scale a differs by a i s at step s: a bin's mean is a i times its mean step,
    the median over i = 1..n is a times the median i; MXFP8's 100x BF16's in every bin (the control that the
    measure tells two recipes apart), and a recipe whose replicates are its paired run is 0 throughout."""
    plan = _plan()
    result = replicate_drift.drift(plan, tmp_path, _write(tmp_path, plan))
    assert list(result) == ["bf16", "mxfp8", "mxfp8-head"]
    bins = [[1, 1], [2, 3], [4, 7], [8, 15], [16, 20]]
    # BF16: replicates 1..3 and the held-out 4..6 (they are bf16 runs with the same kind of change)
    for recipe, ids in (("bf16", range(1, 7)), ("mxfp8", range(1, 3))):
        r = result[recipe]
        assert r["runs"] == len(ids) and r["bins"] == bins
        mean_step = [np.mean(range(lo, hi + 1)) for lo, hi in bins]
        a = SCALE[recipe]
        assert r["median"] == pytest.approx([a * np.median(list(ids)) * m for m in mean_step], rel=1e-9)
        assert r["low"] == pytest.approx([a * min(ids) * m for m in mean_step], rel=1e-9)
        assert r["high"] == pytest.approx([a * max(ids) * m for m in mean_step], rel=1e-9)
    ratio = np.array(result["mxfp8"]["median"]) / np.array(result["bf16"]["median"])
    assert ratio == pytest.approx(100 * np.median(range(1, 3)) / np.median(range(1, 7)), rel=1e-9)

    alike = _write(tmp_path / "same", plan, scale=dict.fromkeys(SCALE, 0.0))
    same = replicate_drift.drift(plan, tmp_path / "same", alike)
    assert all(v == 0 for r in same.values() for v in r["median"])


def test_drift_reads_compacted_runs_as_plain_ones(tmp_path):
    """Finished protocol runs keep their metrics gzip (``compact_run``): the same drift from either form."""
    plan = _plan()
    status = _write(tmp_path, plan)
    want = replicate_drift.drift(plan, tmp_path, status)
    for r in plan.runs():
        compact_run(run_dir(tmp_path, r))
    assert not list(tmp_path.rglob("metrics.jsonl")) and replicate_drift.drift(plan, tmp_path, status) == want


def test_drift_needs_the_same_batches_and_the_same_steps(tmp_path):
    """A design that changes the batches is not measured (None); a replicate that logged other steps than its
    paired run is one line naming it; unfinished runs are left out (no paired run: no recipe)."""
    plan = _plan()
    status = _write(tmp_path, plan)
    assert replicate_drift.drift(dataclasses.replace(plan, design="data"), tmp_path, status) is None
    assert replicate_drift.drift(plan, tmp_path, {n: 0 for n in status}) == {}
    _write(tmp_path, plan, skip=(5,))
    with pytest.raises(BadInput, match=r"bf16_rounding1: its logged steps are not bf16's \(19 vs 20\)"):
        replicate_drift.drift(plan, tmp_path, status)


def test_status_holds_the_drift_and_its_lines_show_the_bins(tmp_path):
    """--status's data holds the drift as ``drift`` computes it, an unreadable pair as its reason (the rest of the
    status stays); the rendered line of a recipe shows the bins holding steps 2 and 8 (64 and 512 are beyond this
    plan) and the last, with the least and greatest replicate's: replicate 1 and 6 at the bins' mean steps 11.5
    and 18 (1e-5 x 1 x 11.5 = 1.15e-4, ...)."""
    plan = _plan()
    open_protocol(plan, tmp_path)
    status = _write(tmp_path, plan)
    p = progress(plan, tmp_path)
    assert p.drift == replicate_drift.drift(plan, tmp_path, status) and p.drift_error is None
    bf16, mx, _ = drift_lines(p.drift)
    assert bf16.startswith("bf16 (6 replicates) steps 2-3: 8.")
    assert bf16.endswith(", 8-15: 4.0e-04 (1.1e-04 to 6.9e-04), 16-20: 6.3e-04 (1.8e-04 to 1.1e-03)")
    assert mx.startswith("mxfp8 (2 replicates) steps 2-3: 3.") and mx.endswith("16-20: 2.7e-02 (1.8e-02 to 3.6e-02)")
    assert [f"  - {line}" for line in drift_lines(p.drift)] == [x for x in status_lines(p) if x.startswith("  - ")]

    _write(tmp_path, plan, skip=(5,))  # unreadable as pairs: its reason, the rest of the status stays
    p = progress(plan, tmp_path)
    assert p.drift is None and p.drift_error.startswith("bf16_rounding1: ") and p.done == len(plan.runs())


def _write_val(out, plan, levels: dict[str, list[float]], *, skip=None, append=False):
    """Finished runs of ``plan`` with validation losses only: the i-th run of a recipe (plan order) at
    ``base(s) * (1 + levels[recipe][i] * s / STEPS)``, so its relative place grows in proportion to the step."""
    status, seen = {}, {}
    for r in plan.runs():
        i = seen[r.recipe] = seen.get(r.recipe, -1) + 1
        path = metrics_path(out, r)
        path.parent.mkdir(parents=True, exist_ok=True)
        steps = [s for s in (5, 10, 20) if (r.name, s) != skip]
        loss = {s: _paired_loss(s) * (1 + levels[r.recipe][i] * s / STEPS) for s in steps}
        text = "".join(json.dumps({"step": s, "val_loss": v}) + "\n" for s, v in loss.items())
        path.write_text((path.read_text() if append else "") + text)
        status[r.name] = "done"
    return status


def test_spread_by_evaluation_is_the_pooled_spread_at_each_step(tmp_path):
    """BF16's runs and the candidate's, each group about its own mean, relative to BF16's mean at the step; the
    E2M1-like control's runs are not in it (a wide control leaves it unchanged: the control that the candidate and
    BF16 alone are pooled), nor an unfinished run; a step one run did not log is dropped."""
    plan = _plan()  # k = 4, m = 3: 4 + 3 held-out BF16 runs, 3 MXFP8 runs, 3 control runs
    bf16, mx = [0.01, -0.01, 0.02, 0.0, -0.02, 0.005, -0.005], [0.05, 0.03, 0.04]
    status = _write_val(tmp_path, plan, {"bf16": bf16, "mxfp8": mx, "mxfp8-head": [0.5, -0.5, 0.9]})
    result = replicate_drift.spread_by_evaluation(plan, tmp_path, status)
    assert result["steps"] == [5, 10, 20] and result["runs"] == (7, 3) and result["dof"] == 8

    def expected(f):  # the closed form at step s = f * STEPS: run i at 1 + x_i f times the base, over BF16's mean
        b, c = 1 + np.array(bf16) * f, 1 + np.array(mx) * f
        return np.sqrt(((b - b.mean()) ** 2).sum() + ((c - c.mean()) ** 2).sum()) / b.mean() / np.sqrt(6 + 2)
    assert result["spread"] == pytest.approx([expected(f) for f in (0.25, 0.5, 1.0)], rel=1e-12)
    assert result["spread"][0] < result["spread"][1] < result["spread"][2]  # it grows with the step, as written
    # at the last step each recipe's runs apart, the control's too: run i ends at base (1 + x_i), so its relative
    # standard deviation is that of 1 + x_i (the base cancels); the control's wide runs are the control of the
    # pooled spread above, and here they are its own
    rsd = {recipe: np.std(1 + np.array(x), ddof=1) / np.mean(1 + np.array(x))
           for recipe, x in (("bf16", bf16), ("mxfp8", mx), ("mxfp8-head", [0.5, -0.5, 0.9]))}
    assert result["at_last"] == {r: (pytest.approx(v, rel=1e-12), n) for (r, v), n in zip(rsd.items(), (7, 3, 3))}

    wide = _write_val(tmp_path / "w", plan, {"bf16": bf16, "mxfp8": mx, "mxfp8-head": [5.0, -5.0, 9.0]})
    assert replicate_drift.spread_by_evaluation(plan, tmp_path / "w", wide)["spread"] == pytest.approx(result["spread"])
    status["mxfp8_rounding1"] = 100
    assert replicate_drift.spread_by_evaluation(plan, tmp_path, status)["runs"] == (7, 2)
    unfinished_left_out = replicate_drift.spread_by_evaluation(plan, tmp_path, status)
    assert unfinished_left_out["at_last"]["mxfp8"][1] == 2
    status = _write_val(tmp_path / "s", plan, {"bf16": bf16, "mxfp8": mx, "mxfp8-head": [0, 0, 0]},
                        skip=("bf16_rounding2", 10))
    assert replicate_drift.spread_by_evaluation(plan, tmp_path / "s", status)["steps"] == [5, 20]
    assert replicate_drift.spread_by_evaluation(plan, tmp_path, {n: 0 for n in status}) is None


def test_status_holds_the_spread_at_each_evaluation_and_its_line_shows_it(tmp_path):
    plan = _plan()
    open_protocol(plan, tmp_path)
    status = _write_val(tmp_path, plan, {"bf16": [0.01, -0.01] * 4, "mxfp8": [0.01, -0.01, 0.0], "mxfp8-head": [0] * 3})
    result = replicate_drift.spread_by_evaluation(plan, tmp_path, status)
    p = progress(plan, tmp_path)
    assert p.spread == result and p.spread_error is None
    assert result["at_last"]["mxfp8-head"] == (0.0, 3)  # the control's three runs, alike: no spread
    line = spread_line(result, STEPS)
    assert line.startswith("validation loss spread at each evaluation (7 BF16 and 3 mxfp8 runs, pooled, 8 degrees "
                           f"of freedom): 5: {result['spread'][0]:.2%}, 10: ")
    assert f"bf16 {result['at_last']['bf16'][0]:.2%} (7 runs)" in line and "mxfp8-head 0.00% (3 runs)" in line
    assert f"  {line}" in status_lines(p)


def test_the_drift_figure_draws_the_spread_beside_it(tmp_path):
    """With validation losses in the runs' logs the drift figure gets a second panel (a wider PNG); without,
    one panel (the control: the same drift, no spread)."""
    plan = _plan()
    open_protocol(plan, tmp_path)
    _write(tmp_path, plan)

    def width(png):  # a PNG's IHDR: the width, big-endian, at bytes 16-19
        return int.from_bytes(png.read_bytes()[16:20], "big")
    one, two = tmp_path.parent / "one.png", tmp_path.parent / "two.png"
    draw_figures(progress(plan, tmp_path), None, one)
    _write_val(tmp_path, plan, {"bf16": [0.01, -0.01] * 4, "mxfp8": [0.01, -0.01, 0.0], "mxfp8-head": [0] * 3},
               append=True)
    p = progress(plan, tmp_path)
    assert p.spread is not None
    draw_figures(p, None, two)
    assert width(one) == 8 * 110 and width(two) == 13 * 110
