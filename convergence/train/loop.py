"""The training loop, once: paired BF16 / MXFP8 pretraining runs from one seed and token stream, on one
process or on N ranks under torchrun (FSDP2 + expert parallelism).

Public: ``TrainConfig``, ``defaults_for(model)``, ``run(cfg, out, resume=False, force=False)``,
``train_recipe(...)``, ``build_model``, ``fingerprint``, ``lr_at``, ``evaluates``, ``evaluation_steps``.

What a run is:
* every recipe starts from the same initial weights (drawn from ``seed`` on the CPU before any recipe is
  applied; their fingerprint is in config.json) and sees the same batches in the same order
  (``data.Batches`` is a function of the data seed and step). Three knobs vary one source of training
  randomness at a time: ``seed`` (initial weights), ``data_seed`` (the order of the training windows;
  None follows ``seed``, so a plain seed changes both) and ``row_order`` (the
  order of a batch's rows: the same arithmetic summed in another order, one rounding apart);
* validation is on a fixed held-out set (``val_batches`` batches spread evenly over the validation split,
  the same for every seed), logged with the standard error of its mean and every batch's loss;
* the BF16 baseline is defined as FP32 master weights and AdamW state, forward and backward under
  ``torch.autocast(dtype=bfloat16)``: every matmul in BF16 with FP32 accumulation, norms, softmax,
  router scoring and the loss in FP32. The MXFP8 recipes are the same run with the recipe's layers'
  matmuls (fwd, dgrad, wgrad) put through torchao's MXFP8;
* AdamW (beta 0.9/0.95, weight decay on matrices only), linear warmup then cosine decay to 10 % of the
  peak learning rate, gradient-norm clipping;
* outputs under ``OUT/<recipe>/``: ``metrics.jsonl`` (one line per step: step, loss, grad_norm, lr,
  tokens, tokens_per_s, expert_load_max_share per MoE layer, host_peak_gib and on a GPU gpu_peak_gib (the
  piece's peak so far, the largest rank's: both peaks are reset when a piece starts, so runs trained one
  after another in one process, as the protocol does on one GPU, do not inherit each other's), with
  ``phase_times`` phase_s (forward / backward / optimizer);
  on each piece's first step setup_s (seconds from the call to that step); every ``val_every`` steps
  val_loss, val_loss_se, val_batch_losses and val_s (the evaluation's seconds); every ``probe_every`` steps
  probe_s (the probe's seconds)),
  ``probes.jsonl`` (every ``probe_every`` steps), ``config.json`` (run config, recipe, versions),
  ``checkpoint.pt`` (every ``ckpt_every`` steps, when stopped, and at the end unless ``final_checkpoint`` is
  off; never with ``ckpt_every=0``); then
  ``OUT/verdict.json`` and ``OUT/curves.png`` from the curve comparison;
* a run may stop at a step with its checkpoint (``stop_at_step``: a trunk, on the whole run's schedule) and a run
  may start from another's checkpoint at a step (``fork_from`` / ``fork_step``: a fork,
  ``convergence.train.checkpoint``), with the trunk's records up to there copied into its ``metrics.jsonl``;
* where the run lives is a placement (``convergence.train.placement``): ``Single`` for one process,
  ``Distributed`` (``convergence.train.distributed``) for ``--ep N`` under torchrun. World size 1 under
  FSDP2 is bit-identical to ``Single`` (tests/convergence/train/test_distributed.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import resource
import shutil
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from convergence.train import checkpoint as ckpt_mod
from convergence.train import data as data_mod
from convergence.train.checkpoint import JsonlLog
from convergence.train.model import Transformer, build_initialised
from convergence.train.placement import CHECKPOINT_FILE, HostStateAdamW, Single, deterministic_mode
from convergence.train.stopping import stop_requested
from numerics.errors import BadInput
from numerics.files import atomic_write, removed_if_left_empty, writable_dir
from numerics.layer.configs import get_config
from numerics.layer.recipes import apply_recipe, get_recipe


@dataclass(frozen=True)
class TrainConfig:
    model: str
    recipes: tuple[str, ...]
    steps: int
    seed: int = 0  # initial weights (and, unless data_seed says otherwise, the order of the training data)
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
    mxfp8_kernel: str = "auto"  # numerics.layer.mxfp8.KERNELS, or auto: real on SM100, emulated elsewhere
    data_seed: int | None = None  # order of the training windows; None: ``seed`` (plain seeds vary both)
    row_order: int | None = None  # None: batch rows as drawn; N: permuted by (N, step), a benign reduction order
    activation_checkpointing: bool = False  # blocks recomputed in backward (the CLI turns it on for 16b)
    phase_times: bool = False  # time forward / backward / optimizer apart (synchronizes between them on a GPU)
    optimizer_state: str = "auto"  # convergence.train.placement: device, host, or auto (what the memory check fits)
    layers: int = 0  # 0: the model's depth; N: its first N layers at the model's widths (model_config)
    fork_from: str | None = None  # a trunk's run folder: start from its checkpoint at fork_step (train.checkpoint)
    fork_step: int = 0

    @property
    def order_seed(self) -> int:
        """The seed of the training data's order: ``data_seed``, or ``seed`` when that is None."""
        return self.seed if self.data_seed is None else self.data_seed

    def fields_for_resume(self) -> dict:
        """What must match for --resume to continue a run (everything that shapes the curve)."""
        d = dataclasses.asdict(self)
        d.pop("recipes")
        d.pop("phase_times")  # a measurement, not the curve
        d.pop("optimizer_state")  # where AdamW's moments wait between steps: the same bits either way
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


def evaluates(step: int, steps: int, val_every: int) -> bool:
    """Whether a run of ``steps`` steps evaluates after step ``step``: every ``val_every`` steps and at its last
    (never with ``val_every`` 0)."""
    return bool(val_every) and (step % val_every == 0 or step == steps)


def evaluation_steps(steps: int, val_every: float) -> list[int]:
    """The steps after which a run of ``steps`` steps evaluates (``evaluates``, asked only of the multiples of
    ``val_every`` and the last step: a plan of a million steps is checked at each of its levels)."""
    every = int(val_every)
    candidates = sorted({*range(every, steps + 1, every), steps}) if every else []
    return [s for s in candidates if evaluates(s, steps, every)]


def lr_at(cfg: TrainConfig, step: int) -> float:
    """Multiplier of the peak lr for optimizer step ``step`` (0-based): linear warmup, then cosine."""
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


REAL_VOCAB_MODELS = ("16b",)  # models that keep their own vocabulary size whatever the tokenizer


def model_config(cfg: TrainConfig, vocab_size: int):
    """The run's ``ModelConfig``: its model's shapes with the tokenizer's vocabulary, except that the 16b keeps
    the real model's 102,400 rows when the tokenizer has fewer ids (the embedding and the output head, 0.4B
    parameters, at their real size; the rows no token uses are still trained by the softmax), and
    only its first ``cfg.layers`` layers when that is set (a 16b checkpoint is 176 GiB at 27 layers)."""
    base = get_config(cfg.model)
    if cfg.model in REAL_VOCAB_MODELS:
        vocab_size = max(vocab_size, base.vocab_size)
    return dataclasses.replace(base, vocab_size=vocab_size, n_layers=cfg.layers or base.n_layers)


def build_model(cfg: TrainConfig, vocab_size: int) -> Transformer:
    return build_initialised(model_config(cfg, vocab_size), cfg.seed)


def fingerprint(model: torch.nn.Module) -> str:
    """A short hash of the model's weights, bit for bit: SHA-256 over each state tensor's name, dtype, shape and
    bytes. Not float sums per tensor: those depend on the CPU thread count above torch's parallel grain (a
    torchrun rank, one thread, and a single process would fingerprint the same weights differently), and
    summing the 16b's 63 GB took ~110 s of its start-up on 2 x H200, where hashing them at SHA-256's ~1.8 GB/s
    takes ~35 s."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}:".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    return "sha256:" + h.hexdigest()[:16]


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
    atomic_write(run_dir / "config.json", json.dumps(config, indent=2, default=str) + "\n", force=True)


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig):
    """AdamW (0.9, 0.95), weight decay on matrices only, and the warmup + cosine schedule; its moments in host
    memory between steps with ``optimizer_state="host"`` (the same bits, ``convergence.train.placement``)."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    adamw = HostStateAdamW if cfg.optimizer_state == "host" else torch.optim.AdamW
    opt = adamw(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, foreach=False,
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(cfg, s))
    return opt, sched


def loss_of(model, tokens: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Next-token cross-entropy of ``tokens`` [b, s+1], forward under BF16 autocast, loss in FP32."""
    inp, tgt = tokens[:, :-1].to(device), tokens[:, 1:].to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        logits = model(inp)
    return F.cross_entropy(logits.float().flatten(0, 1), tgt.flatten())


@torch.no_grad()
def evaluate(model, batches: data_mod.Batches, cfg: TrainConfig, place: Single) -> dict:
    """Loss over the fixed validation batches: ``val_loss`` (their mean), ``val_loss_se`` (its standard error
    from the spread of the per-batch losses; None for one batch) and ``val_batch_losses`` (each batch's, in
    order: a paired comparison takes the difference batch by batch). Leaves the expert counters as it
    found them."""
    moes = [m for _, m in model.moe_layers()]
    saved = [m.tokens_per_expert.clone() for m in moes]
    losses = [place.mean(loss_of(model, place.rows(b), place.device)) for b in batches.eval_batches(cfg.val_batches)]
    for m, s in zip(moes, saved):
        m.tokens_per_expert.copy_(s)
    mean = sum(losses) / len(losses)
    n = len(losses)
    se = math.sqrt(sum((x - mean) ** 2 for x in losses) / (n - 1) / n) if n > 1 else None
    return {"val_loss": mean, "val_loss_se": se, "val_batch_losses": losses}


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


# what the machine measured (time, memory) rather than what the run computed: two runs with the same
# arithmetic differ only here (ep-identity, the resume and kernel identity tests compare everything else)
MEASURED_FIELDS = ("tokens_per_s", "dispatch_combine_s", "dispatch_combine_share", "host_peak_gib", "gpu_peak_gib",
                   "phase_s", "setup_s", "val_s", "probe_s")


def computed(record: dict) -> dict:
    """A metrics record without its ``MEASURED_FIELDS``: the part two identical runs share bit for bit."""
    return {k: v for k, v in record.items() if k not in MEASURED_FIELDS}


class _PhaseClock:
    """Seconds of each phase of a step, when ``device`` is given (None: nothing is timed or synchronized):
    on a GPU each mark waits for the queued work, so a phase is charged for its own kernels."""

    def __init__(self, device: torch.device | None):
        self.device, self.spans = device, {}
        self._last = time.perf_counter()

    def mark(self, name: str) -> None:
        if self.device is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.spans[name], self._last = now - self._last, now


def _reset_peak_memory(device: torch.device) -> None:
    """Start both peaks afresh: CUDA's allocator statistics, and the process's resident-set high-water mark
    (Linux: writing 5 to /proc/self/clear_refs; elsewhere the host peak stays the process's)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _peak_memory(device: torch.device, place) -> dict:
    """The piece's peak so far (``_reset_peak_memory``), the largest over ranks: GPU memory PyTorch allocated
    (on CUDA) and the process's resident host memory (Linux ru_maxrss, KiB), in GiB."""
    host = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    if device.type != "cuda":
        return {"host_peak_gib": place.max([host])[0]}
    gpu, host = place.max([torch.cuda.max_memory_allocated(device) / 2**30, host])
    return {"gpu_peak_gib": gpu, "host_peak_gib": host}


def train_recipe(cfg: TrainConfig, recipe_name: str, run_dir: Path, tokens: data_mod.TokenData, *,
                 place: Single | None = None, resume: bool, progress: bool = True,
                 stop_after_s: float | None = None, final_checkpoint: bool = True,
                 stop_at_step: int | None = None) -> bool:
    """Train one recipe into ``run_dir`` on ``place`` (default: one process on ``cfg.device``); returns True
    when it reached ``cfg.steps`` (or ``stop_at_step``: there it checkpoints and stops, a trunk for forks, on the
    whole run's schedule). ``final_checkpoint=False`` skips the checkpoint of the last step, for a caller that
    deletes it (the protocol: 11 GB of the proxy's weights and moments written, then removed). A ``cfg.fork_from``
    run without a checkpoint of its own starts from its trunk's (``convergence.train.checkpoint``)."""
    from convergence.train import probes as probes_mod

    t_enter = time.perf_counter()  # setup_s counts from here
    place = place or Single(torch.device(cfg.device))
    device = place.device
    _reset_peak_memory(device)
    recipe = get_recipe(recipe_name)
    model = build_model(cfg, tokens.vocab_size)
    model.activation_checkpointing = cfg.activation_checkpointing
    init_fp = fingerprint(model)
    experts = place.place(model)
    applied = apply_recipe(model, recipe, device, kernel=None if cfg.mxfp8_kernel == "auto" else cfg.mxfp8_kernel)
    place.after_recipe(model, experts)
    opt, sched = make_optimizer(model, cfg)
    metrics, probe_log = JsonlLog(run_dir / "metrics.jsonl"), JsonlLog(run_dir / "probes.jsonl")
    start, forked = 0, False
    origin = f"the trunk's checkpoint at step {cfg.fork_step}" if cfg.fork_from else "step 0"
    if resume and not place.has_checkpoint(run_dir) and (run_dir / "metrics.jsonl").exists() and place.writer:
        sys.stderr.write(f"{recipe_name}: no checkpoint yet (stopped before its first): starting again from {origin} "
                         f"({run_dir})\n")
    if resume and place.has_checkpoint(run_dir):
        data_mod.check_same_data(run_dir / "config.json", tokens.meta)
        start = place.load(run_dir, model, opt, sched)["step"]
        if progress and place.writer:  # a resume says so: the bar alone would start at start + 1 unexplained
            sys.stderr.write(f"{recipe_name}: resumed from the checkpoint at step {start} of {cfg.steps} "
                             f"({run_dir})\n")
    elif cfg.fork_from:
        start, forked = ckpt_mod.begin(cfg, run_dir, model, opt, sched, tokens, place, init_fp), True
        if progress and place.writer:
            sys.stderr.write(f"{recipe_name}: forked from {cfg.fork_from} at step {start} of {cfg.steps}\n")
    if stop_at_step is not None and start >= stop_at_step:
        return True  # already where it was asked to stop
    batches = data_mod.Batches(tokens.train, batch=cfg.batch, seq=cfg.seq, seed=cfg.order_seed, row_seed=cfg.row_order)
    val = data_mod.Batches(tokens.val, batch=cfg.batch, seq=cfg.seq, seed=cfg.seed)  # eval: the first windows
    held_out = {"batches": val.eval_count(cfg.val_batches), "asked": cfg.val_batches}
    if place.writer:
        run_dir.mkdir(parents=True, exist_ok=True)
        for log in (metrics, probe_log):
            if log.path.exists() and not forked:  # a fork's log was just written: the trunk's records to its step
                log.truncate_after(start)
        fork = ckpt_mod.fork_section(cfg, run_dir, batches.windows)
        write_run_config(run_dir, cfg, recipe, applied, model.cfg, tokens, init_fp, validation=held_out,
                         **({"fork": fork} if fork else {}), **place.extra_config())
        if progress and start == 0 and held_out["batches"] < cfg.val_batches:  # said once, at the run's start
            sys.stderr.write(f"{recipe_name}: the held-out split holds {held_out['batches']} batches of {cfg.batch} "
                             f"x {cfg.seq}; every evaluation takes all of them (--val-batches {cfg.val_batches} "
                             "asked)\n")
    moe_layers = model.moe_layers()
    coeff = model.cfg.load_balance_coeff
    params = list(model.parameters())
    t_start = time.monotonic()
    for step in range(start, cfg.steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        place.comm_seconds()  # start this step's dispatch / combine clock
        t0 = time.perf_counter()
        clock = _PhaseClock(device if cfg.phase_times else None)
        batch = batches.batch_at(step)
        loss = loss_of(model, place.rows(batch), device)
        clock.mark("forward")
        loss.backward()
        place.scale_expert_grads(experts)
        grad_norm = place.clip(params, cfg.grad_clip)
        clock.mark("backward")
        lr = sched.get_last_lr()[0]
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        clock.mark("optimizer")
        place.sum_counts([m.tokens_per_expert for _, m in moe_layers])
        shares = {f"layer{i}": m.end_step(coeff) for i, m in moe_layers}
        loss_f = place.mean(loss)
        if device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        done = step + 1
        rec = {
            "step": done, "loss": loss_f, "grad_norm": float(grad_norm), "lr": lr,
            "tokens": done * cfg.batch * cfg.seq, "tokens_per_s": cfg.batch * cfg.seq / dt,
            "expert_load_max_share": shares,
        } | _peak_memory(device, place)
        if cfg.phase_times:  # the slowest rank's, each phase
            rec["phase_s"] = dict(zip(clock.spans, place.max(list(clock.spans.values()))))
        if step == start:  # this piece's start-up: model, init, fingerprint, recipe, optimizer, resume
            rec["setup_s"] = t0 - t_enter
        comm = place.comm_seconds()
        if comm is not None:
            rec |= {"dispatch_combine_s": comm, "dispatch_combine_share": comm / dt}
        if evaluates(done, cfg.steps, cfg.val_every):
            t_val = time.perf_counter()
            rec |= evaluate(model, val, cfg, place)
            rec["val_s"] = time.perf_counter() - t_val  # the losses are floats: the evaluation has finished
        if not math.isfinite(loss_f):
            rec["diverged"] = True
        if cfg.probe_every and done % cfg.probe_every == 0:  # every rank probes (collectives); rank 0 writes its own
            t_probe = time.perf_counter()
            probed = probes_mod.probe(model, place.rows(batch), recipe=recipe, device=device,
                                      kernel=applied.get("kernel"))
            rec["probe_s"] = time.perf_counter() - t_probe  # the figures are floats: the probe has finished
            if place.writer:
                probe_log.append({"step": done} | probed | ({"rank": 0, "ranks": place.world} if place.world > 1
                                                            else {}))
        if place.writer:
            metrics.append(rec)
        # out of time: the piece's own deadline, or a scheduler's signal inside stopping.stop_on_signals
        out_of_time = place.any((stop_after_s is not None and time.monotonic() - t_start > stop_after_s)
                                or stop_requested() is not None)
        last = done == cfg.steps
        stop_here = done == stop_at_step and not last
        if cfg.ckpt_every and (final_checkpoint or not last) and (done % cfg.ckpt_every == 0 or last or out_of_time
                                                                   or stop_here or not math.isfinite(loss_f)):
            place.save(run_dir, model, opt, sched, {
                "step": done, "data_position": {"step": done, "samples": done * cfg.batch, "seed": cfg.order_seed,
                                                  "row_order": cfg.row_order},
                "config": json.loads(json.dumps(cfg.fields_for_resume(), default=str)),
            })
        if progress and place.writer:
            _progress(recipe_name, done, cfg.steps, loss_f, rec["tokens_per_s"])
        if not math.isfinite(loss_f):
            return True  # diverged: the comparison reports it; continuing would only add NaNs
        if stop_here:
            return True
        if out_of_time and done < cfg.steps:
            return False
    return True


def _verdict_files(out: Path) -> list[Path]:
    """verdict.json and its figures (curves.png, or curves_<candidate>.png for several candidates) in ``out``:
    written, and replaced, together."""
    return [p for p in (out / "verdict.json", out / "curves.png", *sorted(out.glob("curves_*.png"))) if p.is_file()]


def _verdict_recipes(out: Path) -> list[str] | None:
    """The recipes an existing verdict.json compared (None when there is none or it cannot be read)."""
    try:
        v = json.loads((out / "verdict.json").read_text())
        return [v["baseline"], *v["candidates"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_run_dir(cfg: TrainConfig, out: Path, resume: bool, force: bool) -> None:
    """Refuse, before any work, a run folder that cannot be written, or whose runs or verdict this command
    would overwrite without ``--force`` (``--resume`` continues the same recipes)."""
    if resume and force:
        raise BadInput("--resume and --force exclude each other")
    if resume and not any((out / r).is_dir() and any((out / r).iterdir()) for r in cfg.recipes):
        # training from step 1 instead would hide a mistyped --out
        raise BadInput(f"--resume: {out} holds no run of {', '.join(cfg.recipes)} to continue; check --out, or leave "
                       "--resume out to start one")
    writable_dir(out, what="run folder")
    existing = [out / r for r in cfg.recipes if (out / r).exists() and any((out / r).iterdir())]
    if force:
        for d in existing:
            shutil.rmtree(d)
        for f in _verdict_files(out):
            f.unlink()
        return
    if existing and not resume:
        raise BadInput(f"{existing[0]} already holds a run; pass --resume to continue it or --force to "
                       "overwrite it")
    # the verdict and its figures are replaced together; figures without a verdict.json guard a new folder, not
    # one continued with --resume (compare_and_plot writes verdict.json first: a kill leaves at most a figure short)
    verdict_files = _verdict_files(out)
    if len(cfg.recipes) > 1 and ((out / "verdict.json").exists() or (verdict_files and not resume)):
        before = _verdict_recipes(out)
        if before is None or sorted(before) != sorted(cfg.recipes):
            first = out / "verdict.json" if before else verdict_files[0]
            raise BadInput(f"{first} compares {', '.join(before) if before else 'other runs'}; this "
                           f"command would replace it with {', '.join(cfg.recipes)}: choose another --out, or pass "
                           "--force to replace it")
    for d in existing if resume else ():
        _check_resumable(d, cfg.ckpt_every, cfg.fork_step if cfg.fork_from else 0)
    if resume:
        want = json.loads(json.dumps(cfg.fields_for_resume(), default=str))
        # a field added since the run started is absent from its config: it ran with that field's default
        defaults = json.loads(json.dumps(dataclasses.asdict(TrainConfig(cfg.model, cfg.recipes, cfg.steps)),
                                         default=str))
        for d in existing:
            path = d / "config.json"
            if not path.exists():
                continue
            have = json.loads(path.read_text())["train"]
            for key, value in want.items():
                if isinstance(value, dict) and isinstance(have.get(key), dict):
                    have[key] = defaults[key] | have[key]
                if have.setdefault(key, defaults.get(key)) != value:
                    raise BadInput(
                        f"--resume: {path} was run with {key}={have.get(key)!r}, the command line says "
                        f"{key}={value!r}"
                    )


def _check_resumable(run_dir: Path, ckpt_every: int, first_step: int = 0) -> None:
    """A run that logged steps past its first checkpoint but has none cannot continue: say so instead of restarting
    it (it was deleted, or never written: --ckpt-every 0). One killed before its first checkpoint was in place
    starts again from step 0, as any resume redoes the steps after its checkpoint (``train_recipe`` says so),
    rather than being refused, which would leave only --force, restarting every recipe of the command. A fork counts
    its own steps, after ``first_step`` (the records before are its trunk's, copied)."""
    logged = [r for r in JsonlLog(run_dir / "metrics.jsonl").records() if r.get("step", 0) > first_step]
    has_ckpt = (run_dir / CHECKPOINT_FILE).exists() or (run_dir / "checkpoint").exists() \
        or (run_dir / "checkpoint.old").exists()
    if logged and not has_ckpt and not (ckpt_every and len(logged) <= ckpt_every):
        raise BadInput(f"--resume: {run_dir} logged {len(logged)} steps but has no checkpoint to continue from "
                       "(checkpoint.pt or checkpoint/ is missing); restore it, or start it again alone: the same "
                       f"command with --recipe {run_dir.name} only and --force (--force restarts every recipe given)")


def compare_and_plot(out: Path, recipes: Sequence[str]) -> dict:
    """verdict.json and curves.png through convergence.curves.compare / convergence.curves.plots."""
    baseline = "bf16" if "bf16" in recipes else recipes[0]
    candidates = [r for r in recipes if r != baseline]
    if not candidates:  # nothing compared: no verdict.json, so an earlier one is never replaced by a null
        return {"verdict": None, "reason": f"only one recipe ({baseline}); nothing to compare"}
    # here, not at import: scipy and matplotlib take ~1.5 s of a process's start, and one recipe needs neither
    from convergence.curves.compare import compare_paths
    from convergence.curves.plots import plot_comparison

    result = {"baseline": baseline, "candidates": {}}
    for c in candidates:
        result["candidates"][c] = compare_paths([out / baseline / "metrics.jsonl"], out / c / "metrics.jsonl")
    result["verdict"] = result["candidates"][candidates[0]]["verdict"] if len(candidates) == 1 \
        else {c: r["verdict"] for c, r in result["candidates"].items()}
    # verdict.json first, then its figures: a kill between leaves a folder --resume completes (check_run_dir);
    # a kill mid-write left a hidden temporary (numerics.files.atomic_path) that nothing else removes
    for stale in [*out.glob(".verdict.json.*.tmp"), *out.glob(".curves*.png.*.tmp")]:
        stale.unlink(missing_ok=True)
    atomic_write(out / "verdict.json", json.dumps(result, indent=2, default=str) + "\n", force=True)
    for c, r in result["candidates"].items():
        # force: check_run_dir let this command replace the folder's verdict and figures (--force, or the same
        # recipes continued with --resume), and refused before any step otherwise
        plot_comparison(r, out / ("curves.png" if len(candidates) == 1 else f"curves_{c}.png"), force=True)
    return result


def run(cfg: TrainConfig, out: Path, *, resume: bool = False, force: bool = False, progress: bool = True,
        stop_after_s: float | None = None, timeout_s: float = 300.0, stop_at_step: int | None = None) -> dict | None:
    """All recipes of ``cfg`` into ``out``; the verdict when every recipe finished (on rank 0), else None.
    ``stop_at_step``: every recipe stops there with a checkpoint (trunks for forks); the result then has no verdict
    and says so.

    ``cfg.ep`` >= 1 runs on the torchrun group (``convergence.train.distributed``); 0 on one process."""
    out = Path(out)
    if stop_at_step is not None and not (0 < stop_at_step < cfg.steps and cfg.ckpt_every):
        raise BadInput(f"--stop-at-step must be inside the run, from 1 to {cfg.steps - 1}, with checkpoints (not "
                       f"--ckpt-every 0), got {stop_at_step}")
    if cfg.fork_from and not (resume and all((out / r / CHECKPOINT_FILE).exists() for r in cfg.recipes)):
        ckpt_mod.check_fork(cfg)  # before any work: the trunk, its checkpoint's step, its configuration
    with removed_if_left_empty(out), deterministic_mode(cfg.deterministic, cfg.device):
        if cfg.ep:
            from convergence.train.distributed import open_group

            with open_group(cfg, timeout_s, lambda: check_run_dir(cfg, out, resume, force)) as place:
                return _run_recipes(cfg, out, place, resume, progress, stop_after_s, stop_at_step)
        check_run_dir(cfg, out, resume, force)
        return _run_recipes(cfg, out, Single(torch.device(cfg.device)), resume, progress, stop_after_s, stop_at_step)


def check_memory(cfg: TrainConfig, vocab_size: int, place: Single) -> TrainConfig:
    """Before the first step: one line (BadInput) when the run cannot fit its GPU's memory, or on CPU its
    share of the host's (``convergence.train.memory``); an estimate that itself fails only warns, it never
    stops a run. Returns ``cfg`` with ``optimizer_state`` decided: ``auto`` keeps AdamW's moments on the GPU
    when they fit there, else in host memory (``convergence.train.placement``; the same bits, slower)."""
    from convergence.train import memory

    share, gpu = 1.0, place.device.type == "cuda"
    host_share = memory.host_bytes() / int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if gpu:
        index = place.device.index if place.device.index is not None else torch.cuda.current_device()
        share = getattr(torch.cuda, "get_per_process_memory_fraction", lambda _d: 1.0)(index)  # needs an index
        capacity, where = torch.cuda.get_device_properties(index).total_memory * share, "GPU"
    else:
        capacity, where = host_share, "CPU process"
    if cfg.optimizer_state == "host" and not gpu:
        raise BadInput("--optimizer-state host needs --device cuda (on a CPU the moments are in host memory already)")
    shared = f" (held to {share:.0%} of the GPU: protocol --parallel)" if share < 1 else ""

    def check(state: str) -> None:
        for measure in (False, True):  # the exact model states first: a model that cannot fit stops in a second
            try:
                need = memory.estimate(model_config(cfg, vocab_size), batch=cfg.batch, seq=cfg.seq, ranks=place.world,
                                       ep=cfg.ep or 1, device=place.device, checkpointing=cfg.activation_checkpointing,
                                       activations=measure, optimizer_state=state)
            except Exception as exc:  # noqa: BLE001 - the estimate is advice; training decides
                warnings.warn(f"memory estimate failed ({type(exc).__name__}: {exc}); starting anyway", stacklevel=3)
                return
            memory.check_fits(need, capacity, model=f"--model {cfg.model}{shared}", where=where)
            memory.check_host(need, host_share)

    *first, last = {"auto": ("device", "host") if gpu else ("device",)}.get(cfg.optimizer_state,
                                                                            (cfg.optimizer_state,))
    for state in first:  # auto: the moments on the GPU when they fit there
        try:
            check(state)
            return _placed(cfg, state, place)
        except BadInput:
            continue
    check(last)  # the last placement tried (auto: host, the one that needs the least GPU memory) says why not
    return _placed(cfg, last, place)


def _placed(cfg: TrainConfig, state: str, place: Single) -> TrainConfig:
    """``cfg`` with its optimizer placement decided, refusing what that placement cannot do yet."""
    if state == "host" and place.world > 1 and cfg.ckpt_every:
        raise BadInput("AdamW's moments in host memory (--optimizer-state host, or auto when they do not fit the "
                       "GPU) are not written to distributed checkpoints yet (DTensor.from_local would copy them all "
                       "back to the GPU): pass --ckpt-every 0, or --optimizer-state device where the model fits")
    return dataclasses.replace(cfg, optimizer_state=state)


def _run_recipes(cfg: TrainConfig, out: Path, place: Single, resume: bool, progress: bool,
                 stop_after_s: float | None, stop_at_step: int | None = None) -> dict | None:
    tokens = place.load_tokens(cfg.data)
    data_mod.Batches(tokens.train, batch=cfg.batch, seq=cfg.seq, seed=cfg.order_seed)  # fail early: too few
    data_mod.Batches(tokens.val, batch=cfg.batch, seq=cfg.seq, seed=cfg.seed)
    cfg = check_memory(cfg, tokens.vocab_size, place)
    t0 = time.monotonic()
    for i, name in enumerate(cfg.recipes):
        left = None if stop_after_s is None else stop_after_s - (time.monotonic() - t0)
        if i > 0 and ((left is not None and left <= 0) or stop_requested()):  # out of time: the next call starts it
            return None
        if not train_recipe(cfg, name, out / name, tokens, place=place, resume=resume, progress=progress,
                            stop_after_s=left, stop_at_step=stop_at_step):
            return None
    place.barrier()
    if stop_at_step is not None:  # trunks: no verdict on half runs
        return {"verdict": None, "stopped_at_step": stop_at_step,
                "reason": f"stopped at step {stop_at_step} of {cfg.steps} as asked, each with its checkpoint: a trunk "
                          f"to fork with --fork-from {out}/<recipe> --fork-step {stop_at_step}, or continued with "
                          "--resume"} if place.writer else None
    return compare_and_plot(out, cfg.recipes) if place.writer else None
