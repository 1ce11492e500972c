"""Known disagreements between torchao's MX cast and the MX rules, as narrow block predicates.

Each entry matches one section of FINDINGS.md (same id). Property tests compare every block
*except* those a finding claims, so the known defect does not hide new ones, and a strict xfail
test pins each finding's minimal input: when torchao fixes it, that test starts passing and fails
the run, and the entry here must go. The report counts blocks per finding.

A predicate takes float32 blocks shaped (..., nblocks, block), the element name, the mode and the
oracle's scale bytes (..., nblocks), and returns a boolean mask (..., nblocks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from numerics.tensor.elements import ELEMENTS

# F2's window above max_elem * 2^k: measured at most 40 float32 ulps over every normal exponent
# (torchao 0.18.0, CPU, torch 2.13); 64 ulps keeps the mask narrow (relative width 2^-17) with margin.
F2_WINDOW_ULPS = 64


@dataclass(frozen=True)
class Finding:
    id: str
    title: str
    modes: tuple[str, ...]
    elems: tuple[str, ...]
    affects: Callable[[np.ndarray, str, str, np.ndarray], np.ndarray]

    def applies(self, elem: str, mode: str) -> bool:
        return elem in self.elems and mode in self.modes


def _tiny_scale(blocks, elem, mode, oracle_scale):
    nonzero = (np.nan_to_num(np.abs(blocks), nan=0.0, posinf=0.0) > 0).any(axis=-1)
    return (oracle_scale == 0) & nonzero


def _rceil_boundary(blocks, elem, mode, oracle_scale):
    mag = np.abs(blocks.astype(np.float64))
    finite = np.isfinite(mag).all(axis=-1)
    amax = np.where(finite, np.where(np.isnan(mag), 0, mag).max(axis=-1), 0.0)
    mant_max = ELEMENTS[elem].max_normal / 2.0 ** np.floor(np.log2(ELEMENTS[elem].max_normal))
    safe = np.where(amax > 0, amax, 1.0)
    mant, _ = np.frexp(safe)
    mant = mant * 2.0
    window = F2_WINDOW_ULPS * 2.0**-23
    return finite & (amax >= 2.0**-126) & (mant > mant_max) & (mant <= mant_max + window)


def _inf_scale(blocks, elem, mode, oracle_scale):
    return np.isinf(blocks).any(axis=-1) & ~np.isnan(blocks).any(axis=-1)


FINDINGS: tuple[Finding, ...] = (
    Finding(
        "F1",
        "blocks whose scale is 2^-127 (E8M0 byte 0x00) get elements for 2^-126: FLOOR/CEIL/EVEN halve them, "
        "RCEIL flushes them to zero",
        ("floor", "ceil", "even", "rceil"),
        ("e4m3", "e5m2"),
        _tiny_scale,
    ),
    Finding(
        "F2",
        "RCEIL picks a scale one power of two too small when amax is a few ulps above max_elem * 2^k, "
        "so the block maximum saturates",
        ("rceil",),
        ("e4m3", "e5m2"),
        _rceil_boundary,
    ),
    Finding(
        "F3",
        "FLOOR/CEIL/EVEN give a block holding +-Inf the scale 2^(128 - emax), read from Inf's exponent "
        "field: neither E8M0 NaN nor the largest scale",
        ("floor", "ceil", "even"),
        ("e4m3", "e5m2"),
        _inf_scale,
    ),
)
BY_ID = {f.id: f for f in FINDINGS}


def known_blocks(x: np.ndarray, elem: str, mode: str, oracle_scale: np.ndarray,
                 block: int = 32) -> dict[str, np.ndarray]:
    """Mask of blocks each applicable finding claims, keyed by finding id."""
    blocks = x.reshape(*x.shape[:-1], x.shape[-1] // block, block)
    return {f.id: f.affects(blocks, elem, mode, oracle_scale) for f in FINDINGS if f.applies(elem, mode)}
