"""torchao's MX cast: the minimal inputs of its known findings (FINDINGS.md F1-F3), pinned as strict xfails.

Hypothesis shrank each disagreement to these inputs; the comparison here lets no finding claim a block,
so when torchao fixes one, its test passes and fails the run, and FINDINGS.md and
numerics/tensor/findings.py must be updated. The general properties are in test_subjects.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import Phase, example, given, settings

from numerics.tensor import mx
from numerics.tensor import strategies as S
from numerics.tensor.compare import compare
from numerics.tensor.subjects import torchao

SUBJECT = torchao.SUBJECT
COMBOS = [(e, m) for e in SUBJECT.elems for m in mx.MODES]  # e2m1 too: the same code paths (FINDINGS.md)
IDS = [f"{e}-{m}" for e, m in COMBOS]
ONLY_PINNED = settings(phases=[Phase.explicit], database=None)


def _assert_exact(x, elem, mode):
    result = compare(x, SUBJECT, elem, mode, *SUBJECT.quantize(x, elem, mode), masked=False)
    assert not result.unexplained.any(), result.describe()


def _minimal(value):
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = value
    return x


@pytest.mark.xfail(strict=True, reason="F1: torchao scales byte-0x00 blocks by 2^-126 (FINDINGS.md)")
@pytest.mark.parametrize(("elem", "mode"), COMBOS, ids=IDS)
@ONLY_PINNED
@given(x=S.mx_tensors())
@example(x=_minimal(2.0**-119)).via("shrunk: e4m3 FLOOR/RCEIL/EVEN")
@example(x=_minimal(2.0**-112)).via("shrunk: e5m2 FLOOR/EVEN")
@example(x=_minimal(2.0**-126)).via("shrunk: CEIL")
@example(x=_minimal(2.0**-125)).via("shrunk: e2m1 RCEIL/EVEN; FLOOR/CEIL by hand")
def test_torchao_cast_tiny_scale_blocks_F1(elem, mode, x):
    _assert_exact(x, elem, mode)


@pytest.mark.xfail(strict=True, reason="F2: torchao RCEIL saturates just above max*2^k (FINDINGS.md)")
@pytest.mark.parametrize("elem", SUBJECT.elems)
@ONLY_PINNED
@given(x=S.mx_tensors())
@example(x=_minimal(np.nextafter(np.float32(57344.0), np.float32(np.inf)))).via("shrunk: e4m3")
@example(x=_minimal(np.nextafter(np.float32(448.0), np.float32(np.inf)))).via("shrunk: e5m2")
@example(x=_minimal(np.nextafter(np.float32(192.0), np.float32(np.inf)))).via("by hand: e2m1, 6 * 2^5")
def test_torchao_cast_rceil_boundary_F2(elem, x):
    _assert_exact(x, elem, "rceil")


@pytest.mark.xfail(strict=True, reason="F3: FLOOR/CEIL/EVEN scale Inf blocks by 2^(128-emax) (FINDINGS.md)")
@pytest.mark.parametrize(("elem", "mode"), [c for c in COMBOS if c[1] != "rceil"],
                         ids=[i for i in IDS if "rceil" not in i])
@ONLY_PINNED
@given(x=S.mx_tensors())
@example(x=_minimal(np.inf)).via("shrunk")
def test_torchao_cast_inf_blocks_F3(elem, mode, x):
    _assert_exact(x, elem, mode)


def test_torchao_cast_inf_block_follows_saturate_reading_under_rceil():
    x = _minimal(np.inf)
    x[0, 1] = 1.0
    for elem in SUBJECT.elems:
        _assert_exact(x, elem, "rceil")


@pytest.mark.gpu
@pytest.mark.xfail(strict=True, reason="F5: torchao 0.18's RCEIL scale byte depends on the device inside F2's window "
                   "(CUDA divides by a scalar as a multiply by its reciprocal; FINDINGS.md F5)")
@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
def test_torchao_cast_rceil_bytes_are_the_same_on_cpu_and_cuda_F5(elem):
    """One block per amax, every other element 0: amax walks the 1025 float32 ulps around 1.75 * 2^k (F2's
    window; 1.75 is the mantissa of both elements' max) for every normal exponent k. The same input must
    give the same scale byte on either device; the message names the first amax where it does not."""
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import to_mx

    fields = (np.arange(1, 255)[:, None] << 23) | (0x600000 + np.arange(-512, 513))[None, :]
    mantissas = (fields & 0x7FFFFF).reshape(-1)  # 1.75's mantissa field, +- 512 ulps, every exponent
    blocks = np.zeros((mantissas.size, 32), dtype=np.float32)
    blocks[:, 0] = fields.reshape(-1).astype(np.uint32).view(np.float32)
    x = torch.from_numpy(blocks)
    scales = [to_mx(x.to(dev), torchao.TORCH_ELEM[elem], 32, ScaleCalculationMode.RCEIL)[0]
              .view(torch.uint8).cpu().reshape(-1) for dev in ("cpu", "cuda")]
    differ = torch.nonzero(scales[0] != scales[1]).reshape(-1)
    if differ.numel():
        i = int(differ[0])
        raise AssertionError(f"{elem}: {differ.numel()} amax values get different scale bytes; first amax "
                             f"{float(x[i, 0]):.9g} (mantissa 1.75 + {int(mantissas[i]) - 0x600000} ulps): "
                             f"CPU 0x{int(scales[0][i]):02x}, CUDA 0x{int(scales[1][i]):02x}")
