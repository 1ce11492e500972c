"""The fast MXFP8 linear and grouped GEMM (numerics.layer.fast.ops) against torchao 0.18.0's emulated ops:
output, dX and dW bit for bit, both recipes (wgrad in MXFP8 or in high precision), even, uneven, empty and
unaligned token groups; and where torchao fails (non-contiguous upstream gradient, FINDINGS L1), the fast
ops still give the gradients of the contiguous case. A control plants a one-ulp error in the fast ops'
cast and shows every comparison catches it.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from numerics.assertions import assert_bits_equal
from numerics.errors import BadInput
from numerics.layer import strategies as ls
from numerics.layer.op_recipe import OpRecipe

pytest.importorskip("triton", reason="the fast kernels run on CPU in Triton's interpreter: pip install '.[fast]'")
from numerics.layer.fast import ops  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# (x, weight, upstream gradient) scaled per row over 2^-12..2^12 and per channel over 2^-4..2^4,
# so blocks take many different scales (a plain randn gives nearly one scale for every block)
SCALES = {"normal": (0, 0), "spread": (12, 4)}


def _emulated():
    from torchao.quantization.quantize_.common import KernelPreference

    return KernelPreference.EMULATED


def _rand(shape, g, spread, device):
    rows, cols = SCALES[spread]
    x = torch.randn(shape, generator=g)
    x = x * torch.exp2(torch.randint(-rows, rows + 1, (*shape[:-1], 1), generator=g).float())
    x = x * torch.exp2(torch.randint(-cols, cols + 1, (shape[-1],), generator=g).float())
    return x.to(device=device, dtype=torch.bfloat16)


def _fwd_bwd(op, x, w, grad):
    x = x.detach().clone().requires_grad_(True)
    w = w.detach().clone().requires_grad_(True)
    y = op(x, w)
    y.backward(grad)
    return {"output": y.detach(), "dX": x.grad, "dW": w.grad}


def _assert_same(expected: dict, got: dict, what: str) -> None:
    """Every one of output / dX / dW bit-identical; the failure names each that is not."""
    errors = []
    for name in expected:
        assert got[name].shape == expected[name].shape and got[name].dtype == expected[name].dtype, name
        try:
            assert_bits_equal(expected[name], got[name], what=f"{what}: {name}", canonical_nan=True)
        except AssertionError as e:
            errors.append(str(e))
    if errors:
        raise AssertionError("\n".join(errors))


def _torchao_linear(hp, mode="RCEIL"):
    from torchao.prototype.moe_training.mxfp8_linear import _to_mxfp8_then_scaled_mm
    from torchao.prototype.mx_formats.config import ScaleCalculationMode

    return lambda x, w: _to_mxfp8_then_scaled_mm(x, w, kernel_preference=_emulated(),
                                                 scale_calculation_mode=ScaleCalculationMode[mode], wgrad_with_hp=hp)


def _torchao_grouped(offs, hp, pad, mode="RCEIL"):
    from torchao.prototype.moe_training import _to_mxfp8_then_scaled_grouped_mm
    from torchao.prototype.mx_formats.config import ScaleCalculationMode

    return lambda x, w: _to_mxfp8_then_scaled_grouped_mm(
        x, w.transpose(-2, -1), offs, out_dtype=torch.bfloat16, kernel_preference=_emulated(), wgrad_with_hp=hp,
        scale_calculation_mode=ScaleCalculationMode[mode], pad_token_groups_for_grouped_mm=pad)


def _check_linear(dims, hp, spread, seed, device, *, linear=None):
    linear = linear or ops.linear
    m, k, n = dims
    g = torch.Generator().manual_seed(seed)
    x_shape = (2, m // 2, k) if m % 64 == 0 else (m, k)  # 3D activations too, where the tokens split evenly
    x, w = _rand(x_shape, g, spread, device), _rand((n, k), g, spread, device)
    grad = _rand((*x.shape[:-1], n), g, spread, device)
    expected = _fwd_bwd(_torchao_linear(hp), x, w, grad)
    got = _fwd_bwd(lambda a, b: linear(a, b, OpRecipe(wgrad_with_hp=hp)), x, w, grad)
    _assert_same(expected, got, f"linear {dims} wgrad_with_hp={hp} {spread}")


def _check_grouped(sizes, dims, hp, pad, spread, seed, device, *, grouped_mm=None):
    grouped_mm = grouped_mm or ops.grouped_mm
    _, k, n = dims
    g = torch.Generator().manual_seed(seed)
    m = sum(sizes)
    x, w = _rand((m, k), g, spread, device), _rand((len(sizes), n, k), g, spread, device)
    grad = _rand((m, n), g, spread, device)
    offs = torch.tensor(sizes, device=device).cumsum(0).to(torch.int32)
    expected = _fwd_bwd(_torchao_grouped(offs, hp, pad), x, w, grad)
    got = _fwd_bwd(lambda a, b: grouped_mm(a, b.transpose(-2, -1), offs, OpRecipe(wgrad_with_hp=hp), pad_groups=pad),
                   x, w, grad)
    _assert_same(expected, got, f"grouped_mm {sizes} {dims} wgrad_with_hp={hp} pad={pad} {spread}")


# each example runs six interpreted kernel launches (~1.5 s on one CI core) beside torchao's emulation
@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=8)
@given(dims=ls.gemm_dims(max_blocks=4), hp=st.booleans(), spread=st.sampled_from(tuple(SCALES)),
       seed=st.integers(0, 2**16))
@example(dims=(64, 32, 96), hp=False, spread="spread", seed=0)
@example(dims=(32, 96, 32), hp=True, spread="normal", seed=1)
def test_fast_linear_matches_torchao_emulated_bit_for_bit(device, dims, hp, spread, seed):
    _check_linear(dims, hp, spread, seed, device)


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=8)
@given(sizes=ls.group_sizes(max_tokens=192), dims=ls.gemm_dims(max_blocks=3), hp=st.booleans(),
       spread=st.sampled_from(tuple(SCALES)), seed=st.integers(0, 2**16))
@example(sizes=(64, 64, 32), dims=(0, 64, 96), hp=False, spread="spread", seed=0)  # even, aligned
@example(sizes=(96, 0, 32, 0), dims=(0, 32, 64), hp=True, spread="normal", seed=1)  # uneven with empty experts
@example(sizes=(0, 0, 64, 0), dims=(0, 32, 32), hp=False, spread="normal", seed=2)  # one expert takes all
@example(sizes=(33, 0, 31, 7), dims=(0, 64, 32), hp=False, spread="spread", seed=3)  # unaligned, padded
@example(sizes=(33, 0, 31, 7), dims=(0, 64, 32), hp=True, spread="normal", seed=4)
def test_fast_grouped_mm_matches_torchao_emulated_bit_for_bit(device, sizes, dims, hp, spread, seed):
    pad = any(s % 32 for s in sizes)  # what torchtitan does: pad exactly when a group is unaligned
    _check_grouped(sizes, dims, hp, pad, spread, seed, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("hp", (False, True))
@pytest.mark.parametrize("sizes", [(0, 45, 0, 19, 0), (64, 0, 32), (0, 0, 70, 0)],
                         ids=["uneven, empty first, between and last", "aligned", "one expert takes all"])
def test_fast_grouped_mm_with_padded_groups_matches_torchao_emulated_bit_for_bit(sizes, hp, device):
    """With padded groups (the seam pads always, aligned groups too), the fast op's device-side padding gives
    torchao's emulated op's output, dX and dW bit for bit."""
    _check_grouped(sizes, (0, 64, 96), hp, True, "spread", 10, device)


@pytest.mark.parametrize("hp", (False, True))
def test_fast_grouped_mm_unaligned_groups_without_padding_match_torchao(hp):
    """Unpadded groups of 20 and 44 tokens (total 64): torchao's dW blocks then span both experts (L3);
    the fast op reproduces that, bit for bit, rather than silently differing from the ops it replaces."""
    _check_grouped((20, 44), (0, 32, 64), hp, False, "spread", 5, "cpu")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ("expanded", "transposed"))
def test_fast_ops_take_non_contiguous_upstream_gradients(kind, device):
    """torchao's grouped GEMM asserts on these (FINDINGS L1); the fast ops give the contiguous case's bits."""
    g = torch.Generator().manual_seed(6)
    x, w = _rand((64, 32), g, "spread", device), _rand((2, 64, 32), g, "spread", device)
    offs = torch.tensor([32, 64], device=device, dtype=torch.int32)
    base = _rand((64, 64), g, "normal", device)
    grad = base[:1].expand(64, 64) if kind == "expanded" else base.t()
    assert not grad.is_contiguous()
    for op in (lambda a, b: ops.grouped_mm(a, b.transpose(-2, -1), offs, pad_groups=False),
               lambda a, b: ops.linear(a, b[0])):
        _assert_same(_fwd_bwd(op, x, w, grad.contiguous()), _fwd_bwd(op, x, w, grad), f"{kind} gradient")


@pytest.mark.parametrize("hp", (False, True))
@pytest.mark.parametrize("frozen", ("x", "w", "both"))
def test_fast_ops_cast_only_the_layouts_of_the_gradients_asked_for(monkeypatch, frozen, hp):
    """An operand without a gradient (a frozen weight, an input that needs none) or a forward without autograd (an
    evaluation) asks fewer layouts: the gradients that are asked stay torchao's bit for bit, and a forward under
    no_grad casts each operand along the last dim only (the control: with gradients on, both ways)."""
    g = torch.Generator().manual_seed(3)
    x, w, grad = (_rand(shape, g, "spread", "cpu") for shape in ((64, 64), (32, 64), (64, 32)))
    offs = torch.tensor([32, 64], dtype=torch.int32)
    w_experts = torch.cat([w, w.flip(0)]).reshape(2, 32, 64)  # [E, N, K]
    cases = ((ops.linear, _torchao_linear(hp), w, lambda a, b: ops.linear(a, b, OpRecipe(wgrad_with_hp=hp))),
             (ops.grouped_mm, _torchao_grouped(offs, hp, False), w_experts,
              lambda a, b: ops.grouped_mm(a, b.transpose(-2, -1), offs, OpRecipe(wgrad_with_hp=hp), pad_groups=False)))
    for name, ref, weight, fast_op in cases:
        results = []
        for f in (ref, fast_op):
            a = x.detach().clone().requires_grad_(frozen not in ("x", "both"))
            b = weight.detach().clone().requires_grad_(frozen not in ("w", "both"))
            y = f(a, b)
            if y.requires_grad:
                y.backward(grad)
            results.append({"output": y.detach(), **({"dX": a.grad} if a.requires_grad else {}),
                            **({"dW": b.grad} if b.requires_grad else {})})
        _assert_same(results[0], results[1], f"{name.__name__}, frozen {frozen}, wgrad_with_hp={hp}")
    calls = []
    real = ops._cast_both
    monkeypatch.setattr(ops, "_cast_both", lambda *a: calls.append(1) or real(*a))
    x_, w_ = x.detach().requires_grad_(True), w.detach().requires_grad_(True)
    with torch.no_grad():
        ops.linear(x_, w_, OpRecipe(wgrad_with_hp=hp))
    assert calls == []
    ops.linear(x_, w_, OpRecipe(wgrad_with_hp=hp))
    assert len(calls) == (1 if hp else 2)  # W both ways; x too where dW is quantized


def _planted(cast):
    """``ops._cast`` (or ``ops._cast_both``) with one ulp added to every nonzero finite value it gives: a cast that
    rounds one step off."""
    def off_by_one_ulp(*args):
        out = cast(*args)
        for t in out if isinstance(out, tuple) else (out,):
            bits = t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.int32)
            bits += ((bits != 0) & t.isfinite()).to(bits.dtype)
        return out
    return off_by_one_ulp


@pytest.mark.parametrize("hp", (False, True))
def test_fast_ops_checks_fail_on_a_planted_one_ulp_cast_error(monkeypatch, hp):
    """Each comparison (output, dX, and dW where it is quantized) catches a cast one ulp off."""
    _check_linear((64, 64, 64), hp, "spread", 7, "cpu")
    _check_grouped((32, 0, 64), (0, 64, 64), hp, False, "spread", 8, "cpu")
    monkeypatch.setattr(ops, "_cast", _planted(ops._cast))
    monkeypatch.setattr(ops, "_cast_both", _planted(ops._cast_both))
    caught = ("output", "dX") + (() if hp else ("dW",))
    for check in (lambda: _check_linear((64, 64, 64), hp, "spread", 7, "cpu"),
                  lambda: _check_grouped((32, 0, 64), (0, 64, 64), hp, False, "spread", 8, "cpu")):
        with pytest.raises(AssertionError) as failure:
            check()
        named = {line.split(": ")[1] for line in str(failure.value).splitlines()}
        assert named == set(caught), str(failure.value)


def test_fast_ops_reject_bad_input_with_a_library_error():
    x = torch.zeros(64, 48, dtype=torch.bfloat16)
    with pytest.raises(BadInput, match=r"dim 1 has size 48"):
        ops.linear(x, torch.zeros(32, 48, dtype=torch.bfloat16))
    with pytest.raises(BadInput, match="weight"):
        ops.linear(torch.zeros(64, 32), torch.zeros(32, 64))
    with pytest.raises(BadInput, match="OpRecipe"):
        ops.linear(torch.zeros(64, 32), torch.zeros(32, 32), "mxfp8")
    with pytest.raises(BadInput, match="scale_calculation_mode"):
        OpRecipe(scale_calculation_mode="NEAREST")
    with pytest.raises(BadInput, match="w_t"):
        ops.grouped_mm(torch.zeros(64, 32), torch.zeros(2, 64, 32), torch.tensor([32, 64]), pad_groups=False)


def test_fast_bench_quick_run_prints_every_figure_and_keeps_an_existing_json(tmp_path, capsys):
    from numerics.layer.fast import bench

    out = tmp_path / "bench.json"
    argv = ["--device", "cpu", "--quick", "--iters", "1", "--warmup", "0", "--no-compile", "--sweep", "--repeats", "2",
            "--json", str(out)]
    assert bench.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["kind"] == bench.KIND and result["version"] == 2 and result["repeats"] == 2
    assert {c["dim"] for c in result["casts"]} == {-1, -2, "both"} and [o["op"] for o in result["ops"]] == ["linear",
                                                                                                     "grouped_mm"]
    assert all(c["fast_ms"] > 0 and c["floor_ms"] > 0 for c in result["casts"])
    for row, key in [(c, "fast_ms") for c in result["casts"]] + [(o, k) for o in result["ops"]
                                                                 for k in ("fast_ms", "bf16_wall_ms")]:
        each = row[f"{key}_each"]  # two separate measurements (timings of separate calls never agree to the bit)
        assert len(each) == 2 and each[0] != each[1] and row[f"{key}_range"] == [min(each), max(each)]
        assert row[key] == statistics.median(each)
    for o in result["ops"]:
        ratios = [a / b for a, b in zip(o["fast_ms_each"], o["bf16_ms_each"])]
        assert o["fast_over_bf16"] == o["fast_ms"] / o["bf16_ms"]  # the ratio of the medians
        assert o["fast_over_bf16_range"] == [min(ratios), max(ratios)]  # the range of the per-repeat ratios
    assert bench.load_report(out) == result
    assert "fast/bf16 (range)" in capsys.readouterr().out
    assert bench.main(argv) == 2  # the file exists: not overwritten without --force
    assert "exists" in capsys.readouterr().err


# A first-format (version 1) result as the bench wrote it before repeats: one measurement per figure, no kind or
# version. Its rows are the first three of the first golden/layers/fast_bench__h200.json (one H200, torch 2.11.0).
FIRST_FORMAT = {
    "device": "NVIDIA H200", "torch": "2.11.0+cu130", "iters": 50, "warmup": 10,
    "copy_bandwidth_tb_s": 4.231061114505986,
    "casts": [{"shape": [16384, 2048], "dim": -1, "floor_ms": 0.03172200173139572,
               "torchao_eager_ms": 0.9534080028533936, "torchao_compiled_ms": 0.047200001776218414,
               "fast_ms": 0.050783999264240265}],
    "ops": [{"op": "linear", "shape": [16384, 2048, 1408, 8], "cast_floor_ms": 0.1125139748910442,
             "fast_ms": 0.5992159843444824, "fast_wall_ms": 1.4148441199995432, "emulated_ms": 4.3512959480285645,
             "emulated_wall_ms": 4.778222759999835, "bf16_ms": 0.373648002743721, "bf16_wall_ms": 0.386788539999543},
            {"op": "grouped_mm", "shape": [16384, 2048, 1408, 8], "cast_floor_ms": 0.15067950822412968,
             "fast_ms": 0.7545439898967743, "fast_wall_ms": 1.3026016200001322, "emulated_ms": 5.441119909286499,
             "emulated_wall_ms": 5.460700019999649, "bf16_ms": 0.43913599848747253,
             "bf16_wall_ms": 0.44535795999991024}],
}


def test_fast_bench_reads_the_first_format_as_one_repeat(tmp_path):
    from numerics.layer.fast import bench

    (tmp_path / "v1.json").write_text(json.dumps(FIRST_FORMAT))
    raw = FIRST_FORMAT
    doc = bench.load_report(tmp_path / "v1.json")
    assert doc["read_from_version"] == 1 and doc["repeats"] == 1
    grouped = doc["ops"][1]
    assert grouped["fast_ms_each"] == [raw["ops"][1]["fast_ms"]]
    assert grouped["fast_ms_range"] == [grouped["fast_ms"]] * 2
    assert grouped["fast_over_bf16_range"] == [raw["ops"][1]["fast_ms"] / raw["ops"][1]["bf16_ms"]] * 2
    assert "1.72x (1.72-1.72)" in bench.format_report(doc)
    bad = json.loads(json.dumps(raw))
    del bad["ops"][0]["fast_ms"]  # a first-format file without a figure is refused
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(BadInput, match="lacks figures"):
        bench.load_report(tmp_path / "bad.json")


def test_fast_bench_reads_the_recorded_golden_file():
    """golden/layers/fast_bench__h200.json, whichever version it was recorded in."""
    from numerics.layer.fast import bench

    doc = bench.load_report(Path(__file__).resolve().parents[3] / "golden" / "layers" / "fast_bench__h200.json")
    assert doc["kind"] == bench.KIND and [o["op"] for o in doc["ops"]] == ["linear", "grouped_mm"]
    assert all(o["fast_ms"] > o["bf16_ms"] > 0 for o in doc["ops"])


@pytest.mark.parametrize("argv", (["--device", "cpu"], ["--iters", "0"], ["--device", "tpu", "--quick"],
                                  ["--repeats", "0"]))
def test_fast_bench_bad_input_is_one_line_and_exit_2(argv, capsys):
    from numerics.layer.fast import bench

    assert bench.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(("device", "backend"), [("cpu", "aot_eager"), pytest.param("cuda", "inductor",
                                                                                      marks=pytest.mark.gpu)])
def test_fast_ops_under_torch_compile_give_the_eager_bits(device, backend):
    """The cast is one opaque op (mxval::fast_mx_dequantize) to torch.compile: the compiled model traces
    through the autograd functions and returns the eager bits. CPU checks the tracing (aot_eager, no C++
    build); the GPU tier runs inductor."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(9)
    x, w = _rand((64, 64), g, "spread", device), _rand((2, 96, 64), g, "spread", device)
    grad = _rand((64, 96), g, "normal", device)
    offs = torch.tensor([32, 64], device=device, dtype=torch.int32)

    def model(a, b):
        h = ops.linear(a, b[0])
        return torch.relu(h) * 2 + ops.grouped_mm(a, b.transpose(-2, -1), offs, pad_groups=False)

    _assert_same(_fwd_bwd(model, x, w, grad), _fwd_bwd(torch.compile(model, backend=backend, fullgraph=True),
                                                      x, w, grad), f"torch.compile({backend})")


def _inductor_kernels(code: str) -> list[str]:
    """The Triton kernels an inductor wrapper defines: the names given to ``async_compile.triton``."""
    import re

    return re.findall(r"async_compile\.triton\(\s*'([^']+)'", code)


@pytest.mark.gpu
@pytest.mark.parametrize("cast", ("both", "dim-2", "gathered"))
def test_compiled_cuda_casts_are_the_kernel_launched_by_inductor(cast):
    """Under torch.compile on CUDA a cast is the kernel itself in inductor's code (a triton op): no op dispatch,
    no Python of the cast module, no copy of its operand or results, and the eager bits. Control: the CPU's
    opaque op, called the same way on CUDA, shows up in the code as the op call this test rejects."""
    from torch._inductor.utils import run_and_get_code

    from numerics.layer.fast import cast as C

    torch._dynamo.reset()
    g = torch.Generator().manual_seed(11)
    x = _rand((128, 96), g, "spread", "cuda")
    rows = torch.tensor([5, -1, 7, 0] * 16, device="cuda")
    run = {"both": lambda t: C.mx_dequantize_both(t),
           "dim-2": lambda t: C.mx_dequantize(t, dim=-2),
           "gathered": lambda t: C.mx_dequantize_both(t, rows=rows)}[cast]
    got, codes = run_and_get_code(torch.compile(run, fullgraph=True), x)
    code = "\n".join(codes)
    assert _inductor_kernels(code) and set(_inductor_kernels(code)) == {"_mx_cast"}, _inductor_kernels(code)
    assert "torch.ops.mxval" not in code and "clone" not in code
    expected = run(x)
    pairs = zip(*(r if isinstance(r, tuple) else (r,) for r in (expected, got)))
    for e, o in pairs:
        assert e.stride() == o.stride() and torch.equal(o.view(torch.int16), e.view(torch.int16)), cast

    torch._dynamo.reset()
    _, codes = run_and_get_code(torch.compile(lambda t: C._dequantize_both_op(t, "e4m3", "rceil", "torchao",
                                                                              torch.bfloat16, None)), x)
    assert "torch.ops.mxval.fast_mx_dequantize_both" in "\n".join(codes)


def _torchao_mx(t: torch.Tensor, elem) -> torch.Tensor:
    """torchao's own cast (to_mx, RCEIL) and dequantize along the last dim: the reference for E5M2 operands."""
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import MXTensor

    return MXTensor.to_mx(t.contiguous(), elem, 32, ScaleCalculationMode.RCEIL, _emulated()).dequantize(t.dtype)


def _linear_of_casts(cast, x, w, grad) -> dict:
    """Output, dX and dW of an MX linear as plain GEMMs of ``cast`` operands (``cast`` blocks along the last
    dim), each operand cast along the dim torchao's MXFP8 linear blocks it: K forward, N for dX, tokens for dW."""
    along_tokens = {name: cast(t.t()).t() for name, t in (("x", x), ("grad", grad))}
    return {
        "output": torch.mm(cast(x), cast(w).t()),
        "dX": torch.mm(cast(grad), cast(w.t()).t()),
        "dW": torch.mm(along_tokens["grad"].t(), along_tokens["x"]),
    }


@pytest.mark.parametrize("device", DEVICES)
def test_fast_linear_with_e5m2_elements_is_the_gemms_of_torchaos_e5m2_casts(device):
    """The positive control's op (recipe mxfp8-e5m2, which torchao's training ops do not offer): output, dX and
    dW are the GEMMs of operands cast by torchao's own to_mx with E5M2 elements, each along the dim torchao's
    MXFP8 linear blocks it, in the same layouts -- bit for bit."""
    g = torch.Generator().manual_seed(3)
    x, w, grad = (_rand(s, g, "spread", device) for s in ((64, 96), (32, 96), (64, 32)))
    got = _fwd_bwd(lambda a, b: ops.linear(a, b, OpRecipe(elements="e5m2")), x, w, grad)
    _assert_same(_linear_of_casts(lambda t: _torchao_mx(t, torch.float8_e5m2), x, w, grad), got, "linear e5m2")


@pytest.mark.parametrize(("elem", "low", "high"), [
    # one mantissa bit fewer doubles every operand's rounding step: 20*log10(2) = 6.0 dB (measured 5.9)
    ("e5m2", 4.5, 7.5),
    # two bits fewer quadruple it (12.0 dB), and E2M1's grid (0.5 its only subnormal, 6 its largest value)
    # flushes a block's values under a quarter of its scale: measured 12.7 dB (28.4 -> 15.8 dB)
    ("e2m1", 10.5, 14.5),
])
def test_control_elements_lose_their_mantissa_bits_worth_of_sqnr_per_gemm(elem, low, high):
    """What makes mxfp8-e5m2 and mxfp8-e2m1 worse by construction, measured: output, dX and dW each lose the
    dB above against an FP32 GEMM, compared with E4M3. The windows leave room for saturation and the sample;
    an op that ignored the elements would lose 0 dB, and each window excludes the other element's loss."""
    from numerics.metrics import sqnr_db

    g = torch.Generator().manual_seed(0)
    x, w, grad = (torch.randn(s, generator=g).bfloat16() for s in ((512, 256), (384, 256), (512, 384)))
    exact = _fwd_bwd(lambda a, b: torch.mm(a.float(), b.float().t()), x, w, grad.float())
    loss = {}
    for e in ("e4m3", elem):
        got = _fwd_bwd(lambda a, b, e=e: ops.linear(a, b, OpRecipe(elements=e)), x, w, grad)
        loss[e] = {k: sqnr_db(exact[k].float(), got[k].float()) for k in exact}
    drop = {k: loss["e4m3"][k] - loss[elem][k] for k in exact}
    assert all(low < d < high for d in drop.values()), (drop, loss)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("hp", (False, True))
def test_fast_ops_with_floor_scales_are_torchaos_floor_ops(device, hp):
    """The mxfp8-floor control's ops: torchao's own training ops take ScaleCalculationMode.FLOOR, and the fast
    ops with FLOOR scales give their output, dX and dW bit for bit (linear and grouped, padded groups)."""
    g = torch.Generator().manual_seed(5)
    x, w, grad = (_rand(s, g, "spread", device) for s in ((64, 96), (32, 96), (64, 32)))
    expected = _fwd_bwd(_torchao_linear(hp, "FLOOR"), x, w, grad)
    floor = OpRecipe(wgrad_with_hp=hp, scale_calculation_mode="FLOOR")
    got = _fwd_bwd(lambda a, b: ops.linear(a, b, floor), x, w, grad)
    _assert_same(expected, got, "linear floor")
    rceil = _fwd_bwd(lambda a, b: ops.linear(a, b, OpRecipe(wgrad_with_hp=hp)), x, w, grad)
    assert not torch.equal(rceil["output"], got["output"])  # the mode reaches the casts: FLOOR is another op
    sizes = (33, 0, 31, 64)
    offs = torch.tensor(sizes, device=device).cumsum(0).to(torch.int32)
    x, w, grad = _rand((128, 64), g, "spread", device), _rand((4, 32, 64), g, "spread", device), \
        _rand((128, 32), g, "spread", device)
    expected = _fwd_bwd(_torchao_grouped(offs, hp, True, "FLOOR"), x, w, grad)
    got = _fwd_bwd(lambda a, b: ops.grouped_mm(a, b.transpose(-2, -1), offs, floor, pad_groups=True), x, w, grad)
    _assert_same(expected, got, "grouped_mm floor")


def _spec_mx(t: torch.Tensor, elem: str) -> torch.Tensor:
    """The MX spec's cast (the oracle, numerics.tensor.mx, RCEIL) along the last dim, dequantized to t's dtype."""
    import numpy as np

    from numerics.tensor import mx

    a = t.detach().float().cpu().contiguous().numpy()
    values = mx.dequantize(*mx.quantize(a, elem, "rceil"), elem).astype(np.float32)
    return torch.from_numpy(values).to(device=t.device, dtype=t.dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_fast_linear_with_e2m1_elements_is_the_gemms_of_the_specs_casts(device):
    """The mxfp8-e2m1 control's op: E2M1 (MXFP4) elements, which no torchao training op offers, cast by the
    MX spec (the oracle), each operand along the dim torchao's MXFP8 linear blocks it -- bit for bit."""
    g = torch.Generator().manual_seed(4)
    x, w, grad = (_rand(s, g, "spread", device) for s in ((64, 96), (32, 96), (64, 32)))
    got = _fwd_bwd(lambda a, b: ops.linear(a, b, OpRecipe(elements="e2m1")), x, w, grad)
    _assert_same(_linear_of_casts(lambda t: _spec_mx(t, "e2m1"), x, w, grad), got, "linear e2m1")


@pytest.mark.parametrize("hp", (False, True))
@pytest.mark.parametrize("kind", ("linear", "grouped"))
def test_two_fast_ops_given_one_inputs_casts_keep_every_bit_and_cast_it_once(monkeypatch, kind, hp):
    """Two ops on one x (a SwiGLU's w1 and w3) given x's casts made once: the outputs, both dWs and dX (the sum of
    the two ops' contributions) are the two plain calls' bit for bit, and x is cast once instead of twice. Controls:
    the casts of another x change the outputs (the given casts are what the GEMMs take); casts made without the
    layout dW needs, or of another shape, are refused."""
    g = torch.Generator().manual_seed(5)
    op = OpRecipe(wgrad_with_hp=hp)
    x, grad1, grad3 = (_rand(shape, g, "spread", "cpu") for shape in ((96, 64), (96, 32), (96, 32)))
    if kind == "linear":
        w1, w3 = _rand((32, 64), g, "spread", "cpu"), _rand((32, 64), g, "spread", "cpu")
        call = lambda a, w, casts: ops.linear(a, w, op, x_casts=casts)  # noqa: E731
        make = lambda a, want_dw=True: ops.input_casts(a, op, want_dw=want_dw)  # noqa: E731
    else:
        w1, w3 = _rand((3, 32, 64), g, "spread", "cpu"), _rand((3, 32, 64), g, "spread", "cpu")
        offs = torch.tensor([40, 40, 96], dtype=torch.int32)  # an empty group, and groups padded to 32
        call = lambda a, w, casts: ops.grouped_mm(a, w.transpose(-2, -1), offs, op, pad_groups=True,  # noqa: E731
                                                  x_casts=casts)
        make = lambda a, want_dw=True: ops.grouped_input_casts(a, offs, op, pad_groups=True,  # noqa: E731
                                                               want_dw=want_dw)
    calls = []
    for name in ("_cast", "_cast_both"):
        real = getattr(ops, name)
        monkeypatch.setattr(ops, name, lambda *a, real=real, **k: calls.append(tuple(a[0].shape)) or real(*a, **k))

    def step(shared: bool):
        a, b1, b3 = (t.detach().clone().requires_grad_(True) for t in (x, w1, w3))
        calls.clear()
        casts = make(a) if shared else None
        y1, y3 = call(a, b1, casts), call(a, b3, casts)
        x_casts = sum(len(shape) == 2 and shape[0] >= len(x) for shape in calls)  # x, or x padded; not a weight
        (y1 * grad1.float()).sum().add((y3 * grad3.float()).sum()).backward()
        return {"y1": y1.detach(), "y3": y3.detach(), "dX": a.grad, "dW1": b1.grad, "dW3": b3.grad}, x_casts

    separate, casts_separate = step(False)
    shared, casts_shared = step(True)
    _assert_same(separate, shared, f"{kind} with shared casts, wgrad_with_hp={hp}")
    assert (casts_separate, casts_shared) == (2, 1)

    other = make(x * 2)
    assert not torch.equal(call(x, w1, other), separate["y1"])
    with pytest.raises(BadInput, match="shape"):
        call(x, w1, tuple(t[:32] if t is not None else None for t in make(x)))
    if not hp:  # dW in MX needs x along the tokens
        with pytest.raises(BadInput, match="along the tokens"):
            call(x.detach().requires_grad_(True), w1.detach().requires_grad_(True), make(x, want_dw=False))
