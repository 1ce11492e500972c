"""Reading a profiler trace: every GPU figure checked exactly on a planted trace of two steps (kineto's event
categories, as a CUDA profile has them), with controls that remove what a figure counts."""

from __future__ import annotations

import pytest

from convergence.train.perf.trace import STEP_MARK, analyse, format_analysis, group_of
from numerics.errors import BadInput

PAD = "torchao/prototype/moe_training/kernels/mxfp8/quant.py(418): torch_pad_token_groups"


def _x(cat, name, ts, dur, *, tid=1, pid=1, corr=None):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": {} if corr is None else {"correlation": corr}}


def _kernel(name, ts, dur, corr, cat="kernel"):
    return _x(cat, name, ts, dur, pid=0, tid=7, corr=corr)


def _trace(*, sync: bool = True) -> list[dict]:
    """Two steps of 1000 us. Step 1: a GEMM launched by aten::mm; inside torchao's padding (a Python frame) a
    device-to-host copy, a synchronisation and a copy kernel; the fast cast's Triton kernel through the driver.
    Step 2: the optimizer's kernel. GPU intervals: [20,120] [120,121] [300,350] [510,560] [1130,1930]."""
    ev = [_x("user_annotation", STEP_MARK, 0, 1000), _x("user_annotation", STEP_MARK, 1000, 1000),
          _x("cpu_op", "aten::mm", 10, 20), _x("cuda_runtime", "cudaLaunchKernel", 12, 8, corr=1),
          _kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 20, 100, 1),
          _x("python_function", PAD, 35, 365), _x("cpu_op", "aten::copy_", 40, 20),
          _x("cuda_runtime", "cudaMemcpyAsync", 45, 5, corr=2), _kernel("Memcpy DtoH (Device -> Pageable)", 120, 1, 2,
                                                                        "gpu_memcpy"),
          _x("cpu_op", "aten::copy_", 70, 10), _x("cuda_runtime", "cudaLaunchKernel", 72, 5, corr=3),
          _kernel("void at::native::elementwise_kernel<128, 4>", 300, 50, 3),
          _x("cuda_driver", "cuLaunchKernelEx", 500, 10, corr=4), _kernel("_mx_cast", 510, 50, 4),
          _x("user_annotation", "Optimizer.step#AdamW.step", 1100, 200), _x("cpu_op", "aten::_fused_adamw_", 1110, 180),
          _x("cuda_runtime", "cudaLaunchKernel", 1120, 10, corr=5),
          _kernel("void multi_tensor_apply_kernel<FusedAdamMathFunctor>", 1130, 800, 5),
          {"ph": "f", "cat": "ac2g", "name": "ac2g", "ts": 12}]
    if sync:
        ev.append(_x("cuda_runtime", "cudaStreamSynchronize", 50, 8))
    return ev


def test_trace_gpu_figures_are_exact_on_a_planted_trace():
    r = analyse(_trace(), gpu=True)
    g = r["gpu"]
    assert r["steps"] == 2 and r["wall_ms"] == pytest.approx(1.0)  # 2000 us over 2 steps
    assert g["kernel_ms"] == pytest.approx((100 + 50 + 50 + 800) / 2e3)
    assert g["memcpy_ms"] == pytest.approx(1 / 2e3)
    assert g["busy_ms"] == pytest.approx(1001 / 2e3)  # [20,121] [300,350] [510,560] [1130,1930]
    assert g["idle_ms"] == pytest.approx(999 / 2e3) and g["idle_share"] == pytest.approx(0.4995)
    # gaps 20, 179, 160, 570 and the tail 1930-2000 = 70
    assert g["idle_gaps"]["<10us"] == {"count": 0.0, "ms": 0.0}
    assert g["idle_gaps"]["10-100us"] == pytest.approx({"count": 1.0, "ms": 90 / 2e3})
    assert g["idle_gaps"]["0.1-1ms"] == pytest.approx({"count": 1.5, "ms": 909 / 2e3})
    # each gap charged to what ended it: the GEMM, the padding copy, the cast, the optimizer; then the tail
    assert g["idle_before"] == pytest.approx({"optimizer": 570 / 2e3, "padding": 179 / 2e3, "cast": 160 / 2e3,
                                              "after the last GPU work": 70 / 2e3, "gemm": 20 / 2e3})
    assert list(g["idle_before"])[0] == "optimizer"  # largest first
    # ... and to the host frames of the launch that ended it (the cast's launch has no operator around it)
    by = g["idle_before_caller"]
    assert [c["caller"] for c in by] == ["aten::_fused_adamw_ < Optimizer.step#AdamW.step", f"{PAD} < aten::copy_",
                                         "(no enclosing operator)", "after the last GPU work", "aten::mm"]
    assert [c["ms"] for c in by] == pytest.approx([570 / 2e3, 179 / 2e3, 160 / 2e3, 70 / 2e3, 20 / 2e3])
    assert [c["gaps"] for c in by] == [0.5] * 5  # one gap each in two steps
    assert "idle before work launched by: aten::_fused_adamw_ < Optimizer.step#AdamW.step 0.28 ms" in \
        format_analysis(r)
    assert g["launches"] == 2.0 and g["launch_call_ms"] == pytest.approx((8 + 5 + 10 + 10) / 2e3)
    assert g["syncs"] == 0.5 and g["sync_wait_ms"] == pytest.approx(8 / 2e3)
    assert g["d2h_copies"] == 0.5 and g["pageable_h2d_copies"] == 0.0


def test_trace_groups_kernels_by_name_then_by_their_launch_frames():
    r = analyse(_trace(), gpu=True)
    gpu = {name: v["gpu_ms"] for name, v in r["groups"].items()}
    assert gpu == pytest.approx({"cast": 0.025, "padding": 0.0255, "gemm": 0.05, "attention": 0.0,
                                 "optimizer": 0.4, "other": 0.0})
    assert {k["name"][:12]: k["group"] for k in r["top_kernels"]} == {
        "void multi_t": "optimizer", "sm90_xmma_ge": "gemm", "void at::nat": "padding", "_mx_cast": "cast"}
    assert r["syncs_by_caller"] == [{"caller": f"{PAD} < aten::copy_", "count": 0.5}]
    mm = next(op for op in r["top_host_ops"] if op["name"] == "aten::mm")
    assert mm["group"] == "gemm" and mm["self_ms"] == pytest.approx((20 - 8) / 2e3)  # less its launch call


def test_trace_finds_no_sync_where_none_was_planted():
    g = analyse(_trace(sync=False), gpu=True)["gpu"]
    assert g["syncs"] == 0.0 and g["sync_wait_ms"] == 0.0


def test_trace_counts_a_sync_under_a_versioned_cupti_name():
    ev = [e | {"name": "cudaStreamSynchronize_v3020"} if e["name"] == "cudaStreamSynchronize" else e for e in _trace()]
    assert analyse(ev, gpu=True)["gpu"]["syncs"] == 0.5


def test_trace_a_cpu_profile_has_no_gpu_figures():
    r = analyse(_trace(), gpu=False)
    assert r["gpu"] is None and r["top_kernels"] is None and r["syncs_by_caller"] is None
    assert all(v["gpu_ms"] is None and v["kernels"] is None for v in r["groups"].values())
    assert r["groups"]["gemm"]["host_self_ms"] > 0 and "n/a" in format_analysis(r)


def test_trace_without_step_marks_is_bad_input():
    with pytest.raises(BadInput, match=STEP_MARK):
        analyse([e for e in _trace() if e["name"] != STEP_MARK], gpu=True)


@pytest.mark.parametrize(("frames", "kernel", "group"), [
    ([("cpu_op", "aten::copy_"), ("cpu_op", "aten::linear")], "elementwise_kernel", "other"),  # autocast's copy
    ([("cpu_op", "aten::mm"), ("python_function", "torchao/prototype/moe_training/mxfp8_linear.py(90): forward")],
     None, "gemm"),  # the emulated op's own GEMM is no cast
    ([("cpu_op", "aten::mul"), ("python_function", "torchao/prototype/mx_formats/mx_tensor.py(150): to_mx")],
     None, "cast"),
    ([("cpu_op", "aten::bmm"), ("cpu_op", "aten::_scaled_dot_product_attention_math")], None, "attention"),
    ([("cpu_op", "mxval::fast_mx_dequantize")], "triton_poi_fused_0", "cast"),
    ([("cpu_op", "aten::index_copy_"), ("python_function", "numerics/layer/fast/padding.py(55): pad")],
     "index_copy_kernel", "padding"),  # the fast ops' group padding
    ([("cpu_op", "aten::mul_"), ("python_function", "torch/optim/optimizer.py(509): wrapper")], None, "optimizer"),
    ([("user_annotation", STEP_MARK)], None, "other"),
])
def test_trace_group_of_follows_its_rules(frames, kernel, group):
    assert group_of(frames, kernel) == group


def test_trace_host_table_merges_a_c_methods_frames_across_objects():
    ev = _trace() + [_x("python_function", f"<built-in method tolist of Tensor object at 0x{a:x}>", 41 + a, 1)
                     for a in (1, 2)]
    rows = [op for op in analyse(ev, gpu=True)["top_host_ops"] if op["name"].startswith("<built-in method tolist")]
    assert rows == [{"name": "<built-in method tolist of Tensor object>", "group": "padding", "self_ms": 1e-3,
                     "calls": 1.0}]


def test_trace_without_python_frames_leaves_padding_unknown_not_zero():
    """Padding is told from other copies only by its Python frames: without any, its figures are None and its
    copy kernel counts as other; the control, the same trace with its frames, has padding's GPU time."""
    plain = analyse([e for e in _trace() if e["cat"] != "python_function"], gpu=True)
    assert plain["groups"]["padding"] == {"gpu_ms": None, "kernels": None, "host_self_ms": None}
    framed = analyse(_trace(), gpu=True)
    assert framed["groups"]["padding"]["gpu_ms"] == pytest.approx((1 + 50) / 2e3)
    assert plain["groups"]["other"]["gpu_ms"] == pytest.approx(framed["groups"]["other"]["gpu_ms"] + (1 + 50) / 2e3)
    assert "n/a without Python stacks" in format_analysis(plain)
    assert "n/a without Python stacks" not in format_analysis(framed)
