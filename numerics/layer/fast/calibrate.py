"""Where torchao's RCEIL scale rounds, per amax exponent, measured on the device that runs it.

torchao 0.18.0's RCEIL computes the scale exponent as float32 ``ceil(log2(amax / max))``. The exact
rule (``numerics.tensor.mx``) gives ``E - 127 - emax + (M > 0x600000)`` for amax's exponent field E
and mantissa field M (0x600000 is the mantissa of 1.75, and max = 1.75 * 2^emax for both elements).
torchao's float arithmetic keeps that rule except just above 1.75 * 2^k, where its division and its
float32 log2 round to an exact integer and the ceil does not step up (FINDINGS F2). How far above is a
property of the device's division and log2 (the CPU's correctly rounded division and SLEEF log2; a
GPU's reciprocal multiply and libdevice log2), so it is measured there, not derived: for every E the
threshold T[E] such that torchao steps up exactly when M > T[E].

``rceil_thresholds(device, elem)`` runs torchao's own ``to_mx`` on one block per candidate amax (every
E, M within ``WINDOW`` mantissa ulps of 0x600000, and probes far from it), checks that the answer is one
step per E as described (raising ``FastUnavailable`` otherwise), and returns T as an int32 tensor of
256 entries on the device. Measured on CPU (torch 2.13, torchao 0.18.0): T[E] - 0x600000 is 0 to 40
ulps, the width recorded for F2.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from numerics.errors import BadInput
from numerics.tensor.elements import ELEMENTS

M_MAX = 0x600000  # mantissa field of 1.75
# F2's window was measured at most 40 float32 ulps (findings.F2_WINDOW_ULPS = 64 masks it); 512 probes
# 12x past it on either side, where an error in a float32 log2 of a few ulps cannot reach.
WINDOW = 512
# probes away from the window: every other place the rule could disagree with a float computation
_FAR = (0, 1, 2, 0x200000, 0x400000, M_MAX - 4 * WINDOW, M_MAX + 4 * WINDOW, 0x7FFFFE, 0x7FFFFF)


class FastUnavailable(BadInput):
    """The fast kernels cannot run here, or cannot match their reference here; says what works."""


def _probe_fields() -> np.ndarray:
    return np.unique(np.concatenate([M_MAX + np.arange(-WINDOW, WINDOW + 1), np.array(_FAR)]))


@functools.cache
def _thresholds(device: str, elem: str) -> torch.Tensor:
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import to_mx

    from numerics.tensor.subjects.torchao import TORCH_ELEM

    emax = ELEMENTS[elem].emax
    e_fields = np.arange(255, dtype=np.int64)  # every finite amax exponent, subnormals included
    m_fields = _probe_fields()
    amax_bits = (e_fields[:, None] << 23) | m_fields[None, :]
    blocks = np.zeros((amax_bits.size, 32), dtype=np.float32)
    blocks[:, 0] = amax_bits.astype(np.uint32).reshape(-1).view(np.float32)
    scale, _ = to_mx(torch.from_numpy(blocks).to(device), TORCH_ELEM[elem], 32, ScaleCalculationMode.RCEIL)
    got = scale.view(torch.uint8).cpu().numpy().astype(np.int64).reshape(amax_bits.shape)

    base = e_fields[:, None] - 127 - emax
    low = np.clip(base, -127, 127) + 127
    high = np.clip(base + 1, -127, 127) + 127
    stepped = got == high
    if not ((got == low) | stepped).all():
        e = int(e_fields[np.nonzero(~((got == low) | stepped).all(axis=1))[0][0]])
        raise FastUnavailable(f"torchao's RCEIL scale on {device} for {elem} is not the exact rule +- one step "
                              f"at amax exponent field {e}; the fast kernel cannot reproduce it: use kernel 'emulated'")
    thresholds = np.full(256, M_MAX, dtype=np.int64)
    for i, e in enumerate(e_fields):
        if (low[i] == high[i]).all():  # clamped: the step cannot show
            continue
        up = stepped[i]
        first = int(np.argmax(up)) if up.any() else len(m_fields)
        if up[:first].any() or not up[first:].all() or first == 0 or first == len(m_fields):
            raise FastUnavailable(f"torchao's RCEIL scale on {device} for {elem} does not step once near 1.75 * 2^k "
                                  f"at amax exponent field {int(e)}; the fast kernel cannot reproduce it: "
                                  "use kernel 'emulated'")
        thresholds[e] = m_fields[first - 1]
        if abs(thresholds[e] - M_MAX) >= WINDOW:
            raise FastUnavailable(f"torchao's RCEIL threshold on {device} for {elem} at exponent field {int(e)} lies "
                                  f"{int(thresholds[e] - M_MAX)} ulps from 1.75, outside the probed window; "
                                  "use kernel 'emulated'")
    return torch.from_numpy(thresholds.astype(np.int32)).to(device)


def rceil_thresholds(device: torch.device | str, elem: str) -> torch.Tensor:
    """T[E] (int32, 256 entries, on ``device``): torchao's RCEIL steps up iff amax's mantissa field > T[E]."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return _thresholds(str(dev), elem)


def mantissa_field_of_max(elem: str) -> int:
    """The float32 mantissa field of the element's largest value: 0x600000 (1.75) for E4M3 and E5M2,
    0x400000 (1.5) for E2M1 (6 = 1.5 * 2^2)."""
    fmt = ELEMENTS[elem]
    return int((fmt.max_normal / 2.0 ** fmt.emax - 1.0) * 2 ** 23)


@functools.cache
def _exact(device: str, elem: str) -> torch.Tensor:
    return torch.full((256,), mantissa_field_of_max(elem), dtype=torch.int32, device=device)


def exact_thresholds(device: torch.device | str, elem: str = "e4m3") -> torch.Tensor:
    """The exact RCEIL rule as the same table: the mantissa field of the element's max for every E."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return _exact(str(dev), elem)
