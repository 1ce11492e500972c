"""python -m convergence compare BASELINE CANDIDATE [--baseline MORE ...] [--margin 0.0025]
[--metric loss|val_loss] [--overlap-only] [--json OUT] [--plot OUT.png] [--force]

Prints a short report whose first line is the verdict, its reason and the difference the runs would
call not_equivalent about half the time; exit 0 equivalent, 1 not_equivalent or diverged, 3 inconclusive, 4 incomplete
(a run does not cover the others' steps; ``--overlap-only`` judges the overlap), 2 bad input or an
output that cannot be written (checked before the work starts; files are written atomically).
The statistics are documented in ``convergence.curves.compare``; the JSON is ``compare_paths``'s dict.
"""

from __future__ import annotations

import json
import math
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from convergence.curves.compare import EXIT_CODES, resolution
from convergence.curves.jsonl import is_number
from numerics.cli import ArgumentParser, CLIError
from numerics.files import atomic_write, check_distinct, check_once, check_writable, read_json_object


def _parser() -> ArgumentParser:
    from convergence.curves.compare import METRICS, CompareOptions
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
    p.add_argument("--confidence", type=float, default=d.confidence, help="family confidence of the two intervals")
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
    lines = [f"verdict: {r['verdict'].upper()}  ({r['reason']}; {resolution(r)})",
             (f"margin +-{r['margin']:.3%}, family confidence {r['confidence']:.0%}, "
              f"{r['baseline_runs']} baseline run(s), alignment {r['alignment']['method']} "
              f"({r['alignment']['points']} points)"),
             f"compared steps {cov['compared_steps'][0]}..{cov['compared_steps'][1]}: " + "; ".join(
                 f"{run['role']} {Path(run['source']).name} {run['compared_points']}/{run['points']} points "
                 f"(steps {run['steps'][0]}..{run['steps'][1]})" for run in cov["runs"])]
    sens = r.get("sensitivity")
    if sens:
        lines.append(f"sensitivity: interval half-width {sens['half_width']:.3%}; a difference of "
                     f"{sens['smallest_detectable_difference']:.3%} is called not_equivalent about half the time")
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
            lines.append(f"{name:<12} steps {part['start_step']}..{part['end_step']}: estimate "
                         f"{_pct(part['estimate'])}, interval {iv_s} ({size}) -> {part['decision']}")
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


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    check_distinct(json=args.json, plot=args.plot, inputs=[args.baseline, args.candidate, *args.more, *args.cand_more])
    for out in (args.json, args.plot):
        if out is not None:
            check_writable(out, force=args.force)  # before the work: exit 2 never follows a verdict
    from convergence.curves.compare import compare_paths

    opts = {k: getattr(args, k) for k in ("confidence", "start_fraction", "final_fraction", "final_rise",
                                          "spike_sigma", "coverage_fraction", "overlap_only", "metric", "format",
                                          "loss_key", "step_key", "tag")
            if getattr(args, k) is not None}
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


if __name__ == "__main__":
    from numerics.cli import run_main

    sys.exit(run_main(main))


# what power takes, said where a file is something else (a user's file, not one of the suite's to restore)
POWER_READS = ("power reads the JSON that `python -m convergence compare ... --metric val_loss --json OUT` writes, "
               "or a protocol folder")


def power_main(argv: Sequence[str] | None = None) -> int:
    """python -m convergence power RESULT [RESULT ...]: replicates and steps for a margin, from measured spreads."""
    from convergence.curves import power
    from numerics.errors import BadInput

    p = ArgumentParser(prog="python -m convergence power", description=power_main.__doc__.split(": ", 1)[1])
    p.add_argument("results", nargs="+", type=Path,
                   help="compare --metric val_loss JSON files, or protocol folders (their results/*_verdict__*.json)")
    p.add_argument("--margin", type=float, default=None,
                   help="relative margin to plan for (default: the one the results were judged at)")
    p.add_argument("--confidence", type=float, default=None,
                   help="family confidence (default: the one the results were judged at)")
    p.add_argument("--larger-set", type=float, default=None, metavar="TIMES",
                   help="plan for a held-out set TIMES as many batches (its error / sqrt(TIMES); --val-batches, "
                        "--val-percent)")
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
    ms, judged = [], {"margin": set(), "confidence": set()}
    for f in files:
        result = read_json_object(f, what="a compare --metric val_loss result", fix=POWER_READS)
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
    analysis = power.analyse(ms, **plan_at)
    print(power.report(analysis))
    if args.json:
        atomic_write(args.json, json.dumps(analysis, indent=1) + "\n", force=args.force)
    return 0
