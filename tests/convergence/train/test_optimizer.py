"""convergence.train.placement: AdamW with its moments in host memory is AdamW, bit for bit."""

from __future__ import annotations

import pytest
import torch

from convergence.train.placement import HostStateAdamW


def _model(device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).to(device)


def _optimizer(cls, model, **over):
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    kw = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, foreach=False) | over
    opt = cls([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], **kw)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + s))  # the lr changes every step


def _train(model, opt, sched, steps: range, device: str) -> list[torch.Tensor]:
    for step in steps:
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(4, 16, generator=g).to(device), torch.randn(4, 8, generator=g).to(device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if step == 2:
            model[0].bias.grad = None  # a parameter without a gradient this step: AdamW skips it
        opt.step()
        sched.step()
    return [p.detach().clone() for p in model.parameters()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _compare(device: str, **reference_over):
    ref_model, host_model = _model(device), _model(device)
    ref = _train(ref_model, *_optimizer(torch.optim.AdamW, ref_model, **reference_over), range(6), device)
    host_opt, host_sched = _optimizer(HostStateAdamW, host_model)
    got = _train(host_model, host_opt, host_sched, range(6), device)
    return ref, got, host_opt


def test_host_state_adamw_is_adamw_bit_for_bit_and_a_different_adamw_is_told_apart():
    ref, got, _ = _compare("cpu")
    assert _same(ref, got)
    other, got, _ = _compare("cpu", eps=1e-6)  # the control: the comparison sees an AdamW that differs
    assert not _same(other, got)


def test_host_state_adamw_resumes_from_its_state_dict_bit_identically():
    """A checkpoint's optimizer state (torch.save of state_dict, as convergence.train.placement.Single writes)
    continues the run exactly, and loading leaves the moments in host memory."""
    whole_model = _model("cpu")
    whole = _train(whole_model, *_optimizer(HostStateAdamW, whole_model), range(6), "cpu")
    first = _model("cpu")
    opt, sched = _optimizer(HostStateAdamW, first)
    _train(first, opt, sched, range(3), "cpu")
    saved = {"model": first.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}
    second = _model("cpu")
    opt2, sched2 = _optimizer(HostStateAdamW, second)
    second.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    sched2.load_state_dict(saved["sched"])
    assert _same(whole, _train(second, opt2, sched2, range(3, 6), "cpu"))
    assert all(s["exp_avg"].device.type == "cpu" for s in opt2.state.values())


def test_host_state_adamw_refuses_the_multi_tensor_implementations():
    with pytest.raises(ValueError, match="one parameter at a time"):
        HostStateAdamW(_model("cpu").parameters(), fused=True)


@pytest.mark.gpu
def test_host_state_adamw_on_cuda_is_adamw_bit_for_bit_with_its_moments_in_pinned_host_memory():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (none visible); run `pytest -m gpu` on a GPU machine")
    ref, got, opt = _compare("cuda")
    assert _same(ref, got)
    other, got, _ = _compare("cuda", eps=1e-6)
    assert not _same(other, got)
    for state in opt.state.values():
        assert state["exp_avg"].device.type == "cpu" and state["exp_avg"].is_pinned()
        assert state["exp_avg_sq"].device.type == "cpu" and state["exp_avg_sq"].is_pinned()
