"""Deterministic training-like input tensors for the tensor-level report, benchmark and golden vectors.

Where ``numerics.tensor.strategies`` draws blocks for Hypothesis to shrink, this module draws whole
tensors from a seeded NumPy generator, so a report or a golden file is reproduced by its seed.
Every family returns a float32 array; ``input_dtype`` says whether its values are BF16-exact
(what a BF16 model hands the cast) or full FP32 (gradients, boundary values).

* ``normal``     activations: N(0, 1) rounded to BF16;
* ``outliers``   heavy tails: Laplace values, rows scaled over 2^-8..2^8, with 1-3 values per
                 32-block multiplied by 2^4..2^10 (what per-block scaling exists for), BF16;
* ``gradients``  FP32 magnitudes log-uniform per block around 10^-30..10^0, three decades wide,
                 and one block in 64 made of FP32 subnormals (down to 2^-149);
* ``boundary``   FP32 blocks whose maximum sits on, or one ulp either side of, 448*2^k or 57344*2^k
                 (k in [-20, 20]), the rest of the block normal values below it.

Public: ``FAMILIES``, ``INPUT_DTYPE``, ``SHAPES``, ``generate(family, shape, seed)``.
"""

from __future__ import annotations

import numpy as np

BLOCK = 32
FAMILIES = ("normal", "outliers", "gradients", "boundary")
INPUT_DTYPE = {"normal": "bfloat16", "outliers": "bfloat16", "gradients": "float32", "boundary": "float32"}
# tiny: for tests; quick: the whole report (4 families x 8 casts) runs in seconds on a 2-core CPU;
# full: one DeepSeek-V3 hidden-size activation (8192 x 7168, the shape of the SQNR figures in docs/tensor.md).
SHAPES = {"tiny": (4, 256), "quick": (256, 1024), "full": (8192, 7168)}


def to_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to the nearest bfloat16 (half to even), kept as float32 (finite inputs)."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


def _normal(rng, shape):
    return to_bf16(rng.standard_normal(shape, dtype=np.float32))


def _outliers(rng, shape):
    x = rng.laplace(size=shape).astype(np.float32)
    x *= np.exp2(rng.integers(-8, 9, size=(*shape[:-1], 1))).astype(np.float32)  # one factor a row
    blocks = x.reshape(-1, BLOCK)
    for count in (1, 2, 3):  # a third of the blocks each get 1, 2 or 3 outliers
        rows = np.arange(count - 1, blocks.shape[0], 3)
        for _ in range(count):
            cols = rng.integers(0, BLOCK, size=rows.size)
            blocks[rows, cols] *= np.exp2(rng.integers(4, 11, size=rows.size)).astype(np.float32)
    return to_bf16(x)


def _gradients(rng, shape):
    nblocks = int(np.prod(shape)) // BLOCK
    centre = rng.uniform(-30, 0, size=(nblocks, 1))  # decade of each block
    mag = 10.0 ** (centre + rng.uniform(-1.5, 1.5, size=(nblocks, BLOCK)))
    x = (mag * rng.choice([-1.0, 1.0], size=mag.shape)).astype(np.float32)
    sub = np.arange(0, nblocks, 64)  # FP32 subnormal blocks: k * 2^-149, k < 2^23
    x[sub] = (rng.integers(-(2**23) + 1, 2**23, size=(sub.size, BLOCK)) * 2.0**-149).astype(np.float32)
    return x.reshape(shape)


def _boundary(rng, shape):
    nblocks = int(np.prod(shape)) // BLOCK
    anchor = np.where(rng.integers(0, 2, nblocks) == 0, 448.0, 57344.0)
    top = np.ldexp(anchor, rng.integers(-20, 21, nblocks)).astype(np.float32)
    side = rng.integers(-1, 2, nblocks)
    top = np.where(side < 0, np.nextafter(top, np.float32(0)), top)
    top = np.where(side > 0, np.nextafter(top, np.float32(np.inf)), top).astype(np.float32)
    rest = np.clip(rng.standard_normal((nblocks, BLOCK)) / 4, -0.99, 0.99).astype(np.float32) * top[:, None]
    pos = rng.integers(0, BLOCK, nblocks)
    rest[np.arange(nblocks), pos] = top * rng.choice(np.float32([-1, 1]), nblocks)
    return rest.reshape(shape)


_GENERATORS = {"normal": _normal, "outliers": _outliers, "gradients": _gradients, "boundary": _boundary}


def generate(family: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """The ``family`` tensor of ``shape`` (last dim a multiple of 32) for ``seed``; float32."""
    if family not in _GENERATORS:
        raise ValueError(f"family={family!r} is not known; choose one of {', '.join(FAMILIES)}")
    if shape[-1] % BLOCK:
        raise ValueError(f"the last dim must be a multiple of {BLOCK}, got shape {shape}")
    rng = np.random.default_rng([seed, FAMILIES.index(family)])
    return np.ascontiguousarray(_GENERATORS[family](rng, tuple(shape)), dtype=np.float32)
