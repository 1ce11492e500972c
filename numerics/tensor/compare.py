"""A subject's MX bytes against the oracle's, block by block, with the known findings accounted for.

``compare(x, subject, elem, mode, scale_bits, elem_bits)`` -> ``Comparison``: per block, whether the
subject's scale byte and element bytes equal the oracle's (``numerics.tensor.mx.quantize`` under the
subject's Inf reading), which blocks each applicable finding (``numerics.tensor.findings``) claims, and
which differ unexplained. Element bytes of a NaN-scale block are not compared: the spec makes the whole
block NaN whatever they hold. ``Comparison.describe()`` names the first unexplained block with both
byte sets and a one-line reproducer. The report, the property tests and the golden check all use it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from numerics.tensor import findings, mx
from numerics.tensor.elements import E8M0_NAN


@dataclass
class Comparison:
    subject: str
    elem: str
    mode: str
    x_blocks: np.ndarray  # (..., nblocks, block) float32
    oracle_scale: np.ndarray  # (..., nblocks)
    oracle_elems: np.ndarray  # (..., nblocks, block)
    got_scale: np.ndarray
    got_elems: np.ndarray
    exact: np.ndarray  # (..., nblocks) bool
    claimed: dict[str, np.ndarray]  # finding id -> blocks it explains among the inexact ones
    unexplained: np.ndarray

    def counts(self) -> dict:
        return {"blocks": int(self.exact.size), "blocks_bit_exact": int(self.exact.sum()),
                "blocks_known_findings": {k: int(v.sum()) for k, v in self.claimed.items()},
                "blocks_unexplained": int(self.unexplained.sum())}

    def describe(self) -> str:
        """The first unexplained block, both byte sets and a reproducer ('' when there is none)."""
        bad = np.argwhere(self.unexplained)
        if not len(bad):
            return ""
        idx = tuple(int(i) for i in bad[0])
        what = "scale" if self.oracle_scale[idx] != self.got_scale[idx] else "elements"
        return (f"{self.subject} {self.elem}/{self.mode}: {len(bad)} block(s) differ from the oracle; first block "
                f"{idx} ({what}): scale oracle 0x{self.oracle_scale[idx]:02x} {self.subject} "
                f"0x{self.got_scale[idx]:02x}; elements oracle {self.oracle_elems[idx].tolist()} {self.subject} "
                f"{self.got_elems[idx].tolist()}; reproduce with x = np.array({self.x_blocks[idx].tolist()!r}, "
                "dtype=np.float32).reshape(1, 32)")


def compare(x: np.ndarray, subject, elem: str, mode: str, scale_bits: np.ndarray, elem_bits: np.ndarray,
            *, block: int = 32, masked: bool = True) -> Comparison:
    """``subject`` is a ``numerics.tensor.subjects.Subject``; ``masked=False`` lets no finding claim a block."""
    oracle_scale, oracle_elems = mx.quantize(x, elem, mode, block, inf=subject.inf)
    nblocks = oracle_scale.shape
    if scale_bits.shape != nblocks or elem_bits.shape != oracle_elems.shape:
        raise ValueError(f"{subject.name} gave shapes {scale_bits.shape} / {elem_bits.shape}, "
                         f"the oracle {nblocks} / {oracle_elems.shape}")
    blocks = x.reshape(*nblocks, block)
    want = oracle_elems.reshape(*nblocks, block)
    got = elem_bits.reshape(*nblocks, block)
    same_scale = oracle_scale == scale_bits
    nan_scale = oracle_scale == E8M0_NAN
    exact = same_scale & ((want == got).all(axis=-1) | nan_scale)
    unexplained = ~exact
    claimed = {}
    for f in findings.applicable(subject.name, elem, mode) if masked else []:
        if f.affects is not None:
            mask = f.affects(blocks, elem, mode, oracle_scale)
        else:
            mask = same_scale & ((f.rewrite(blocks, oracle_scale, want) == got).all(axis=-1) | nan_scale)
        claimed[f.id] = mask & unexplained
        unexplained = unexplained & ~mask
    return Comparison(subject.name, elem, mode, blocks, oracle_scale, want, scale_bits, got, exact, claimed,
                      unexplained)
