"""torchao 0.18's MX cast (the subject) against the oracle, bit for bit, and its error against BF16.

Every block is compared except those a known finding claims (numerics/findings.py, FINDINGS.md);
each finding's minimal input is pinned below as a strict xfail, so a fix upstream fails the run.
Element bytes inside a NaN-scale block are not compared: the spec makes the whole block NaN
whatever its elements hold (torchao writes 0x00 there, the oracle the NaN code); instead
torchao's own dequantize must give NaN for the whole block.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import Phase, example, given, settings

from numerics import metrics
from numerics.assertions import assert_sqnr_at_least
from numerics.tensor import cases, findings, mx, torchao_cast
from numerics.tensor import strategies as S
from numerics.tolerances import floor

COMBOS = [(e, m) for e in ("e4m3", "e5m2") for m in mx.MODES]
IDS = [f"{e}-{m}" for e, m in COMBOS]


def _oracle(x, elem, mode):
    # torchao treats Inf as the largest magnitude (RCEIL follows the oracle's inf="saturate"
    # reading exactly; FLOOR/CEIL/EVEN differ in the scale only, finding F3).
    return mx.quantize(x, elem, mode, inf="saturate")


def _disagreements(x, elem, mode, *, masked=True, device=None):
    """Blocks where torchao and the oracle differ, as (block index, what) pairs."""
    so, eo = _oracle(x, elem, mode)
    st, et = torchao_cast.quantize(x, elem, mode, device=device)
    assert st.shape == so.shape and et.shape == eo.shape
    known = np.zeros(so.shape, dtype=bool)
    if masked:
        for mask in findings.known_blocks(x, elem, mode, so).values():
            known |= mask
    eb, tb = eo.reshape(*so.shape, 32), et.reshape(*so.shape, 32)
    scale_bad = (so != st) & ~known
    elem_bad = (eb != tb).any(axis=-1) & ~known & (so != 0xFF)
    return [(tuple(int(i) for i in idx), "scale" if scale_bad[tuple(idx)] else "elements")
            for idx in np.argwhere(scale_bad | elem_bad)], so, st, eo, et


def _report(x, elem, mode, bad, so, st, eo, et):
    idx, what = bad[0]
    blk = x.reshape(*so.shape, 32)[idx]
    return (
        f"torchao {elem}/{mode}: {len(bad)} block(s) differ from the oracle; first block {idx} ({what}): "
        f"scale oracle 0x{so[idx]:02x} torchao 0x{st[idx]:02x}; elements oracle "
        f"{eo.reshape(*so.shape, 32)[idx].tolist()} torchao {et.reshape(*so.shape, 32)[idx].tolist()}; "
        f"reproduce with x = np.array({blk.tolist()!r}, dtype=np.float32).reshape(1, 32)"
    )


@pytest.mark.parametrize(("elem", "mode"), COMBOS, ids=IDS)
@given(x=S.mx_tensors())
def test_torchao_cast_matches_oracle_bitwise(elem, mode, x):
    bad, *arrays = _disagreements(x, elem, mode)
    assert not bad, _report(x, elem, mode, bad, *arrays)


@pytest.mark.gpu
@pytest.mark.parametrize(("elem", "mode"), COMBOS, ids=IDS)
@given(x=S.mx_tensors())
def test_torchao_cast_on_cuda_matches_oracle_bitwise(elem, mode, x):
    """The same property with torchao's cast running on the GPU (torch eager kernels on CUDA)."""
    bad, *arrays = _disagreements(x, elem, mode, device="cuda")
    assert not bad, _report(x, elem, mode, bad, *arrays)


@pytest.mark.gpu
@pytest.mark.parametrize("case", cases.CASES, ids=lambda c: c.name)
def test_torchao_cast_on_cuda_named_cases_agree_with_cpu(case):
    """CPU and CUDA casts give the same bytes, the known findings included (same code, other device)."""
    cpu = torchao_cast.quantize(case.block(), case.elem, case.mode)
    gpu = torchao_cast.quantize(case.block(), case.elem, case.mode, device="cuda")
    np.testing.assert_array_equal(cpu[0], gpu[0])
    if case.scale != 0xFF:
        np.testing.assert_array_equal(cpu[1], gpu[1])


@pytest.mark.parametrize(("elem", "mode"), COMBOS, ids=IDS)
@given(x=S.mx_tensors(families=("normal", "outliers", "bf16")))
def test_torchao_cast_known_findings_leave_training_ranges_untouched(elem, mode, x):
    """The findings' masks claim no block of activation-range data (|x| within 2^-60..2^60):
    the masking in the property test above cannot hide a defect in the common case."""
    if np.abs(x).max(initial=0) == 0 or np.abs(x[x != 0]).min() < 2.0**-60:
        return
    so, _ = _oracle(x, elem, mode)
    claimed = {k: int(v.sum()) for k, v in findings.known_blocks(x, elem, mode, so).items() if v.any()}
    # F2 can claim an activation block only if its max sits within 64 ulps above max*2^k: allowed.
    claimed.pop("F2", None)
    assert not claimed, f"findings claim ordinary blocks: {claimed}"


@pytest.mark.parametrize("case", cases.CASES, ids=lambda c: c.name)
def test_torchao_cast_named_cases(case):
    if case.finding:
        pytest.xfail(f"known finding {case.finding} (FINDINGS.md); pinned strictly below")
    so, eo = _oracle(case.block(), case.elem, case.mode)
    st, et = torchao_cast.quantize(case.block(), case.elem, case.mode)
    assert st[0, 0] == case.scale, f"{case.name}: scale torchao 0x{st[0, 0]:02x}, derived 0x{case.scale:02x}"
    if case.scale != 0xFF:
        np.testing.assert_array_equal(et, case.expected_elements())


# ---- known findings: the minimal inputs Hypothesis shrank to, pinned; strict, so a fix fails the run ----

def _minimal(value):
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = value
    return x


ONLY_PINNED = settings(phases=[Phase.explicit], database=None)
F1_MIN = {"e4m3": 2.0**-119, "e5m2": 2.0**-112}  # the largest amax whose FLOOR scale is 2^-127


@pytest.mark.xfail(strict=True, reason="F1: torchao scales byte-0x00 blocks by 2^-126 (FINDINGS.md)")
@pytest.mark.parametrize(("elem", "mode"), COMBOS, ids=IDS)
@ONLY_PINNED
@given(x=S.mx_tensors())
@example(x=_minimal(2.0**-119)).via("shrunk: e4m3 FLOOR/RCEIL/EVEN")
@example(x=_minimal(2.0**-112)).via("shrunk: e5m2 FLOOR/EVEN")
@example(x=_minimal(2.0**-126)).via("shrunk: CEIL")
def test_torchao_cast_tiny_scale_blocks_F1(elem, mode, x):
    bad, *arrays = _disagreements(x, elem, mode, masked=False)
    assert not bad, _report(x, elem, mode, bad, *arrays)


@pytest.mark.xfail(strict=True, reason="F2: torchao RCEIL saturates just above max*2^k (FINDINGS.md)")
@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
@ONLY_PINNED
@given(x=S.mx_tensors())
@example(x=_minimal(np.nextafter(np.float32(57344.0), np.float32(np.inf)))).via("shrunk: e4m3")
@example(x=_minimal(np.nextafter(np.float32(448.0), np.float32(np.inf)))).via("shrunk: e5m2")
def test_torchao_cast_rceil_boundary_F2(elem, x):
    bad, *arrays = _disagreements(x, elem, "rceil", masked=False)
    assert not bad, _report(x, elem, "rceil", bad, *arrays)


@pytest.mark.xfail(strict=True, reason="F3: FLOOR/CEIL/EVEN scale Inf blocks by 2^(128-emax) (FINDINGS.md)")
@pytest.mark.parametrize(("elem", "mode"), [c for c in COMBOS if c[1] != "rceil"],
                         ids=[i for i in IDS if "rceil" not in i])
@ONLY_PINNED
@given(x=S.mx_tensors())
@example(x=_minimal(np.inf)).via("shrunk")
def test_torchao_cast_inf_blocks_F3(elem, mode, x):
    bad, *arrays = _disagreements(x, elem, mode, masked=False)
    assert not bad, _report(x, elem, mode, bad, *arrays)


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
    scales = [to_mx(x.to(dev), torchao_cast.TORCH_ELEM[elem], 32, ScaleCalculationMode.RCEIL)[0]
              .view(torch.uint8).cpu().reshape(-1) for dev in ("cpu", "cuda")]
    differ = torch.nonzero(scales[0] != scales[1]).reshape(-1)
    if differ.numel():
        i = int(differ[0])
        raise AssertionError(f"{elem}: {differ.numel()} amax values get different scale bytes; first amax "
                             f"{float(x[i, 0]):.9g} (mantissa 1.75 + {int(mantissas[i]) - 0x600000} ulps): "
                             f"CPU 0x{int(scales[0][i]):02x}, CUDA 0x{int(scales[1][i]):02x}")


def test_torchao_cast_inf_block_follows_saturate_reading_under_rceil():
    x = _minimal(np.inf)
    x[0, 1] = 1.0
    for elem in ("e4m3", "e5m2"):
        bad, *arrays = _disagreements(x, elem, "rceil", masked=False)
        assert not bad, _report(x, elem, "rceil", bad, *arrays)


@pytest.mark.parametrize(("elem", "mode"), COMBOS, ids=IDS)
def test_torchao_cast_nan_block_dequantizes_to_all_nan(elem, mode):
    x = np.ones((2, 32), np.float32)
    x[0, 5] = np.nan
    out = torchao_cast.roundtrip(x, elem, mode).numpy()
    assert np.isnan(out[0]).all() and (out[1] == 1.0).all()


# ---- error against BF16: SQNR of the round trip, with the floors and their reasons in tolerances.py ----

@pytest.mark.parametrize(("elem", "mode"), COMBOS, ids=IDS)
def test_torchao_cast_roundtrip_sqnr_of_normal_bf16_data(elem, mode):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 1024, generator=g).to(torch.bfloat16)
    out = torchao_cast.roundtrip(x, elem, mode)
    measured = assert_sqnr_at_least(x.float(), out, floor("tensor", elem, "roundtrip", "sqnr_db"),
                                    what=f"{elem}/{mode} round trip")
    assert_sqnr_at_least(x.float(), out, floor("tensor", elem, "roundtrip_normal", "sqnr_db"),
                         what=f"{elem}/{mode} round trip")
    # the oracle's round trip of the same data must give the same SQNR: same bytes, same values
    so, eo = mx.quantize(x.float().numpy(), elem, mode)
    assert metrics.sqnr_db(x.float(), mx.dequantize(so, eo, elem)) == pytest.approx(measured, abs=1e-9)
