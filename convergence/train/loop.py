"""python -m convergence train: paired BF16 / MXFP8 pretraining runs from one seed and token stream.

Public: ``TrainConfig``, ``defaults_for(model)``, ``run(cfg, out, resume=False, force=False)``,
``train_recipe(...)``, ``main(argv)``.

What a run is:
* every recipe starts from the same initial weights (drawn from ``seed`` on the CPU before any recipe is
  applied; their fingerprint is in config.json) and sees the same batches in the same order
  (``data.Batches`` is a function of seed and step);
* the BF16 baseline is defined as FP32 master weights and AdamW state, forward and backward under
  ``torch.autocast(dtype=bfloat16)``: every matmul in BF16 with FP32 accumulation, norms, softmax,
  router scoring and the loss in FP32. The MXFP8 recipes are the same run with the recipe's layers'
  matmuls (fwd, dgrad, wgrad) put through torchao's MXFP8;
* AdamW (beta 0.9/0.95, weight decay on matrices only), linear warmup then cosine decay to 10 % of the
  peak learning rate, gradient-norm clipping;
* outputs under ``OUT/<recipe>/``: ``metrics.jsonl`` (one line per step: step, loss, grad_norm, lr,
  tokens, tokens_per_s, expert_load_max_share per MoE layer, val_loss every ``val_every`` steps),
  ``probes.jsonl`` (every ``probe_every`` steps), ``config.json`` (run config, recipe, versions),
  ``checkpoint.pt`` (every ``ckpt_every`` steps and at the end; never with ``ckpt_every=0``); then
  ``OUT/verdict.json`` and ``OUT/curves.png`` from the curve comparison.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from convergence.train import data as data_mod
from convergence.train.checkpoint import JsonlLog, load_checkpoint, plain, save_checkpoint
from convergence.train.model import Transformer
from numerics.cli import EXIT_BAD_INPUT, ArgumentParser, CLIError
from numerics.layer.configs import CONFIGS, get_config
from numerics.layer.recipes import RECIPES, apply_recipe, get_recipe


@dataclass(frozen=True)
class TrainConfig:
    model: str
    recipes: tuple[str, ...]
    steps: int
    seed: int = 0
    device: str = "cpu"
    batch: int = 8
    seq: int = 128
    lr: float = 3e-3
    warmup: int = 5
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    val_every: int = 10
    val_batches: int = 4
    probe_every: int = 0  # 0: no probes
    ckpt_every: int = 10
    data: data_mod.DataSpec = field(default_factory=data_mod.DataSpec)
    ep: int = 0  # 0: single process; N >= 1: N ranks under torchrun, FSDP2 + expert parallelism
    ep_backend: str = "reference"  # numerics.ep backend for dispatch / combine: reference or deepep
    deterministic: bool = False  # torch.use_deterministic_algorithms(True) and friends

    def fields_for_resume(self) -> dict:
        """What must match for --resume to continue a run (everything that shapes the curve)."""
        d = dataclasses.asdict(self)
        d.pop("recipes")
        return d


def defaults_for(model: str) -> dict:
    """Per-model defaults for batch, sequence, learning rate and cadences (overridable on the CLI)."""
    if model == "tiny":  # ~0.1 s (bf16) / ~0.5 s (emulated mxfp8) per step on one CPU core
        return dict(batch=8, seq=128, lr=3e-3, warmup=5, val_every=10, val_batches=4, probe_every=25,
                    ckpt_every=10)
    # proxy / 16b: 4 x 2048 = 8192 tokens per step (proxy: ~0.1 s bf16, ~1 s emulated mxfp8 on H200)
    # a proxy checkpoint (weights + AdamW state, FP32) is ~11 GB: every 100 steps and when stopping
    return dict(batch=4, seq=2048, lr=6e-4, warmup=50, val_every=50, val_batches=8, probe_every=100,
                ckpt_every=100)


def lr_at(cfg: TrainConfig, step: int) -> float:
    """Multiplier of the peak lr for optimizer step ``step`` (0-based): linear warmup, then cosine."""
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def build_model(cfg: TrainConfig, vocab_size: int) -> Transformer:
    mcfg = dataclasses.replace(get_config(cfg.model), vocab_size=vocab_size)
    model = Transformer(mcfg)
    model.init_weights(torch.Generator().manual_seed(cfg.seed))
    return model


def fingerprint(model: torch.nn.Module) -> str:
    """A short hash of the model's weights (sum and sum of squares per tensor, in float64)."""
    h = hashlib.sha256()
    for name, t in sorted(plain(model.state_dict()).items()):
        t64 = t.double()
        h.update(f"{name}:{float(t64.sum())!r}:{float((t64 * t64).sum())!r}".encode())
    return h.hexdigest()[:16]


def write_run_config(run_dir: Path, cfg: TrainConfig, recipe, applied: dict, model_cfg, tokens, init_fp: str,
                     **extra: dict) -> None:
    """DIR/<recipe>/config.json: what ran and on what; ``extra`` sections (e.g. ``distributed``) go before
    the environment. One writer for the single-process and the distributed trainer."""
    from numerics.environment import describe

    config = {
        "train": dataclasses.asdict(cfg),
        "recipe": recipe.as_dict() | applied,
        "model": dataclasses.asdict(model_cfg),
        "data": tokens.meta,
        "init_fingerprint": init_fp,
        "tokens_per_step": cfg.batch * cfg.seq,
        "baseline_definition": "FP32 master weights; fwd/bwd under torch.autocast(bfloat16)",
        **extra,
        "environment": describe(),
    }
    (run_dir / "config.json").write_text(json.dumps(config, indent=2, default=str) + "\n")


def _optimizer(model: torch.nn.Module, cfg: TrainConfig):
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, foreach=False,
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(cfg, s))
    return opt, sched


def _loss(model, tokens: torch.Tensor, device: torch.device) -> torch.Tensor:
    inp, tgt = tokens[:, :-1].to(device), tokens[:, 1:].to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        logits = model(inp)
    return F.cross_entropy(logits.float().flatten(0, 1), tgt.flatten())


@torch.no_grad()
def _validate(model, batches: data_mod.Batches, cfg: TrainConfig, device: torch.device) -> float:
    moes = [m for _, m in model.moe_layers()]
    saved = [m.tokens_per_expert.clone() for m in moes]
    losses = [float(_loss(model, b, device)) for b in batches.eval_batches(cfg.val_batches)]
    for m, s in zip(moes, saved):
        m.tokens_per_expert.copy_(s)
    return sum(losses) / len(losses)


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _progress(recipe: str, step: int, total: int, loss: float, tps: float) -> None:
    width = 24
    filled = int(width * step / total)
    sys.stderr.write(
        f"\r{recipe:>15} [{'#' * filled}{'.' * (width - filled)}] {step}/{total} "
        f"loss {loss:.4f} {tps:,.0f} tok/s"
    )
    if step == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def train_recipe(cfg: TrainConfig, recipe_name: str, run_dir: Path, tokens: data_mod.TokenData,
                 *, resume: bool, progress: bool = True, stop_after_s: float | None = None) -> bool:
    """Train one recipe into ``run_dir``; returns True when it reached ``cfg.steps``."""
    from convergence.train import probes as probes_mod

    device = torch.device(cfg.device)
    recipe = get_recipe(recipe_name)
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics, probe_log = JsonlLog(run_dir / "metrics.jsonl"), JsonlLog(run_dir / "probes.jsonl")
    ckpt_path = run_dir / "checkpoint.pt"

    model = build_model(cfg, tokens.vocab_size)
    init_fp = fingerprint(model)
    start = 0
    ckpt = load_checkpoint(ckpt_path) if resume and ckpt_path.exists() else None
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        start = ckpt["step"]
    model.to(device)
    applied = apply_recipe(model, recipe, device)
    opt, sched = _optimizer(model, cfg)
    if ckpt is not None:
        opt.load_state_dict(ckpt["optimizer"])
        sched.load_state_dict(ckpt["scheduler"])
        _set_rng_state(ckpt["rng"])
    for log in (metrics, probe_log):
        if log.path.exists():
            log.truncate_after(start)

    write_run_config(run_dir, cfg, recipe, applied, model.cfg, tokens, init_fp)

    batches = data_mod.Batches(tokens.train, batch=cfg.batch, seq=cfg.seq, seed=cfg.seed)
    val = data_mod.Batches(tokens.val, batch=cfg.batch, seq=cfg.seq, seed=cfg.seed)
    moe_layers = model.moe_layers()
    coeff = model.cfg.load_balance_coeff
    params = [p for p in model.parameters()]
    t_start = time.monotonic()
    for step in range(start, cfg.steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        batch = batches.batch_at(step)
        loss = _loss(model, batch, device)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        lr = sched.get_last_lr()[0]
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        shares = {f"layer{i}": m.end_step(coeff) for i, m in moe_layers}
        loss_f = float(loss.detach())
        if device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        done = step + 1
        rec = {
            "step": done, "loss": loss_f, "grad_norm": float(grad_norm), "lr": lr,
            "tokens": done * cfg.batch * cfg.seq, "tokens_per_s": cfg.batch * cfg.seq / dt,
            "expert_load_max_share": shares,
        }
        if cfg.val_every and (done % cfg.val_every == 0 or done == cfg.steps):
            rec["val_loss"] = _validate(model, val, cfg, device)
        if not math.isfinite(loss_f):
            rec["diverged"] = True
        metrics.append(rec)
        if cfg.probe_every and done % cfg.probe_every == 0:
            probe_log.append({"step": done} | probes_mod.probe(model, batch, recipe=recipe, device=device))
        out_of_time = stop_after_s is not None and time.monotonic() - t_start > stop_after_s
        if cfg.ckpt_every and (done % cfg.ckpt_every == 0 or done == cfg.steps or out_of_time
                               or not math.isfinite(loss_f)):
            save_checkpoint(ckpt_path, {
                "step": done, "model": model.state_dict(), "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict(), "rng": _rng_state(),
                "data_position": {"step": done, "samples": done * cfg.batch, "seed": cfg.seed},
                "config": cfg.fields_for_resume(),
            })
        if progress:
            _progress(recipe_name, done, cfg.steps, loss_f, rec["tokens_per_s"])
        if not math.isfinite(loss_f):
            return True  # diverged: the comparison reports it; continuing would only add NaNs
        if out_of_time and done < cfg.steps:
            return False
    return True


def _check_run_dir(cfg: TrainConfig, out: Path, resume: bool, force: bool) -> None:
    if resume and force:
        raise CLIError("--resume and --force exclude each other")
    existing = [out / r for r in cfg.recipes if (out / r).exists() and any((out / r).iterdir())]
    if force:
        for d in existing:
            shutil.rmtree(d)
        for f in ("verdict.json", "curves.png"):
            (out / f).unlink(missing_ok=True)
        return
    if existing and not resume:
        raise CLIError(f"{existing[0]} already holds a run; pass --resume to continue it or --force to "
                       "overwrite it")
    if resume:
        want = json.loads(json.dumps(cfg.fields_for_resume(), default=str))
        for d in existing:
            path = d / "config.json"
            if not path.exists():
                continue
            have = json.loads(path.read_text())["train"]
            for key, value in want.items():
                if have.get(key) != value:
                    raise CLIError(
                        f"--resume: {path} was run with {key}={have.get(key)!r}, the command line says "
                        f"{key}={value!r}"
                    )


def compare_and_plot(out: Path, recipes: Sequence[str]) -> dict:
    """verdict.json and curves.png through convergence.curves.compare / convergence.curves.plots."""
    baseline = "bf16" if "bf16" in recipes else recipes[0]
    candidates = [r for r in recipes if r != baseline]
    try:
        from convergence.curves.compare import compare_paths
        from convergence.curves.plots import plot_comparison
    except ImportError:  # TODO(lead): remove once compare.py is merged
        result = {"verdict": None, "reason": "convergence.curves.compare not available"}
    else:
        if not candidates:
            result = {"verdict": None, "reason": f"only one recipe ({baseline}); nothing to compare"}
        else:
            result = {"baseline": baseline, "candidates": {}}
            for c in candidates:
                r = compare_paths([out / baseline / "metrics.jsonl"], out / c / "metrics.jsonl")
                result["candidates"][c] = r
                plot_comparison(r, out / ("curves.png" if len(candidates) == 1 else f"curves_{c}.png"))
            result["verdict"] = result["candidates"][candidates[0]]["verdict"] if len(candidates) == 1 \
                else {c: r["verdict"] for c, r in result["candidates"].items()}
    (out / "verdict.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    return result


def run(cfg: TrainConfig, out: Path, *, resume: bool = False, force: bool = False, progress: bool = True,
        stop_after_s: float | None = None) -> dict | None:
    """All recipes of ``cfg`` into ``out``; the verdict when every recipe finished, else None."""
    out = Path(out)
    _check_run_dir(cfg, out, resume, force)
    tokens = data_mod.load_tokens(cfg.data)
    data_mod.Batches(tokens.train, batch=cfg.batch, seq=cfg.seq, seed=cfg.seed)  # fail early: too few
    data_mod.Batches(tokens.val, batch=cfg.batch, seq=cfg.seq, seed=cfg.seed)
    t0 = time.monotonic()
    for name in cfg.recipes:
        left = None if stop_after_s is None else stop_after_s - (time.monotonic() - t0)
        if left is not None and left <= 0:
            return None
        if not train_recipe(cfg, name, out / name, tokens, resume=resume, progress=progress,
                            stop_after_s=left):
            return None
    return compare_and_plot(out, cfg.recipes)


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
    d = defaults_for(args.model)
    for key in d:
        v = getattr(args, key, None)
        if v is not None:
            if v <= 0 and key not in ("probe_every", "warmup", "ckpt_every"):  # 0: none / no warmup / never
                raise CLIError(f"--{key.replace('_', '-')} must be > 0, got {v}")
            d[key] = v
    if args.ep is not None and args.probe_every is None:
        d["probe_every"] = 0  # probes are single-process only
    spec = data_mod.DataSpec(path=args.data, tokenizer=args.tokenizer, bin_dtype=args.data_dtype)
    return TrainConfig(model=args.model, recipes=recipes, steps=args.steps, seed=args.seed,
                       device=args.device, data=spec, ep=args.ep or 0, ep_backend=args.ep_backend,
                       deterministic=args.deterministic, **d)


class _RankParser(ArgumentParser):
    """Usage errors printed by rank 0 only (every torchrun rank parses the same command line)."""

    def error(self, message: str):
        if os.environ.get("RANK", "0") != "0":
            raise SystemExit(EXIT_BAD_INPUT)
        super().error(message)


def main(argv: Sequence[str] | None = None) -> int:
    p = _RankParser(prog="python -m convergence train", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help=f"one of {', '.join(CONFIGS)}")
    p.add_argument("--recipe", action="append", help=f"repeatable; one of {', '.join(RECIPES)}")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--resume", action="store_true", help="continue the runs in --out from their checkpoints")
    p.add_argument("--force", action="store_true", help="overwrite the runs in --out")
    p.add_argument("--data", help="text / .jsonl / .parquet / pre-tokenized .bin (default: Python stdlib)")
    p.add_argument("--data-dtype", default="uint16", help="token dtype of a .bin: uint16 or uint32")
    p.add_argument("--tokenizer", default="byte", help="byte (default) or bpe")
    for key in defaults_for("tiny"):
        p.add_argument(f"--{key.replace('_', '-')}", type=float if key == "lr" else int, default=None)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--stop-after-minutes", type=float, default=None,
                   help="checkpoint and stop after this long; rerun with --resume to continue")
    p.add_argument("--ep", type=int, default=None,
                   help="expert-parallel size = number of torchrun processes (FSDP2 + EP); README: distributed")
    p.add_argument("--ep-backend", default="reference", help="reference (all-to-all) or deepep")
    p.add_argument("--deterministic", action="store_true", help="deterministic algorithms, fixed seeds")
    p.add_argument("--dist-timeout", type=float, default=300.0, help="seconds before a collective gives up")
    args = p.parse_args(argv)
    rank = os.environ.get("RANK", "0")
    if args.ep is None and "WORLD_SIZE" in os.environ and os.environ["WORLD_SIZE"] != "1":
        if rank != "0":
            return EXIT_BAD_INPUT
        raise CLIError(f"running under torchrun with WORLD_SIZE={os.environ['WORLD_SIZE']}: pass "
                       f"--ep {os.environ['WORLD_SIZE']}")
    if args.threads:
        torch.set_num_threads(args.threads)
    stop = None if args.stop_after_minutes is None else 60 * args.stop_after_minutes
    if args.ep is not None:
        from convergence.train.distributed import PeerFailed, run_distributed

        try:
            cfg = config_from_args(args)
            result = run_distributed(cfg, args.out, resume=args.resume, force=args.force, stop_after_s=stop,
                                     timeout_s=args.dist_timeout)
        except PeerFailed:
            return EXIT_BAD_INPUT  # rank 0 has printed the one line
        except CLIError:  # before any process group: every rank found the same error alone
            if rank != "0":
                time.sleep(1.0)  # torchrun ends the other ranks when one exits: let rank 0 print first
                return EXIT_BAD_INPUT
            raise
        if rank != "0":
            return 0
    else:
        cfg = config_from_args(args)
        result = run(cfg, args.out, resume=args.resume, force=args.force, stop_after_s=stop)
    if result is None:
        print(f"stopped before the end; continue with the same command and --resume (out: {args.out})")
        return 0
    print(f"verdict: {result.get('verdict')}  ({args.out / 'verdict.json'})")
    return 0
