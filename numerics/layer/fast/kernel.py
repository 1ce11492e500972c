"""The fused MX cast kernel: one read of a BF16/FP32 operand, one write of its MX-dequantized values.

``cast_kernel(device)`` returns the kernel for a device: compiled by Triton for CUDA, run by Triton's
interpreter (NumPy) for CPU, from the one Python source below. The kernel only uses operations whose
results are exact under both: integer and bit operations, float multiplication by powers of two, the
addition and subtraction of a power of two that rounds (exact IEEE round-to-nearest-even in both), and
bit-casts. No division, no transcendental, no float conversion instruction: those
are approximate or differ between Triton on a GPU and NumPy. Triton's NVIDIA backend does not flush
float32 denormals for plain arithmetic (only its libdevice calls, which are not used), so subnormal
inputs and results are exact there as in NumPy.

Per block of 32 values (along the last axis, or along the rows for the transposed operands of the
backward, in which case the output is written transposed: block axis fastest in memory):

1. ``A`` = max of the magnitudes' bit patterns (the bit patterns of |x| order like |x|, NaN above Inf),
   so the block's amax, and whether it holds a NaN or Inf, come from one integer max.
2. The shared exponent ``s`` from A's exponent field ``E`` and mantissa field ``M`` (``emax`` is the
   element's largest exponent, ``M_MAX`` the mantissa field of its largest value: 0x600000 (1.75) for
   448 = 1.75 * 2^8 and 57344 = 1.75 * 2^15, 0x400000 (1.5) for E2M1's 6 = 1.5 * 2^2):
   floor ``E - 127 - emax``; ceil ``+ (M > 0)``; even: E after adding half an element ulp to A
   (round amax to the element's precision, a carry bumps E); rceil ``+ (M > threshold[E])`` with
   threshold ``M_MAX`` under the exact rule, or a per-exponent table (``calibrate.py``) that
   reproduces torchao's float32 ``ceil(log2(amax / max))``. Then clamped to E8M0's [-127, 127].
3. Elements: ``v = |x| * 2^-t`` (t = s, or torchao's substitute for s = -127, FINDINGS F1), saturated
   at max and rounded half-to-even to the element grid as ``(v + C) - C`` with ``C = 2^23 * quantum(v)``.
   No int32 operation overflows (Triton's interpreter checks every one).
4. Dequantized value ``= rounded * 2^s`` (exact in float32: at least 2^-143, at most 5 significant bits,
   or +-Inf past float32's range), then rounded half-to-even to BF16 by integer arithmetic if asked.

Public: ``cast_kernel(device_type)``, ``MODE_IDS``.
"""

import functools

import triton
import triton.language as tl

# scale modes as the kernel takes them (a runtime argument)
MODE_IDS = {"floor": 0, "rceil": 1, "ceil": 2, "even": 3}


def _mx_cast(
    x_ptr, out_ptr, scale_ptr, code_ptr, thr_ptr, out2_ptr, src_ptr,
    R, C, s_b, s_r, s_c,
    mode, torchao, mbits, emax, bias, max_bits, nan_code, width,
    IN_BF16: tl.constexpr, OUT_BF16: tl.constexpr, WRITE_BYTES: tl.constexpr,
    ALONG_ROWS: tl.constexpr, INDEX64: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
    BOTH: tl.constexpr = False, GATHER: tl.constexpr = False,
):
    """One [BR, BC] tile of batch b of a [B, R, C] operand (strides s_b, s_r, s_c, in elements).

    ALONG_ROWS=False: blocks of 32 along C; out, codes [B, R, C] and scales [B, R, C/32], contiguous.
    ALONG_ROWS=True: blocks of 32 along R; out, codes [B, C, R] and scales [B, C, R/32], contiguous.
    BOTH=True (ALONG_ROWS=False, no bytes): both in one launch; along C into out, then along R into out2, the second
    pass loading the tile again (from L2, just read): regrouping the first pass's tile in registers instead kept
    it live through the second pass and measured 1.35-1.41x the two single casts' time on an H100, loading it
    again 0.85-0.87x (docs/studies/bench.md).
    GATHER=True (batch 1): row r of the operand is row src[r] of x (int64 [R]), or zeros where src[r] < 0: a
    gather of x's rows (the grouped GEMM's padding) folded into the loads, the operand itself never written.
    """
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    b = tl.program_id(2)
    if INDEX64:
        b = b.to(tl.int64)
    # one pass per layout written: the tile's values go through the same arithmetic in each, blocked one way
    for p in tl.static_range(2 if BOTH else 1):
        if ALONG_ROWS or p == 1:  # tile [BR // 32, 32, BC]: block index, position in block, column
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
        if GATHER:  # the rows read: each one's source row, a negative one read as zeros
            src = tl.load(src_ptr + rows, mask=rows < R, other=-1)
            if not INDEX64:
                src = src.to(tl.int32)
            x_at, in_mask = x_ptr + src * s_r + cols * s_c, mask & (src >= 0)
        else:
            x_at, in_mask = x_ptr + b * s_b + rows * s_r + cols * s_c, mask
        if IN_BF16:  # bf16 bits: the high half of the float32 bits
            u = tl.load(x_at, mask=in_mask, other=0).to(tl.int16, bitcast=True).to(tl.int32) << 16
        else:
            u = tl.load(x_at, mask=in_mask, other=0).to(tl.int32, bitcast=True)
        mag = u & 0x7FFFFFFF
        sign = u ^ mag  # 0 or INT32_MIN
        # tl.reduce with the standard max combiner rather than tl.max: tl.max is itself a jit function, bound
        # to compiled or interpreted mode when triton is imported, while the interpreter runs this combiner
        # as a NumPy max (and the compiler as a maximum), so one source serves both in one process.
        # Per-block values stay 2D until used per element (expand_dims): the threshold lookup, a gather,
        # then only moves these small tensors between register layouts, never the tile.
        if ALONG_ROWS or p == 1:
            amax = tl.reduce(mag, 1, tl.standard._elementwise_max)  # [BR // 32, BC]
        else:
            amax = tl.reduce(mag, 2, tl.standard._elementwise_max)  # [BR, BC // 32]

        # the shared exponent (unclamped), from amax's exponent field E and mantissa field M; mode and flavour
        # are runtime values (per block, so all four formulas cost 1/32 of an operation per element) to keep
        # the compiled variants few
        e_field = amax >> 23
        m_field = amax & 0x7FFFFF
        base = e_field - (127 + emax)
        ceil = base + (m_field > 0).to(tl.int32)
        # even: add half an element ulp (bit 22 - mbits) to amax, so a carry bumps E; NaN bits would overflow
        even = ((tl.minimum(amax, 0x7F800000) + (1 << (22 - mbits))) >> 23) - (127 + emax)
        # rceil: the exact rule is threshold M_MAX for every E; torchao's is measured (calibrate.py)
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
        if ALONG_ROWS or p == 1:
            inv3, deq3, bad3 = tl.expand_dims(inv, 1), tl.expand_dims(deq, 1), tl.expand_dims(bad, 1)
        else:
            inv3, deq3, bad3 = tl.expand_dims(inv, 2), tl.expand_dims(deq, 2), tl.expand_dims(bad, 2)

        # round |x| * 2^-t half-to-even to the element grid, saturating at max: adding C = 2^23 * quantum(v)
        # (quantum = 2^(max(e, emin) - mbits), e = v's exponent) puts v's rounding bit at C's last mantissa
        # bit, so the float addition rounds v to the grid, half to even, and subtracting C back is exact.
        # (The product is exact wherever it can matter: below 2^-126 it is far under half a quantum.)
        v = (mag.to(tl.float32, bitcast=True) * inv3).to(tl.int32, bitcast=True)
        vc = tl.minimum(v, max_bits)  # saturate first, as torchao clamps before its cast (max is on the grid)
        emin_bits = (1 - bias + 127) << 23  # 2^emin, the element's smallest normal
        cb = (tl.maximum(vc, emin_bits) & 0x7F800000) + ((23 - mbits) << 23)
        cf = cb.to(tl.float32, bitcast=True)
        shifted = vc.to(tl.float32, bitcast=True) + cf
        r = shifted - cf
        d = (r * deq3).to(tl.int32, bitcast=True) | sign  # the dequantized value, exact in float32

        if ALONG_ROWS or p == 1:
            off = b * R * C + cols * R + rows
        else:
            off = b * R * C + rows * C + cols
        if p == 1:  # a branch, not a conditional expression: out2_ptr is None unless BOTH
            dest = out2_ptr
        else:
            dest = out_ptr
        if OUT_BF16:  # round half to even on the bits (sign-magnitude: the carry never reaches the sign)
            o = tl.where(bad3, 0x7FC0, (d + 0x7FFF + ((d >> 16) & 1)) >> 16)
            tl.store(dest + off, o.to(tl.int16).to(dest.dtype.element_ty, bitcast=True), mask=mask)
        else:
            tl.store(dest + off, tl.where(bad3, 0x7FC00000, d).to(dest.dtype.element_ty, bitcast=True), mask=mask)
        if WRITE_BYTES:
            if ALONG_ROWS:  # per-block offsets and masks, 2D like the block values
                blk2 = tl.reshape(blk, (BR // 32, 1))
                cols2 = tl.reshape(cols, (1, BC))
                soff = b * (R // 32) * C + cols2 * (R // 32) + blk2
                smask = (blk2 * 32 < R) & (cols2 < C)
            else:
                rows2 = tl.reshape(rows, (BR, 1))
                blk2 = tl.reshape(blk, (1, BC // 32))
                soff = b * R * (C // 32) + rows2 * (C // 32) + blk2
                smask = (rows2 < R) & (blk2 * 32 < C)
            sbyte = tl.where(bad, 255, s + 127)
            tl.store(scale_ptr + soff, sbyte.to(tl.uint8), mask=smask)
            rb = r.to(tl.int32, bitcast=True)
            # below 2^emin the sum counts quanta, which is the subnormal code; above, the bits give it
            code = tl.where(rb < emin_bits, shifted.to(tl.int32, bitcast=True) - cb,
                            (rb >> (23 - mbits)) - ((127 - bias) << mbits))
            # the sign at the code's top bit (bit 7 of an FP8 code, bit 3 of E2M1's): sign is 0 or INT32_MIN
            code = tl.where(bad3, nan_code, code) | ((sign >> (32 - width)) & (1 << (width - 1)))
            tl.store(code_ptr + off, code.to(tl.uint8), mask=mask)


_SETTINGS = ("mode", "torchao", "mbits", "emax", "bias", "max_bits", "nan_code", "width")


@functools.cache
def cast_kernel(device_type: str):
    """The kernel for ``device_type``: Triton-compiled on "cuda", interpreted (NumPy) on "cpu"."""
    if device_type == "cuda":
        # runtime settings: not specialised on ==1 or %16, which would compile a variant per value
        return triton.JITFunction(_mx_cast, do_not_specialize=_SETTINGS)
    from triton.runtime.interpreter import InterpretedFunction

    return InterpretedFunction(_mx_cast)


def compile_ahead(*, along_rows: bool, in_bf16: bool = True, out_bf16: bool = True, write_bytes: bool = False,
                  index64: bool = False, both: bool = False, gather: bool = False,
                  tile: tuple[int, int, int] = (32, 128, 4), arch: int = 90):
    """Compile the CUDA kernel for compute capability ``arch`` with no GPU present (Triton ships ptxas):
    the CPU tier's check that the compiled variants build, and a look at their code. Arguments as the
    launcher specialises them: contiguous last stride (1), 16-divisible pointers, sizes and strides."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = triton.JITFunction(_mx_cast, do_not_specialize=_SETTINGS)
    br, bc, warps = tile
    ints = ("R", "C", "s_b", "s_r") + _SETTINGS
    unused = ({"scale_ptr", "code_ptr"} if not write_bytes else set()) | ({"out2_ptr"} if not both else set()) | (
        {"src_ptr"} if not gather else set())  # passed as None, as the launch does
    value = "*bf16" if out_bf16 else "*fp32"
    signature = {"x_ptr": "*bf16" if in_bf16 else "*fp32", "out_ptr": value, "scale_ptr": "*u8", "code_ptr": "*u8",
                 "thr_ptr": "*i32", "out2_ptr": value, "src_ptr": "*i64", "s_c": "constexpr",
                 **{name: "i64" if index64 and name in ("s_b", "s_r") else "i32" for name in ints},
                 **{name: "constexpr" for name in ("IN_BF16", "OUT_BF16", "WRITE_BYTES", "ALONG_ROWS", "INDEX64",
                                                   "BR", "BC", "BOTH", "GATHER")},
                 **{name: "constexpr" for name in unused}}
    constexprs = {"s_c": 1, "IN_BF16": in_bf16, "OUT_BF16": out_bf16, "WRITE_BYTES": write_bytes,
                  "ALONG_ROWS": along_rows, "INDEX64": index64, "BR": br, "BC": bc, "BOTH": both, "GATHER": gather,
                  **{name: None for name in unused}}
    aligned = [["tt.divisibility", 16]]
    attrs = {(fn.arg_names.index(name),): aligned for name in ("x_ptr", "out_ptr", "scale_ptr", "code_ptr", "thr_ptr",
                                                                "out2_ptr", "src_ptr", "R", "C", "s_b", "s_r")
             if name not in unused}
    source = ASTSource(fn, {name: signature[name] for name in fn.arg_names}, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps})
