"""Runs and GPU-hours per design and test (convergence.curves.decision.designs) and ``python -m convergence power``'s
table. The power formula itself is held to simulations in test_equivalence.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from convergence.__main__ import main as convergence_main
from convergence.curves import power
from convergence.curves.decision import designs

GOLDEN = Path(__file__).resolve().parents[3] / "golden" / "training"
K16 = "proxy_long_lr3e-4_k16_{}__h200.json"
K16_RUN_S = 6.6 * 3600 / 64  # the k16 plan: 64 runs of 1,500 steps in 6.6 H200-hours, start-ups and lost pieces in
PROXY_STARTUP_S = 60.0  # a proxy run's start-up on an H200 (convergence.protocol.pieces.STARTUP_S)


def k16_design() -> designs.Design:
    """The proxy's numbers: the final window's spread over the k16 plan's 32 BF16 runs (baselines and held-out) and
    16 MXFP8 runs, each group around its own mean (0.963 %, 46 degrees of freedom), and its held-out set error."""
    r, held = (json.loads((GOLDEN / K16.format(v)).read_text())["final_window"]
               for v in ("verdict", "negative_control"))
    spread, dof = power.pooled_spread([r["replicate_levels"] + held["candidate_levels"], r["candidate_levels"]])
    assert dof == 46
    return designs.independent(spread, r["se_set"], source="measured: k16")


def pilot_fork(ind: designs.Design, **kw) -> designs.Design:
    """The proxy's fork design at the golden fork pilot's within-trunk final-window spread (0.319 %, 8
    continuations of one trunk from step 500)."""
    spread, dof = designs.pilot_spread(json.loads((GOLDEN / "proxy_fork_h100_pilot__h100.json").read_text()))
    assert dof == 7
    return designs.fork(spread, ind.se_set, source="measured: fork pilot", **kw)


@pytest.mark.parametrize("test", designs.TEST_ROWS)
@pytest.mark.parametrize("delta", [0.0, 0.001])
def test_runs_per_arm_is_the_fewest_that_reach_the_power(test, delta):
    for d in (designs.independent(0.0096, 0.0003), designs.fork(0.005, 0.0003)):
        n = designs.runs_per_arm(d, test, delta, 0.0025)
        assert designs.favourable(d, test, delta, 0.0025, n) >= 0.8 > designs.favourable(d, test, delta, 0.0025, n - 1)


def test_runs_per_arm_is_none_where_no_number_of_runs_reaches_the_margin():
    """A held-out set error as large as the margin, or a true difference at the margin, is never resolved (the
    control: the same design with the set's error a tenth of it is)."""
    assert designs.runs_per_arm(designs.independent(0.0096, 0.0025), "equivalence", 0.0, 0.0025) is None
    assert designs.runs_per_arm(designs.independent(0.0096), "non-inferiority", 0.0025, 0.0025) is None
    assert designs.runs_per_arm(designs.independent(0.0096, 0.00025), "equivalence", 0.0, 0.0025) is not None


def test_the_proxy_table_by_design_and_test():
    """docs/protocol.md's table (the proxy at 1,500 steps, margin +-0.25 %, alpha 0.05, 80 % power at no true
    difference):
    independent runs need 299 per arm for equivalence, 206 for non-inferiority and 470 under the two-ranges rule
    (~1.6x TOST's: the 97.5 % intervals); a fork at step 500 at the fork pilot's within-trunk spread (0.319 %) 34,
    24 and 54, in 5, 3 and 7 trunks of 8 pairs. GPU-hours at the k16 plan's measured 371 s a run and a 60 s
    start-up paid again by each trunk and continuation: 61.7 and 5.3 for equivalence. Without a pilot, the fork's
    spread is assumed (0.55x the independent one, 0.527 %) and said so: 91, 63 and 143 runs per arm."""
    ind = k16_design()
    fk = pilot_fork(ind)
    rows = designs.table([ind, fk], 0.0025, run_s=K16_RUN_S, startup_s=PROXY_STARTUP_S)
    got = {(r["design"], r["test"]): (r["runs_per_arm"], r["trunks"], round(r["gpu_hours"], 1)) for r in rows}
    assert got == {("independent", "equivalence"): (299, None, 61.7),
                   ("independent", "non-inferiority"): (206, None, 42.5),
                   ("independent", "two-ranges"): (470, None, 96.9), ("fork", "equivalence"): (34, 5, 5.3),
                   ("fork", "non-inferiority"): (24, 3, 3.7), ("fork", "two-ranges"): (54, 7, 8.3)}
    for r in rows:  # the type-I point: a candidate a margin worse is favourable at most alpha (two-ranges: 1.25 %)
        assert r["favourable_at_margin"] <= (0.0125 if r["test"] == "two-ranges" else 0.05) + 1e-4
    text = designs.report_table(rows, 0.0025, 0.8, 0.05)
    assert "| fork | equivalence | +0.000% | favourable | 34 | 5 | 73 | 5.3 | 4.9% |" in text
    assumed = designs.fork(None, ind.se_set, independent_spread=ind.spread)
    assert assumed.spread == pytest.approx(math.sqrt(0.3) * ind.spread) and assumed.source.startswith("assumed")
    assert [designs.runs_per_arm(assumed, t, 0.0, 0.0025) for t in designs.TEST_ROWS] == [91, 63, 143]


def test_the_readme_power_table_is_the_one_the_golden_curves_give():
    """README.md's table of runs per arm and H200-hours, row by row, is ``designs.table`` at the spread the golden
    k16 verdicts measure (0.963 %), so the README cannot drift from the code or the curves: the independent rows
    measured, the fork rows at the golden fork pilot's within-trunk spread, their trunks priced at the
    projection's deterministic pace. The control: a row with
    another number is told apart."""
    import re

    from convergence.protocol.projection import COSTS

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    ind = k16_design()
    fk = pilot_fork(ind, fork_fraction=500 / 1500)
    rows = designs.table([ind, fk], 0.0025, run_s=K16_RUN_S, startup_s=PROXY_STARTUP_S,
                         deterministic_pace=COSTS["proxy"]["deterministic_pace"])  # the trunks' steps
    want = {(r["design"], r["test"]): (r["runs_per_arm"], f"{r['gpu_hours']:.1f}") for r in rows}
    row = re.compile(r"^\| (independent runs|fork at step 500) \| (equivalence|non-inferiority|two-ranges)\b[^|]*"
                     r"\| (\d+) \| ([\d.]+) \| ([^|]*)\|$", re.M)

    def found(text: str) -> dict:
        return {("independent" if d.startswith("independent") else "fork", t): (int(n), h)
                for d, t, n, h, _ in row.findall(text)}

    got = found(readme)
    assert len(got) == 5 and all(got[key] == want[key] for key in got), (got, want)
    assert all(src.startswith("measured") for _, _, _, _, src in row.findall(readme))
    for d in (ind, fk):  # the spreads the table names
        assert f"{d.spread:.3%}".replace("%", " %") in readme
    assert found(readme.replace("| 206 | 42.5 |", "| 205 | 42.5 |"))[("independent", "non-inferiority")] != want[
        ("independent", "non-inferiority")]


def test_a_fork_costs_its_trunks_once_and_its_continuations_from_the_fork_step():
    """By hand: 20 pairs, 8 per trunk -> 3 trunks of a third of a BF16 run, and 20 BF16 and 20 candidate runs of
    two thirds each; each part pays the start-up again. Independent runs cost whole runs."""
    fk = designs.fork(0.005, pairs_per_trunk=8, fork_fraction=1 / 3)
    want = 3 * (60 + (300 - 60) / 3) + 20 * ((60 + 2 * (300 - 60) / 3) + (60 + 2 * (450 - 60) / 3))
    assert fk.trunks(20) == 3 and fk.cost_s(20, 300, 450, 60) == pytest.approx(want)
    assert designs.independent(0.01).cost_s(20, 300, 450, 60) == 20 * 750
    assert fk.dof(20) == 2 * 20 - 2 * 3 and designs.fork(0.005, pairs_per_trunk=1).dof(20) == 19


def test_a_forks_deterministic_trunks_cost_their_steps_at_the_deterministic_pace():
    """A trunk trains --deterministic: its steps (not its start-up) cost ``pace`` times an ordinary step's; the
    continuations and independent runs are unchanged. By hand at pace 1.5."""
    fk = designs.fork(0.005, pairs_per_trunk=8, fork_fraction=1 / 3)
    trunk_extra = 3 * 0.5 * (300 - 60) / 3
    assert fk.cost_s(20, 300, 450, 60, 1.5) == pytest.approx(fk.cost_s(20, 300, 450, 60) + trunk_extra)
    assert designs.independent(0.01).cost_s(20, 300, 450, 60, 1.5) == 20 * 750
    assert designs.part_cost_s(300, 1, 60) == 300 and designs.part_cost_s(300, 1, 60, 2.0) == 60 + 2 * 240


def test_pace_costs_are_each_finished_runs_pieces_since_its_last_start(tmp_path):
    """A run stopped and continued counts both pieces; a run that restarted at step 0 counts from the restart; two
    runs sharing a GPU count half their wall seconds each; an unfinished run does not count."""
    rows = [{"run": "bf16", "recipe": "bf16", "per_gpu": 1, "from_step": 0, "to_step": 600, "wall_s": 120},
            {"run": "bf16", "recipe": "bf16", "per_gpu": 1, "from_step": 600, "to_step": 1500, "wall_s": 180},
            {"run": "b1", "recipe": "bf16", "per_gpu": 1, "from_step": 0, "to_step": 700, "wall_s": 999},
            {"run": "b1", "recipe": "bf16", "per_gpu": 1, "from_step": 0, "to_step": 1500, "wall_s": 260},
            {"run": "m", "recipe": "mxfp8", "per_gpu": 2, "from_step": 0, "to_step": 1500, "wall_s": 800},
            {"run": "m2", "recipe": "mxfp8", "per_gpu": 1, "from_step": 0, "to_step": 900, "wall_s": 300}]
    (tmp_path / "pace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert designs.pace_costs(tmp_path) == {"bf16": pytest.approx((300 + 260) / 2), "mxfp8": pytest.approx(400)}
    assert convergence_main(["power", "--spread", "0.0096", "--pace", str(tmp_path)]) == 0


def test_power_prints_the_table_from_a_result_or_a_spread(tmp_path, capsys):
    """From the k16 verdict: the two-ranges analysis as before, then the table at the result's final-window spread
    (BF16 and MXFP8 runs pooled); from --spread alone, the table; --fork-spread replaces the assumption."""
    out = tmp_path / "p.json"
    assert convergence_main(["power", str(GOLDEN / K16.format("verdict")), "--run-s", "371", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("margin +-0.250%, family confidence 95%") and "| independent | equivalence |" in text
    rows = json.loads(out.read_text())["designs"]
    assert rows[0]["spread_source"].startswith("measured: ") and rows[0]["gpu_hours"] > 0
    assert convergence_main(["power", "--spread", "0.0096", "--fork-spread", "0.004", "--fork-step", "500",
                             "--steps", "1500"]) == 0
    text = capsys.readouterr().out
    assert "fork: spread 0.400%" in text and "given (a fork pilot's)" in text and "step 500 of 1500" in text


@pytest.mark.parametrize(("argv", "words"), [
    ([], "give RESULT files or folders, or --spread"),
    (["--spread", "0.01", "--fork-step", "1500", "--steps", "1500"], "--fork-step must be inside the run"),
    (["--spread", "0.01", "--alpha", "0.5"], "--alpha must be in (0, 0.5)"),
    (["--spread", "0.01", "--pairs-per-trunk", "0"], "--pairs-per-trunk must be >= 1"),
    (["--spread", "-0.01"], "--spread must be in (0, inf)"),
    (["--spread", "0.01", "--pace", "{missing}"], "no such file"),
])
def test_power_refuses_bad_numbers_in_one_line(tmp_path, capsys, argv, words):
    argv = [a.replace("{missing}", str(tmp_path / "nowhere")) for a in argv]
    assert convergence_main(["power", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err


def test_power_takes_the_fork_spread_and_step_from_a_pilots_result(tmp_path, capsys):
    """--fork-pilot: the pilot's within-trunk final-window spread in the fork row, its fork step and steps; a file
    that is not a pilot's is refused in one line (the control: the k16 verdict)."""
    pilot = {"kind": "fork pilot", "fork_step": 500, "steps": 1500, "fork_spread": 0.004,
             "final_window": {"spread": 0.004, "dof": 7}, "continuations": [{}] * 8}
    path = tmp_path / "pilot.json"
    path.write_text(json.dumps(pilot))
    out = tmp_path / "rows.json"
    assert convergence_main(["power", "--spread", "0.0096", "--fork-pilot", str(path), "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["designs"]
    fork = [r for r in rows if r["design"] == "fork"]
    assert all(r["spread"] == 0.004 and "measured: the fork pilot" in r["spread_source"] for r in fork)
    assert {r["true_difference"] for r in rows} == {0.0, 0.005}  # and twice the margin: a worse one detected
    assert "step 500 of 1500" in capsys.readouterr().out
    assert convergence_main(["power", "--spread", "0.0096", "--fork-pilot", str(GOLDEN / K16.format("verdict"))]) == 2
    assert "not a fork pilot's result" in capsys.readouterr().err


def test_runs_per_arm_detects_a_worse_candidate_beyond_the_margin():
    """Beyond the margin the right verdict is the unfavourable one: the runs for 80 % power to call a candidate
    twice the margin worse not_equivalent (inferior); at the margin itself no verdict is right and none suffice."""
    d = designs.independent(0.0096, 0.0003)
    n = designs.runs_per_arm(d, "equivalence", 0.005, 0.0025)
    chance = designs.verdict_chance(d, "equivalence", 0.005, 0.0025, n, aim="unfavourable")
    assert chance >= 0.8 > designs.verdict_chance(d, "equivalence", 0.005, 0.0025, n - 1, aim="unfavourable")
    assert designs.runs_per_arm(d, "non-inferiority", 0.0025, 0.0025) is None
