"""The fast path's group padding (numerics.layer.fast.padding) against torchao 0.18.0's, the torch fallback
``KernelPreference.EMULATED`` takes (``torch_pad_token_groups`` / ``torch_unpad_token_groups``): the padded
tensor, the padded start and end offsets and the unpadded rows bit for bit, with their dtypes and shapes, over
empty, aligned, single and random groups; and what it is for: it compiles to one graph that reads no value on the
host, alone and inside the fast grouped GEMM, and on a GPU the grouped GEMM's forward and backward make no host
synchronisation. Controls show that each check catches torchao's padding, which reads group sizes on the host.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from numerics.assertions import assert_bits_equal
from numerics.layer import strategies as ls
from numerics.layer.fast import padding

pytest.importorskip("triton", reason="the fast kernels run on CPU in Triton's interpreter: pip install '.[fast]'")
from numerics.layer.fast import ops  # noqa: E402

CASES = {  # tokens per group
    "empty first": (0, 5, 40),
    "empty middle": (7, 0, 25),
    "empty last": (33, 31, 0),
    "empty between and around": (0, 3, 0, 0, 50, 0),
    "aligned": (32, 64, 96),  # padding adds nothing but the upper-bound tail
    "aligned with empty": (0, 64, 0, 32),
    "one group": (45,),
    "one expert takes all": (0, 0, 70, 0),
    "no tokens": (0, 0, 0),
    "one group, no tokens": (0,),
}


def _torchao():
    from torchao.prototype.moe_training.kernels.mxfp8.quant import torch_pad_token_groups, torch_unpad_token_groups

    return torch_pad_token_groups, torch_unpad_token_groups


def _random_bits(rows: int, cols: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """Every bit pattern of ``dtype`` alike (NaN payloads, -0, infinities, subnormals): padding only moves bits."""
    raw = torch.randint(0, 256, (rows, cols * dtype.itemsize), generator=g, dtype=torch.uint8)
    return raw.view(dtype)


def _check_against_torchao(sizes, dtype, offs_dtype, seed) -> None:
    torch_pad, torch_unpad = _torchao()
    g = torch.Generator().manual_seed(seed)
    tokens = sum(sizes)
    offs = torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(offs_dtype)
    x = _random_bits(tokens, 64, dtype, g)
    want, want_starts, want_ends = torch_pad(x, offs, 32)
    dest, starts, ends = padding.destinations(offs, tokens)
    got = padding.pad(x, *padding.sources(offs, dest, ends, padding.padded_rows(tokens, len(sizes))))
    for name, w, o in (("padded", want, got), ("starts", want_starts, starts), ("ends", want_ends, ends)):
        assert (o.shape, o.dtype) == (w.shape, w.dtype), f"{sizes} {name}: {o.shape} {o.dtype}, not {w.shape} {w.dtype}"
        assert_bits_equal(w, o, what=f"{sizes} {dtype} offs {offs_dtype}: {name}")
    # the GEMM's output in the padded layout, its padding rows not zero: unpad reads the groups' rows alone
    y = _random_bits(want.shape[0], 96, dtype, g)
    want_y, got_y = torch_unpad(y, offs, want_starts, tokens, 32), padding.unpad(y, dest)
    assert (got_y.shape, got_y.dtype) == (want_y.shape, want_y.dtype)
    assert_bits_equal(want_y, got_y, what=f"{sizes} {dtype} offs {offs_dtype}: unpadded")


def _layout(sizes) -> tuple[list[int], list[int], int]:
    """The documented layout from its rules alone: each group rounded up to 32 rows, back to back from row 0;
    the buffer tokens + 32 per group, rounded up to 32."""
    padded = [-(-s // 32) * 32 for s in sizes]
    ends = [sum(padded[: i + 1]) for i in range(len(sizes))]
    return [e - p for e, p in zip(ends, padded)], ends, -(-(sum(sizes) + 32 * len(sizes)) // 32) * 32


@pytest.mark.parametrize("offs_dtype", (torch.int32, torch.int64), ids=("offs_int32", "offs_int64"))
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=("bf16", "fp32"))
@pytest.mark.parametrize("sizes", CASES.values(), ids=CASES.keys())
def test_fast_padding_is_torchaos_padding_bit_for_bit(sizes, dtype, offs_dtype):
    """Padded tensor, padded start and end offsets (their dtypes too: ends int32, starts in the type offs promotes
    with int32) and unpadded rows equal torchao's, which equal the documented layout."""
    _check_against_torchao(sizes, dtype, offs_dtype, seed=len(sizes))
    starts, ends, rows = _layout(sizes)
    offs = torch.tensor(sizes).cumsum(0).to(offs_dtype)
    dest, got_starts, got_ends = padding.destinations(offs, sum(sizes))
    assert (got_starts.tolist(), got_ends.tolist(), padding.padded_rows(sum(sizes), len(sizes))) == (starts, ends, rows)
    assert sorted(set(dest.tolist())) == dest.tolist()  # rows keep their order, none shares a destination
    # the gather's maps: each destination holds its routed row, the blank rows are every other row, in order
    src, blank = padding.sources(offs, dest, got_ends, rows)
    assert src[dest].tolist() == list(range(sum(sizes)))
    assert blank.tolist() == sorted(set(range(rows)) - set(dest.tolist()))


@given(sizes=ls.group_sizes(max_experts=8, max_tokens=300), dtype=st.sampled_from((torch.bfloat16, torch.float32)),
       seed=st.integers(0, 2**16))
@example(sizes=(31, 1, 0, 33), dtype=torch.bfloat16, seed=0)  # a row short of a block, one row, none, a row past
def test_fast_padding_is_torchaos_padding_over_random_group_sizes(sizes, dtype, seed):
    """Over uneven, empty and aligned groups alike, padded tensor, offsets and unpadded rows equal torchao's."""
    _check_against_torchao(sizes, dtype, torch.int32, seed)


def _aot_graphs(fn, *args):
    """``fn(*args)`` compiled whole (``fullgraph=True``) through AOTAutograd, and the forward and backward graphs
    it captured (ATen ops, eager execution: no C++ build on a CPU)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    out = torch.compile(fn, fullgraph=True, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep))(*args)
    return out, graphs


def _host_reads(graphs) -> list[str]:
    """The graphs' nodes that read a tensor's value on the host (a host synchronisation each on a GPU)."""
    return [str(n) for gm in graphs for n in gm.graph.nodes if n.target is torch.ops.aten._local_scalar_dense.default]


def _pad_unpad(x, offs):
    dest, starts, ends = padding.destinations(offs, x.shape[0])
    padded = padding.pad(x, *padding.sources(offs, dest, ends, padding.padded_rows(x.shape[0], offs.shape[0])))
    return padding.unpad(padded * 2, dest), padded, starts, ends


def test_an_moe_layers_three_grouped_gemms_compute_their_padded_layout_once(monkeypatch):
    """w1, w3 and w2 of an MoE layer get the same ``offs``: the first computes the maps, the other two reuse them,
    and give the bits they gave when each computed its own. The controls: a new offs tensor with the same values, or
    the same one changed in place, is computed afresh (and the changed one's layout is its own)."""
    made = []
    compute = padding._made
    monkeypatch.setattr(padding, "_made", lambda offs, tokens: made.append(tokens) or compute(offs, tokens))
    g = torch.Generator().manual_seed(5)
    sizes = (0, 45, 3, 19, 0)
    offs = torch.tensor(sizes).cumsum(0).to(torch.int32)
    x = torch.randn(sum(sizes), 64, generator=g).to(torch.bfloat16)
    w1, w3 = (torch.randn(len(sizes), 64, 96, generator=g).to(torch.bfloat16) for _ in range(2))
    w2 = torch.randn(len(sizes), 96, 64, generator=g).to(torch.bfloat16)

    def layer(offs):
        h = torch.nn.functional.silu(ops.grouped_mm(x, w1, offs, pad_groups=True))
        return ops.grouped_mm(h * ops.grouped_mm(x, w3, offs, pad_groups=True), w2, offs, pad_groups=True)

    shared = layer(offs)
    assert made == [sum(sizes)]
    separate = layer(offs.clone())  # control: equal values, another tensor
    assert len(made) == 2
    assert_bits_equal(separate, shared, what="MoE layer output, layout shared vs computed once per GEMM")
    kept = padding.layout(offs, sum(sizes))
    offs[1] += 1  # in place, the same tokens: one row moves from group 2 to group 1; the version counter moves on
    assert padding.layout(offs, sum(sizes)) is not kept and len(made) == 3
    for got, want in zip(padding.layout(offs, sum(sizes)), padding._made(offs, sum(sizes))):
        assert torch.equal(got, want)
    with torch.inference_mode():  # an evaluation's offs may have no version counter: computed, not kept
        assert_bits_equal(layer(offs.clone()), layer(offs), what="MoE layer output under inference_mode")


def test_fast_padding_compiles_to_one_graph_that_reads_nothing_on_the_host():
    """Pad, an elementwise op on the padded rows, and unpad trace whole (no graph break) into a graph with no
    data-dependent host read, and give the eager bits. Controls: torchao's pad traces whole too (torch 2.13
    captures its ``.tolist()``) but its graph reads the group sizes on the host, and its unpad does not trace."""
    torch_pad, torch_unpad = _torchao()
    sizes = (0, 5, 0, 40, 0)
    offs = torch.tensor(sizes).cumsum(0).to(torch.int32)
    x = torch.randn(sum(sizes), 64).to(torch.bfloat16)
    out, graphs = _aot_graphs(_pad_unpad, x, offs)
    assert len(graphs) == 1 and _host_reads(graphs) == []
    for name, want, got in zip(("unpadded", "padded", "starts", "ends"), _pad_unpad(x, offs), out):
        assert_bits_equal(want, got, what=f"compiled {name}")

    padded, starts, _ = torch_pad(x, offs, 32)
    _, graphs = _aot_graphs(torch_pad, x, offs, 32)
    assert len(_host_reads(graphs)) >= len(sizes)  # at least each group size read back
    with pytest.raises(torch._dynamo.exc.UserError, match="data-dependent"):
        _aot_graphs(torch_unpad, padded, offs, starts, x.shape[0], 32)


def test_fast_grouped_mm_with_padded_groups_compiles_to_one_graph_that_reads_nothing_on_the_host():
    """The fast grouped GEMM with padded groups, forward and backward, traces whole (the cast one opaque op) into
    graphs with no data-dependent host read, and gives the eager bits."""
    g = torch.Generator().manual_seed(11)
    sizes = (0, 45, 0, 19, 0)
    offs = torch.tensor(sizes).cumsum(0).to(torch.int32)
    x = torch.randn(sum(sizes), 64, generator=g).to(torch.bfloat16)
    w_t = torch.randn(len(sizes), 64, 96, generator=g).to(torch.bfloat16)
    grad = torch.randn(sum(sizes), 96, generator=g).to(torch.bfloat16)

    def grouped(a, b):
        return ops.grouped_mm(a, b, offs, pad_groups=True)

    def fwd_bwd(compile_it: bool):
        a, b = x.clone().requires_grad_(True), w_t.clone().requires_grad_(True)
        y, graphs = _aot_graphs(grouped, a, b) if compile_it else (grouped(a, b), [])
        y.backward(grad)  # the backward graph is captured here
        return (y.detach(), a.grad, b.grad), graphs

    (want, _), (got, graphs) = fwd_bwd(False), fwd_bwd(True)
    assert len(graphs) == 2 and _host_reads(graphs) == []  # one forward graph, one backward
    for name, w, o in zip(("output", "dX", "dW"), want, got):
        assert_bits_equal(w, o, what=f"compiled grouped_mm {name}")


# Run in a process of its own: the sync debug mode is process-wide, and a synchronisation it turns into an error
# inside an op (the caching allocator's, cuBLAS's) can leave that process's CUDA state unusable for later tests.
NO_SYNC_SCRIPT = """
import sys
import torch
from torchao.prototype.moe_training.utils import pad_token_groups
from torchao.quantization.quantize_.common import KernelPreference
from numerics.layer.fast import ops

torch.use_deterministic_algorithms(sys.argv[1] == "deterministic")
sizes = (0, 45, 0, 19, 64, 0)
offs = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
x = torch.randn(sum(sizes), 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
w_t = torch.randn(len(sizes), 64, 96, device="cuda", dtype=torch.bfloat16, requires_grad=True)
grad = torch.randn(sum(sizes), 96, device="cuda", dtype=torch.bfloat16)
ops.grouped_mm(x, w_t, offs, pad_groups=True).backward(grad)  # first call: kernel builds, calibration
torch.cuda.synchronize()
torch.cuda.set_sync_debug_mode("error")
ops.grouped_mm(x, w_t, offs, pad_groups=True).backward(grad)  # any host synchronisation raises
print("fast: no host synchronisation")
try:
    pad_token_groups(x.detach(), offs, alignment_size=32, kernel_preference=KernelPreference.EMULATED)
except RuntimeError as e:
    assert "synchronizing CUDA operation" in str(e), e
    print("control: torchao's padding synchronises")
"""


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", (False, True), ids=("default", "deterministic"))
def test_fast_grouped_mm_with_padded_groups_makes_no_host_sync(deterministic):
    """Forward and backward of the fast grouped GEMM with padded groups run with every host synchronisation an
    error (``torch.cuda.set_sync_debug_mode("error")``), with and without deterministic algorithms (the proxy's
    identity runs use them); the control, torchao's emulated padding, raises under the same mode."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, (str(root), os.environ.get("PYTHONPATH")))),
                        "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}  # cuBLAS's deterministic workspace
    r = subprocess.run([sys.executable, "-c", NO_SYNC_SCRIPT, "deterministic" if deterministic else "default"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines() == ["fast: no host synchronisation", "control: torchao's padding synchronises"]
