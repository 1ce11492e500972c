"""The fused MX cast kernel: one read of a BF16/FP32 operand, one write of its MX-dequantized values.

``cast_kernel(device)`` returns the kernel for a device: compiled by Triton for CUDA, run by Triton's
interpreter (NumPy) for CPU, from the one Python source below. The kernel only uses operations whose
results are exact under both: integer and bit operations, float multiplication by powers of two, one
float addition and one subtraction of a power of two (the rounding step, exact IEEE round-to-nearest-
even in both), and bit-casts. No division, no transcendental, no float conversion instruction: those
are approximate or differ between Triton on a GPU and NumPy. Triton's NVIDIA backend does not flush
float32 denormals for plain arithmetic (only its libdevice calls, which are not used), so subnormal
inputs and results are exact there as in NumPy.

Per block of 32 values (along the last axis, or along the rows for the transposed operands of the
backward, in which case the output is written transposed: block axis fastest in memory):

1. ``A`` = max of the magnitudes' bit patterns (the bit patterns of |x| order like |x|, NaN above Inf),
   so the block's amax, and whether it holds a NaN or Inf, come from one integer max.
2. The shared exponent ``s`` from A's exponent field ``E`` and mantissa field ``M`` (``emax`` is the
   element's largest exponent, ``M_MAX`` = 0x600000 the mantissa field of 448 = 57344 / 2^7 = 1.75 * 2^8):
   floor ``E - 127 - emax``; ceil ``+ (M > 0)``; even: E after adding half an element ulp to A
   (round amax to the element's precision, a carry bumps E); rceil ``+ (M > threshold[E])`` with
   threshold ``M_MAX`` under the exact rule, or a per-exponent table (``calibrate.py``) that
   reproduces torchao's float32 ``ceil(log2(amax / max))``. Then clamped to E8M0's [-127, 127].
3. Elements: ``v = |x| * 2^-t`` (t = s, or torchao's substitute for s = -127, FINDINGS F1), saturated
   at max and rounded half-to-even to the element grid: for v >= 2^emin by integer rounding of v's
   bits at bit 23 - mbits; below 2^emin (the element's subnormals, one fixed quantum q) by
   ``(v + 2^23 q) - 2^23 q``. No int32 operation overflows (Triton's interpreter checks every one).
4. Dequantized value ``= rounded * 2^s`` (exact in float32: at least 2^-143, at most 5 significant bits,
   or +-Inf past float32's range), then rounded half-to-even to BF16 by integer arithmetic if asked.

Public: ``cast_kernel(device)``, ``ModeId``.
"""

import functools

import triton
import triton.language as tl

# scale modes as the kernel's constexpr
MODE_IDS = {"floor": 0, "rceil": 1, "ceil": 2, "even": 3}


def _mx_cast(
    x_ptr, out_ptr, scale_ptr, code_ptr, thr_ptr,
    R, C, s_b, s_r, s_c,
    mode, torchao, mbits, emax, bias, max_bits, nan_code,
    IN_BF16: tl.constexpr, OUT_BF16: tl.constexpr, WRITE_BYTES: tl.constexpr,
    ALONG_ROWS: tl.constexpr, INDEX64: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
):
    """One [BR, BC] tile of batch b of a [B, R, C] operand (strides s_b, s_r, s_c, in elements).

    ALONG_ROWS=False: blocks of 32 along C; out, codes [B, R, C] and scales [B, R, C/32], contiguous.
    ALONG_ROWS=True: blocks of 32 along R; out, codes [B, C, R] and scales [B, C, R/32], contiguous.
    """
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    b = tl.program_id(2)
    if INDEX64:
        b = b.to(tl.int64)
    if ALONG_ROWS:  # tile [BR // 32, 32, BC]: block index, position in block, column
        blk = tl.arange(0, BR // 32)[:, None, None] + pid_r * (BR // 32)
        rows = blk * 32 + tl.arange(0, 32)[None, :, None]
        cols = pid_c * BC + tl.arange(0, BC)[None, None, :]
    else:  # tile [BR, BC // 32, 32]: row, block index, position in block
        rows = pid_r * BR + tl.arange(0, BR)[:, None, None]
        blk = tl.arange(0, BC // 32)[None, :, None] + pid_c * (BC // 32)
        cols = blk * 32 + tl.arange(0, 32)[None, None, :]
    if INDEX64:
        rows = rows.to(tl.int64)
        cols = cols.to(tl.int64)
        blk = blk.to(tl.int64)
    mask = (rows < R) & (cols < C)
    if IN_BF16:  # bf16 bits in an int16 view: the high half of the float32 bits
        u = tl.load(x_ptr + b * s_b + rows * s_r + cols * s_c, mask=mask, other=0).to(tl.int32) << 16
    else:
        u = tl.load(x_ptr + b * s_b + rows * s_r + cols * s_c, mask=mask, other=0)
    mag = u & 0x7FFFFFFF
    sign = u ^ mag  # 0 or INT32_MIN
    # tl.reduce with the standard max combiner rather than tl.max: tl.max is itself a jit function, bound
    # to compiled or interpreted mode when triton is imported, while the interpreter runs this combiner
    # as a NumPy max (and the compiler as a maximum), so one source serves both in one process
    if ALONG_ROWS:
        amax = tl.reduce(mag, 1, tl.standard._elementwise_max, keep_dims=True)  # [BR // 32, 1, BC]
    else:
        amax = tl.reduce(mag, 2, tl.standard._elementwise_max, keep_dims=True)  # [BR, BC // 32, 1]

    # the shared exponent (unclamped), from amax's exponent field E and mantissa field M; mode and flavour
    # are runtime values (per block, so all four formulas cost 1/32 of an operation per element) to keep
    # the compiled variants few
    e_field = amax >> 23
    m_field = amax & 0x7FFFFF
    base = e_field - (127 + emax)
    ceil = base + (m_field > 0).to(tl.int32)
    # even: add half an element ulp (bit 22 - mbits) to amax, so a carry bumps E; NaN bits would overflow
    even = ((tl.minimum(amax, 0x7F800000) + (1 << (22 - mbits))) >> 23) - (127 + emax)
    # rceil: the exact rule is threshold 0x600000 (1.75) for every E; torchao's is measured (calibrate.py)
    rceil = base + (m_field > tl.load(thr_ptr + e_field)).to(tl.int32)
    s = tl.where(mode == 0, base, tl.where(mode == 1, rceil, tl.where(mode == 2, ceil, even)))
    s = tl.minimum(tl.maximum(s, -127), 127)
    is_nan = amax > 0x7F800000
    is_inf = amax == 0x7F800000
    # torchao: Inf gives RCEIL the largest scale 0xFE; byte 0x00 scales the elements by 1 (RCEIL) or
    # 2^-126 (the others) instead of 2^-127 (F1); only NaN makes a NaN scale. The spec reads Inf as NaN.
    s = tl.where((torchao != 0) & (mode == 1) & is_inf, 127, s)
    t = tl.where((torchao != 0) & (s == -127), tl.where(mode == 1, 0, -126), s)
    bad = is_nan | ((torchao == 0) & is_inf)
    # 2^-t and 2^s as float32 bits; 2^-127 is the subnormal 0x00400000
    inv = tl.where(t == 127, 0x400000, (127 - t) << 23).to(tl.float32, bitcast=True)
    deq = tl.where(s == -127, 0x400000, (127 + s) << 23).to(tl.float32, bitcast=True)

    # round |x| * 2^-t half-to-even to the element grid, saturating at max
    sh = 23 - mbits
    v = mag.to(tl.float32, bitcast=True) * inv
    vb = v.to(tl.int32, bitcast=True)
    vc = tl.minimum(vb, max_bits)  # saturate first, as torchao clamps before its cast (max is on the grid)
    rn = (vc + ((1 << (sh - 1)) - 1) + ((vc >> sh) & 1)) & (-(1 << sh))
    big = (1 - bias - mbits + 150) << 23  # 2^23 * the subnormal quantum 2^(emin - mbits), as bits
    bigf = tl.full([1, 1, 1], big, tl.int32).to(tl.float32, bitcast=True)
    shifted = v + bigf
    rs = (shifted - bigf).to(tl.int32, bitcast=True)
    small = vb < ((1 - bias + 127) << 23)  # v < 2^emin
    rbits = tl.where(small, rs, rn)
    d = (rbits.to(tl.float32, bitcast=True) * deq).to(tl.int32, bitcast=True)

    if ALONG_ROWS:
        off = b * R * C + cols * R + rows
        soff = b * (R // 32) * C + cols * (R // 32) + blk
        smask = (blk * 32 < R) & (cols < C)
    else:
        off = b * R * C + rows * C + cols
        soff = b * R * (C // 32) + rows * (C // 32) + blk
        smask = (rows < R) & (blk * 32 < C)
    if OUT_BF16:
        o = ((d + 0x7FFF + ((d >> 16) & 1)) >> 16) | ((sign >> 16) & 0x8000)
        o = tl.where(bad, 0x7FC0, o)
        tl.store(out_ptr + off, o.to(tl.int16), mask=mask)
    else:
        o = tl.where(bad, 0x7FC00000, d | sign)
        tl.store(out_ptr + off, o, mask=mask)
    if WRITE_BYTES:
        sbyte = tl.where(bad, 255, s + 127)
        tl.store(scale_ptr + soff, sbyte.to(tl.uint8), mask=smask)
        code = tl.where(small, shifted.to(tl.int32, bitcast=True) - big, (rbits >> sh) - ((127 - bias) << mbits))
        code = tl.where(bad, nan_code, code) | ((sign >> 24) & 0x80)
        tl.store(code_ptr + off, code.to(tl.uint8), mask=mask)


_SETTINGS = ("mode", "torchao", "mbits", "emax", "bias", "max_bits", "nan_code")


@functools.cache
def cast_kernel(device_type: str):
    """The kernel for ``device_type``: Triton-compiled on "cuda", interpreted (NumPy) on "cpu"."""
    if device_type == "cuda":
        # runtime settings: not specialised on ==1 or %16, which would compile a variant per value
        return triton.JITFunction(_mx_cast, do_not_specialize=_SETTINGS)
    from triton.runtime.interpreter import InterpretedFunction

    return InterpretedFunction(_mx_cast)
