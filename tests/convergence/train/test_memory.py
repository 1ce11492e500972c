"""convergence.train.memory: model states counted exactly, activations measured, one line when a run cannot fit;
and training runs one after another in one process leave no tensors behind."""

from __future__ import annotations

import dataclasses

import pytest

from convergence.train import memory
from numerics.errors import BadInput
from numerics.layer.configs import get_config, param_count

GIB = memory.GIB


def test_model_states_are_16_bytes_per_parameter_sharded_by_fsdp_and_ep():
    cfg = get_config("16b")
    states, gathered, dense, experts = memory.state_bytes(cfg)
    counted = param_count(cfg)  # from the shapes alone, independently of the meta-device model
    assert dense + experts == counted["total"] and experts == counted["routed_experts"]
    assert states == 16 * counted["total"] and gathered == 0
    two, gathered2, *_ = memory.state_bytes(cfg, ranks=2, ep=2)
    assert two == states / 2 and 0 < gathered2 < 0.05 * two  # one block's FP32 weights, twice
    assert states / GIB == pytest.approx(234.0, abs=1.0)  # the "about 250 GB" before activations


def test_activations_are_measured_per_token_and_scale_with_the_batch():
    cfg = get_config("tiny")
    per = memory.activation_bytes_per_token(cfg, 64)
    assert set(per) == {"dense_block", "moe_block", "head"} and all(v > 0 for v in per.values())
    # a MoE block saves at least its top_k expert rows of the SwiGLU hidden (w1, w3 outputs, bf16) per token
    assert per["moe_block"] >= cfg.top_k * 2 * cfg.moe_hidden * 2
    a, b = (memory.estimate(cfg, batch=n, seq=64) for n in (4, 8))
    assert b.activations == pytest.approx(2 * a.activations) and b.states == a.states
    wider = memory.activation_bytes_per_token(dataclasses.replace(cfg, moe_hidden=2 * cfg.moe_hidden), 64)
    assert wider["moe_block"] > per["moe_block"] and wider["dense_block"] == per["dense_block"]


def _need(states_gib: float, act_per_token: float, tokens: int = 8192) -> memory.MemoryNeed:
    return memory.MemoryNeed(params_dense=int(1e9), params_experts=int(14.7e9), ranks=2, ep=2,
                             tokens_per_rank=tokens, states=states_gib * GIB, gathered=0.0,
                             activations=act_per_token * tokens, activation_per_token=act_per_token)


def test_a_run_that_cannot_fit_is_one_line_that_says_how_much_and_what_would_fit():
    gpu = 139 * GIB
    memory.check_fits(_need(100, 2e6 * 0.1), gpu)  # 100 + 1.5 GiB: fits
    with pytest.raises(BadInput) as e:  # states fit, activations do not: the tokens that would
        memory.check_fits(_need(117, 4e6), gpu, model="--model 16b")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("--model 16b needs about 148 GiB per GPU") and "--batch" in msg
    with pytest.raises(BadInput, match=r"model states alone need 2 GPUs"):  # 16 B x 15.7B on one 139 GiB GPU
        memory.check_fits(dataclasses.replace(_need(234, 1e5), ranks=1, ep=1), gpu)


def test_the_check_fails_just_above_the_usable_memory_and_passes_just_below():
    need = _need(60, 1e5)
    usable = need.total / (1 - memory.HEADROOM)
    memory.check_fits(need, usable * 1.001)
    with pytest.raises(BadInput):
        memory.check_fits(need, usable * 0.999)


def test_the_measurement_leaves_the_callers_random_stream_alone():
    """The estimate runs before a run's first step: it must not reseed the generator the run draws from."""
    import torch

    torch.manual_seed(5)
    expected = torch.rand(4)
    torch.manual_seed(5)
    memory.activation_bytes_per_token(get_config("tiny"), 32)
    assert torch.equal(torch.rand(4), expected)


def test_activation_checkpointing_keeps_one_residual_per_block_and_one_block_live():
    """With checkpointing, the activations are each block's FP32 input plus the largest block's own (the one
    being recomputed) plus the head: far less than every block's, and no less than the inputs alone."""
    cfg = get_config("proxy")
    full = memory.estimate(cfg, batch=1, seq=256)
    ac = memory.estimate(cfg, batch=1, seq=256, checkpointing=True)
    inputs = cfg.n_layers * memory.RESIDUAL_BYTES * cfg.dim
    assert inputs < ac.activation_per_token < full.activation_per_token / 2
    assert ac.states == full.states and ac.checkpointing and not full.checkpointing


def test_a_run_whose_activations_do_not_fit_is_told_about_checkpointing():
    need = memory.estimate(get_config("tiny"), batch=64, seq=128)
    with pytest.raises(BadInput, match="--activation-checkpointing"):
        memory.check_fits(need, need.states + need.gathered + need.activations / 4, model="--model tiny")


def test_a_cpu_run_is_checked_against_its_share_of_host_memory_and_fails_in_seconds(monkeypatch):
    """Bad input on a CPU: --model 16b on a 64 GiB host stops before building anything, from the
    exact model states alone (no half-minute activation measurement), and says to use GPUs."""
    import time

    from convergence.train.loop import TrainConfig, check_memory
    from convergence.train.placement import Single

    monkeypatch.setattr(memory, "host_bytes", lambda: 64 * memory.GIB)
    monkeypatch.setattr(memory, "activation_bytes_per_token", lambda *a, **k: pytest.fail("measured activations"))
    t0 = time.monotonic()
    with pytest.raises(BadInput, match=r"16b needs about 234 GiB per CPU process .*activations not counted.*"
                                       r"has 64 GiB: .*train it on GPUs"):
        check_memory(TrainConfig(model="16b", recipes=("bf16",), steps=1, batch=4, seq=2048), 256, Single("cpu"))
    assert time.monotonic() - t0 < 5


def test_a_gpu_run_on_cuda_without_an_index_is_checked_against_its_share_of_the_current_gpu(monkeypatch):
    """``--device cuda`` (no index) is checked against the current device's share: torch's memory-fraction query
    wants an index, so the check asks for the current device's."""
    import types

    import torch

    from convergence.train.loop import TrainConfig, check_memory
    from convergence.train.placement import Single

    def indexed(value):
        def get(device):
            assert isinstance(device, int), device  # torch raises ValueError for torch.device("cuda")
            return value
        return get

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", indexed(0.5))
    gpu = types.SimpleNamespace(total_memory=64 * memory.GIB)
    monkeypatch.setattr(torch.cuda, "get_device_properties", indexed(gpu))
    monkeypatch.setattr(memory, "activation_bytes_per_token", lambda *a, **k: pytest.fail("measured activations"))
    with pytest.raises(BadInput, match=r"held to 50% of the GPU.*has 32 GiB"):
        check_memory(TrainConfig(model="16b", recipes=("bf16",), steps=1, batch=4, seq=2048, device="cuda"), 256,
                     Single("cuda"))


def test_moments_in_host_memory_leave_8_bytes_per_parameter_and_the_largest_parameters_moments_on_the_gpu():
    cfg = get_config("16b")
    device, *_ = memory.state_bytes(cfg, ranks=2, ep=2)
    host, *_ = memory.state_bytes(cfg, ranks=2, ep=2, optimizer_state="host")
    largest = param_count(cfg)["routed_experts"] / 2 / (3 * cfg.n_moe_layers)  # one layer's w1 on one EP rank
    assert host == pytest.approx(device / 2 + 8 * largest)
    need = memory.estimate(cfg, batch=4, seq=2048, ranks=2, ep=2, activations=False, optimizer_state="host")
    assert need.host_states == pytest.approx(device / 2) and need.host_states / GIB == pytest.approx(58.5, abs=0.1)
    memory.check_host(need, 128 * GIB)  # each of the x2 machine's two ranks: half of its 256 GiB
    with pytest.raises(BadInput, match=r"keeps 59 GiB of AdamW moments in host memory per rank, 85 GiB once pinned"
                                       r".*share of the host is 64 GiB"):
        memory.check_host(need, 64 * GIB)  # 59 GiB would fit 64 less the headroom; pinned they do not


def test_the_host_peak_is_what_the_16b_measured_on_two_h200s():
    """The 16b, EP=2, moments in host memory (golden/training/16b_ep2_*__h200x2.jsonl): each rank's resident
    peak was 90.1 GiB. The moments are 58.5 GiB; pinned, each rounded up to a power of two, 84.5 GiB; the
    whole FP32 model each rank builds first, 58.5 GiB. The estimate's peak must account for all but the
    process's own few GiB (under the headroom), which the exact moments alone would not."""
    need = memory.estimate(get_config("16b"), batch=4, seq=2048, ranks=2, ep=2, activations=False,
                           optimizer_state="host")
    measured = 90.1 * GIB
    assert need.host_pinned / GIB == pytest.approx(84.5, abs=0.1)
    assert need.host_build / GIB == pytest.approx(58.5, abs=0.1)
    assert measured * (1 - memory.HEADROOM) <= need.host_peak <= measured
    assert need.host_states < measured * (1 - 2 * memory.HEADROOM)  # the control: the exact moments fall short


def test_every_rank_building_the_whole_model_is_checked_too():
    """Eight ranks on one 256 GiB host: each builds the 16b's 58.5 GiB before sharding it; refused in one line
    before anything is built, with the moments on the GPU as well."""
    need = memory.estimate(get_config("16b"), batch=8, seq=2048, ranks=8, ep=8, activations=False)
    assert need.host_states == 0 and need.host_build / GIB == pytest.approx(58.5, abs=0.1)
    with pytest.raises(BadInput, match=r"every rank builds the whole FP32 model in host memory before sharding it, "
                                       r"59 GiB, and each rank's share of the host is 32 GiB"):
        memory.check_host(need, 256 * GIB / 8)
    memory.check_host(need, 128 * GIB)


def _check_16b_on_two_gpus(monkeypatch, gpu_gib: float, **cfg_over):
    """check_memory for the 16b under --ep 2 on two (mocked) GPUs of ``gpu_gib`` and a 256 GiB host, with the
    activations a fixed 3 MB per token, 11.4 GiB per rank (what matters here is where the states go)."""
    import types

    import torch

    from convergence.train.loop import TrainConfig, check_memory

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda _i: 1.0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _i: types.SimpleNamespace(
        total_memory=gpu_gib * GIB))
    monkeypatch.setattr(memory, "host_bytes", lambda: 256 * GIB)
    monkeypatch.setattr(memory, "activation_bytes_per_token", lambda *a, **k: {
        "dense_block": 3e6 / 27, "moe_block": 3e6 / 27, "head": 0.0})
    cfg = TrainConfig(model="16b", recipes=("bf16",), steps=20, batch=4, seq=2048, device="cuda", ep=2,
                      **cfg_over)
    return check_memory(cfg, 102400, types.SimpleNamespace(device=torch.device("cuda", 0), world=2))


def test_auto_keeps_the_moments_on_the_gpu_when_they_fit_and_moves_them_to_the_host_when_not(monkeypatch):
    # device: 117 GiB of states + 0.6 gathered + 11.4 of activations = 129 GiB; host: 59 + 0.6 + 11.4 = 71 GiB
    assert _check_16b_on_two_gpus(monkeypatch, 160).optimizer_state == "device"  # 144 GiB usable
    assert _check_16b_on_two_gpus(monkeypatch, 139, ckpt_every=0).optimizer_state == "host"  # 125 GiB usable
    with pytest.raises(BadInput, match=r"not written to distributed checkpoints yet.*--ckpt-every 0"):
        _check_16b_on_two_gpus(monkeypatch, 139, ckpt_every=100)
    with pytest.raises(BadInput, match=r"needs about 129 GiB per GPU.*--optimizer-state host"):
        _check_16b_on_two_gpus(monkeypatch, 139, optimizer_state="device")
    with pytest.raises(BadInput, match=r"state of one parameter \(the rest in host\).*need 4 GPUs or more"):
        _check_16b_on_two_gpus(monkeypatch, 40, ckpt_every=0)  # 8 B x 15.7B = 117 GiB of weights and gradients


def test_moments_in_host_memory_need_a_gpu():
    from convergence.train.loop import TrainConfig, check_memory
    from convergence.train.placement import Single

    with pytest.raises(BadInput, match="--optimizer-state host needs --device cuda"):
        check_memory(TrainConfig(model="tiny", recipes=("bf16",), steps=1, optimizer_state="host"), 256,
                     Single("cpu"))


def _live_tensors() -> tuple[int, int]:
    """(tensors, bytes of their distinct storages) that Python still holds after a full collection: a tensor kept
    alive from C++ (an autograd graph, a hook) still has its Python object, which is what is counted here."""
    import gc

    import torch
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    gc.collect()
    # type(o), not isinstance: that reads o.__class__, which some objects answer with a deprecation warning
    tensors = [o for o in gc.get_objects() if issubclass(type(o), torch.Tensor)]
    # those with a storage of their own: not meta, not a wrapper subclass, not the fake tensors torch.compile keeps
    # (earlier tests in the process may have compiled something); all of them are still counted as tensors
    plain = [t for t in tensors if t.device.type != "meta" and not is_traceable_wrapper_subclass(t)
             and not issubclass(type(t), FakeTensor)]
    storages = {(s.data_ptr(), s.nbytes()) for s in (t.untyped_storage() for t in plain)}
    return len(tensors), sum(n for _, n in storages)


def assert_runs_leave_nothing_behind(run_once) -> None:
    """``run_once()`` three times; the tensors alive after the third must be those alive after the second. The first
    may fill a cache that stays (a bounded one made once per process is not a leak), so it is not compared; the
    runs are identical, so anything more after the third is left behind by every run."""
    run_once()
    run_once()
    second = _live_tensors()
    run_once()
    third = _live_tensors()
    assert third == second, (f"{third[0] - second[0]} tensors ({third[1] - second[1]} bytes) more alive after the "
                             f"third run than after the second")


def _tiny_run(tmp_path, recipes: tuple[str, ...], corpus):
    """``run_once()``: a tiny run of ``recipes`` into a new folder through ``loop.run`` (its memory check included),
    2 steps on the ``corpus`` file, with validation, probes and checkpoints."""
    import itertools

    from convergence.train.data import DataSpec
    from convergence.train.loop import TrainConfig, defaults_for, run

    cfg = TrainConfig(model="tiny", recipes=recipes, steps=2, **(defaults_for("tiny") | dict(
        batch=2, seq=32, val_every=2, val_batches=1, probe_every=2, ckpt_every=2, data=DataSpec(path=str(corpus)))))
    n = itertools.count()
    return lambda: run(cfg, tmp_path / f"run{next(n)}", progress=False)


def test_training_runs_one_after_another_in_one_process_leave_no_tensors_behind(tmp_path, stdlib_corpus):
    """Runs trained one after another in one process (``loop.run`` called in a loop, as a script does) leave nothing
    alive: the memory check's activation measurement, which every run makes, keeps none of the autograd graphs it
    builds (a saved-tensors hook returning a saved output with its grad_fn closes a cycle gc cannot collect)."""
    assert_runs_leave_nothing_behind(_tiny_run(tmp_path, ("bf16", "mxfp8"), stdlib_corpus(tmp_path / "corpus.txt")))


def test_the_leak_check_sees_a_run_that_keeps_its_model(tmp_path, monkeypatch, stdlib_corpus):
    """The control: runs that each keep their model in a list fail the check."""
    from convergence.train import loop

    kept = []
    build = loop.build_model
    monkeypatch.setattr(loop, "build_model", lambda *a: kept.append(build(*a)) or kept[-1])
    with pytest.raises(AssertionError, match=r"\d+ tensors \(\d+ bytes\) more alive after the third run"):
        assert_runs_leave_nothing_behind(_tiny_run(tmp_path, ("bf16",), stdlib_corpus(tmp_path / "corpus.txt")))
    assert len(kept) == 3


def test_the_activation_measurement_leaves_no_tensors_behind():
    """What autograd saves is counted through a saved-tensors hook; the hook must not keep the graph it counts."""
    assert_runs_leave_nothing_behind(lambda: memory.activation_bytes_per_token(get_config("tiny"), 32))
