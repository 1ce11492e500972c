"""Exact MX block quantization, written from the rules (NumPy only): the suite's tensor-level oracle.

Public functions:
    quantize(x, elem, mode, block=32, *, inf="nan", rceil="exact") -> (scale_bits, elem_bits)
    dequantize(scale_bits, elem_bits, elem, block=32) -> float32 values
    scale_exponents(amax, elem, mode, *, rceil="exact") -> unbiased shared exponents (unclamped)

Rules (OCP Microscaling Formats v1.0, section 6.3, plus the scale-selection modes in use):
for every block of ``block`` consecutive values along the last axis, with ``amax`` the largest
magnitude and ``emax``/``max`` the element's largest normal exponent/value
(E4M3: 8 / 448, E5M2: 15 / 57344), the shared exponent ``s`` is

* ``floor``  s = floor(log2 amax) - emax                      (OCP MX v1.0; can saturate: amax/2^s < 2*2^emax)
* ``rceil``  s = the smallest integer with amax / 2^s <= max   (NVIDIA cuBLAS "UE8M0" recipe; never saturates)
* ``ceil``   s = ceil(log2 amax) - emax                        (torchao ScaleCalculationMode.CEIL docstring)
* ``even``   s = floor(log2 round(amax)) - emax, where round() rounds amax half-to-even to the
             element's mantissa width (torchao ScaleCalculationMode.EVEN docstring: "rounding(max_abs)")

then ``s`` is clamped to E8M0's range [-127, 127] (an all-zero block gets s = -127, byte 0x00,
which is what every rule gives for amax -> 0 after clamping), the scale byte is ``s + 127``, and each
element is ``round_half_even(v / 2^s)`` in the element format, saturating to +-max. ``v / 2^s`` is
a power-of-two rescale, exact wherever it can affect a code, so there is exactly one rounding, as
the spec requires (``elements.encode_f32`` does it with float32 bit arithmetic, checked against the
float64 ``elements.encode``).

Where the rules are silent the oracle picks, and says so:

* NaN anywhere in a block: scale byte 0xFF (E8M0 NaN) and every element the format's NaN code
  (0x7F for E4M3, 0x7E for E5M2, 0x0 for E2M1, which has none; sign of the input kept). The spec
  defines a NaN scale as making the whole block NaN; it fixes no element payload, so comparisons treat
  all NaN codes alike.
* Inf in a block (``inf=``): ``"nan"`` (default) treats it like NaN, since E8M0 cannot express Inf;
  ``"saturate"`` treats Inf as the largest magnitude: amax = Inf gives the largest exponent, 127,
  Infs saturate to +-max and finite elements are scaled by 2^-127 (mostly to zero).
* RCEIL boundary (``rceil=``): ``"exact"`` (default) decides ``amax / 2^s <= max`` in exact
  arithmetic; ``"fp32"`` first rounds ``amax / max`` to float32 (round-to-nearest-even, subnormals
  kept) and takes the exact ceil(log2) of that float, which is what an fp32 kernel computes. The
  two differ only where amax / max falls in float32's subnormal range (amax < max * 2^-126).
"""

from __future__ import annotations

import numpy as np

from numerics.tensor import elements
from numerics.tensor.elements import E8M0_MAX_EXP, E8M0_MIN_EXP, E8M0_NAN, ELEMENTS

MODES = ("floor", "rceil", "ceil", "even")
INF_POLICIES = ("nan", "saturate")
RCEIL_READINGS = ("exact", "fp32")


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not supported; choose one of {', '.join(map(repr, choices))}")


def _floor_log2(a: np.ndarray) -> np.ndarray:
    """floor(log2 a) for finite a > 0, exactly (frexp: a = m * 2^k, m in [0.5, 1))."""
    _, k = np.frexp(a)
    return k.astype(np.int64) - 1


def _mantissa(a: np.ndarray) -> np.ndarray:
    """a / 2^floor(log2 a), in [1, 2)."""
    m, _ = np.frexp(a)
    return m * 2.0


def scale_exponents(amax: np.ndarray, elem: str, mode: str, *, rceil: str = "exact") -> np.ndarray:
    """Unclamped shared exponent per block for finite amax > 0 (others give garbage: mask them)."""
    fmt = ELEMENTS[elem]
    a = np.asarray(amax, dtype=np.float64)
    safe = np.where(np.isfinite(a) & (a > 0), a, 1.0)
    k = _floor_log2(safe)
    m = _mantissa(safe)
    if mode == "floor":
        return k - fmt.emax
    if mode == "ceil":
        return k + (m > 1.0) - fmt.emax
    if mode == "even":
        # round amax to 1 + mbits significant bits (half to even); a carry to 2.0 bumps the exponent
        carried = np.rint(m * 2.0**fmt.mbits) == 2.0 ** (fmt.mbits + 1)
        return k + carried - fmt.emax
    if mode == "rceil":
        if rceil == "exact":
            # amax = m * 2^k and max = m_max * 2^emax: amax / 2^s <= max  <=>  s >= k - emax + log2(m / m_max),
            # and log2(m / m_max) lies in (-1, 1), so s is k - emax, plus one when m > m_max.
            m_max = _mantissa(np.float64(fmt.max_normal))
            return k - fmt.emax + (m > m_max)
        ratio = (safe.astype(np.float32) / np.float32(fmt.max_normal)).astype(np.float64)
        ratio = np.where(ratio > 0, ratio, 2.0**-149)  # an fp32 quotient that underflows to 0
        return _floor_log2(ratio) + (_mantissa(ratio) > 1.0)
    raise AssertionError(mode)


def _validate(x: np.ndarray, elem: str, mode: str, block: int) -> None:
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        got = x.dtype if isinstance(x, np.ndarray) else type(x).__name__
        raise ValueError(f"x must be a float32 numpy array, got {got}")
    _check_choice("elem", elem, tuple(ELEMENTS))
    _check_choice("mode", mode, MODES)
    if not isinstance(block, (int, np.integer)) or block <= 0:
        raise ValueError(f"block must be a positive integer, got {block!r}")
    if x.ndim == 0 or x.shape[-1] % block:
        raise ValueError(f"x's last dim must be a multiple of block={block}, got shape {x.shape}")


# Blocks per pass: 2048 blocks = 64K float32 values (256 KB), so the ~6 temporaries of one pass stay in a
# core's L2 cache instead of streaming 16 MB arrays through memory ~15 times. Measured on the 2-core machine,
# 2048x2048 float32 E4M3: encode_f32 0.132 s whole-array vs 0.041 s in 64K-value chunks (best of 5; 4K: 0.117,
# 16K: 0.064, 256K: 0.047). The result does not depend on it: blocks are independent (tests/meta).
CHUNK_BLOCKS = 2048


def quantize(
    x: np.ndarray,
    elem: str,
    mode: str,
    block: int = 32,
    *,
    inf: str = "nan",
    rceil: str = "exact",
) -> tuple[np.ndarray, np.ndarray]:
    """MX-quantize ``x`` (float32, last dim a multiple of ``block``) to (scale bytes, element bytes)."""
    _validate(x, elem, mode, block)
    _check_choice("inf", inf, INF_POLICIES)
    _check_choice("rceil", rceil, RCEIL_READINGS)
    fmt = ELEMENTS[elem]
    flat = np.ascontiguousarray(x).reshape(-1, block)
    scale_bits = np.empty(flat.shape[0], dtype=np.uint8)
    codes = np.empty(flat.shape, dtype=np.uint8)
    for start in range(0, flat.shape[0], CHUNK_BLOCKS):
        end = start + CHUNK_BLOCKS
        scale_bits[start:end], codes[start:end] = _quantize_blocks(flat[start:end], fmt, mode, inf, rceil)
    return scale_bits.reshape(*x.shape[:-1], x.shape[-1] // block), codes.reshape(x.shape)


def _quantize_blocks(blocks: np.ndarray, fmt, mode: str, inf: str, rceil: str) -> tuple[np.ndarray, np.ndarray]:
    """``quantize`` of float32 blocks shaped (n, block)."""
    # amax on the bit patterns: |x|'s bits order like |x| (NaN's above Inf's), so one integer max
    # per block gives amax and says whether the block holds a NaN or an Inf
    amax_bits = (blocks.view(np.uint32) & np.uint32(0x7FFFFFFF)).max(axis=-1)
    nan_block = amax_bits > 0x7F800000
    if inf == "nan":
        nan_block |= amax_bits == 0x7F800000
    amax = np.where(nan_block, 0, amax_bits).astype(np.uint32).view(np.float32).astype(np.float64)

    s = scale_exponents(amax, fmt.name, mode, rceil=rceil)
    s = np.where(amax == 0, E8M0_MIN_EXP, s)
    s = np.where(np.isinf(amax), E8M0_MAX_EXP, s)  # only reached with inf="saturate"
    s = np.clip(s, E8M0_MIN_EXP, E8M0_MAX_EXP)
    s = np.where(nan_block, 0, s)  # NaN blocks: their bytes are set below; keep the rescale harmless

    # x / 2^s in float32 is exact wherever the quotient is a normal float32; below 2^-126 it may
    # round, but every such value rounds to zero in every element format (their smallest
    # subnormals are 2^-9, 2^-16 and 2^-1), so the codes are those of the exact quotient.
    inv_scale = np.ldexp(1.0, -s).astype(np.float32)  # 2^-s for s in [-127, 127]: exact in float32
    codes = elements.encode_f32(blocks * inv_scale[:, None], fmt)
    if nan_block.any():
        sign = np.signbit(blocks[nan_block]).astype(np.uint8) << (fmt.width - 1)
        codes[nan_block] = np.uint8(fmt.nan_code) | sign
    scale_bits = np.where(nan_block, np.uint8(E8M0_NAN), elements.scale_byte(s))
    return scale_bits.astype(np.uint8), codes


def dequantize(scale_bits: np.ndarray, elem_bits: np.ndarray, elem: str, block: int = 32, *,
               dtype=np.float32) -> np.ndarray:
    """(scale bytes, element bytes) -> values; a 0xFF scale makes its whole block NaN.

    float32 by default (what a model sees; a block scaled near 2^127 can overflow it to Inf);
    ``dtype=np.float64`` gives the exact value of every code.
    """
    _check_choice("elem", elem, tuple(ELEMENTS))
    scale_bits = np.asarray(scale_bits, dtype=np.uint8)
    elem_bits = np.asarray(elem_bits, dtype=np.uint8)
    if elem_bits.ndim == 0 or elem_bits.shape[-1] % block:
        raise ValueError(f"elem_bits' last dim must be a multiple of block={block}, got {elem_bits.shape}")
    expected = elem_bits.shape[:-1] + (elem_bits.shape[-1] // block,)
    if scale_bits.shape != expected:
        raise ValueError(f"scale_bits must have shape {expected} for elem_bits {elem_bits.shape}, "
                         f"got {scale_bits.shape}")
    values = elements.decode(elem_bits, ELEMENTS[elem]).reshape(*expected, block)
    scale = elements.scale_value(scale_bits)[..., None]
    # the product of an element (<= 2^16) and a scale (<= 2^127) is exact in float64; float32 may overflow
    with np.errstate(over="ignore", invalid="ignore"):
        out = (values * scale).astype(dtype)
    return out.reshape(elem_bits.shape)
