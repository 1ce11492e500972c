"""python -m convergence compare BASELINE CANDIDATE [--baseline MORE ...] [--margin 0.0025]
[--metric loss|val_loss] [--test equivalence|non-inferiority|two-ranges] [--alpha A] [--endpoint final|whole]
[--overlap-only] [--json OUT] [--plot OUT.png] [--force]

Prints a short report whose first line is the verdict, its reason and what the runs resolve; exit 0 equivalent
or non_inferior, 1 not_equivalent, inferior or diverged, 3 inconclusive, 4 incomplete (a run does not cover the
others' steps; ``--overlap-only`` judges the overlap), 2 bad input or an output that cannot be written (checked
before the work starts; files are written atomically).

The rule: ``--metric val_loss`` declares ``--test equivalence`` (TOST at ``--alpha`` 0.05: the 90 % interval
inside +-margin) on ``--endpoint final`` (the final window) unless told otherwise; ``--test two-ranges`` is the
rule before a test was declared (both ranges' Bonferroni intervals, ``--confidence``), and the training loss's
only rule. The statistics are documented in ``convergence.curves.compare``; the JSON is ``compare_paths``'s dict.
"""

from __future__ import annotations

import json
import math
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from convergence.curves.compare import EXIT_CODES, resolution
from convergence.curves.decision.equivalence import LEGACY, PART_OF, describe
from convergence.curves.decision.verdict import RANGE_NAMES, rule_of
from convergence.curves.jsonl import is_number
from numerics.cli import ArgumentParser, CLIError
from numerics.files import atomic_write, check_distinct, check_once, check_writable, read_json_object


def _parser() -> ArgumentParser:
    from convergence.curves.compare import METRICS, CompareOptions
    from convergence.curves.decision.equivalence import ENDPOINTS, TESTS
    from convergence.curves.load import FORMATS

    d = CompareOptions()
    p = ArgumentParser(prog="python -m convergence compare", description=__doc__.splitlines()[0])
    p.add_argument("baseline", help="baseline run: JSONL, CSV, torchtitan log, or TensorBoard event dir/file")
    p.add_argument("candidate", help="candidate run (e.g. the MXFP8 one), same formats")
    p.add_argument("--baseline", dest="more", action="append", default=[], metavar="MORE",
                   help="another baseline seed (repeatable); their spread sets 'training randomness'")
    p.add_argument("--candidate-replicate", dest="cand_more", action="append", default=[], metavar="MORE",
                   help="another run of the candidate recipe, perturbed as the baselines are (repeatable; "
                   "--metric val_loss): the estimate is the mean of the candidate runs")
    p.add_argument("--margin", type=float, default=d.margin,
                   help=f"relative equivalence margin (default {d.margin}: DeepSeek-V3's 0.25%%)")
    p.add_argument("--test", choices=TESTS, default=None,
                   help="equivalence (TOST) or non-inferiority on one endpoint (--metric val_loss; its default: "
                   f"equivalence), or {LEGACY} (both ranges inside the margin: the rule before, the training "
                   "loss's default and only rule)")
    p.add_argument("--alpha", type=float, default=None,
                   help=f"level of each one-sided test of --test equivalence / non-inferiority (default {d.alpha})")
    p.add_argument("--endpoint", choices=ENDPOINTS, default=None,
                   help="what a declared test decides on: final (the final window, default) or whole (the compared "
                   "range); the other is reported, never deciding")
    p.add_argument("--confidence", type=float, default=None,
                   help=f"--test {LEGACY}: family confidence of the two intervals (default {d.confidence})")
    p.add_argument("--start-fraction", type=float, default=d.start_fraction, help="warm-up fraction not compared")
    p.add_argument("--final-fraction", type=float, default=d.final_fraction, help="final window, as a fraction")
    p.add_argument("--final-rise", type=float, default=d.final_rise,
                   help="diverged if final smoothed loss exceeds its own minimum by this (relative)")
    p.add_argument("--spike-sigma", type=float, default=d.spike_sigma, help="spike threshold in robust sigmas")
    p.add_argument("--coverage-fraction", type=float, default=d.coverage_fraction,
                   help="a run must be compared to within this fraction of the longest span at each end")
    p.add_argument("--metric", choices=METRICS, default=d.metric,
                   help="loss: training loss (step noise, baseline seeds); val_loss: held-out validation loss of a "
                   "paired candidate against baseline replicates (docs/protocol.md)")
    p.add_argument("--overlap-only", action="store_true",
                   help="judge the steps all runs share even when a run stops early or starts late")
    p.add_argument("--format", choices=FORMATS, help="skip content detection")
    p.add_argument("--loss-key", help="JSONL key / CSV column of the loss (default: loss, with fallbacks)")
    p.add_argument("--step-key", help="JSONL key / CSV column of the step (default: step, with fallbacks)")
    p.add_argument("--tag", help="TensorBoard tag (default: loss_metrics/global_avg_loss, with fallbacks)")
    p.add_argument("--json", type=Path, metavar="OUT", help="write the full result as JSON")
    p.add_argument("--plot", type=Path, metavar="OUT.png", help="draw curves, relative difference and verdict")
    p.add_argument("--force", action="store_true", help="overwrite existing --json / --plot files")
    return p


def _pct(x) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.3%}"


def report(r: dict) -> str:
    """The short human report printed by the CLI."""
    cov = r["coverage"]
    legacy = rule_of(r) == LEGACY
    rule = (f"family confidence {r['confidence']:.0%}" if legacy else
            f"test {describe(r['test'], r['alpha'])}, on the {RANGE_NAMES[PART_OF[r['endpoint']]]}")
    lines = [f"verdict: {r['verdict'].upper()}  ({r['reason']}; {resolution(r)})",
             (f"margin +-{r['margin']:.3%}, {rule}, "
              f"{r['baseline_runs']} baseline run(s), alignment {r['alignment']['method']} "
              f"({r['alignment']['points']} points)"),
             f"compared steps {cov['compared_steps'][0]}..{cov['compared_steps'][1]}: " + "; ".join(
                 f"{run['role']} {Path(run['source']).name} {run['compared_points']}/{run['points']} points "
                 f"(steps {run['steps'][0]}..{run['steps'][1]})" for run in cov["runs"])]
    sens = r.get("sensitivity")
    if sens:
        lines.append(f"sensitivity: interval half-width {sens['half_width']:.3%}; a difference of "
                     f"{sens['smallest_detectable_difference']:.3%} is called "
                     f"{'inferior' if rule_of(r) == 'non-inferiority' else 'not_equivalent'} about half the time")
    val = r.get("metric") == "val_loss"
    for name in ("overall", "final_window"):
        part = r.get(name)
        if part:
            iv = part["interval"]
            iv_s = f"[{_pct(iv[0])}, {_pct(iv[1])}]" if iv else "n/a"
            cands = part.get("candidate_runs") or 1
            size = (f"{part['points']} evaluations; replicate spread {_pct(part.get('seed_spread'))}"
                    + (f", {cands} candidate runs, their spread {_pct(part.get('candidate_spread'))}" if cands > 1
                       else "") + f", held-out set s.e. {_pct(part.get('se_set'))}"
                    + (f" over {part['heldout_batches']} batches" if part.get("heldout_batches") else "") if val else
                    f"{part['windows']} windows of {part['window_points']} points")
            role = "" if legacy else " (the endpoint: decides)" if PART_OF[r["endpoint"]] == name else \
                " (secondary: reported, never decides)"
            tests = "" if legacy or "p_test" not in part else \
                f"; p = {part['p_no_difference']:.3g} against no difference, test p = {part['p_test']:.3g}"
            lines.append(f"{name:<12} steps {part['start_step']}..{part['end_step']}: estimate "
                         f"{_pct(part['estimate'])}, interval {iv_s} ({size}{tests}) -> {part['decision']}{role}")
    n = r.get("noise")
    if n and val:
        lines.append(f"noise ({n['model']}): {n['note']}")
    elif n:
        lines.append(f"noise ({n['model']}): step noise {n['step_noise']:.3%}, lag-1 autocorrelation "
                     f"{n['autocorr_lag1']:.2f}, correlation time {n['correlation_time']:.1f} points; {n['note']}")
    if r.get("divergence_judged_on", "training loss") != "training loss":
        lines.append(f"divergence judged on the {r['divergence_judged_on']}")
    if r["divergence"]:
        d = r["divergence"]
        lines.append(f"divergence: step {d['step']} ({d['kind']}): "
                     + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                 for k, v in d.items() if k not in ("step", "kind")))
    for src in (*r["inputs"]["baselines"], r["inputs"]["candidate"], *r["inputs"].get("candidate_replicates", [])):
        for rs in src["restarts"]:
            lines.append(f"restart in {src['source']}: step {rs['from_step']} -> {rs['to_step']}, "
                         f"{rs['dropped']} earlier point(s) replaced by the later run")
        for w in src["warnings"]:
            lines.append(f"warning: {w}")
    return "\n".join(lines)


def declared_test(args) -> str:
    """The rule a command line asks for: ``--test``, else equivalence on validation loss and the two-ranges rule on
    the training loss; the knobs of the other rule are refused (they would be ignored in silence)."""
    test = args.test or ("equivalence" if args.metric == "val_loss" else LEGACY)
    other = ["--confidence"] if test != LEGACY else ["--alpha", "--endpoint"]
    given = [flag for flag in other if getattr(args, flag[2:]) is not None]
    if given:
        raise CLIError(f"{' and '.join(given)} {'go' if len(given) > 1 else 'goes'} with "
                       + (f"--test {LEGACY}" if test != LEGACY else "--test equivalence or non-inferiority")
                       + f", and the test here is {test}")
    return test


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    check_distinct(json=args.json, plot=args.plot, inputs=[args.baseline, args.candidate, *args.more, *args.cand_more])
    for out in (args.json, args.plot):
        if out is not None:
            check_writable(out, force=args.force)  # before the work: exit 2 never follows a verdict
    from convergence.curves.compare import compare_paths

    opts = {k: getattr(args, k) for k in ("confidence", "alpha", "endpoint", "start_fraction", "final_fraction",
                                          "final_rise", "spike_sigma", "coverage_fraction", "overlap_only", "metric",
                                          "format", "loss_key", "step_key", "tag")
            if getattr(args, k) is not None}
    opts["test"] = declared_test(args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NaN arithmetic in a diverged run is reported, not warned
        result = compare_paths([args.baseline, *args.more], args.candidate, margin=args.margin,
                               candidate_replicates=args.cand_more, **opts)
    print(report(result))
    if args.json:
        atomic_write(args.json, json.dumps(result, indent=1, allow_nan=True) + "\n", force=args.force)
        print(f"wrote {args.json}")
    if args.plot:
        from convergence.curves.plots import plot_comparison

        print(f"wrote {plot_comparison(result, args.plot, force=args.force)}")
    return EXIT_CODES[result["verdict"]]



def _positive(name: str, value: float | None, *, upper: float = float("inf")) -> None:
    if value is not None and not 0 < value < upper:
        raise CLIError(f"--{name} must be in (0, {upper:g}), got {value:g}")


# what power takes, said where a file is something else (a user's file, not one of the suite's to restore)
POWER_READS = ("power reads the JSON that `python -m convergence compare ... --metric val_loss --json OUT` writes, "
               "or a protocol folder")


def power_main(argv: Sequence[str] | None = None) -> int:
    """python -m convergence power [RESULT ...] [--spread S] [--fork-spread S] [--run-s S | --pace FOLDER] ...:
    runs and GPU-hours a declared test needs, per design, from measured spreads. Two answers:

    * the runs a declared test needs (``convergence.curves.decision.designs``): per design (independent runs;
      forks from BF16 trunks), test (equivalence, non-inferiority, and the two-ranges rule before them) and true
      difference, the runs per arm for ``--power`` (80 %), total runs and, with a cost per run (``--run-s``, or
      a protocol folder's ``--pace``), GPU-hours. The spread is a result's final window (its BF16 and candidate
      runs pooled) or ``--spread``; the fork's within-trunk spread is a fork pilot's result (``--fork-pilot``) or
      ``--fork-spread``, else an assumption the table names; by default at no true difference and at twice the
      margin (a worse candidate detected: the planted positive control's shift);
    * given RESULTs (``compare --metric val_loss`` JSON files or protocol folders), also the two-ranges rule's
      replicates and run lengths for a margin (``convergence.curves.power``), as before.

    Exit 0, or 2 for bad input.
    """
    from convergence.curves import power
    from convergence.curves.decision import designs
    from numerics.errors import BadInput

    p = ArgumentParser(prog="python -m convergence power", description="runs and GPU-hours a declared test needs, "
                       "per design, from measured spreads")
    p.add_argument("results", nargs="*", type=Path,
                   help="compare --metric val_loss JSON files, or protocol folders (their results/*_verdict__*.json)")
    p.add_argument("--margin", type=float, default=None,
                   help="relative margin to plan for (default: the one the results were judged at)")
    p.add_argument("--confidence", type=float, default=None,
                   help="family confidence (default: the one the results were judged at)")
    p.add_argument("--larger-set", type=float, default=None, metavar="TIMES",
                   help="plan for a held-out set TIMES as many batches (its error / sqrt(TIMES); --val-batches, "
                        "--val-percent)")
    p.add_argument("--spread", type=float, default=None,
                   help="run-to-run spread of the endpoint's level (relative; default: the results' final window, "
                   "BF16 and candidate runs pooled)")
    p.add_argument("--se-set", type=float, default=None, help="the held-out set's standard error (default: the "
                   "results', else 0)")
    p.add_argument("--fork-spread", type=float, default=None,
                   help="within-trunk spread of a fork's continuations (a fork pilot's; default: assumed from "
                   f"--spread, sqrt(1 - {designs.EXPLAINED_AT_FORK:.2f}) x it, and said so)")
    p.add_argument("--fork-pilot", type=Path, default=None, metavar="PILOT",
                   help="a fork pilot's result (OUT/results/*_pilot__*.json of protocol --design fork --pilot N): its "
                   "within-trunk final-window spread in the fork row, and its fork step")
    p.add_argument("--pairs-per-trunk", type=int, default=8, help="fork: BF16 / candidate pairs per trunk")
    p.add_argument("--fork-step", type=int, default=None, help="fork: the trunk's step (default: a third of --steps)")
    p.add_argument("--steps", type=int, default=None, help="a run's steps (default: the results')")
    p.add_argument("--alpha", type=float, default=0.05, help="each one-sided test's level")
    p.add_argument("--power", type=float, default=0.8, help="the chance of the favourable verdict to plan for")
    p.add_argument("--true-difference", type=float, action="append", default=None,
                   help="relative true difference to plan at (repeatable; default 0 and twice the margin)")
    p.add_argument("--run-s", type=float, default=None,
                   help="GPU-seconds of one whole BF16 run, start-up included (default: --pace's)")
    p.add_argument("--candidate-run-s", type=float, default=None,
                   help="GPU-seconds of one whole candidate run (default: --run-s, or --pace's)")
    p.add_argument("--candidate", default="mxfp8", help="the candidate recipe, for --pace (default mxfp8)")
    p.add_argument("--startup-s", type=float, default=0.0,
                   help="seconds of a run's start-up, paid again by each trunk and fork (proxy on an H200: ~60)")
    p.add_argument("--pace", type=Path, default=None,
                   help="a protocol folder (or its pace.jsonl): the mean GPU-seconds of its finished runs per recipe")
    p.add_argument("--deterministic-pace", type=float, default=None, metavar="TIMES",
                   help="a deterministic step's time over an ordinary one's, for the fork's trunks (default: the "
                   "--fork-pilot's measured one, else 1)")
    p.add_argument("--json", type=Path, metavar="OUT", help="write the analysis as JSON")
    p.add_argument("--force", action="store_true", help="overwrite an existing --json file")
    args = p.parse_args(argv)
    if (args.margin is not None and not 0 < args.margin < 1) or (args.confidence is not None
                                                                 and not 0.5 < args.confidence < 1):
        raise CLIError("--margin must be in (0, 1) and --confidence in (0.5, 1)")
    # a thousandth to a million times the set: the set's error divides by up to 1,000 or grows up to 32x; beyond,
    # no split holds it and the planning arithmetic overflows (inf raised OverflowError, 1e-320 too)
    if args.larger_set is not None and not 1e-3 <= args.larger_set <= 1e6:
        raise CLIError(f"--larger-set must be from 0.001 to 1e6 (times the held-out set's batches), got "
                       f"{args.larger_set:g}")
    for name in ("spread", "fork_spread", "run_s", "candidate_run_s", "deterministic_pace"):
        _positive(name.replace("_", "-"), getattr(args, name))
    _positive("alpha", args.alpha, upper=0.5)
    _positive("power", args.power, upper=1.0)
    if args.se_set is not None and not 0 <= args.se_set < 1 or not 0 <= args.startup_s < 1e7:
        raise CLIError("--se-set must be in [0, 1) and --startup-s a number of seconds >= 0")
    if args.pairs_per_trunk < 1:
        raise CLIError(f"--pairs-per-trunk must be >= 1, got {args.pairs_per_trunk}")
    if args.fork_pilot is not None and args.fork_spread is not None:
        raise CLIError("--fork-pilot gives the fork's spread: leave out --fork-spread")
    if not args.results and args.spread is None:
        raise CLIError("give RESULT files or folders, or --spread (the run-to-run spread to plan with)")
    if args.json:
        check_writable(args.json, force=args.force)
    files = []
    for path in args.results:
        found = sorted(f for f in path.glob("results/*_verdict__*.json") if not f.name.endswith(".meta.json")) \
            if path.is_dir() else [path]
        if not found:
            hint = (f"a protocol still running: `python -m convergence protocol --status --out {path}` plans from "
                    "its finished runs" if (path / "protocol.json").is_file() else "is the protocol complete?")
            raise CLIError(f"{path}: a folder without results/*_verdict__*.json ({hint})")
        files += found
    check_once(files, counts="each measurement counts once in the spread's fit")
    ms, results, judged = [], [], {"margin": set(), "confidence": set()}
    for f in files:
        result = read_json_object(f, what="a compare --metric val_loss result", fix=POWER_READS)
        results.append(result)
        for key, seen in judged.items():
            if is_number(result.get(key)):
                seen.add(result[key])
        try:  # measured names the file in its messages
            ms.append(power.measured(result, source=str(f)))
        except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
            raise BadInput(str(exc) if isinstance(exc, ValueError) and str(f) in str(exc) else
                           f"{f}: not a compare --metric val_loss result ({type(exc).__name__}: {exc})") from None
    if args.larger_set is not None:
        try:
            ms = [power.with_larger_set(m, args.larger_set) for m in ms]
        except ValueError as exc:
            raise BadInput(str(exc)) from None
    plan_at = {}  # the margin and confidence the results were judged at, unless told (not a fixed 0.25 %, 95 %)
    for key, default in (("margin", 0.0025), ("confidence", 0.95)):
        given, seen = getattr(args, key), judged[key]
        if given is None and len(seen) > 1:
            raise BadInput(f"the results were judged at different {key}s ({', '.join(f'{v:g}' for v in sorted(seen))})"
                           f": pass --{key}")
        plan_at[key] = given if given is not None else next(iter(seen), default)
        low = 0.0 if key == "margin" else 0.5
        if not low < plan_at[key] < 1:  # a damaged result's; a given one was checked above
            raise BadInput(f"the results were judged at {key} {plan_at[key]:g}, not in ({low:g}, 1): pass --{key}")
    analysis = {}
    if ms:
        analysis = power.analyse(ms, **plan_at)
        print(power.report(analysis) + "\n")
    analysis["designs"] = design_table(args, plan_at, ms, results)
    if args.json:
        atomic_write(args.json, json.dumps(analysis, indent=1) + "\n", force=args.force)
    return 0


def design_table(args, plan_at: dict, ms: list, results: list[dict]) -> list[dict]:
    """Print and return ``designs.table``'s rows for the command line's numbers (or the longest result's)."""
    from convergence.curves.decision import designs
    from numerics.errors import BadInput

    spread, se_set, steps, source = args.spread, args.se_set, args.steps, "given"
    fork_source, fork_at, pace = "given (a fork pilot's)", args.fork_step, args.deterministic_pace
    if args.fork_pilot is not None:
        pilot = read_json_object(args.fork_pilot, what="a fork pilot's result", fix="python -m convergence protocol "
                                 "--design fork --pilot N writes it in OUT/results/*_pilot__*.json")
        args.fork_spread, dof = designs.pilot_spread(pilot, str(args.fork_pilot))
        fork_source = (f"measured: the fork pilot {args.fork_pilot}, {len(pilot.get('continuations') or [])} "
                       f"continuations, {dof} degrees of freedom")
        if fork_at is None:
            fork_at, steps = pilot["fork_step"], steps or pilot["steps"]
        if pace is None and is_number(pilot.get("deterministic_pace")) and pilot["deterministic_pace"] > 0:
            pace = float(pilot["deterministic_pace"])
    pace = 1.0 if pace is None else pace
    if ms:
        # the longest runs; among a protocol's results, its verdict's (BF16 and the candidate, not a control)
        i = max(range(len(ms)), key=lambda j: (ms[j].steps, (results[j].get("protocol") or {}).get("verdict")
                                               == "verdict"))
        steps = steps or ms[i].steps
        if spread is None:
            spread, dof, _ = designs.endpoint_spread(results[i])
            source = f"measured: {ms[i].source}, final window, {dof} degrees of freedom"
        se_set = ms[i].se_set if se_set is None else se_set  # after --larger-set
    se_set = se_set or 0.0
    fork_step = fork_at
    if fork_step is not None and (steps is None or not 0 < fork_step < steps):
        raise CLIError(f"--fork-step must be inside the run (0, {steps}): pass --steps" if steps is None else
                       f"--fork-step must be inside the run (0, {steps}), got {fork_step}")
    fraction = 1 / 3 if fork_step is None else fork_step / steps
    run_s, cand_s = args.run_s, args.candidate_run_s
    if args.pace is not None:
        costs = designs.pace_costs(args.pace)
        if run_s is None and "bf16" not in costs or cand_s is None and run_s is None and args.candidate not in costs:
            raise BadInput(f"{args.pace}: no finished bf16 and {args.candidate} runs to take their cost from "
                           f"(it has {', '.join(sorted(costs)) or 'none'}): pass --run-s")
        run_s = costs["bf16"] if run_s is None else run_s
        cand_s = costs.get(args.candidate, run_s) if cand_s is None else cand_s
    ind = designs.independent(spread, se_set, source=source)
    fk = designs.fork(args.fork_spread, se_set, pairs_per_trunk=args.pairs_per_trunk, fork_fraction=fraction,
                      independent_spread=spread, source=fork_source)
    rows = designs.table([ind, fk], plan_at["margin"],
                         deltas=tuple(args.true_difference or (0.0, 2 * plan_at["margin"])),
                         alpha=args.alpha, power=args.power, confidence=plan_at["confidence"], run_s=run_s,
                         candidate_run_s=cand_s, startup_s=args.startup_s, deterministic_pace=pace)
    where = "the fork at " + (f"step {fork_step} of {steps}" if fork_step else "a third of the run")
    cost = ("" if run_s is None else f"; a whole run {run_s:.0f} GPU-s (BF16), {cand_s or run_s:.0f} (candidate), "
            f"start-up {args.startup_s:.0f} s, a trunk's deterministic step {pace:.2f}x an ordinary one")
    print(designs.report_table(rows, plan_at["margin"], args.power, args.alpha) + f"\n({where}{cost})")
    return rows


if __name__ == "__main__":
    from numerics.cli import run_main

    sys.exit(run_main(main))
