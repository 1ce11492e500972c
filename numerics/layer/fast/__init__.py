"""Fast MXFP8 emulation: fused Triton cast kernels, bit-identical to torchao's emulated ops, and the
linear / grouped GEMM built on them (kernel choice ``fast`` in the MXFP8 seam).

Modules: ``kernel`` (the Triton kernel), ``calibrate`` (torchao's RCEIL rounding, measured per device),
``cast`` (``mx_dequantize``, ``mx_dequantize_both``, ``available``),
``padding`` (token groups padded to 32 rows on the device),
``ops`` (``linear``, ``grouped_mm``), ``bench``.
"""

from numerics.layer.fast.calibrate import FastUnavailable
from numerics.layer.fast.cast import FLAVOURS, available, mx_dequantize, mx_dequantize_both

__all__ = ["FLAVOURS", "FastUnavailable", "available", "mx_dequantize", "mx_dequantize_both"]
