"""A scheduler's signal stops training at the next step boundary with its checkpoint; the resumed run is the same."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch

from convergence.train import data as data_mod
from convergence.train.checkpoint import load_checkpoint
from convergence.train.loop import TrainConfig, computed, defaults_for, train_recipe
from convergence.train.stopping import stop_on_signals, stop_requested

# as a protocol piece trains: a checkpoint only when it stops and at the end; no evaluation, so the batches the loop
# reads are the training steps' alone
CFG = TrainConfig(model="tiny", recipes=("bf16",), steps=8, **defaults_for("tiny") | {"ckpt_every": 8,
                                                                                      "val_every": 0})


@pytest.fixture(scope="module")
def tokens():
    return data_mod.load_tokens(CFG.data)


def _train(tokens, out, resume=False) -> bool:
    return train_recipe(CFG, "bf16", out / "bf16", tokens, resume=resume, progress=False)


def _signal_at_step(monkeypatch, step: int) -> None:
    """SIGUSR2 to this process while the loop reads the batch of ``step`` (0-based), once: as Slurm's warning
    arriving mid-step."""
    real = data_mod.Batches.batch_at
    sent = []

    def batch_at(self, s):
        if s == step and not sent:
            sent.append(s)
            os.kill(os.getpid(), signal.SIGUSR2)
        return real(self, s)

    monkeypatch.setattr(data_mod.Batches, "batch_at", batch_at)


def _curve(out):
    return [computed(json.loads(line)) for line in (out / "bf16" / "metrics.jsonl").read_text().splitlines()]


def test_stop_on_signals_stops_at_the_next_step_with_a_checkpoint_and_resumes_bit_identically(tmp_path, monkeypatch,
                                                                                              tokens):
    assert _train(tokens, tmp_path / "ref")
    _signal_at_step(monkeypatch, 4)
    with stop_on_signals(signal.SIGUSR2):
        assert not _train(tokens, tmp_path / "run")  # stopped before its end
        assert stop_requested() == "SIGUSR2"
    assert stop_requested() is None  # the request ends with the context
    assert len(_curve(tmp_path / "run")) == 5  # the step the signal arrived in was finished, no later one begun
    assert load_checkpoint(tmp_path / "run" / "bf16" / "checkpoint.pt")["step"] == 5
    monkeypatch.undo()
    assert _train(tokens, tmp_path / "run", resume=True)
    assert _curve(tmp_path / "run") == _curve(tmp_path / "ref")
    a, b = (load_checkpoint(tmp_path / d / "bf16" / "checkpoint.pt")["model"] for d in ("ref", "run"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_signal_outside_stop_on_signals_does_not_stop_training(tmp_path, monkeypatch, tokens):
    """The control: the same signal, handled by someone else's handler, leaves the run to its end."""
    got = []
    before = signal.signal(signal.SIGUSR2, lambda s, f: got.append(s))
    try:
        _signal_at_step(monkeypatch, 4)
        assert _train(tokens, tmp_path / "run")
    finally:
        signal.signal(signal.SIGUSR2, before)
    assert got == [signal.SIGUSR2] and len(_curve(tmp_path / "run")) == CFG.steps
