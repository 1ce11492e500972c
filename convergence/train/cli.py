"""python -m convergence train: paired BF16 / MXFP8 pretraining runs (``convergence.train.loop``) from the
command line, on one process or under ``torchrun --nproc-per-node N ... --ep N``.

Bad input is one line on stderr and exit code 2 (on rank 0 only, under torchrun); the verdict line says
what the comparison of the recipes' curves concluded, and on one process the exit code is ``compare``'s.
A run stopped by --stop-after-minutes exits 4 (incomplete); one stopped by --stop-at-step exits 0 (it did what was
asked: a trunk for ``--fork-from``, ``convergence.train.checkpoint``). Under torchrun a finished or stopped run exits 0
whatever the verdict: torchrun reports any other exit as a failed rank, with a traceback that would read as a
crash.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from convergence.curves.decision.verdict import EXIT_CODES  # compare's, without compare's scipy
from convergence.train import checkpoint as ckpt_mod
from convergence.train import data as data_mod
from convergence.train.loop import REAL_VOCAB_MODELS, TrainConfig, defaults_for, run
from convergence.train.placement import OPTIMIZER_STATES
from numerics.cli import EXIT_BAD_INPUT, ArgumentParser, CLIError, seed_arg
from numerics.errors import BadInput
from numerics.files import atomic_write, check_writable
from numerics.layer.configs import CONFIGS
from numerics.layer.mxfp8 import KERNELS as MXFP8_KERNELS
from numerics.layer.mxfp8 import kernel_problem as mxfp8_problem
from numerics.layer.recipes import RECIPES, check_recipe_kernels

DIST_TIMEOUT_S = 300.0  # a collective's wait before a rank gives up: far above a step's (16b: ~4.5 s), below a hang


def config_from_args(args) -> TrainConfig:
    if args.model not in CONFIGS:
        raise CLIError(f"unknown model {args.model!r}; choose from {', '.join(CONFIGS)}")
    recipes = tuple(dict.fromkeys(args.recipe or ["bf16", "mxfp8"]))
    for r in recipes:
        if r not in RECIPES:
            raise CLIError(f"unknown recipe {r!r}; choose from {', '.join(RECIPES)}")
    if args.steps <= 0:
        raise CLIError(f"--steps must be > 0, got {args.steps}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise CLIError("--device cuda: no CUDA device is visible")
    if args.mxfp8_kernel != "auto" and any(RECIPES[r]().mxfp8 for r in recipes):
        problem = mxfp8_problem(args.mxfp8_kernel, args.device)
        if problem:
            raise CLIError(f"--mxfp8-kernel: {problem}")
    check_recipe_kernels(recipes, args.mxfp8_kernel, args.device)
    base = CONFIGS[args.model]()
    if args.layers is not None and not base.n_dense_layers < args.layers <= base.n_layers:
        raise CLIError(f"--layers must be from {base.n_dense_layers + 1} (the dense layers and one MoE layer) to "
                       f"{base.n_layers} (model {args.model}'s depth), got {args.layers}")
    d = defaults_for(args.model)
    for key in d:
        v = getattr(args, key, None)
        if v is not None:
            zero_ok = key in ("probe_every", "warmup", "ckpt_every")  # 0: none / no warmup / never
            if not (v >= 0 if zero_ok else v > 0) or not math.isfinite(v):  # NaN compares False: refused too
                bound = ">= 0" if zero_ok else "> 0"
                raise CLIError(f"--{key.replace('_', '-')} must be a finite number {bound}, got {v}")
            d[key] = v
    if args.ep is not None and args.probe_every is None:
        d["probe_every"] = 0  # with --ep, probes only when asked for: each costs every rank a step's work
    for flag in ("seed", "data_seed", "row_order"):
        v = getattr(args, flag)
        if v is not None and v < 0:
            raise CLIError(f"--{flag.replace('_', '-')} must be >= 0, got {v}")
    from numerics.ep.backends import BACKENDS

    if args.ep_backend not in BACKENDS:
        raise CLIError(f"--ep-backend must be one of {', '.join(BACKENDS)}, got {args.ep_backend!r}")
    if args.ep is None and args.ep_backend != "reference":  # recorded in config.json, though nothing dispatched
        raise CLIError(f"--ep-backend {args.ep_backend} goes with --ep (without it no tokens are dispatched)")
    is_bin = args.data is not None and Path(args.data).suffix.lower() == ".bin"
    if args.data_dtype != "uint16" and not is_bin:
        raise CLIError(f"--data-dtype {args.data_dtype} is the token type of a pre-tokenized .bin (--data X.bin)")
    if args.tokenizer is not None and is_bin:  # its ids are read as they are
        raise CLIError(f"--tokenizer {args.tokenizer}: {args.data} is pre-tokenized (a .bin is read as ids)")
    tokenizer = args.tokenizer or ("bpe" if args.model in REAL_VOCAB_MODELS else "byte")
    bpe_vocab = base.vocab_size if args.model in REAL_VOCAB_MODELS else data_mod.DataSpec.bpe_vocab
    data_mod.check_val_percent(args.val_percent)
    spec = data_mod.DataSpec(path=args.data, tokenizer=tokenizer, bpe_vocab=bpe_vocab, bin_dtype=args.data_dtype,
                             val_percent=args.val_percent)
    checkpointing = args.model == "16b" if args.activation_checkpointing is None else args.activation_checkpointing
    data_seed, row_order, fork_from = args.data_seed, args.row_order, None
    if (args.fork_from is None) != (args.fork_step is None):
        raise CLIError("--fork-from and --fork-step go together: the trunk's run folder and the step it stopped at")
    if args.fork_from is not None:  # a fork keeps its trunk's order unless told to perturb it
        fork_from = str(Path(args.fork_from).resolve())  # as recorded, so that --resume from elsewhere matches
        # a fork continued with --resume keeps what it started with (its trunk may have moved on since)
        own = [args.out / r for r in recipes if args.resume and (args.out / r / "config.json").is_file()]
        source = ckpt_mod.trunk_config(own[0] if own else Path(fork_from))
        data_seed, row_order = ckpt_mod.inherit(source["train"], data_seed, row_order)
    return TrainConfig(model=args.model, recipes=recipes, steps=args.steps, seed=args.seed,
                       device=args.device, data=spec, ep=args.ep or 0, ep_backend=args.ep_backend,
                       deterministic=args.deterministic, mxfp8_kernel=args.mxfp8_kernel,
                       data_seed=data_seed, row_order=row_order, fork_from=fork_from, fork_step=args.fork_step or 0,
                       activation_checkpointing=checkpointing, phase_times=args.phase_times,
                       optimizer_state=args.optimizer_state, layers=args.layers or 0, **d)


class _RankParser(ArgumentParser):
    """Usage errors printed by rank 0 only (every torchrun rank parses the same command line)."""

    def error(self, message: str):
        if os.environ.get("RANK", "0") != "0":
            raise SystemExit(EXIT_BAD_INPUT)
        super().error(message)


def train_parser() -> ArgumentParser:
    """The parser of ``python -m convergence train`` (the protocol's run commands are parsed by it in tests)."""
    p = _RankParser(prog="python -m convergence train", description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--model", required=True, help=f"one of {', '.join(CONFIGS)}")
    p.add_argument("--recipe", action="append", help=f"repeatable; one of {', '.join(RECIPES)}")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--seed", type=seed_arg, default=0, help="initial weights (and the data order, unless --data-seed)")
    p.add_argument("--data-seed", type=seed_arg, default=None, help="order of the training data (default: --seed)")
    p.add_argument("--row-order", type=seed_arg, default=None,
                   help="permute each batch's rows by this seed: the same tokens summed in another order")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--resume", action="store_true", help="continue the runs in --out from their checkpoints")
    p.add_argument("--force", action="store_true", help="overwrite the runs in --out")
    p.add_argument("--data", help="text / .jsonl / .parquet / pre-tokenized .bin (default: Python stdlib)")
    p.add_argument("--val-percent", type=int, default=None,
                   help="documents held out for validation, percent (default 2; 1 %% of a .bin): a larger held-out "
                   "set has a smaller sampling error (docs/protocol.md) and less to train on")
    p.add_argument("--data-dtype", default="uint16", help="token dtype of a .bin: uint16 or uint32")
    p.add_argument("--tokenizer", default=None, choices=["byte", "bpe"],
                   help="byte, or a byte-level BPE trained on the data's train split and cached (pip install "
                   "'mxval[bpe]'); default: bpe for 16b (as many ids as the model's 102,400 rows the corpus "
                   "yields), byte otherwise")
    for key in defaults_for("tiny"):
        p.add_argument(f"--{key.replace('_', '-')}", type=float if key == "lr" else int, default=None)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--stop-after-minutes", type=float, default=None,
                   help="checkpoint and stop after this long; rerun with --resume to continue")
    p.add_argument("--stop-at-step", type=int, default=None,
                   help="checkpoint and stop at this step, on the whole --steps schedule (exit 0): a trunk for "
                   "--fork-from; rerun with --resume to continue it")
    p.add_argument("--fork-from", type=Path, default=None, metavar="TRUNK",
                   help="start from another run's checkpoint (its run folder, e.g. OUT/bf16, stopped with "
                   "--stop-at-step) at --fork-step, with this command's recipes; its records up to there are copied. "
                   "Perturb the continuation with --row-order (or --data-seed: the remaining windows reshuffled); "
                   "without them the trunk's are kept")
    p.add_argument("--fork-step", type=int, default=None, help="the trunk's step to fork at (its checkpoint's)")
    p.add_argument("--ep", type=int, default=None,
                   help="expert-parallel size = number of torchrun processes (FSDP2 + EP); docs/distributed.md")
    p.add_argument("--ep-backend", default="reference",
                   help="reference (all-to-all), deepep (V1 Buffer) or deepep-v2 (numerics.ep.backends)")
    p.add_argument("--deterministic", action="store_true", help="deterministic algorithms, fixed seeds")
    p.add_argument("--phase-times", action="store_true",
                   help="log each step's forward, backward and optimizer seconds (phase_s); on a GPU the step "
                   "waits for its kernels between phases, so tokens/s drops a little")
    p.add_argument("--activation-checkpointing", action=argparse.BooleanOptionalAction, default=None,
                   help="keep only each block's input and recompute the block in backward (same bits, less "
                   "memory, ~1/3 more compute); default: on for 16b, off otherwise")
    p.add_argument("--layers", type=int, default=None,
                   help="train the model's first N layers only, every width as the model's (default: all): a 16b "
                   "whose checkpoint fits a disk, for checking checkpoint and resume at its real widths")
    p.add_argument("--optimizer-state", default="auto", choices=OPTIMIZER_STATES,
                   help="where AdamW's moments wait between steps: device, host (pinned host memory, each "
                   "parameter's brought to the GPU for its update: the same bits, slower), or auto: device when "
                   "the memory check says they fit, else host")
    p.add_argument("--mxfp8-kernel", default="auto", choices=["auto", *MXFP8_KERNELS],
                   help="emulated (torchao's eager ops), fast (fused casts, bit-identical), real (SM100); auto: "
                   "real on SM100, emulated elsewhere")
    p.add_argument("--dist-timeout", type=float, default=None,
                   help=f"with --ep: seconds before a collective gives up (default {DIST_TIMEOUT_S:.0f})")
    return p


def check_run_flags(args) -> None:
    """The flags that shape how a run is made, not what it computes (``config_from_args`` checks those): NaN and
    out-of-range values are refused in one line (unchecked, a negative --threads fails inside torch,
    --stop-after-minutes -1 stops as 0 does, after one step, and NaN values are ignored)."""
    if args.threads is not None and args.threads < 1:
        raise CLIError(f"--threads must be >= 1, got {args.threads}")
    if args.stop_after_minutes is not None and not 0 <= args.stop_after_minutes < math.inf:  # 0: after one step
        raise CLIError(f"--stop-after-minutes must be a number >= 0, got {args.stop_after_minutes}")
    if args.dist_timeout is not None and not 0 < args.dist_timeout < math.inf:
        raise CLIError(f"--dist-timeout must be a number of seconds > 0, got {args.dist_timeout}")
    if args.dist_timeout is not None and args.ep is None:  # refused, not ignored: one process waits on no peer
        raise CLIError("--dist-timeout goes with --ep (one process has no collective to time out)")
    if args.stop_after_minutes is not None and args.ckpt_every == 0:  # it would stop, and --resume have nothing to load
        raise CLIError("--stop-after-minutes stops at a checkpoint to continue from, and --ckpt-every 0 writes none")


def main(argv: Sequence[str] | None = None) -> int:
    args = train_parser().parse_args(argv)
    rank = os.environ.get("RANK", "0")
    try:
        check_run_flags(args)
    except CLIError:
        if rank != "0":
            return EXIT_BAD_INPUT  # every torchrun rank parses the same flags: rank 0 prints the one line
        raise
    if args.ep is None and "WORLD_SIZE" in os.environ and os.environ["WORLD_SIZE"] != "1":
        if rank != "0":
            return EXIT_BAD_INPUT
        raise CLIError(f"running under torchrun with WORLD_SIZE={os.environ['WORLD_SIZE']}: pass "
                       f"--ep {os.environ['WORLD_SIZE']}")
    if args.threads:
        torch.set_num_threads(args.threads)
    stop = None if args.stop_after_minutes is None else 60 * args.stop_after_minutes
    if args.ep is not None:
        from convergence.train.distributed import PeerFailed

        try:
            cfg = config_from_args(args)
            result = run(cfg, args.out, resume=args.resume, force=args.force, stop_after_s=stop,
                         timeout_s=DIST_TIMEOUT_S if args.dist_timeout is None else args.dist_timeout,
                         stop_at_step=args.stop_at_step)
        except PeerFailed:
            return EXIT_BAD_INPUT  # rank 0 has printed the one line
        except BadInput:  # before any process group: every rank found the same error alone
            if rank != "0":
                time.sleep(1.0)  # torchrun ends the other ranks when one exits: let rank 0 print first
                return EXIT_BAD_INPUT
            raise
        if rank != "0":
            return 0
        if result is not None:  # torchrun calls any non-zero exit a failed rank: the verdict is in words only
            report_cost(args.out, cfg.recipes)
            report_verdict(result, args.out)
            if result.get("candidates"):
                first = next(iter(result["candidates"]))
                pair = " ".join(str(args.out / r / "metrics.jsonl") for r in (result["baseline"], first))
                print(f"exit 0: the run finished (under torchrun the exit code is not the verdict; "
                      f"python -m convergence compare {pair} exits with it)")
            return 0
    else:
        cfg = config_from_args(args)
        result = run(cfg, args.out, resume=args.resume, force=args.force, stop_after_s=stop,
                     stop_at_step=args.stop_at_step)
    if result is None:  # exit 4 on one process, as compare's incomplete and protocol's stopped; 0 under torchrun
        print(f"stopped before the end; continue with the same command and --resume (out: {args.out})")
        return 0 if args.ep is not None else EXIT_CODES["incomplete"]
    report_cost(args.out, cfg.recipes)
    return report_verdict(result, args.out)


def report_cost(out: Path, recipes: Sequence[str]) -> None:
    """One line per recipe: its median step and peak memory (``convergence.train.profile``), and the command
    that breaks the step down."""
    from convergence.train.profile import load_records, profile

    runs = [out / r for r in recipes if (out / r / "metrics.jsonl").exists()]
    for run_dir in runs:
        try:
            p = profile(load_records(run_dir))
        except BadInput:  # a report, not a check: the run itself is done
            continue
        if p["step_s"] is None:
            continue
        gpu = "" if p["gpu_peak_gib"] is None else f"GPU {p['gpu_peak_gib']:.1f} GiB, "
        host = "" if p["host_peak_gib"] is None else f"host {p['host_peak_gib']:.1f} GiB"
        print(f"{run_dir.name}: {p['steps']} steps, median {p['step_s']:.3f} s/step ({p['tokens_per_s']:,.0f} "
              f"tokens/s), peak {gpu}{host}".rstrip(", "))
    if runs:
        print("where the time went: python -m convergence profile " + " ".join(str(r) for r in runs))


def report_verdict(result: dict, out: Path) -> int:
    """One line per compared candidate, ``compare``'s words and exit code (the worst of them): 0 equivalent,
    1 not_equivalent or diverged, 3 inconclusive, 4 incomplete; 0 when there was nothing to compare."""
    if not result.get("candidates"):
        print(f"trained; no verdict: {result.get('reason')}")
        return 0
    codes = []
    for name, r in result["candidates"].items():
        print(f"{name} against {result['baseline']}: {r['verdict'].upper()}: {r['reason']}")
        codes.append(EXIT_CODES[r["verdict"]])
    print(f"verdict: {out / 'verdict.json'}")
    severity = {1: 3, 4: 2, 3: 1, 0: 0}  # not_equivalent / diverged, then incomplete, then inconclusive
    return max(codes, key=severity.__getitem__)



def bench_main(argv: Sequence[str] | None = None) -> int:
    """python -m convergence bench: BF16 and MXFP8 (every kernel here) training steps, eager and compiled."""
    import json

    from convergence.train.perf import bench

    p = ArgumentParser(prog="python -m convergence bench", description=bench.__doc__.splitlines()[0])
    p.add_argument("--model", default="proxy", help=f"one of {', '.join(CONFIGS)}")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3,
                   help="measurements of each configuration, each a fresh build and warm-up, taken round the "
                   "configurations (default 3): rows show the median and the range")
    p.add_argument("--kernel", action="append", help="repeatable MXFP8 kernel (emulated, fast, real); default: "
                   "every one that runs on the device")
    p.add_argument("--no-compile", action="store_true", help="eager only (eager and compiled is the default)")
    p.add_argument("--compile-emulated", action="store_true",
                   help="also compile the emulated kernel (minutes of compilation on an H200)")
    p.add_argument("--json", type=Path, help="write the rows, the cast-work floor and the environment here (again "
                   "after every round of repeats: a run cut short keeps the rounds it finished)")
    p.add_argument("--force", action="store_true", help="overwrite an existing --json file")
    args = p.parse_args(argv)
    if args.model not in CONFIGS:
        raise CLIError(f"unknown model {args.model!r}; choose from {', '.join(CONFIGS)}")
    if min(args.batch, args.seq, args.steps, args.repeats) <= 0 or args.warmup < 0:
        raise CLIError("--batch, --seq, --steps and --repeats must be > 0 and --warmup >= 0")
    if args.compile_emulated and args.no_compile:  # it printed eager rows only
        raise CLIError("--compile-emulated adds compiled rows, and --no-compile asks for eager ones only")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise CLIError("--device cuda: no CUDA device is visible")
    device = torch.device(args.device)
    for k in args.kernel or []:
        problem = mxfp8_problem(k, device)
        if problem:
            raise CLIError(problem)
    if args.json:
        check_writable(args.json, force=args.force)
    cfg_flops = bench.step_flops(bench.get_config(args.model), args.seq)
    print(f"model {args.model}, {args.batch} x {args.seq} tokens/step, {cfg_flops / 1e9:.4g} GFLOP/token, "
          f"device {args.device}", flush=True)
    # the run's settings, copy bandwidth and environment first: the JSON is written after every round of repeats
    doc = bench.report([], model=args.model, batch=args.batch, seq=args.seq, device=device, steps=args.steps,
                       warmup=args.warmup, repeats=args.repeats)

    def after_round(rows, done):
        doc.update(rows=rows, repeats_done=done)
        if args.json:
            atomic_write(args.json, json.dumps(doc, indent=1, default=str) + "\n", force=True)

    bench.progress_line(bench.format_rows([]))
    rows = bench.bench(args.model, batch=args.batch, seq=args.seq, steps=args.steps, warmup=args.warmup,
                       device=device, compile_=not args.no_compile, kernels=args.kernel, progress=bench.progress_line,
                       compile_emulated=args.compile_emulated, repeats=args.repeats, after_round=after_round)
    print(bench.format_rows(rows))
    if doc["cast_floor_ms"] is not None:
        print(f"cast-work floor: {doc['cast_bytes_per_step'] / 1e9:.2f} GB per step at {doc['copy_gbps']:.0f} GB/s "
              f"device copy = {doc['cast_floor_ms']:.1f} ms per step")
    for r in rows:
        if r.get("ratio_to_bf16") is not None and r["recipe"] != "bf16":
            lo, hi = r["ratio_to_bf16_range"]
            print(f"step-time ratio mxfp8/{r['kernel']} (compiled={r['compiled']}) / bf16: {r['ratio_to_bf16']:.2f}x "
                  f"(ratio of medians of {r['repeats']}; per-repeat ratios {lo:.2f}-{hi:.2f})")
    if args.json:
        print(f"wrote {args.json}")
    return 0


def ep_identity_main(argv: Sequence[str] | None = None) -> int:
    """python -m convergence ep-identity RUN_A RUN_B [--recipe R ...] [--json OUT] [--force]"""
    import json

    from convergence.train.ep_identity import compare_runs, report

    p = ArgumentParser(prog="python -m convergence ep-identity",
                       description="are two training runs identical step for step")
    p.add_argument("a", type=Path, help="run directory or metrics.jsonl (e.g. --ep-backend reference)")
    p.add_argument("b", type=Path, help="run directory or metrics.jsonl (e.g. --ep-backend deepep)")
    p.add_argument("--recipe", action="append", help="compare only these recipes (repeatable)")
    p.add_argument("--json", type=Path, metavar="OUT", help="write the result with versions and hardware")
    p.add_argument("--force", action="store_true", help="overwrite an existing --json file")
    args = p.parse_args(argv)
    if args.json is not None:
        check_writable(args.json, force=args.force)
    result = compare_runs(args.a, args.b, args.recipe)
    print(report(result))
    if args.json is not None:
        from numerics.environment import describe
        atomic_write(args.json, json.dumps(result | {"environment": describe()}, indent=2, default=str) + "\n",
                     force=True)
    return 0 if result["identical"] else 1

if __name__ == "__main__":
    from numerics.cli import exit_process, run_main

    exit_process(run_main(main))
