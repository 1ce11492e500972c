"""The DeepEP adapters (V1 ``Buffer`` at v1.2.x or main, V2 ``ElasticBuffer``) on CPU, against a stand-in
``deep_ep`` (``fakes/deep_ep``) that has DeepEP main's call signatures and moves data with the reference.

What this can show without a GPU: the adapters call DeepEP with the right keywords, unpack its tuples
and handles, convert 32-bit top-k indices, ask V2 for the contract's order and clean its unspecified
weights, check their buffers' limits collectively, and that the check fails when the order is wrong.
Whether DeepEP itself is right is the GPU tier's question (``test_deepep.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from numerics.ep.backends import BackendUnavailable, make_backend, require
from numerics.ep.check import bad_input_specs, judge_bad_input
from numerics.ep.launch import Session
from numerics.ep.strategies import CaseSpec

FAKES = Path(__file__).resolve().parent / "fakes"
RUNNER = "numerics.ep.check:CaseRunner"
SPECS = (
    CaseSpec(world=2, seed=11, tokens=(40, 33), hidden=256, topk=6, num_experts=64, specials=0.05),
    CaseSpec(world=2, seed=12, tokens=(0, 25), hidden=256, topk=8, num_experts=64, payload="fp8", specials=0.2),
    CaseSpec(world=2, seed=13, tokens=(30, 31), hidden=128, topk=6, num_experts=64, routing="masked"),
)


@pytest.fixture
def fake_deep_ep(monkeypatch):
    import sys

    monkeypatch.syspath_prepend(str(FAKES))  # spawned ranks inherit sys.path
    monkeypatch.delitem(sys.modules, "deep_ep", raising=False)
    yield
    # the stand-in must not outlive the test: later tests in this process would find a deep_ep
    for name in [m for m in sys.modules if m == "deep_ep" or m.startswith("deep_ep.")]:
        del sys.modules[name]


def _failures(results) -> dict:
    out = {}
    for rank, res in enumerate(results):
        assert "error" not in res, f"rank {rank}: {res.get('traceback', res['error'])}"
        out.update({k: v for k, v in res["checks"].items() if v})
    return out


# 32-bit top-k indices (a DeepEP main build option) exercise the conversions; 64-bit is the identity
@pytest.mark.parametrize("backend, bits", [("deepep", "32"), ("deepep-v2", "32")])
def test_deepep_adapter_matches_reference_through_the_stand_in(backend, bits, fake_deep_ep, monkeypatch):
    monkeypatch.setenv("FAKE_DEEP_EP_TOPK_BITS", bits)
    kwargs = {"backend": backend, "against": "reference", "timeout_s": 30.0, "deterministic": True}
    with Session(2, RUNNER, kwargs, timeout_s=30.0) as session:
        for spec in SPECS:
            results = session.run(spec)
            assert _failures(results) == {}, spec
            names = set(results[0]["checks"])
            assert ("layout.is_token_in_rank" in names) == (backend == "deepep")  # V2 has no layout call
            assert "dispatch.recv_topk_weights" in names and "combine" in names
        for spec in bad_input_specs(2):  # the adapters check inputs collectively before DeepEP sees them
            assert judge_bad_input(spec, session.run(spec)) is None, spec
    assert session.exitcodes == [0]


def test_deepep_v2_receive_order_is_checked(fake_deep_ep, monkeypatch):
    """Control: a V2 that ignores deterministic=True returns rows in another order; the check fails."""
    monkeypatch.setenv("FAKE_DEEP_EP_V2_IGNORE_DETERMINISTIC", "1")
    with Session(2, RUNNER, {"backend": "deepep-v2", "against": "reference", "timeout_s": 30.0},
                 timeout_s=30.0) as session:
        failed = _failures(session.run(SPECS[0]))
    assert {"dispatch.recv_x.bf16", "dispatch.recv_topk_idx"} <= set(failed)
    assert "dispatch_cached.recv_x.bf16" in failed


def test_deepep_v2_refuses_more_tokens_than_its_buffer_holds(fake_deep_ep):
    """A rank over max_tokens raises ValueError; its peer PeerInputError; nothing reaches DeepEP."""
    import datetime

    import torch
    import torch.distributed as dist

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        backend = make_backend("deepep-v2", device="cpu", max_tokens=16, timeout=datetime.timedelta(seconds=10))
        x = torch.zeros(17, 128, dtype=torch.bfloat16)
        idx = torch.zeros(17, 2, dtype=torch.int64)
        idx[:, 1] = 1
        with pytest.raises(ValueError, match="tokens per rank 17 exceeds the 16 this DeepEPV2Backend buffer"):
            backend.dispatch(x, idx, torch.ones(17, 2), 4)
        backend.close()
    finally:
        dist.destroy_process_group()


def test_backend_names_one_factory(fake_deep_ep):
    require("reference")
    require("deepep")
    require("deepep-v2")
    with pytest.raises(BackendUnavailable, match="choose from reference, deepep, deepep-v2"):
        require("deep-ep")
    with pytest.raises(BackendUnavailable, match="needs 64 CUDA GPUs"):
        require("deepep", world=64)
    with pytest.raises(BackendUnavailable, match="is not an EPBackend"):
        require("numerics.ep.backends:BACKENDS")


def test_deep_ep_that_fails_its_own_import_check_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    """DeepEP main asserts at import that torch loaded the NCCL it was built with; that is a setup
    problem for the user, reported as one line, not a traceback."""
    from numerics.ep.__main__ import main as ep_main

    pkg = tmp_path / "deep_ep"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise AssertionError('Invalid NCCL versions: /a/libnccl.so.2 (loaded) v.s. "
                                     "/b/libnccl.so.2 (expected)')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "deep_ep", raising=False)
    assert ep_main(["check", "--backend", "deepep-v2"]) == 2
    err = capsys.readouterr().err
    assert "Invalid NCCL versions" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
