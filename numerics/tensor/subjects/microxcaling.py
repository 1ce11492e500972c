"""microsoft/microxcaling's pure-PyTorch MX quantizer (``mx.mx_ops._quantize_mx``) as a tensor-level subject.

microxcaling is the MX emulator much of the MX literature used. It is not on the package index and is
never part of this repository: it is imported from ``PYTHONPATH`` (a clone's root, which holds the
``mx`` package), else from the folder ``$MXVAL_MICROXCALING``, else from ``.microxcaling/`` at the
repository root (git-ignored). Tested at commit 7bc4195 (2024-08-19).

Its one scale rule (``shared_exp_method="max"``) is the OCP FLOOR rule, so FLOOR is its only mode. Its
element rounding is a setting, ``round``: "nearest" (ties away from zero; its ``MxSpecs`` default) or
"even" (ties to even). The subject is held to "even", which OCP MX v1.0 requires implementations to
support; its default "nearest" is finding X3. ``_quantize_mx`` returns dequantized values, not bytes, so
the adapter takes its two steps with microxcaling's own functions: the scale byte is its shared
exponent (``mx_ops._shared_exponents`` of the block, less the element's emax, clamped to [-127, 127]
and NaN above, as ``_quantize_mx`` does), and the element bytes are the float8 codes (torch's cast; for
E2M1, which torch has no one-code-a-byte dtype for, ml_dtypes' ``float4_e2m1fn``) of
``elemwise_ops._quantize_elemwise_core`` on the block divided by that power of two. Every call checks
that element * 2^scale equals ``_quantize_mx``'s output bit for bit, and that every element is on the
element grid (else it has no code): the bytes are the subject's, not the adapter's.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from numerics.tensor.subjects.subject import Subject

TESTED_COMMIT = "7bc41952de394f5cc5e782baf132e7c7542eb4e4"
FORMATS = {"e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2", "e2m1": "fp4_e2m1"}
TORCH_ELEM = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}  # E2M1's codes come from ml_dtypes
ROUNDINGS = ("nearest", "even")
ROUNDING = "even"  # what this subject is held to: ties to even, the rounding OCP MX v1.0 requires support for
LIBRARY_DEFAULT_ROUNDING = "nearest"  # microxcaling's MxSpecs default for every "round*" setting (finding X3)
SCALE_BITS = 8  # E8M0
FOLDER_ENV = "MXVAL_MICROXCALING"
INSTALL_HINT = ("git clone https://github.com/microsoft/microxcaling .microxcaling (at the repository root; "
                f"tested at {TESTED_COMMIT[:7]}), or put a clone's root on PYTHONPATH or in ${FOLDER_ENV}")
_PACKAGE = "_mxval_microxcaling"  # the name a clone outside sys.path is loaded under, so no other `mx` is shadowed


def _folder() -> Path:
    env = os.environ.get(FOLDER_ENV)
    return Path(env) if env else Path(__file__).resolve().parents[3] / ".microxcaling"


@functools.cache
def _library() -> SimpleNamespace:
    """microxcaling's ``mx_ops`` and ``formats`` modules, and the folder they came from."""
    try:
        mx_ops = importlib.import_module("mx.mx_ops")
        formats = importlib.import_module("mx.formats")
        elemwise_ops = importlib.import_module("mx.elemwise_ops")
    except ImportError:
        mx_ops = None
    if mx_ops is not None and hasattr(mx_ops, "_quantize_mx"):
        return SimpleNamespace(mx_ops=mx_ops, formats=formats, elemwise_ops=elemwise_ops,
                               root=Path(mx_ops.__file__).parents[1])
    init = _folder() / "mx" / "__init__.py"
    if not init.is_file():
        raise ImportError(f"microxcaling is not importable: no `mx` package on sys.path and no {init}")
    if _PACKAGE not in sys.modules:
        spec = importlib.util.spec_from_file_location(_PACKAGE, init, submodule_search_locations=[str(init.parent)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[_PACKAGE] = module  # its relative imports resolve through this entry
        try:
            spec.loader.exec_module(module)
        except Exception:
            del sys.modules[_PACKAGE]
            raise
    return SimpleNamespace(mx_ops=importlib.import_module(f"{_PACKAGE}.mx_ops"),
                           formats=importlib.import_module(f"{_PACKAGE}.formats"),
                           elemwise_ops=importlib.import_module(f"{_PACKAGE}.elemwise_ops"), root=init.parents[1])


def unavailable() -> str | None:
    try:
        _library()
    except Exception as exc:  # an old or broken clone fails in its own way; the hint is the same
        return f"{exc}; {INSTALL_HINT}"
    return None


def version() -> str:
    """The clone's commit (read from its .git without running git), or 'unknown commit'."""
    git = _library().root / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head
        ref = head[5:]
        if (git / ref).is_file():
            return (git / ref).read_text().strip()
        for line in (git / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0]
    except OSError:
        pass
    return "unknown commit"


def _check(elem: str, mode: str, round: str) -> None:
    if elem not in FORMATS:
        raise ValueError(f"elem={elem!r} is not supported; choose one of {', '.join(FORMATS)}")
    if mode != "floor":
        raise ValueError(f"microxcaling implements the FLOOR scale rule only, not mode={mode!r}")
    if round not in ROUNDINGS:
        raise ValueError(f"round={round!r} is not supported; choose one of {', '.join(ROUNDINGS)}")


def _as_tensor(x, device: str | None) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)) if isinstance(x, np.ndarray) else x.float()
    return t.to(device).contiguous() if device else t.contiguous()


def roundtrip(x, elem: str, mode: str = "floor", block: int = 32, *, device: str | None = None,
              round: str = ROUNDING) -> torch.Tensor:
    """``_quantize_mx`` over blocks of ``block`` along the last axis: the float32 values a model sees."""
    _check(elem, mode, round)
    lib = _library()
    return lib.mx_ops._quantize_mx(_as_tensor(x, device), SCALE_BITS, FORMATS[elem], shared_exp_method="max",
                                   axes=[-1], block_size=block, round=round)


def _shared_exponents(lib, blocks: torch.Tensor, elem: str) -> torch.Tensor:
    """The scale exponent per block, keepdim (NaN where it overflows), as ``_quantize_mx`` derives it."""
    emax = lib.formats._get_format_params(FORMATS[elem])[2]
    s = lib.mx_ops._shared_exponents(blocks, method="max", axes=[-1], ebits=0) - emax
    limit = 2 ** (SCALE_BITS - 1) - 1
    s[s > limit] = float("nan")
    s[s < -limit] = -limit
    return s


def quantize(x, elem: str, mode: str = "floor", block: int = 32, *, device: str | None = None,
             round: str = ROUNDING) -> tuple[np.ndarray, np.ndarray]:
    """(scale bytes, element bytes) of microxcaling's MX cast; see the module docstring."""
    shape = tuple(x.shape)
    if not shape or shape[-1] % block:
        raise ValueError(f"x's last dim must be a multiple of block={block}, got shape {shape}")
    out = roundtrip(x, elem, mode, block, device=device, round=round)
    lib = _library()
    t = _as_tensor(x, device)
    blocks = t.reshape(*shape[:-1], shape[-1] // block, block)
    s = _shared_exponents(lib, blocks, elem)
    ebits, mbits, _, max_norm, _ = lib.formats._get_format_params(FORMATS[elem])
    # the two steps _quantize_mx takes between the shared exponent and its output, with its own functions
    q = lib.elemwise_ops._quantize_elemwise_core(blocks / (2**s), mbits, ebits, max_norm, round=round,
                                                 allow_denorm=True, saturate_normals=True)
    if not _same_bits(q * (2**s), out.reshape(blocks.shape)):
        raise RuntimeError("microxcaling's _quantize_mx no longer equals its shared exponent and element "
                           f"quantizer composed as this adapter does (a change after {TESTED_COMMIT[:7]}?)")
    nan_block = torch.isnan(s).squeeze(-1).cpu().numpy()
    codes, decoded = _element_codes(q, elem)
    off_grid = ~_same_bits(decoded, q, elementwise=True).cpu().numpy() & ~nan_block[..., None]
    if off_grid.any():
        idx = tuple(int(i) for i in np.argwhere(off_grid)[0])
        raise ValueError(f"microxcaling's element {float(q[idx])!r} at {idx} is not an {elem} value: no byte code")
    exps = torch.nan_to_num(s.squeeze(-1), nan=0.0).cpu().numpy().astype(np.int64)
    scale_bits = np.where(nan_block, 0xFF, exps + 127).astype(np.uint8)
    return scale_bits, codes.reshape(shape)


def _element_codes(q: torch.Tensor, elem: str) -> tuple[np.ndarray, torch.Tensor]:
    """(the byte code of each element value, the value each code decodes to): the caller checks the two agree."""
    if elem in TORCH_ELEM:
        codes = q.to(TORCH_ELEM[elem])
        return codes.view(torch.uint8).cpu().numpy(), codes.float()
    import ml_dtypes

    with np.errstate(invalid="ignore"):  # a NaN block's elements have no E2M1 code; they are not compared
        codes = q.cpu().numpy().astype(ml_dtypes.float4_e2m1fn)
    return codes.view(np.uint8), torch.from_numpy(codes.astype(np.float32)).to(q.device)


def _same_bits(a: torch.Tensor, b: torch.Tensor, *, elementwise: bool = False):
    """float32 equality of bit patterns, any NaN equal to any NaN."""
    same = (a.view(torch.int32) == b.view(torch.int32)) | (torch.isnan(a) & torch.isnan(b))
    return same if elementwise else bool(same.all())


SUBJECT = Subject(
    name="microxcaling",
    what="microxcaling mx.mx_ops._quantize_mx (pure PyTorch), round='even'",
    modes=("floor",),
    inf="nan",  # an Inf makes the shared exponent overflow to NaN, so the whole block is NaN
    quantize=quantize,
    roundtrip=roundtrip,
    version=version,
    unavailable=unavailable,
    devices=("cpu", "cuda"),
    elems=("e4m3", "e5m2", "e2m1"),
)
