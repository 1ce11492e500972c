"""python -m convergence calibrate [--pairs N] [--seed S] | --bench [--steps N] [--dir DIR]

Calibration: runs the comparator (``convergence.curves.compare.compare_curves``) on many synthetic pairs
with a known truth (``convergence.curves.synthetic``) and prints, per scenario, how often each verdict
came out and the error rate that matters for that truth:
  truth equivalent (|drift| <= margin/2)   false alarm  = not_equivalent + diverged
  truth on the margin (drift = margin)     false equiv. = equivalent
  truth not equivalent (drift >= 2 margin) miss         = anything but not_equivalent
  truth diverged (NaN / jump injected)     miss         = anything but diverged
The table is the one in docs/curves.md (Measured error rates).

Benchmark (``--bench``): writes two N-step runs (default 1,000,000) as harness-style JSONL and as
TensorBoard event files into ``--dir`` (a new or empty directory; default: a fresh temporary one),
then times loading and comparing them, and a plain ``json.loads`` loop over one of the JSONL files as
the machine's yardstick; prints seconds and the ratios to that loop, all measured in this one run.
Budgets: two 1M-step JSONL runs loaded and compared in 5 s, one 1M-step TensorBoard file
loaded in 10 s, on the 2-core CI machine. Not a test: no assertion.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from numerics.cli import ArgumentParser, CLIError, seed_arg

MARGIN = 0.0025


@dataclass(frozen=True)
class Scenario:
    name: str
    truth: str  # "equivalent" | "margin" | "not_equivalent" | "diverged"
    spec: dict  # SyntheticSpec overrides
    run: dict  # make_runs keyword arguments


def scenarios() -> list[Scenario]:
    m = MARGIN
    noisy = {"steps": 5_000, "noise": 0.02, "phi": 0.9}
    return [
        Scenario("identical, 20k steps, 1% noise, phi .7", "equivalent", {}, {}),
        Scenario("identical, 5k steps, 2% noise, phi .9", "equivalent", noisy, {}),
        Scenario("identical, log every 10 steps", "equivalent", {"log_every": 10}, {}),
        Scenario("identical, 3 baselines, seed spread .05%", "equivalent", {"seed_spread": 0.0005},
                 {"n_baselines": 3}),
        Scenario("offset +0.5 margin", "equivalent", {}, {"drift": 0.5 * m}),
        Scenario("offset +1 margin (boundary)", "margin", {}, {"drift": m}),
        Scenario("offset +2 margin", "not_equivalent", {}, {"drift": 2 * m}),
        Scenario("offset +4 margin", "not_equivalent", {}, {"drift": 4 * m}),
        Scenario("offset -4 margin, noisy 5k", "not_equivalent", noisy, {"drift": -4 * m}),
        Scenario("ramp 0 -> +4 margin", "not_equivalent", {}, {"drift": 4 * m, "drift_shape": "ramp"}),
        Scenario("NaN at 60%", "diverged", {}, {"nan_at": 0.6}),
        Scenario("+30% jump at 70%, no recovery", "diverged", {}, {"spike_at": 0.7, "spike_height": 0.3}),
    ]


def _error(truth: str, counts: Counter, n: int) -> tuple[str, float]:
    if truth == "equivalent":
        return "false alarm", (counts["not_equivalent"] + counts["diverged"]) / n
    if truth == "margin":
        return "false equiv.", counts["equivalent"] / n
    if truth == "not_equivalent":
        return "miss", 1 - counts["not_equivalent"] / n
    return "miss", 1 - counts["diverged"] / n


def calibrate(pairs: int, seed: int, *, out=None) -> list[dict]:
    from convergence.curves.compare import CompareOptions, compare_curves
    from convergence.curves.synthetic import SyntheticSpec, make_runs

    out = out or sys.stdout  # looked up at call time: a default bound at import outlives a replaced stdout
    opts = CompareOptions(margin=MARGIN)
    rows = []
    print(f"{pairs} pairs per scenario, margin {MARGIN:.2%}, family confidence {opts.confidence:.0%}", file=out)
    header = "| scenario | truth | equivalent | inconclusive | not_equivalent | diverged | error rate |"
    print(header + "\n|---|---|---|---|---|---|---|", file=out)
    for k, sc in enumerate(scenarios()):
        spec = SyntheticSpec(**sc.spec)
        counts: Counter = Counter()
        for i in range(pairs):
            bases, cand = make_runs(spec, seed + 100_000 * k + i, **sc.run)
            counts[compare_curves(bases, cand, opts)["verdict"]] += 1
        what, rate = _error(sc.truth, counts, pairs)
        row = {"scenario": sc.name, "truth": sc.truth, **{v: counts[v] / pairs for v in
               ("equivalent", "inconclusive", "not_equivalent", "diverged")}, "error": what, "rate": rate}
        rows.append(row)
        print(f"| {sc.name} | {sc.truth} | " + " | ".join(f"{row[v]:.1%}" for v in
              ("equivalent", "inconclusive", "not_equivalent", "diverged")) + f" | {what} {rate:.1%} |",
              file=out, flush=True)
    return rows


def _write_jsonl(path: Path, steps: np.ndarray, loss: np.ndarray, rng: np.random.Generator):
    grad = 1.0 + 0.1 * rng.standard_normal(len(steps))
    with open(path, "w") as f:
        for s, v, g in zip(steps.tolist(), loss.tolist(), grad.tolist()):
            f.write(json.dumps({"step": s, "loss": v, "grad_norm": g, "lr": 3e-4, "tokens": s * 4096,
                                "tokens_per_s": 51234.5, "layers": {"0": {"rms": 0.5}, "1": {"rms": 0.6}}}))
            f.write("\n")
            if s % 1000 == 0:
                f.write(json.dumps({"step": s, "val_loss": v * 1.01}) + "\n")


def _cpu() -> float:
    """CPU seconds of this process and its finished children (the parallel loaders)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _bench_dir(directory: Path | None) -> Path:
    if directory is None:
        return Path(tempfile.mkdtemp(prefix="mxval-bench-"))
    if directory.exists() and not directory.is_dir():
        raise CLIError(f"--dir {directory} is a file; give a new or empty directory")
    if directory.exists() and any(directory.iterdir()):
        raise CLIError(f"--dir {directory} is not empty; give a new or empty directory (nothing is overwritten)")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CLIError(f"--dir {directory}: cannot create it: {exc.strerror or exc}") from None
    return directory


def _json_loads_loop(path: Path) -> float:
    """Seconds for the plainest reader: json.loads on every line, nothing kept (the machine's yardstick)."""
    t = time.perf_counter()
    with open(path, "rb") as f:
        for line in f:
            json.loads(line)
    return time.perf_counter() - t


def bench(steps: int, directory: Path | None) -> dict:
    from convergence.curves.compare import compare_curves
    from convergence.curves.load import load_curve, load_curves
    from convergence.curves.synthetic import SyntheticSpec, make_runs
    from convergence.curves.tbevents import write_scalars

    root = _bench_dir(directory)
    spec = SyntheticSpec(steps=steps)
    (base,), cand = make_runs(spec, 0, drift=0.0)
    rng = np.random.default_rng(1)
    files = {}
    t0 = time.perf_counter()
    for name, c in (("baseline", base), ("candidate", cand)):
        p = root / f"{name}.jsonl"
        _write_jsonl(p, c.steps, c.values, rng)
        d = root / f"tb_{name}"
        d.mkdir()
        write_scalars(d / "events.out.tfevents.0000000000.bench", {
            "loss_metrics/global_avg_loss": (c.steps, c.values),
            "grad_norm": (c.steps, 1.0 + 0.1 * rng.standard_normal(len(c.steps))),
            "throughput(tps)": (c.steps, np.full(len(c.steps), 51234.0)),
        })
        files[name] = (p, d)
    print(f"wrote {steps:,}-step runs under {root} in {time.perf_counter() - t0:.1f} s "
          f"(JSONL {files['baseline'][0].stat().st_size / 2**20:.0f} MiB each, TensorBoard "
          f"{next(files['baseline'][1].iterdir()).stat().st_size / 2**20:.0f} MiB each, 3 tags per step)")
    from numerics.environment import describe

    t = time.perf_counter()
    describe()  # imports torch: paid once by compare_paths, timed apart
    env_s = time.perf_counter() - t
    yardstick = _json_loads_loop(files["baseline"][0])
    print(f"yardstick: a plain json.loads loop over one JSONL file takes {yardstick:.2f} s on this machine now")
    out = {"steps": steps, "environment_s": env_s, "json_loads_loop_s": yardstick}
    runs = (("jsonl", "2 files + compare", 0, 2, 5.0), ("tensorboard", "1 file", 1, 1, 10.0),
            ("tensorboard", "2 files + compare", 1, 2, None))
    for fmt, what, idx, n, budget in runs:
        t, cpu = time.perf_counter(), _cpu()
        if n == 2:
            b, c = load_curves([files["baseline"][idx], files["candidate"][idx]])
        else:
            b = c = load_curve(files["baseline"][idx])
        t_load, cpu_load = time.perf_counter() - t, _cpu() - cpu
        t, cpu = time.perf_counter(), _cpu()
        verdict = compare_curves([b], c)["verdict"] if n == 2 else "-"
        t_cmp, cpu_cmp = time.perf_counter() - t, _cpu() - cpu
        total = t_load + t_cmp
        key = f"{fmt} {what}"
        out[key] = {"load_s": t_load, "compare_s": t_cmp, "total_s": total, "load_cpu_s": cpu_load,
                    "compare_cpu_s": cpu_cmp, "budget_s": budget, "ratio_to_json_loads_loop": total / yardstick,
                    "verdict": verdict}
        within = f" ({total / budget:.2f} of the {budget:.0f} s budget)" if budget else ""
        print(f"{key:<32} {total:6.2f} s wall{within}, {total / yardstick:.2f}x the json.loads loop; "
              f"load {t_load:.2f} s ({cpu_load:.2f} s CPU, all processes) + compare {t_cmp:.2f} s; "
              f"verdict {verdict}", flush=True)
    print(f"environment description (torch import) {env_s:.2f} s, once per process; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (wall times stretch when it exceeds the cores; "
          "the ratios to the json.loads loop, measured in the same run, do not)")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = ArgumentParser(prog="python -m convergence calibrate", description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, help="synthetic pairs per scenario (default 200)")
    p.add_argument("--seed", type=seed_arg, help="the synthetic pairs' seed (default 0)")
    p.add_argument("--bench", action="store_true", help="time loading + comparing two long runs instead")
    p.add_argument("--steps", type=int, help="--bench: steps per run (default 1,000,000)")
    p.add_argument("--dir", type=Path, help="--bench: where to write the runs (default: a new temp dir)")
    args = p.parse_args(argv)
    # each mode's options, refused in the other rather than ignored in silence
    other = ("--pairs", "--seed") if args.bench else ("--steps", "--dir")
    given = [flag for flag in other if getattr(args, flag[2:]) is not None]
    if given:
        raise CLIError(f"{' and '.join(given)} {'apply' if len(given) > 1 else 'applies'} only "
                       f"{'without' if args.bench else 'with'} --bench")
    pairs = 200 if args.pairs is None else args.pairs
    steps = 1_000_000 if args.steps is None else args.steps
    if pairs < 1 or steps < 1000:
        raise CLIError("--pairs must be >= 1 and --steps >= 1000")
    if args.bench:
        bench(steps, args.dir)
    else:
        calibrate(pairs, 0 if args.seed is None else args.seed)
    return 0
