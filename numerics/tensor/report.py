"""Tensor-level report: each subject's MXFP8 cast against BF16/FP32 input and against the exact oracle.

``tensor_report(size=, seed=, device=, subjects=) -> {"header": {...}, "records": [...]}`` runs, for each
subject (``numerics.tensor.subjects``: every importable one by default), element format it casts to
(e4m3, e5m2; e2m1 for torchao),
scale mode the subject implements and input family (``numerics.tensor.families``), the subject's MX
round trip (SQNR, max abs error against the input) and its cast's bytes against ``numerics.tensor.mx``
block by block (``numerics.tensor.compare``): a block is bit-exact when its scale byte and its 32
element bytes equal the oracle's; the others are claimed by a known finding of that subject
(``numerics.tensor.findings``, FINDINGS.md) or counted as unexplained.

``python -m numerics report [--size quick|full] [--seed S] [--device cpu|cuda] [--subject NAME]... [--out DIR]
[--force]`` prints one table per subject and writes report.json and report.md under DIR (default
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
from numerics.cli import ArgumentParser, CLIError, run_main, seed_arg
from numerics.errors import BadInput
from numerics.files import atomic_write
from numerics.tensor import families, mx
from numerics.tensor import subjects as registry
from numerics.tensor.compare import compare

ELEMS = ("e4m3", "e5m2", "e2m1")  # the tables' row order
OUTPUTS = ("report.json", "report.md")


def _torch_input(x: np.ndarray, family: str, device: str) -> torch.Tensor:
    t = torch.from_numpy(x)
    if families.INPUT_DTYPE[family] == "bfloat16":
        t = t.to(torch.bfloat16)  # exact: the family's values are BF16-representable
    return t.to(device)


def agreement(x: np.ndarray, elem: str, mode: str, got_scale: np.ndarray, got_elems: np.ndarray, *,
              subject: str = "torchao") -> dict:
    """Blocks where (got_scale, got_elems) equal the oracle's bytes, and how the rest are explained."""
    return compare(x, registry.get(subject), elem, mode, got_scale, got_elems).counts()


def _subjects(names: Sequence[str] | None) -> list[registry.Subject]:
    if names is None:
        return registry.available()
    chosen = [registry.get(n) for n in names]
    for s in chosen:
        if (why := s.unavailable()) is not None:
            raise BadInput(f"subject {s.name} is not importable: {why}")
    return chosen


def tensor_report(*, size: str = "quick", seed: int = 0, device: str = "cpu",
                  subjects: Sequence[str] | None = None) -> dict:
    """One record per (subject, elem, mode, family); see the module docstring."""
    if size not in families.SHAPES:
        raise ValueError(f"size={size!r} is not known; choose one of {', '.join(families.SHAPES)}")
    chosen = _subjects(subjects)
    shape = families.SHAPES[size]
    records = []
    for family in families.FAMILIES:
        x = families.generate(family, shape, seed)
        t = _torch_input(x, family, device)
        for subject in chosen:
            for elem in subject.elems:
                for mode in subject.modes:
                    start = time.perf_counter()
                    out = subject.roundtrip(t, elem, mode)
                    ref = t.float()
                    got_scale, got_elems = subject.quantize(t, elem, mode)
                    rec = {"subject": subject.name, "elem": elem, "mode": mode, "family": family,
                           "input_dtype": families.INPUT_DTYPE[family], "shape": list(shape),
                           "sqnr_db": metrics.sqnr_db(ref, out), "max_abs_err": metrics.max_abs_err(ref, out)}
                    rec |= compare(x, subject, elem, mode, got_scale, got_elems).counts()
                    records.append(rec)
                    print(f"  {subject.name:<12} {family:<9} {elem} {mode:<5} SQNR {rec['sqnr_db']:6.2f} dB, "
                          f"{rec['blocks_unexplained']} unexplained block(s) "
                          f"({time.perf_counter() - start:.1f} s)", file=sys.stderr, flush=True)
    header = environment.describe() | {"size": size, "seed": seed, "device": device, "block": 32,
                                       "families": {f: families.INPUT_DTYPE[f] for f in families.FAMILIES},
                                       "subjects": {s.name: {"what": s.what, "version": s.version()}
                                                    for s in chosen}}
    return {"header": header, "records": records}


def _fmt_known(known: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in known.items() if v) or "-"


def format_tables(report: dict) -> str:
    """One Markdown table per subject: a row per (elem, mode, family) with SQNR, max error and oracle agreement."""
    out = []
    described = report["header"].get("subjects", {})
    names = list(dict.fromkeys(r.get("subject", "torchao") for r in report["records"]))
    for name in names:
        info = described.get(name, {})
        out += [f"### {name} {info.get('version', '')}".rstrip(), "", info.get("what", ""), "",
                "| elem | mode | family | input | SQNR dB | max abs err | blocks | bit-exact | known findings "
                "| unexplained |", "|---|---|---|---|---:|---:|---:|---:|---|---:|"]
        for elem in ELEMS:
            for mode in mx.MODES:
                for r in report["records"]:
                    if (r.get("subject", "torchao"), r["elem"], r["mode"]) != (name, elem, mode):
                        continue
                    out.append(f"| {elem} | {mode} | {r['family']} | {r['input_dtype']} | {r['sqnr_db']:.2f} "
                               f"| {r['max_abs_err']:.3g} | {r['blocks']} | {r['blocks_bit_exact']} "
                               f"| {_fmt_known(r['blocks_known_findings'])} | {r['blocks_unexplained']} |")
        out.append("")
    return "\n".join(out)


def to_markdown(report: dict) -> str:
    h = report["header"]
    lines = ["# Tensor-level report: MX casts vs BF16/FP32 input and vs the exact oracle", "",
             f"size {h['size']} (shape {families.SHAPES[h['size']]}), seed {h['seed']}, device {h['device']}; "
             f"torch {h.get('torch')}, torchao {h.get('torchao')}, commit {h.get('mxval_commit')}", "",
             "SQNR and max abs error: the subject's round trip against the input. Bit-exact: blocks whose "
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
    parser.add_argument("--seed", type=seed_arg, default=0)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--subject", action="append", choices=list(registry.SUBJECTS),
                        help="repeatable; default: every subject importable here")
    parser.add_argument("--out", type=Path, help="results folder (default results/tensor-<timestamp>/)")
    parser.add_argument("--force", action="store_true", help="overwrite report.json / report.md in --out")
    args = parser.parse_args(argv)
    if args.seed < 0:
        raise CLIError(f"--seed must be >= 0, got {args.seed}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise CLIError("--device cuda: no CUDA device is available here")
    chosen = _subjects(args.subject)  # an unimportable --subject fails before anything is written
    out = args.out or _default_out()
    _prepare_out(out, args.force)
    print(f"tensor report: size {args.size}, seed {args.seed}, device {args.device} -> {out}",
          file=sys.stderr, flush=True)
    report = tensor_report(size=args.size, seed=args.seed, device=args.device, subjects=[s.name for s in chosen])
    atomic_write(out / "report.json", json.dumps(report, indent=1) + "\n", force=True)  # _prepare_out asked for --force
    atomic_write(out / "report.md", to_markdown(report) + "\n", force=True)
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
