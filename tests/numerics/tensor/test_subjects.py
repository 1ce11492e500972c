"""Every tensor-level subject (numerics.tensor.subjects) against the oracle, bit for bit, and its error against BF16.

Parametrized over the registry and each subject's scale modes; a subject that is not importable here
is skipped at collection with its install hint (tests/conftest.py). Every block is compared except
those a known finding of that subject claims (numerics/tensor/findings.py, FINDINGS.md); each
finding's minimal input is pinned as a strict xfail in test_<subject>_findings.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given

from numerics import metrics
from numerics.assertions import assert_sqnr_at_least
from numerics.tensor import cases, findings, mx
from numerics.tensor import strategies as S
from numerics.tensor.compare import compare
from numerics.tensor.subjects import SUBJECTS
from numerics.tolerances import floor

COMBOS = [(s, e, m) for s in SUBJECTS.values() for e in s.elems for m in s.modes]  # what each subject casts
IDS = [f"{s.name}-{e}-{m}" for s, e, m in COMBOS]
ON_CUDA = [c for c in COMBOS if "cuda" in c[0].devices]


def _case_params(*, known_xfail: bool = True):
    """(subject, case) for every named case in a mode the subject implements; known findings xfail strictly
    (``known_xfail``) where the test holds the subject against the derived bytes."""
    params = []
    for s in SUBJECTS.values():
        for c in cases.CASES:
            if c.mode not in s.modes or c.elem not in s.elems:
                continue
            known = [f for f in c.findings if findings.BY_ID[f].subject == s.name]
            reason = f"known finding {', '.join(known)} (FINDINGS.md)"
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if known and known_xfail else []
            params.append(pytest.param(s, c, marks=marks, id=f"{s.name}-{c.name}"))
    return params


def _assert_matches_oracle(subject, x, elem, mode, device=None):
    got = subject.quantize(x, elem, mode, device=device) if device else subject.quantize(x, elem, mode)
    result = compare(x, subject, elem, mode, *got)
    assert not result.unexplained.any(), result.describe()


@pytest.mark.parametrize(("subject", "elem", "mode"), COMBOS, ids=IDS)
@given(x=S.mx_tensors())
def test_subject_cast_matches_oracle_bitwise(subject, elem, mode, x):
    _assert_matches_oracle(subject, x, elem, mode)


@pytest.mark.gpu
@pytest.mark.parametrize(("subject", "elem", "mode"), ON_CUDA, ids=[f"{s.name}-{e}-{m}" for s, e, m in ON_CUDA])
@given(x=S.mx_tensors())
def test_subject_cast_on_cuda_matches_oracle_bitwise(subject, elem, mode, x):
    """The same property with the subject's cast running on the GPU (torch eager kernels on CUDA)."""
    _assert_matches_oracle(subject, x, elem, mode, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize(("subject", "case"),
                         [p for p in _case_params(known_xfail=False) if "cuda" in p.values[0].devices])
def test_subject_cast_on_cuda_named_cases_agree_with_cpu(subject, case):
    """CPU and CUDA casts give the same bytes, the known findings included (same code, other device)."""
    cpu = subject.quantize(case.block(), case.elem, case.mode)
    gpu = subject.quantize(case.block(), case.elem, case.mode, device="cuda")
    np.testing.assert_array_equal(cpu[0], gpu[0])
    if case.scale != 0xFF:
        np.testing.assert_array_equal(cpu[1], gpu[1])


@pytest.mark.parametrize(("subject", "case"), _case_params())
def test_subject_cast_named_cases(subject, case):
    st, et = subject.quantize(case.block(), case.elem, case.mode)
    assert st[0, 0] == case.scale, f"{case.name}: scale {subject.name} 0x{st[0, 0]:02x}, derived 0x{case.scale:02x}"
    if case.scale != 0xFF:
        np.testing.assert_array_equal(et, case.expected_elements())


@pytest.mark.parametrize(("subject", "elem", "mode"), COMBOS, ids=IDS)
@S.share_of_profile(1 / 3)  # a guard on the masks, not the cast: a third of the profile's examples
@given(x=S.mx_tensors(families=("normal", "outliers", "bf16")))
def test_subject_known_findings_leave_training_ranges_untouched(subject, elem, mode, x):
    """The findings' masks claim no block of activation-range data (|x| within 2^-60..2^60): the masking
    in the property test cannot hide a defect in the common case. F2 and X1 may claim a block whose max
    sits within their narrow windows around max*2^k or 2^k: allowed."""
    if np.abs(x).max(initial=0) == 0 or np.abs(x[x != 0]).min() < 2.0**-60:
        return
    so, _ = mx.quantize(x, elem, mode, inf=subject.inf)
    claimed = {k: int(v.sum()) for k, v in findings.known_blocks(x, elem, mode, so, subject=subject.name).items()
               if v.any() and k not in ("F2", "X1")}
    assert not claimed, f"findings claim ordinary blocks: {claimed}"


@pytest.mark.parametrize(("subject", "elem", "mode"), COMBOS, ids=IDS)
def test_subject_nan_block_dequantizes_to_all_nan(subject, elem, mode):
    x = np.ones((2, 32), np.float32)
    x[0, 5] = np.nan
    out = subject.roundtrip(x, elem, mode).numpy()
    assert np.isnan(out[0]).all() and (out[1] == 1.0).all()


@pytest.mark.parametrize(("subject", "elem", "mode"), COMBOS, ids=IDS)
def test_subject_roundtrip_sqnr_of_normal_bf16_data(subject, elem, mode):
    """SQNR of the round trip against the BF16 input, with the floors and their reasons in tolerances.py; the
    oracle's round trip of the same data gives the same SQNR (same bytes, same values)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 1024, generator=g).to(torch.bfloat16)
    out = subject.roundtrip(x, elem, mode)
    measured = assert_sqnr_at_least(x.float(), out, floor("tensor", elem, "roundtrip", "sqnr_db"),
                                    what=f"{subject.name} {elem}/{mode} round trip")
    assert_sqnr_at_least(x.float(), out, floor("tensor", elem, "roundtrip_normal", "sqnr_db"),
                         what=f"{subject.name} {elem}/{mode} round trip")
    so, eo = mx.quantize(x.float().numpy(), elem, mode)
    assert metrics.sqnr_db(x.float(), mx.dequantize(so, eo, elem)) == pytest.approx(measured, abs=1e-9)
