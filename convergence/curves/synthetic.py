"""Synthetic loss curves with a known truth: power-law decay times (1 + AR(1) noise), and strategies.

Public API
  ``SyntheticSpec``  frozen dataclass: the process (curve shape, noise, logging, seed spread).
  ``truth(spec, steps)``  the noiseless curve ``a + b * ((t + t0) / t0) ** -c``.
  ``sample_run(spec, rng, *, drift=0.0, drift_shape="constant", shared=None)``  one run's values:
      ``truth * (1 + level + delta(t) + e_t)``; ``e`` is AR(1) with lag-1 correlation ``phi`` and
      marginal sd ``noise``; ``level ~ N(0, seed_spread)`` is the run's seed offset; ``delta`` is
      the injected relative difference (``constant``: ``drift`` everywhere; ``ramp``: 0 at the first
      step to ``drift`` at the last). ``shared`` is a noise path common to both runs of a pair (the
      same token stream): a fraction ``spec.shared_noise`` of the variance comes from it.
  ``make_runs(spec, seed, *, drift=0.0, drift_shape="constant", n_baselines=1, nan_at=None,
      spike_at=None, spike_height=0.5) -> (baselines, candidate)``  ``Curve`` objects; ``nan_at`` /
      ``spike_at`` are fractions of the run where a NaN or a non-recovering jump of
      ``spike_height`` (relative) is put into the candidate.
  Hypothesis strategies (keyword-only ``@st.composite``): ``specs(...)``.

No global random state: every function takes a seed or a ``numpy.random.Generator``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st
from scipy.signal import lfilter

from convergence.curves.load import Curve, CurveMeta


@dataclass(frozen=True)
class SyntheticSpec:
    steps: int = 20_000
    log_every: int = 1
    a: float = 2.0  # irreducible loss
    b: float = 8.0  # reducible loss at step 0
    c: float = 0.5  # power-law exponent
    t0: float = 200.0  # steps before the power law bends
    noise: float = 0.01  # marginal relative sd of the step noise (1% is typical of pretraining)
    phi: float = 0.7  # AR(1) lag-1 autocorrelation of the step noise
    seed_spread: float = 0.0  # relative sd of a run's level offset across seeds
    shared_noise: float = 0.0  # fraction of noise variance shared by the runs of a pair


def truth(spec: SyntheticSpec, steps: np.ndarray) -> np.ndarray:
    t = np.asarray(steps, dtype=np.float64)
    return spec.a + spec.b * ((t + spec.t0) / spec.t0) ** (-spec.c)


def _ar1(rng: np.random.Generator, n: int, phi: float, sd: float) -> np.ndarray:
    eps = rng.standard_normal(n) * sd * np.sqrt(1.0 - phi**2)
    eps[0] = rng.standard_normal() * sd  # start in the stationary distribution
    return lfilter([1.0], [1.0, -phi], eps)


def steps_of(spec: SyntheticSpec) -> np.ndarray:
    return np.arange(spec.log_every, spec.steps + 1, spec.log_every, dtype=np.int64)


def sample_run(spec: SyntheticSpec, rng: np.random.Generator, *, drift: float = 0.0,
               drift_shape: str = "constant", shared: np.ndarray | None = None) -> np.ndarray:
    steps = steps_of(spec)
    n = len(steps)
    own_var = 1.0 - (spec.shared_noise if shared is not None else 0.0)
    e = _ar1(rng, n, spec.phi, spec.noise * np.sqrt(own_var))
    if shared is not None:
        e = e + shared * np.sqrt(spec.shared_noise)
    level = rng.standard_normal() * spec.seed_spread
    if drift_shape == "constant":
        delta = np.full(n, drift)
    elif drift_shape == "ramp":
        delta = np.linspace(0.0, drift, n)
    else:
        raise ValueError(f"drift_shape must be 'constant' or 'ramp', got {drift_shape!r}")
    return truth(spec, steps) * (1.0 + level + delta + e)


def _curve(steps: np.ndarray, values: np.ndarray, name: str) -> Curve:
    return Curve(steps, values, CurveMeta(name, "synthetic", "loss", name))


def make_runs(spec: SyntheticSpec, seed: int, *, drift: float = 0.0, drift_shape: str = "constant",
              n_baselines: int = 1, nan_at: float | None = None, spike_at: float | None = None,
              spike_height: float = 0.5) -> tuple[list[Curve], Curve]:
    rng = np.random.default_rng(seed)
    steps = steps_of(spec)
    shared = _ar1(rng, len(steps), spec.phi, spec.noise) if spec.shared_noise > 0 else None
    bases = [_curve(steps, sample_run(spec, rng, shared=shared), f"baseline{i}") for i in range(n_baselines)]
    values = sample_run(spec, rng, drift=drift, drift_shape=drift_shape, shared=shared)
    if nan_at is not None:
        values[int(nan_at * (len(values) - 1))] = np.nan
    if spike_at is not None:
        values[int(spike_at * (len(values) - 1)):] *= 1.0 + spike_height
    return bases, _curve(steps, values, "candidate")


@st.composite
def specs(draw, *, min_steps: int = 2_000, max_steps: int = 20_000, max_noise: float = 0.02,
          max_phi: float = 0.9, seed_spread: float = 0.0) -> SyntheticSpec:
    """Training-like processes. Bounds: ``max_noise`` 2% relative step noise is the noisy end of
    pretraining loss logs at small batch; ``phi`` <= 0.9 keeps the correlation time (<= 19 steps)
    well below the run length so that batch means have enough windows; ``min_steps`` 2,000 is the
    shortest run worth comparing at a 0.25% margin."""
    return SyntheticSpec(
        steps=draw(st.integers(min_steps, max_steps)),
        log_every=draw(st.sampled_from([1, 1, 2, 5])),  # most harnesses log every step
        a=draw(st.floats(1.5, 3.0)),  # final losses of LLM pretraining
        b=draw(st.floats(2.0, 10.0)),  # initial loss ~ ln(vocab) ~ 10-12
        c=draw(st.floats(0.3, 0.8)),  # measured scaling-law exponents lie here
        t0=draw(st.floats(50.0, 500.0)),
        noise=draw(st.floats(0.002, max_noise)),
        phi=draw(st.floats(0.0, max_phi)),
        seed_spread=seed_spread,
    )


