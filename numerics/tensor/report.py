"""Tensor-level report: torchao's MXFP8 cast against BF16/FP32 input and against the exact oracle.

``tensor_report(size=, seed=, device=) -> {"header": {...}, "records": [...]}`` runs, for each
element dtype (e4m3, e5m2), scale mode (floor, rceil, ceil, even) and input family
(``numerics.tensor.families``), torchao's MX round trip (SQNR, max abs error against the input) and its
cast's bytes against ``numerics.tensor.mx`` block by block. A block is bit-exact when its scale byte and
its 32 element bytes equal the oracle's (element bytes of a NaN-scale block are not compared, as
in tests/numerics/tensor/test_torchao_cast.py); the others are claimed by a known finding
(``numerics.tensor.findings``, FINDINGS.md) or counted as unexplained.

``python -m numerics report [--size quick|full] [--seed S] [--device cpu|cuda] [--out DIR] [--force]``
prints one table per (dtype, mode) and writes report.json and report.md under DIR (default
results/tensor-<timestamp>/); exit 1 if any block is unexplained, 2 on bad input.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from numerics import environment, metrics
from numerics.cli import ArgumentParser, CLIError, run_main
from numerics.tensor import families, findings, mx, torchao_cast

ELEMS = ("e4m3", "e5m2")
OUTPUTS = ("report.json", "report.md")


def _torch_input(x: np.ndarray, family: str, device: str) -> torch.Tensor:
    t = torch.from_numpy(x)
    if families.INPUT_DTYPE[family] == "bfloat16":
        t = t.to(torch.bfloat16)  # exact: the family's values are BF16-representable
    return t.to(device)


def agreement(x: np.ndarray, elem: str, mode: str, got_scale: np.ndarray, got_elems: np.ndarray) -> dict:
    """Blocks where (got_scale, got_elems) equal the oracle's bytes, and how the rest are explained."""
    # torchao treats Inf as the largest magnitude; the oracle's matching reading (see test_torchao_cast)
    scale, elems = mx.quantize(x, elem, mode, inf="saturate")
    nblocks = scale.shape
    same_elems = (elems.reshape(*nblocks, -1) == got_elems.reshape(*nblocks, -1)).all(axis=-1)
    exact = (scale == got_scale) & (same_elems | (scale == 0xFF))
    unexplained = ~exact
    claimed = {}
    for fid, mask in findings.known_blocks(x, elem, mode, scale).items():
        claimed[fid] = int((mask & unexplained).sum())
        unexplained &= ~mask
    return {"blocks": int(scale.size), "blocks_bit_exact": int(exact.sum()),
            "blocks_known_findings": claimed, "blocks_unexplained": int(unexplained.sum())}


def tensor_report(*, size: str = "quick", seed: int = 0, device: str = "cpu") -> dict:
    """One record per (elem, mode, family); see the module docstring."""
    if size not in families.SHAPES:
        raise ValueError(f"size={size!r} is not known; choose one of {', '.join(families.SHAPES)}")
    shape = families.SHAPES[size]
    records = []
    for family in families.FAMILIES:
        x = families.generate(family, shape, seed)
        t = _torch_input(x, family, device)
        for elem in ELEMS:
            for mode in mx.MODES:
                start = time.perf_counter()
                out = torchao_cast.roundtrip(t, elem, mode)
                ref = t.float()
                got_scale, got_elems = torchao_cast.quantize(t, elem, mode)
                rec = {"elem": elem, "mode": mode, "family": family,
                       "input_dtype": families.INPUT_DTYPE[family], "shape": list(shape),
                       "sqnr_db": metrics.sqnr_db(ref, out), "max_abs_err": metrics.max_abs_err(ref, out)}
                rec |= agreement(x, elem, mode, got_scale, got_elems)
                records.append(rec)
                print(f"  {family:<9} {elem} {mode:<5} SQNR {rec['sqnr_db']:6.2f} dB, "
                      f"{rec['blocks_unexplained']} unexplained block(s) "
                      f"({time.perf_counter() - start:.1f} s)", file=sys.stderr, flush=True)
    header = environment.describe() | {"size": size, "seed": seed, "device": device, "block": 32,
                                       "families": {f: families.INPUT_DTYPE[f] for f in families.FAMILIES}}
    return {"header": header, "records": records}


def _fmt_known(known: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in known.items() if v) or "-"


def format_tables(report: dict) -> str:
    """One Markdown table per (elem, mode): SQNR and max error per family, then oracle agreement."""
    out = []
    for elem in ELEMS:
        for mode in mx.MODES:
            rows = [r for r in report["records"] if r["elem"] == elem and r["mode"] == mode]
            if not rows:
                continue
            out += [f"### {elem} / {mode}", "",
                    "| family | input | SQNR dB | max abs err | blocks | bit-exact | known findings | unexplained |",
                    "|---|---|---:|---:|---:|---:|---|---:|"]
            for r in rows:
                out.append(f"| {r['family']} | {r['input_dtype']} | {r['sqnr_db']:.2f} | {r['max_abs_err']:.3g} "
                           f"| {r['blocks']} | {r['blocks_bit_exact']} | {_fmt_known(r['blocks_known_findings'])} "
                           f"| {r['blocks_unexplained']} |")
            out.append("")
    return "\n".join(out)


def to_markdown(report: dict) -> str:
    h = report["header"]
    lines = ["# Tensor-level report: torchao MX cast vs BF16/FP32 input and vs the exact oracle", "",
             f"size {h['size']} (shape {families.SHAPES[h['size']]}), seed {h['seed']}, device {h['device']}; "
             f"torch {h.get('torch')}, torchao {h.get('torchao')}, commit {h.get('mxval_commit')}", "",
             "SQNR and max abs error: torchao's MXTensor round trip against the input. Bit-exact: blocks whose "
             "scale and element bytes equal numerics.tensor.mx's; known findings: FINDINGS.md.", "",
             format_tables(report)]
    return "\n".join(lines)


def _default_out() -> Path:
    return Path("results") / f"tensor-{time.strftime('%Y%m%d-%H%M%S')}"


def _prepare_out(out: Path, force: bool) -> None:
    """Fail before any work: an existing output without --force, or a folder we cannot write."""
    if out.exists() and not out.is_dir():
        raise CLIError(f"--out {out} exists and is not a directory")
    clash = [name for name in OUTPUTS if (out / name).exists()]
    if clash and not force:
        raise CLIError(f"{out / clash[0]} exists; pass --force to overwrite it, or choose another --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CLIError(f"cannot create --out {out}: {exc.strerror or exc}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise CLIError(f"cannot write to --out {out}")


def _main(argv: Sequence[str] | None) -> int:
    parser = ArgumentParser(prog="python -m numerics report", description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(families.SHAPES), default="quick")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--out", type=Path, help="results folder (default results/tensor-<timestamp>/)")
    parser.add_argument("--force", action="store_true", help="overwrite report.json / report.md in --out")
    args = parser.parse_args(argv)
    if args.seed < 0:
        raise CLIError(f"--seed must be >= 0, got {args.seed}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise CLIError("--device cuda: no CUDA device is available here")
    out = args.out or _default_out()
    _prepare_out(out, args.force)
    print(f"tensor report: size {args.size}, seed {args.seed}, device {args.device} -> {out}",
          file=sys.stderr, flush=True)
    report = tensor_report(size=args.size, seed=args.seed, device=args.device)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "report.md").write_text(to_markdown(report) + "\n")
    print(format_tables(report))
    unexplained = sum(r["blocks_unexplained"] for r in report["records"])
    worst = min((r["sqnr_db"] for r in report["records"]), default=math.nan)
    print(f"wrote {out / 'report.json'} and {out / 'report.md'}; lowest SQNR {worst:.2f} dB; "
          f"{unexplained} unexplained block(s)")
    return 1 if unexplained else 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
