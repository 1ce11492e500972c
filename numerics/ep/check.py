"""``python -m numerics.ep check``: a backend against a reference, bit for bit, on many routings.

    torchrun --nproc-per-node 2 -m numerics.ep check --backend deepep --against reference
    torchrun --nproc-per-node 2 -m numerics.ep check --backend deepep-v2 --against reference
    python -m numerics.ep check --world 2          # CPU: spawns 2 gloo ranks, reference vs simulate

Every rank regenerates every rank's inputs from the case (``numerics.ep.strategies``), runs
``simulate`` for the expectation and the row provenance, runs the backend(s) (``numerics.ep.backends``),
and compares bits. Rank 0 prints a table with, per check, the first mismatch located by rank / row /
column and source rank and token, and the case that produced it (replay it with ``--spec``), then one
verdict line. Differences that a known finding explains (``numerics.ep.known``) are counted on their
row and do not fail the run: ``PASS (known: E1 on 44 values in 3 cases)``; ``--strict`` fails them.
Exit code 0 on PASS, 1 on FAIL (a mismatch, an error, or a known finding under ``--strict``), 2 on bad
input, which is refused before any case runs. Bad-input cases (``BAD_INPUTS``) run first: the rank
with the bad tensor must raise ValueError naming it, the others PeerInputError; the group must stay
usable for the cases after them.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from numerics.cli import ArgumentParser, CLIError, seed_arg
from numerics.ep import compare, known
from numerics.ep.backend import COMBINE_START, COMBINE_STARTS, PeerInputError, is_fp8
from numerics.ep.backends import BACKENDS, is_custom, make_backend, require
from numerics.ep.simulate import simulate
from numerics.ep.strategies import (
    EXPERTS,
    HIDDENS,
    MAX_TOKENS,
    PAYLOADS,
    CaseSpec,
    edge_specs,
    make_combine_input,
    make_inputs,
    sample_specs,
)
from numerics.errors import BadInput
from numerics.files import atomic_write, check_creatable

# defect -> (words the ValueError must contain, whether rank 0 may hold it)
BAD_INPUTS: dict[str, tuple[tuple[str, ...], bool]] = {
    "topk_out_of_range": (("topk_idx", "outside"), True),
    "topk_dtype": (("topk_idx", "int64"), True),
    "duplicate_expert": (("topk_idx", "twice"), True),
    "x_dtype": (("x must be", "bfloat16"), True),
    "weights_dtype": (("topk_weights", "float32"), True),
    "fp8_scales_shape": (("x[1]", "scales"), True),
    "experts_not_divisible": (("num_experts", "divisible"), True),
    "hidden_mismatch": (("x hidden size", "rank 0"), False),
    "topk_mismatch": (("top-k", "rank 0"), False),
}


@dataclass(frozen=True)
class BadInputSpec:
    world: int
    defect: str
    bad_rank: int


def _run(backend, x, idx, w, y, num_experts: int, *, twice: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if backend.has_layout:
        out["layout"] = backend.layout(idx, num_experts)
    out["dispatch"] = d = backend.dispatch(x, idx, w, num_experts)
    out["cached"] = backend.dispatch_cached(x, d.handle)
    out["combine"] = backend.combine(y, d.handle)
    if twice:  # determinism: an identical second call must give identical bits
        out["dispatch2"] = d2 = backend.dispatch(x, idx, w, num_experts)
        out["combine2"] = backend.combine(y, d2.handle)
    return out


def _payload_parts(prefix: str, x: Any) -> dict[str, torch.Tensor]:
    if is_fp8(x):
        return {f"{prefix}.fp8_data": x[0], f"{prefix}.fp8_scales": x[1]}
    return {f"{prefix}.bf16": x}


def compare_outputs(exp: dict[str, Any], got: dict[str, Any], *, rank: int, sim_rank,
                    known_out: dict[str, dict[str, dict[str, Any]]] | None = None) -> dict[str, str | None]:
    """Check name -> None (bit-identical, or only known findings) or the first unexplained mismatch,
    for one rank and one case. Known findings' counts go to ``known_out[check][finding]``."""
    rows = compare.recv_row_locator(sim_rank.recv_src_rank, sim_rank.recv_src_idx)
    checks: dict[str, str | None] = {}
    if "layout" in got and "layout" in exp:  # DeepEP V2 has no layout call
        el, gl = exp["layout"], got["layout"]
        checks["layout.num_tokens_per_rank"] = compare.diff(el.num_tokens_per_rank, gl.num_tokens_per_rank,
                                                            rank=rank)
        checks["layout.num_tokens_per_expert"] = compare.diff(el.num_tokens_per_expert, gl.num_tokens_per_expert,
                                                              rank=rank)
        checks["layout.is_token_in_rank"] = compare.diff(el.is_token_in_rank, gl.is_token_in_rank, rank=rank,
                                                         where=compare.layout_locator)
    ed, gd = exp["dispatch"], got["dispatch"]
    for prefix, e_x, g_x in (("dispatch.recv_x", ed.recv_x, gd.recv_x), ("dispatch_cached.recv_x",
                                                                         exp["cached"], got["cached"])):
        g_parts = _payload_parts(prefix, g_x) if is_fp8(g_x) == is_fp8(e_x) else {}
        for name, e_t in _payload_parts(prefix, e_x).items():
            checks[name] = (compare.diff(e_t, g_parts[name], rank=rank, where=rows) if name in g_parts
                            else f"rank {rank}: expected the {'FP8 pair' if is_fp8(e_x) else 'bf16 tensor'}")
    checks["dispatch.recv_topk_idx"] = compare.diff(ed.recv_topk_idx, gd.recv_topk_idx, rank=rank, where=rows)
    checks["dispatch.recv_topk_weights"] = compare.diff(ed.recv_topk_weights, gd.recv_topk_weights, rank=rank,
                                                        where=rows)
    checks["dispatch.num_recv_tokens_per_expert"] = compare.diff(
        list(ed.num_recv_tokens_per_expert), list(gd.num_recv_tokens_per_expert), rank=rank)
    where = compare.combine_locator(sim_rank.layout.is_token_in_rank)
    checks["combine"], found = compare.split_known(exp["combine"], got["combine"], rank=rank, nan_any=True,
                                                   where=where, known=known.for_check("combine"))
    if found and known_out is not None:
        known_out["combine"] = found
    return checks


def _determinism(got: dict[str, Any], rank: int) -> dict[str, str | None]:
    first, second = got["dispatch"], got["dispatch2"]
    msg = None
    for name, a in _payload_parts("recv_x", first.recv_x).items():
        msg = msg or compare.diff(a, _payload_parts("recv_x", second.recv_x)[name], rank=rank)
    msg = msg or compare.diff(first.recv_topk_idx, second.recv_topk_idx, rank=rank)
    msg = msg or compare.diff(first.recv_topk_weights, second.recv_topk_weights, rank=rank)
    return {"determinism.dispatch": msg,
            "determinism.combine": compare.diff(got["combine"], got["combine2"], rank=rank)}


class CaseRunner:
    """One per rank: runs a ``CaseSpec`` or ``BadInputSpec`` and returns this rank's verdicts."""

    def __init__(self, rank: int, world: int, device: torch.device, *, backend: str = "reference",
                 against: str = "simulate", num_sms: int | None = None, max_hidden: int = max(HIDDENS),
                 timeout_s: float = 120.0, deterministic: bool = False, combine_start: str = COMBINE_START):
        self.rank, self.world, self.device = rank, world, device
        self.combine_start = combine_start  # the expectation's convention (simulate, the --against reference)
        # torch.use_deterministic_algorithms for this rank while the runner lives (restored by close)
        self._deterministic_before = torch.are_deterministic_algorithms_enabled()
        if deterministic:
            torch.use_deterministic_algorithms(True)
        timeout = datetime.timedelta(seconds=timeout_s)
        self.subject = make_backend(backend, device=device, num_sms=num_sms, max_hidden=max_hidden, timeout=timeout)
        self.target = None
        if against != "simulate":
            self.target = make_backend(against, device=device, num_sms=num_sms, max_hidden=max_hidden,
                                       timeout=timeout, combine_start=combine_start)

    def close(self) -> None:
        for b in (self.subject, self.target):
            if b is not None:
                b.close()
        torch.use_deterministic_algorithms(self._deterministic_before)

    def __call__(self, spec: CaseSpec | BadInputSpec) -> dict[str, Any]:
        if isinstance(spec, BadInputSpec):
            return self._bad_input(spec)
        inputs = [make_inputs(spec, r, self.device) for r in range(spec.world)]
        sim = simulate([i[0] for i in inputs], [i[1] for i in inputs], [i[2] for i in inputs], spec.num_experts)
        ys = [make_combine_input(spec, r, sim.num_recv(r), None, self.device) for r in range(spec.world)]
        sim_rank = sim.ranks[self.rank]
        expected = {"layout": sim_rank.layout, "dispatch": sim_rank.dispatched,
                    "cached": sim_rank.dispatched.recv_x, "combine": sim.combine(ys, self.combine_start)[self.rank]}
        x, idx, w = inputs[self.rank]
        y = ys[self.rank]
        got = _run(self.subject, x, idx, w, y, spec.num_experts, twice=True)
        checks = _determinism(got, self.rank)
        found: dict[str, dict[str, dict[str, Any]]] = {}
        if self.target is None:
            checks.update(compare_outputs(expected, got, rank=self.rank, sim_rank=sim_rank, known_out=found))
        else:
            target = _run(self.target, x, idx, w, y, spec.num_experts, twice=False)
            checks.update(compare_outputs(target, got, rank=self.rank, sim_rank=sim_rank, known_out=found))
            vs_sim = compare_outputs(expected, target, rank=self.rank, sim_rank=sim_rank)
            bad = [f"{k}: {v}" for k, v in vs_sim.items() if v]
            checks["against.matches_simulate"] = bad[0] if bad else None
        return {"checks": checks, "known": found}

    def _bad_input(self, spec: BadInputSpec) -> dict[str, Any]:
        base = CaseSpec(world=spec.world, seed=7, tokens=(8,) * spec.world, hidden=2048, topk=8,
                        num_experts=16 * spec.world, payload="fp8" if spec.defect == "fp8_scales_shape" else "bf16")
        x, idx, w = make_inputs(base, self.rank, self.device)
        experts = base.num_experts
        if self.rank == spec.bad_rank:
            d = spec.defect
            if d == "topk_out_of_range":
                idx[0, 0] = experts
            elif d == "topk_dtype":
                idx = idx.to(torch.int32)
            elif d == "duplicate_expert":
                idx[3, 1] = idx[3, 0] = 5
            elif d == "x_dtype":
                x = x.float()
            elif d == "weights_dtype":
                w = w.double()
            elif d == "fp8_scales_shape":
                x = (x[0], x[1][:, :-1])
            elif d == "experts_not_divisible":
                experts += 1
            elif d == "hidden_mismatch":
                x = torch.cat([x, x[:, :128]], dim=1)
            elif d == "topk_mismatch":
                idx, w = idx[:, :-1].contiguous(), w[:, :-1].contiguous()
        try:
            self.subject.dispatch(x, idx, w, experts)
        except (ValueError, PeerInputError) as exc:
            return {"raised": type(exc).__name__, "message": str(exc)}
        return {"raised": None, "message": ""}


def judge_bad_input(spec: BadInputSpec, results: list[dict]) -> str | None:
    words, _ = BAD_INPUTS[spec.defect]
    for rank, res in enumerate(results):
        if "error" in res:
            return f"rank {rank}: {res['error']}"
        want = "ValueError" if rank == spec.bad_rank else "PeerInputError"
        if res["raised"] != want:
            return f"rank {rank}: expected {want}, got {res['raised'] or 'no error'} ({res['message']})"
        if want == "ValueError" and not all(word in res["message"] for word in words):
            return f"rank {rank}: ValueError {res['message']!r} does not name {' and '.join(words)}"
    return None


def bad_input_specs(world: int) -> list[BadInputSpec]:
    return [BadInputSpec(world, defect, (i % world) if zero_ok else 1 + i % (world - 1))
            for i, (defect, (_, zero_ok)) in enumerate(BAD_INPUTS.items())]


# ---------------------------------------------------------------------------------------------
# Driving the cases (rank 0), the verdict and the report
# ---------------------------------------------------------------------------------------------

@dataclass
class CheckRow:
    cases: int = 0
    failures: int = 0  # cases with a difference no known finding explains
    first: str | None = None
    first_case: str | None = None
    known: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> {cases, values, first}


def drive(run: Callable[[Any], list[Any]], specs: Sequence[Any], *, progress=None) -> dict[str, CheckRow]:
    rows: dict[str, CheckRow] = {}

    def record(name: str, msg: str | None, spec: Any) -> None:
        row = rows.setdefault(name, CheckRow())
        row.cases += 1
        if msg:
            row.failures += 1
            if row.first is None:
                row.first = msg
                row.first_case = spec.to_json() if isinstance(spec, CaseSpec) else repr(spec)

    def record_known(results: list[dict]) -> None:
        per: dict[tuple[str, str], dict[str, Any]] = {}
        for res in results:
            for check, found in (res.get("known") or {}).items():
                for fid, info in found.items():
                    agg = per.setdefault((check, fid), {"values": 0, "first": info["first"]})
                    agg["values"] += info["values"]
        for (check, fid), agg in per.items():
            entry = rows.setdefault(check, CheckRow()).known.setdefault(
                fid, {"cases": 0, "values": 0, "first": agg["first"]})
            entry["cases"] += 1
            entry["values"] += agg["values"]

    start = time.monotonic()
    for i, spec in enumerate(specs):
        results = run(spec)
        if isinstance(spec, BadInputSpec):
            record(f"bad_input.{spec.defect}", judge_bad_input(spec, results), spec)
        else:
            errors = [f"rank {r}: {res['error']}" for r, res in enumerate(results) if "error" in res]
            record("case.completed", errors[0] if errors else None, spec)
            names = sorted({n for res in results if "checks" in res for n in res["checks"]})
            for name in names:
                msgs = [res["checks"].get(name) for res in results if "checks" in res]
                record(name, next((m for m in msgs if m), None), spec)
            record_known([res for res in results if "checks" in res])
        if progress and (i + 1) % 10 == 0 or progress and i + 1 == len(specs):
            progress(f"  {i + 1}/{len(specs)} cases, {time.monotonic() - start:.1f} s")
    return rows


@dataclass(frozen=True)
class Verdict:
    status: str  # "pass" or "fail"
    line: str  # "PASS", "PASS (known: E1 on 44 values in 3 cases)", "FAIL: ...": never contradicts status
    known: dict[str, dict[str, Any]]  # finding id -> {cases, values, what}
    failed: tuple[str, ...]  # checks with unexplained differences


def verdict(rows: dict[str, CheckRow], *, strict: bool = False) -> Verdict:
    """One status and its one-line reason, from the same counts: PASS, PASS (known: ...), or FAIL."""
    failed = tuple(n for n, r in rows.items() if r.failures)
    found: dict[str, dict[str, Any]] = {}
    for row in rows.values():
        for fid, k in row.known.items():
            agg = found.setdefault(fid, {"cases": 0, "values": 0, "what": known.describe(fid)})
            agg["cases"] += k["cases"]
            agg["values"] += k["values"]
    known_text = ", ".join(f"{fid} on {k['values']} values in {k['cases']} case{'s' * (k['cases'] != 1)}"
                           for fid, k in found.items())
    if failed:
        line = f"FAIL: {len(failed)} check{'s' * (len(failed) != 1)} differ ({', '.join(failed[:4])}"
        line += ", ..." if len(failed) > 4 else ""
        line += f"){'; known: ' + known_text if known_text else ''}"
        return Verdict("fail", line, found, failed)
    if found and strict:
        return Verdict("fail", f"FAIL (--strict, known findings fail): {known_text}", found, failed)
    return Verdict("pass", f"PASS (known: {known_text})" if found else "PASS", found, failed)


def format_table(rows: dict[str, CheckRow], *, strict: bool = False) -> str:
    width = max([len(n) for n in rows] + [5])
    lines = [f"{'check':<{width}}  {'cases':>5}  {'fail':>4}  result  first mismatch"]
    for name, row in rows.items():
        result = "FAIL" if row.failures or (row.known and strict) else ("KNOWN" if row.known else "PASS")
        lines.append(f"{name:<{width}}  {row.cases:>5}  {row.failures:>4}  {result:<6}  {row.first or ''}")
        if row.first_case:
            lines.append(f"{'':<{width}}  {'':>5}  {'':>4}  {'':<6}  case: {row.first_case}")
        for fid, k in row.known.items():
            lines.append(f"{'':<{width}}  {'':>5}  {'':>4}  {'':<6}  known {fid}: {k['values']} values in "
                         f"{k['cases']} cases; first: {k['first']}")
    return "\n".join(lines)


def _csv(text: str, allowed: Sequence[Any], cast=str) -> tuple:
    try:
        vals = tuple(cast(v) for v in text.split(",") if v)
    except ValueError:
        raise CLIError(f"cannot read {text!r} as a comma-separated list") from None
    bad = [v for v in vals if v not in allowed]
    if bad or not vals:
        raise CLIError(f"{text!r}: choose from {', '.join(map(str, allowed))}")
    return vals


# the options that shape the sampled case space, which a --spec (a case given whole) leaves unused (--no-edge and
# --no-bad-input say what a --spec does anyway: taken)
SPACE_OPTIONS = ("cases", "seed", "max_tokens", "max_elements", "payload", "hidden")


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m numerics.ep check", description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="reference",
                   help=f"{', '.join(BACKENDS)}, or package.module:Class (an EPBackend built with device=, timeout=)")
    p.add_argument("--against", choices=["simulate", "reference"], default="simulate")
    p.add_argument("--combine-start", choices=COMBINE_STARTS, default=COMBINE_START,
                   help="the expected combine sum starts at +0.0 (the contract) or at the first row (E1)")
    p.add_argument("--strict", action="store_true", help="known findings fail the run too")
    p.add_argument("--cases", type=int, default=120, help="sampled routings after the named edge cases")
    p.add_argument("--seed", type=seed_arg, default=0)
    p.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help=f"tokens per rank, at most (<= {MAX_TOKENS})")
    p.add_argument("--max-elements", type=int, default=None,
                   help="cap on tokens x hidden per rank (default: none on GPU, 2**19 on CPU)")
    p.add_argument("--payload", default=",".join(PAYLOADS), help="bf16,fp8")
    p.add_argument("--hidden", default=",".join(map(str, HIDDENS)), help="2048,7168")
    p.add_argument("--no-edge", action="store_true", help="skip the named edge cases")
    p.add_argument("--no-bad-input", action="store_true", help="skip the bad-input cases")
    p.add_argument("--spec", action="append", default=[], help="replay one case (JSON, as printed); repeatable")
    p.add_argument("--world", type=int, default=2, help="ranks to spawn when not under torchrun")
    p.add_argument("--num-sms", type=int, default=None, help="DeepEP SMs (even); default DeepEP's")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before a silent peer is an error")
    p.add_argument("--json", type=Path, default=None, help="write the report here (JSON)")
    p.add_argument("--force", action="store_true", help="overwrite --json if it exists")
    return p


def _parse_specs(args) -> list[CaseSpec]:
    try:
        specs = [CaseSpec.from_json(s) for s in args.spec]
    except (ValueError, TypeError) as exc:
        raise CLIError(f"--spec is not a case as printed by check: {exc}") from None
    for spec in specs:
        problem = spec.problem()
        if problem:
            raise CLIError(f"--spec {spec.to_json()}: {problem}")
    return specs


def check_world(args, world: int) -> None:
    """Refuse a world the cases cannot run on, before any process starts (CLIError: one line, exit 2)."""
    if world < 2:
        raise CLIError(f"--world {world}: the communication level needs at least 2 ranks")
    if args.spec:
        bad = [s for s in _parse_specs(args) if s.world != world]
        if bad:
            raise CLIError(f"--spec was recorded for {bad[0].world} ranks, not {world}")
        return
    odd = [e for e in EXPERTS if e % world]
    if odd:
        fits = [w for w in range(2, min(EXPERTS) + 1) if all(e % w == 0 for e in EXPERTS)]
        raise CLIError(f"--world {world} does not divide the case space's expert counts "
                       f"({', '.join(map(str, EXPERTS))}); use one of {', '.join(map(str, fits))}")


def check_args(args) -> None:
    """Every option that can be judged without processes; CLIError (one line, exit 2) on the first bad one."""
    if args.json:
        check_creatable(args.json, force=args.force)
    if args.cases < 0 or not 0 < args.timeout < math.inf:  # NaN compares False: it passed '<= 0'
        raise CLIError("--cases must be >= 0 and --timeout a number > 0")
    if not 0 <= args.max_tokens <= MAX_TOKENS:
        raise CLIError(f"--max-tokens {args.max_tokens}: must be in [0, {MAX_TOKENS}] (what the buffers hold)")
    if args.max_elements is not None and args.max_elements < 1:
        raise CLIError(f"--max-elements {args.max_elements}: must be >= 1")
    if args.num_sms is not None and (args.num_sms <= 0 or args.num_sms % 2):
        raise CLIError(f"--num-sms {args.num_sms}: DeepEP needs a positive even number of SMs")
    _csv(args.payload, PAYLOADS)
    _csv(args.hidden, HIDDENS, int)
    _parse_specs(args)
    if args.spec:  # a --spec is the whole case: case-space options beside it are refused, not ignored
        parser = build_parser()
        given = [f"--{key.replace('_', '-')}" for key in SPACE_OPTIONS if getattr(args, key) != parser.get_default(key)]
        if given:
            raise CLIError(f"{', '.join(given)}: --spec replays the cases as given; these options shape sampled "
                           "cases only")


def _specs(args, world: int, on_gpu: bool) -> list[Any]:
    if args.spec:
        return list(_parse_specs(args))
    payloads = _csv(args.payload, PAYLOADS)
    hiddens = _csv(args.hidden, HIDDENS, int)
    max_elements = args.max_elements or (MAX_TOKENS * max(HIDDENS) if on_gpu else 2**19)
    space = {"world": world, "max_tokens": args.max_tokens, "max_elements": max_elements, "hiddens": hiddens,
             "payloads": payloads}
    specs: list[Any] = [] if args.no_bad_input else bad_input_specs(world)
    if not args.no_edge:
        specs += edge_specs(**space)
    return specs + sample_specs(args.cases, seed=args.seed, **space)


def report(args, world: int, rows: dict[str, CheckRow], seconds: float, backend: str) -> int:
    from numerics.environment import describe

    v = verdict(rows, strict=args.strict)
    cases = max((r.cases for r in rows.values()), default=0)
    summary = (f"{v.line}: {args.backend} against {args.against}, {world} ranks ({backend}), "
               f"{cases} cases in {seconds:.1f} s")
    print(format_table(rows, strict=args.strict))
    print(summary)
    if args.json:
        doc = {"kind": "ep-check", "version": 2, "status": v.status, "passed": v.status == "pass",
               "verdict": v.line, "summary": summary, "strict": args.strict, "known": v.known,
               "failed_checks": list(v.failed),
               "world": world, "comm_backend": backend, "backend": args.backend, "against": args.against,
               "combine_start": args.combine_start, "seconds": round(seconds, 2),
               "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               "checks": {n: dataclasses.asdict(r) for n, r in rows.items()}, "environment": describe()}
        if "deepep" in (args.backend, args.against) or args.backend == "deepep-v2":
            from numerics.ep.deepep import describe_deep_ep
            doc["deep_ep"] = describe_deep_ep()
        args.json.parent.mkdir(parents=True, exist_ok=True)
        # whole or not at all (checked before the run, hence force): mxval validate reads it back as its level
        atomic_write(args.json, json.dumps(doc, indent=1) + "\n", force=True)
        print(f"wrote {args.json}")
    return 0 if v.status == "pass" else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun else args.world
    try:
        check_args(args)
        check_world(args, world)
        on_gpu = torch.cuda.is_available() and torch.cuda.device_count() >= world
        require(args.backend, world=world if not is_custom(args.backend) else None)
    except BadInput:
        if under_torchrun and os.environ["RANK"] != "0":
            return 2  # rank 0 prints the one line; every rank stops before any process group exists
        raise
    kwargs = {"backend": args.backend, "against": args.against, "num_sms": args.num_sms,
              "timeout_s": args.timeout, "combine_start": args.combine_start}
    factory = "numerics.ep.check:CaseRunner"

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if under_torchrun:
        return _main_torchrun(args, factory, kwargs, progress)
    from numerics.ep.launch import Session

    specs = _specs(args, world, on_gpu)
    comm = "nccl" if on_gpu else "gloo"
    start = time.monotonic()
    with Session(world, factory, kwargs, comm=comm, timeout_s=args.timeout) as session:
        rows = drive(session.run, specs, progress=progress)
    return report(args, world, rows, time.monotonic() - start, comm)


def _main_torchrun(args, factory: str, kwargs: dict, progress) -> int:
    import torch.distributed as dist

    from numerics.ep.launch import lead_under_torchrun

    def lead(run, world: int, device) -> int:
        comm = dist.get_backend()
        specs = _specs(args, world, device.type == "cuda")
        start = time.monotonic()
        rows = drive(run, specs, progress=progress)
        return report(args, world, rows, time.monotonic() - start, comm)

    rc = lead_under_torchrun(factory, kwargs, args.timeout, lead)
    return 0 if rc is None else rc
