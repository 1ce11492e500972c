"""Hypothesis strategies for the layer level: GEMM shapes, token-group splits, input families.

Kept beside ``numerics/strategies.py`` (the tensor-level strategies) because they describe layer
shapes, not tensors. Every size torchao quantizes along is a multiple of the MX block (32);
bounds are small so one example runs in milliseconds on a CPU.
"""

from __future__ import annotations

from hypothesis import strategies as st

from numerics.layer.harness import INPUT_FAMILIES
from numerics.layer.recipes import MX_RECIPES

BLOCK = 32  # the MX block (numerics.layer.mxfp8.BLOCK): every size torchao quantizes along is a multiple


@st.composite
def gemm_dims(draw, *, max_blocks: int = 6) -> tuple[int, int, int]:
    """(M, K, N), each a multiple of 32 between 32 and 32 * max_blocks (192: ms per example on CPU)."""
    return tuple(BLOCK * draw(st.integers(1, max_blocks)) for _ in range(3))


@st.composite
def group_sizes(draw, *, max_experts: int = 6, max_tokens: int = 384, aligned: bool | None = None) -> tuple[int, ...]:
    """Token counts per expert: uneven, possibly empty, possibly one expert taking all tokens.

    ``aligned=True`` keeps every size a multiple of 32 (what torchtitan's MXFP8 dispatcher pads to);
    ``False`` forces at least one size that is not; ``None`` draws either. The total is a positive
    multiple of 32 when aligned, since torchao's weight gradient quantizes along the tokens.
    """
    experts = draw(st.integers(1, max_experts))
    if aligned is None:
        aligned = draw(st.booleans())
    unit = BLOCK if aligned else 1
    sizes = draw(st.lists(st.integers(0, max_tokens // experts // unit), min_size=experts, max_size=experts))
    sizes = [s * unit for s in sizes]
    if sum(sizes) == 0:
        sizes[draw(st.integers(0, experts - 1))] = BLOCK  # at least one token block in the call
    if not aligned and all(s % BLOCK == 0 for s in sizes):
        sizes[draw(st.integers(0, experts - 1))] += draw(st.integers(1, BLOCK - 1))
    return tuple(sizes)


def input_families() -> st.SearchStrategy[str]:
    return st.sampled_from(INPUT_FAMILIES)


def mx_recipes() -> st.SearchStrategy[str]:
    return st.sampled_from(MX_RECIPES)
