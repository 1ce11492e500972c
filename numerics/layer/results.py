"""What the layer level reports: per-tensor statistics of a run, tables, JSON, and the floors they must meet.

Public: ``TensorStat``, ``LayerResult``, ``format_table``, ``to_json``, ``floors_for``, ``floor_violations``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from numerics.layer.recipes import MX_RECIPES


def _json_float(v: float | None):
    if v is None or math.isfinite(v):
        return v
    return str(v)  # "inf", "-inf", "nan": strict JSON has no such numbers


@dataclass(frozen=True)
class TensorStat:
    layer: str
    case: str
    recipe: str
    tensor: str
    sqnr_vs_fp32: float
    sqnr_vs_bf16: float | None
    rel_err: float
    max_abs_err: float
    cosine: float
    shape: dict = field(default_factory=dict)

    def record(self) -> dict:
        d = dataclasses.asdict(self)
        for k in ("sqnr_vs_fp32", "sqnr_vs_bf16", "rel_err", "max_abs_err", "cosine"):
            d[k] = _json_float(d[k])
        return d


@dataclass(frozen=True)
class LayerResult:
    layer: str
    case: str
    shape: dict
    stats: tuple[TensorStat, ...]

    def stat(self, recipe: str, tensor: str) -> TensorStat:
        for s in self.stats:
            if s.recipe == recipe and s.tensor == tensor:
                return s
        raise KeyError(f"{self.layer}/{self.case}: no {recipe}/{tensor}; have "
                       f"{sorted({(s.recipe, s.tensor) for s in self.stats})}")

    def tensors(self) -> list[str]:
        return list(dict.fromkeys(s.tensor for s in self.stats))

    def records(self) -> list[dict]:
        return [s.record() for s in self.stats]

    def table(self) -> str:
        return format_table([self])

    __str__ = table


def format_table(results: Iterable[LayerResult], *, markdown: bool = False) -> str:
    head = ("layer", "case", "recipe", "tensor", "SQNR/fp32 dB", "SQNR/bf16 dB", "rel err", "cosine")
    rows = [head]
    for r in results:
        for s in r.stats:
            vs_bf16 = "-" if s.sqnr_vs_bf16 is None else f"{s.sqnr_vs_bf16:.2f}"
            rows.append((r.layer, r.case, s.recipe, s.tensor, f"{s.sqnr_vs_fp32:.2f}", vs_bf16,
                         f"{s.rel_err:.3e}", f"{s.cosine:.6f}"))
    if markdown:
        lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def to_json(results: Iterable[LayerResult], header: dict) -> str:
    return json.dumps({"header": header, "records": [rec for r in results for rec in r.records()]}, indent=1)


def floors_for(layer: str, recipe: str, tensor: str, family: str = "normal") -> list:
    """The ``numerics.tolerances`` entries a (layer, recipe, tensor) result must meet, vs BF16.

    Block layers (moe, mla) have floors for Gaussian post-norm inputs only: heavy-tailed inputs make
    attention and routing ill-conditioned, so their figures there are reported, not judged.
    """
    from numerics.tolerances import floor

    if recipe not in MX_RECIPES:
        return []
    kind = "dw" if tensor.startswith("dw") else tensor
    if recipe == "mxfp8-wgrad-hp" and kind == "dw" and layer in ("linear", "grouped_mm"):
        return [floor("layer", "mxfp8-wgrad-hp", "hp_path", "sqnr_db")]
    if layer in ("linear", "grouped_mm"):
        if family != "normal":  # torchao's bars are for Gaussian operands (its tests use randn)
            return [floor("layer", "mxfp8", "gemm.heavy_tailed", "sqnr_db")]
        return [floor("layer", "mxfp8", f"{layer}.{kind}", "sqnr_db"),
                floor("layer", "mxfp8", "gemm.normal", "sqnr_db")]
    if layer == "mla" and tensor.startswith("dw:") and tensor.endswith("norm"):
        kind = "dw_norm"
    if layer in ("moe", "mla") and family == "normal":
        return [floor("layer", "mxfp8", f"{layer}.{kind}", "sqnr_db")]
    return []


def floor_violations(results: Iterable[LayerResult]) -> list[str]:
    """One line per MXFP8 figure below its floor (SQNR against the BF16 run); empty when all pass."""
    bad = []
    for r in results:
        family = r.shape.get("input", "normal")
        for s in r.stats:
            for tol in floors_for(r.layer, s.recipe, s.tensor, family):
                v = s.sqnr_vs_bf16
                if v is None or math.isnan(v) or v < tol.floor:
                    bad.append(f"{r.layer}/{r.case}/{s.recipe}/{s.tensor}: " + tol.describe(
                        float("nan") if v is None else v))
    return bad
