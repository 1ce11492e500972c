"""torchao's MX cast (``torchao.prototype.mx_formats.mx_tensor.to_mx``, eager) as a tensor-level subject.

``quantize`` runs ``to_mx`` on a float32 (or bfloat16) tensor and returns (scale bytes, element bytes);
``roundtrip`` goes through ``MXTensor`` and its ``dequantize``, which is what a model sees. All four
scale modes; E4M3, E5M2 and E2M1 (MXFP4, ``torch.float4_e2m1fn_x2``: two codes a byte, unpacked here);
the cast can run on CUDA (``device="cuda"``). torchao is imported lazily.
"""

from __future__ import annotations

import numpy as np
import torch

from numerics.tensor.subjects.subject import Subject

TORCH_ELEM = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "e2m1": torch.float4_e2m1fn_x2}


def _mode(mode: str):
    from torchao.prototype.mx_formats.config import ScaleCalculationMode

    return ScaleCalculationMode(mode)


def _as_tensor(x, device: str | None = None) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x
    return t.to(device).contiguous() if device else t.contiguous()


def quantize(x, elem: str, mode: str, block: int = 32, *, device: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """torchao's cast on ``device`` (default: where x is; NumPy input runs on CPU)."""
    from torchao.prototype.mx_formats.mx_tensor import to_mx

    scale, data = to_mx(_as_tensor(x, device), TORCH_ELEM[elem], block, _mode(mode))
    data = data.view(torch.uint8).cpu().numpy()
    if elem == "e2m1":  # two FP4 codes a byte, element 2i in the low nibble (torchao's pack_uint4)
        data = np.stack([data & 0xF, data >> 4], axis=-1).reshape(*data.shape[:-1], 2 * data.shape[-1])
    return scale.view(torch.uint8).cpu().numpy().reshape(scale.shape), data


def roundtrip(x, elem: str, mode: str, block: int = 32) -> torch.Tensor:
    """Quantize then dequantize through torchao's MXTensor, returned as float32."""
    from torchao.prototype.mx_formats.mx_tensor import MXTensor

    t = MXTensor.to_mx(_as_tensor(x), TORCH_ELEM[elem], block, scaling_mode=_mode(mode))
    return t.dequantize(torch.float32)


def version() -> str:
    import torchao

    return torchao.__version__


def unavailable() -> str | None:
    try:
        from torchao.prototype.mx_formats.mx_tensor import MXTensor, to_mx  # noqa: F401
    except ImportError as exc:
        return f"torchao's MX cast is not importable ({exc}); pip install torchao==0.18.0"
    return None


SUBJECT = Subject(
    name="torchao",
    what="torchao.prototype.mx_formats.mx_tensor.to_mx (eager) and MXTensor.dequantize",
    modes=("floor", "rceil", "ceil", "even"),
    # torchao treats Inf as the largest magnitude: RCEIL follows the oracle's "saturate" reading
    # exactly; FLOOR/CEIL/EVEN differ in the scale only (finding F3)
    inf="saturate",
    quantize=quantize,
    roundtrip=roundtrip,
    version=version,
    unavailable=unavailable,
    devices=("cpu", "cuda"),
    elems=("e4m3", "e5m2", "e2m1"),
)
