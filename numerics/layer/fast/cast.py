"""``mx_dequantize``: an operand's MX-dequantized values (and, if asked, its scale and element bytes)
in one pass of the fused kernel, in the memory layout torchao's emulated GEMMs give the same values.

Flavours: ``torchao`` equals torchao 0.18.0's ``to_mx`` followed by its dequantize (``MXTensor.dequantize``
or the grouped GEMM's ``data.to(bf16) * scale.to(bf16)``, which agree) bit for bit, including its
deviations from the rules (FINDINGS F1, F2, F3); ``spec`` equals the oracle ``numerics.tensor.mx``
(``quantize`` with its defaults, then ``dequantize``) bit for bit. NaN-scale blocks dequantize to NaN in
both; their element bytes are the format's NaN code (the suite compares no element bytes there).

Layout: blocks along the last dim (``dim=-1``) give a contiguous result; blocks along the second-to-last
dim (``dim=-2``, the transposed operands of the backward) give a result of the input's shape whose memory
is the transpose's (``out.transpose(-2, -1).is_contiguous()``), what torchao's ``x.t().contiguous()``
then ``to_mx`` then ``.t()`` leaves for the GEMM. Scale bytes come shaped like the blocks (``[..., R, C/32]``
or ``[..., R/32, C]``, the latter transposed in memory the same way); element bytes like the result.

``mx_dequantize_both`` gives both layouts in one launch over the operand: what ``dim=-1`` and ``dim=-2`` give, bit
for bit, for an operand the GEMMs take blocked both ways (forward and backward).

Both take ``rows``: the operand is then ``x``'s rows gathered by it (row ``i`` is ``x[rows[i]]``, zeros where
``rows[i] < 0``), the gather done by the cast's own loads: the grouped GEMM's padded operands are cast from the
unpadded rows, the padded copy never written (``numerics.layer.fast.padding.row_map``).

Public: ``mx_dequantize``, ``mx_dequantize_both``, ``available``, ``FLAVOURS``, ``TORCHAO_ELEMENTS``.
"""

from __future__ import annotations

import contextlib
import functools

import numpy as np
import torch

from numerics.errors import BadInput
from numerics.layer.fast.calibrate import FastUnavailable, exact_thresholds, rceil_thresholds
from numerics.tensor.elements import ELEMENTS

FLAVOURS = ("torchao", "spec")
TORCHAO_ELEMENTS = ("e4m3", "e5m2")  # the elements the torchao flavour reproduces torchao's to_mx for
MODES = ("floor", "rceil", "ceil", "even")
BLOCK = 32
_EMULATED = "use kernel 'emulated' (torchao's eager ops), or 'real' on an SM100 GPU"


def available(device: torch.device | str) -> str | None:
    """None if the fast kernels run on ``device``, else one line saying why and what works there.

    CUDA needs Triton (shipped with CUDA builds of torch) and compute capability 8.0+ (BF16); CPU runs
    the same kernel in Triton's interpreter (``pip install 'mxval[fast]'``): exact, slow, for tests and
    tiny models.
    """
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None and torch.cuda.is_available():
        dev = torch.device("cuda", torch.cuda.current_device())
    return _available(str(dev))


@functools.cache
def _available(device: str) -> str | None:
    dev = torch.device(device)
    try:
        import triton  # noqa: F401
    except ImportError:
        extra = " (pip install 'mxval[fast]')" if dev.type == "cpu" else ""
        return f"kernel 'fast' needs Triton, which is not installed{extra}; {_EMULATED}"
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            return f"kernel 'fast' needs a visible CUDA GPU, none is; {_EMULATED}"
        index = dev.index or 0
        major, minor = torch.cuda.get_device_capability(index)
        if major < 8:
            return f"kernel 'fast' needs compute capability 8.0+ (BF16), GPU {index} has {major}.{minor}; {_EMULATED}"
        return None
    if dev.type == "cpu":
        return None
    return f"kernel 'fast' has no kernels for device type {dev.type!r}; {_EMULATED}"


def _choice(name: str, value, choices) -> None:
    if value not in choices:
        raise BadInput(f"{name}={value!r} is not supported; choose one of {', '.join(map(repr, choices))}")


def _as_3d(t: torch.Tensor, *, output: bool = False) -> torch.Tensor:
    """[B, R, C]: leading dims merged. An input may be copied where its strides do not allow a view;
    an output is always a view (the kernel writes through it)."""
    if t.ndim <= 3:
        return t.view(1, 1, -1) if t.ndim == 1 else t.unsqueeze(0) if t.ndim == 2 else t
    return t.view(-1, *t.shape[-2:]) if output else t.reshape(-1, *t.shape[-2:])


def _launch_config(device_type: str, along_rows: bool, both: bool, rows: int, cols: int) -> tuple[int, int, int]:
    """(BR, BC, num_warps). On CPU the interpreter pays per program, so tiles are large. On a GPU the tiles
    along dim -2 and for both layouts are one warp's, which reduces each block's 32 rows inside the warp (on an
    H200: 32 x 64 along dim -2 at 0.77x the time of 64 x 32 x 2, both layouts 32 x 32 at 0.93x, bit-identical:
    dev/gpu/both_sweep.py, docs/studies/bench.md); along the last dim 32 x 128 with 4 warps (256-byte rows in
    and out)."""
    if device_type != "cuda":
        return (128, 128, 1)
    if both:
        return (32, 32, 1)
    return (32, 64, 1) if along_rows else (32, 128, 4)


def mx_dequantize(
    x: torch.Tensor,
    *,
    elem: str = "e4m3",
    mode: str = "rceil",
    dim: int = -1,
    flavour: str = "torchao",
    out_dtype: torch.dtype = torch.bfloat16,
    return_bytes: bool = False,
    rows: torch.Tensor | None = None,
):
    """MX-quantize ``x`` (BF16 or FP32) in blocks of 32 along ``dim`` (-1 or -2) and dequantize to ``out_dtype``.

    Returns the dequantized tensor, or ``(dequantized, scale_bytes, element_bytes)`` (uint8) when
    ``return_bytes``. Any strides are accepted; nothing is copied first. Without ``return_bytes`` the
    cast keeps a compiled model's graph whole: on CUDA ``torch.compile`` launches the kernel from its graph
    (``mxval::fast_mx_dequantize_cuda``, a triton op), on CPU it is one opaque op
    (``mxval::fast_mx_dequantize``). ``rows``: cast ``x``'s rows gathered by this map (module docstring).
    """
    along_rows = _validate(_operand(x, rows), elem, mode, dim, flavour, out_dtype)
    if return_bytes or not torch.compiler.is_compiling():  # eager: skip the custom op's dispatch cost
        return _cast(x, elem, mode, along_rows, flavour, out_dtype, return_bytes=return_bytes, rows=rows)
    dim = -2 if along_rows else -1
    if x.device.type == "cuda" and _TRITON:  # without Triton the opaque op says the fast path is unavailable
        return _dequantize_cuda_op(x, _compiled_table(x.device, elem, flavour, mode), elem, mode, dim, flavour,
                                   out_dtype, rows)
    return _dequantize_op(x, elem, mode, dim, flavour, out_dtype, rows)


def mx_dequantize_both(
    x: torch.Tensor,
    *,
    elem: str = "e4m3",
    mode: str = "rceil",
    flavour: str = "torchao",
    out_dtype: torch.dtype = torch.bfloat16,
    rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mx_dequantize(x, dim=-1, ...), mx_dequantize(x, dim=-2, ...))`` from one launch of the kernel over
    ``x``: the same values in the same layouts, each tile read twice in a row by one program (the second read, of
    a tile just read, can come from L2). ``x`` needs at least two dims, the last two multiples of 32. Compiled
    as ``mx_dequantize`` is (``mxval::fast_mx_dequantize_both_cuda``, ``mxval::fast_mx_dequantize_both``).
    ``rows``: as for ``mx_dequantize``."""
    operand = _operand(x, rows)
    _validate(operand, elem, mode, -1, flavour, out_dtype)
    if x.ndim < 2:
        raise BadInput(f"mx_dequantize_both needs at least two dims, got shape {tuple(x.shape)}")
    _validate(operand, elem, mode, -2, flavour, out_dtype)
    if not torch.compiler.is_compiling():
        return _cast_both(x, elem, mode, flavour, out_dtype, rows=rows)
    if x.device.type == "cuda" and _TRITON:
        return _dequantize_both_cuda_op(x, _compiled_table(x.device, elem, flavour, mode), elem, mode, flavour,
                                        out_dtype, rows)
    return _dequantize_both_op(x, elem, mode, flavour, out_dtype, rows)


def _operand(x: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """What the cast quantizes: ``x``, or with ``rows`` a stand-in of the gathered operand's shape (no memory)."""
    if rows is None:
        return x
    if not isinstance(x, torch.Tensor) or x.ndim != 2:
        raise BadInput(f"rows gathers the rows of a 2-D x, got shape {tuple(getattr(x, 'shape', ()))}")
    if not isinstance(rows, torch.Tensor) or rows.dtype != torch.int64 or rows.ndim != 1 or rows.device != x.device:
        raise BadInput(f"rows must be a 1-D int64 tensor on x's device ({x.device}), got "
                       f"{rows.dtype if isinstance(rows, torch.Tensor) else type(rows).__name__}")
    return x.new_empty(1, 1).expand(rows.numel(), x.shape[1])


def _validate(x, elem, mode, dim, flavour, out_dtype) -> bool:
    """Whether blocks run along the rows (dim -2); BadInput naming what is wrong otherwise."""
    if not isinstance(x, torch.Tensor):
        raise BadInput(f"x must be a bfloat16 or float32 tensor, got {type(x).__name__}")
    args = (x.dtype, x.shape, elem, mode, dim, flavour, out_dtype)
    if torch.compiler.is_compiling():  # dynamo traces the checks once, and warns of a cache it would skip
        return _validated.__wrapped__(*args)
    return _cached(_validated, *args)  # an unhashable argument is checked uncached, which names what is wrong


def _cached(fn, *args):
    """``fn(*args)`` through its ``functools`` cache, or uncached where the arguments do not hash (a wrong type, a
    traced shape's SymInts)."""
    try:
        return fn(*args)
    except TypeError:
        return fn.__wrapped__(*args)


@functools.lru_cache(maxsize=4096)  # a step validates the same few shapes again and again (BadInput: not cached)
def _validated(dtype, shape, elem, mode, dim, flavour, out_dtype) -> bool:
    if dtype not in (torch.bfloat16, torch.float32):
        raise BadInput(f"x must be a bfloat16 or float32 tensor, got {dtype}")
    _choice("elem", elem, tuple(ELEMENTS))
    _choice("mode", mode, MODES)
    _choice("flavour", flavour, FLAVOURS)
    if flavour == "torchao" and elem not in TORCHAO_ELEMENTS:
        raise BadInput(f"flavour 'torchao' reproduces torchao's to_mx for {', '.join(TORCHAO_ELEMENTS)} only; "
                       f"{elem} takes flavour 'spec'")
    _choice("out_dtype", out_dtype, (torch.bfloat16, torch.float32))
    if len(shape) == 0:
        raise BadInput("x must have at least one dimension, got a scalar")
    if dim not in (-1, len(shape) - 1) and (len(shape) < 2 or dim not in (-2, len(shape) - 2)):
        raise BadInput(f"dim={dim} is not supported for shape {tuple(shape)}: blocks run along the last "
                       "dim (-1) or the second-to-last (-2)")
    along_rows = dim in (-2, len(shape) - 2) and len(shape) >= 2
    axis = len(shape) - 2 if along_rows else len(shape) - 1
    if shape[axis] % BLOCK:
        raise BadInput(f"shape {tuple(shape)}: dim {axis} has size {shape[axis]}, not a multiple of the "
                       f"MX block size {BLOCK}")
    return along_rows


def _empty_result(x: torch.Tensor, along_rows: bool, dtype: torch.dtype) -> torch.Tensor:
    """A tensor of x's shape laid out block-major: contiguous, or the transpose of a contiguous one."""
    if along_rows:
        return torch.empty(*x.shape[:-2], x.shape[-1], x.shape[-2], dtype=dtype, device=x.device).transpose(-2, -1)
    return torch.empty(x.shape, dtype=dtype, device=x.device)


def _cast(x, elem, mode, along_rows, flavour, out_dtype, *, return_bytes: bool, config=None, rows=None, thr=None):
    """``config`` = (BR, BC, num_warps) overrides the tile choice (the benchmark's sweep). ``thr``: the thresholds
    table, given by the compiled path's triton ops, which then launch through ``wrap_triton``."""
    reason = available(x.device)
    if reason:
        raise FastUnavailable(reason)
    src = rows  # the gather map; ``rows`` counts the operand's rows below
    operand = _operand(x, src)
    out = _empty_result(operand, along_rows, out_dtype)
    x3, out3 = _as_3d(x), _as_3d(out, output=True)
    batch, rows, cols = _as_3d(operand).shape
    block_major = (lambda t: t.transpose(-2, -1)) if along_rows else (lambda t: t)
    scales = codes = None
    if return_bytes:
        codes = _empty_result(operand, along_rows, torch.uint8)
        shape = (batch, cols, rows // BLOCK) if along_rows else (batch, rows, cols // BLOCK)
        scales = block_major(torch.empty(shape, dtype=torch.uint8, device=x.device))  # shaped like the blocks
    if out3.numel():
        _run(x3, block_major(out3), block_major(scales) if return_bytes else None,
             block_major(_as_3d(codes, output=True)) if return_bytes else None,
             along_rows=along_rows, elem=elem, mode=mode, torchao=flavour == "torchao", config=config, src=src,
             thr=thr)
    if not return_bytes:
        return out
    scale_shape = ((*operand.shape[:-2], rows // BLOCK, cols) if along_rows else
                   (*operand.shape[:-1], cols // BLOCK))
    return out, scales.reshape(scale_shape), codes


def _cast_both(x, elem, mode, flavour, out_dtype, *, config=None, rows=None, thr=None):
    reason = available(x.device)
    if reason:
        raise FastUnavailable(reason)
    operand = _operand(x, rows)
    along_cols, along_rows = _empty_result(operand, False, out_dtype), _empty_result(operand, True, out_dtype)
    if along_cols.numel():
        _run(_as_3d(x), _as_3d(along_cols, output=True), None, None, along_rows=False, elem=elem, mode=mode,
             torchao=flavour == "torchao", config=config,
             second=_as_3d(along_rows, output=True).transpose(-2, -1), src=rows, thr=thr)
    return along_cols, along_rows


# Under torch.compile on CUDA the cast is a triton op: inductor traces its body to the kernel's launch and launches
# the kernel from its compiled graph, no Python of this module between (on an H100 the opaque op below cost the
# compiled proxy step 3-11 ms of host time the GPU did not hide: docs/studies/bench.md). The thresholds table is
# the op's input, a constant of the compiled graph: dynamo runs ``_compiled_table`` once while tracing (a real
# tensor read inside the traced op is refused by its fake tensors). Dynamo names such a constant after its
# function's code, so each table has a function of its own (two tables from one function in a graph clash).
try:  # without Triton the fast path is unavailable (``available`` says so) and no triton op is registered
    import triton  # noqa: F401

    _TRITON = True
except ImportError:
    _TRITON = False


def _table_function(elem: str, rceil: bool):
    def table(device: torch.device) -> torch.Tensor:
        return _table(device, elem, rceil)

    name = f"_mx_table_{elem}_{'rceil' if rceil else 'exact'}"
    table.__code__ = table.__code__.replace(co_name=name)
    table.__name__ = table.__qualname__ = name
    return torch.compiler.assume_constant_result(table)


def _compiled_table(device: torch.device, elem: str, flavour: str, mode: str) -> torch.Tensor:
    return _TABLE_FUNCTIONS[elem, flavour == "torchao" and mode == "rceil"](device)


if _TRITON:
    _TABLE_FUNCTIONS = {(elem, rceil): _table_function(elem, rceil) for elem in ELEMENTS for rceil in (False, True)}

    @torch.library.triton_op("mxval::fast_mx_dequantize_cuda", mutates_args=())
    def _dequantize_cuda_op(x: torch.Tensor, thr: torch.Tensor, elem: str, mode: str, dim: int, flavour: str,
                            out_dtype: torch.dtype, rows: torch.Tensor | None) -> torch.Tensor:
        return _cast(x, elem, mode, dim == -2, flavour, out_dtype, return_bytes=False, rows=rows, thr=thr)

    @torch.library.triton_op("mxval::fast_mx_dequantize_both_cuda", mutates_args=())
    def _dequantize_both_cuda_op(x: torch.Tensor, thr: torch.Tensor, elem: str, mode: str, flavour: str,
                                 out_dtype: torch.dtype, rows: torch.Tensor | None
                                 ) -> tuple[torch.Tensor, torch.Tensor]:
        return _cast_both(x, elem, mode, flavour, out_dtype, rows=rows, thr=thr)


# On CPU (Triton's interpreter, which cannot run on fake tensors) one opaque op for torch.compile (its fake gives
# the result's shape and strides), in mxval's own namespace: registered when this module is imported, since a
# model being compiled may call it first.
@torch.library.custom_op("mxval::fast_mx_dequantize", mutates_args=(),
                         schema="(Tensor x, str elem, str mode, int dim, str flavour, ScalarType out_dtype, "
                                "Tensor? rows) -> Tensor")
def _dequantize_op(x, elem, mode, dim, flavour, out_dtype, rows):
    return _cast(x, elem, mode, dim == -2, flavour, out_dtype, return_bytes=False, rows=rows)


@_dequantize_op.register_fake
def _(x, elem, mode, dim, flavour, out_dtype, rows):
    return _empty_result(_operand(x, rows), dim == -2, out_dtype)


@torch.library.custom_op("mxval::fast_mx_dequantize_both", mutates_args=(),
                         schema="(Tensor x, str elem, str mode, str flavour, ScalarType out_dtype, Tensor? rows) -> "
                                "(Tensor, Tensor)")
def _dequantize_both_op(x, elem, mode, flavour, out_dtype, rows):
    return _cast_both(x, elem, mode, flavour, out_dtype, rows=rows)


@_dequantize_both_op.register_fake
def _(x, elem, mode, flavour, out_dtype, rows):
    operand = _operand(x, rows)
    return _empty_result(operand, False, out_dtype), _empty_result(operand, True, out_dtype)


def _run(x3, store, scale_store, codes_store, *, along_rows: bool, elem: str, mode: str, torchao: bool,
         config=None, second=None, src=None, thr=None) -> None:
    """One launch of the kernel over x3 [B, R, C]; ``second`` (a [B, C, R] contiguous store) asks for the blocks
    along R too, in the same launch (``store`` then takes the blocks along C); ``src`` (int64 [R'], with B = 1)
    makes the operand x3's rows gathered by it, R' rows (negative: zeros). Pointers not used are None. With
    ``thr`` given (inside the compiled path's op) the launch goes through ``wrap_triton``, so that inductor
    launches the kernel itself from its compiled graph."""
    from numerics.layer.fast.kernel import cast_kernel

    device_type = x3.device.type
    grid, scalars, options = _cached(
        _launch, x3.device.type, x3.dtype, x3.shape, x3.stride(), store.dtype, store.numel(),
        None if src is None else src.numel(), along_rows, elem, mode, torchao, config, second is not None,
        scale_store is not None)
    if thr is None:
        kernel, thr = cast_kernel(device_type), _table(x3.device, elem, torchao and mode == "rceil")
    else:
        kernel = torch.library.wrap_triton(cast_kernel(device_type))
    # the interpreter computes with NumPy, which warns where IEEE overflows to Inf (scale 2^127 blocks)
    quiet = np.errstate(over="ignore") if device_type != "cuda" else contextlib.nullcontext()
    with quiet:
        kernel[grid](x3, store, scale_store, codes_store, thr, second, src, *scalars, **options)


@functools.lru_cache(maxsize=64)  # looked up on every eager launch
def _table(device: torch.device, elem: str, rceil: bool) -> torch.Tensor:
    """The kernel's thresholds table: torchao's RCEIL steps (calibrated once per device), or the exact rule's."""
    return rceil_thresholds(device, elem) if rceil else exact_thresholds(device, elem)


@functools.lru_cache(maxsize=4096)
def _launch(device_type, x_dtype, shape, strides, out_dtype, out_numel, gathered, along_rows, elem, mode, torchao,
            config, both, write_bytes):
    """What a launch takes besides its tensors and the thresholds table: the grid, the scalar arguments and the
    compile-time options. A step casts the same few operands again and again, so this is computed once for each
    (the host's cost of a cast is mostly Python: on an H100, dev/gpu/launch_probe.py measured 64.5 us a cast of
    both layouts without this cache and the cached checks, 53.7 us with them, 19.0 of it Triton's launch)."""
    fmt = ELEMENTS[elem]
    batch, rows, cols = shape
    if gathered is not None:
        rows = gathered
    br, bc, warps = config or _launch_config(device_type, along_rows, both, rows, cols)
    grid = (triton_cdiv(rows, br), triton_cdiv(cols, bc), batch)
    reach = sum((n - 1) * abs(s) for n, s in zip(shape, strides)) + 1
    index64 = max(reach, out_numel) >= 2**31
    max_bits = int(np.float32(fmt.max_normal).view(np.uint32))
    from numerics.layer.fast.kernel import MODE_IDS

    scalars = (rows, cols, *strides, MODE_IDS[mode], int(torchao), fmt.mbits, fmt.emax, fmt.bias, max_bits,
               fmt.nan_code, fmt.width)
    options = dict(IN_BF16=x_dtype == torch.bfloat16, OUT_BF16=out_dtype == torch.bfloat16, WRITE_BYTES=write_bytes,
                   ALONG_ROWS=along_rows, INDEX64=index64, BR=br, BC=bc, BOTH=both, GATHER=gathered is not None,
                   num_warps=warps)
    return grid, scalars, options


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
