"""The tensor-level subject: torchao 0.18's MX cast, adapted to the oracle's byte interface.

``quantize(x, elem, mode, block=32)`` runs ``torchao.prototype.mx_formats.mx_tensor.to_mx`` on a
float32 (or bfloat16) tensor and returns (scale bytes, element bytes) as uint8 NumPy arrays, the
same layout ``numerics.tensor.mx.quantize`` returns. ``roundtrip`` goes through ``MXTensor`` and its
``dequantize``, which is what a model sees. torchao is imported lazily.
"""

from __future__ import annotations

import numpy as np
import torch

TORCH_ELEM = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


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
    return (scale.view(torch.uint8).cpu().numpy().reshape(scale.shape),
            data.view(torch.uint8).cpu().numpy())


def roundtrip(x, elem: str, mode: str, block: int = 32) -> torch.Tensor:
    """Quantize then dequantize through torchao's MXTensor, returned as float32."""
    from torchao.prototype.mx_formats.mx_tensor import MXTensor

    t = MXTensor.to_mx(_as_tensor(x), TORCH_ELEM[elem], block, scaling_mode=_mode(mode))
    return t.dequantize(torch.float32)
