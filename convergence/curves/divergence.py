"""Has a run diverged? Three checks on the raw (unaligned) loss curve, first hit wins.

Public function
  ``detect_divergence(steps, values, *, spike_sigma, spike_min_rise, recovery_fraction, final_rise)
  -> dict | None``  ``None`` when healthy, else ``{"step", "kind", ...numbers that decided it}``.

1. ``non_finite``: the first NaN or +-Inf loss.
2. ``spike`` (non-recovering): in log space, each point is compared with the median of the
   trailing ``_TRAIL_BLOCKS`` block medians before it (blocks of ``n // 4000`` points, at least 1;
   a trailing median, so a falling curve only makes the reference higher). A point is elevated when
   it exceeds that reference by more than ``max(spike_sigma * robust sigma, log1p(spike_min_rise))``,
   robust sigma being 1.4826 * MAD of all such residuals. An elevated point starts a divergence when
   no point within the next ``recovery_fraction`` of the run's steps comes back under the threshold
   measured against the reference frozen at the spike, and at least ``_MIN_AFTER`` points were seen
   after it (a lone high point at the very end cannot be judged and is not flagged).
3. ``final_rise``: the final smoothed loss (mean of the last ``w`` points) exceeds the minimum of
   the centred ``w``-point windowed mean by more than ``max(final_rise, 4 standard errors)``
   (relative). ``w = max(5, n // 50, 10 tau)`` with tau the correlation time of the log-loss
   residual; the standard error is that of a difference of two ``w``-point means, so short noisy
   runs are not called diverged for the noise in their minimum. The reported step is where the
   smoothed curve first crosses that level after its minimum; a run shorter than ``2 w`` is not
   judged by this check.

Spike and final-rise checks need a positive loss (cross-entropy is); they are skipped, with a note,
for curves with non-positive values.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from convergence.curves.align import windowed_mean

_TRAIL_BLOCKS = 8  # reference = median of the 8 previous blocks: robust to a spike inside one block
_MIN_AFTER = 3  # points needed after an elevated point before "did not recover" can be said
_MAX_STARTS = 5000  # elevated excursions examined; more means the threshold sits inside the noise


def _trailing_reference(y: np.ndarray) -> tuple[np.ndarray, int]:
    n = len(y)
    b = max(1, n // 4000)
    nb = -(-n // b)
    padded = np.concatenate([y, np.full(nb * b - n, np.nan)]).reshape(nb, b)
    bm = np.nanmedian(padded, axis=1) if b > 1 else padded[:, 0]
    head = np.full(_TRAIL_BLOCKS, bm[0])
    windows = sliding_window_view(np.concatenate([head, bm]), _TRAIL_BLOCKS)[:nb]
    ref_blocks = np.median(windows, axis=1)
    return np.repeat(ref_blocks, b)[:n], b


def _spike(steps, y, *, spike_sigma, spike_min_rise, recovery_fraction) -> dict | None:
    ref, _ = _trailing_reference(y)
    z = y - ref
    sigma = 1.4826 * float(np.median(np.abs(z - np.median(z))))
    thr = max(spike_sigma * sigma, float(np.log1p(spike_min_rise)))
    elevated = z > thr
    starts = np.flatnonzero(elevated & ~np.concatenate([[False], elevated[:-1]]))
    horizon = max(1, round(recovery_fraction * float(steps[-1] - steps[0])))
    ends = np.searchsorted(steps, steps + horizon, side="right")
    for i in starts[:_MAX_STARTS]:
        after = y[i + 1:ends[i]]
        if len(after) < _MIN_AFTER:
            continue
        if np.all(after > ref[i] + thr):
            return {
                "step": int(steps[i]), "kind": "spike",
                "rise": float(np.expm1(z[i])), "threshold": float(np.expm1(thr)),
                "robust_sigma_log": sigma, "recovery_steps": horizon,
                "reference_loss": float(np.exp(ref[i])), "loss": float(np.exp(y[i])),
            }
    return None


def _final_rise(steps, x, *, final_rise) -> dict | None:
    n = len(x)
    y = np.log(x)
    resid = y - windowed_mean(y, max(25, n // 100))
    sd = float(resid.std())
    rho = float(np.corrcoef(resid[:-1], resid[1:])[0, 1]) if sd > 0 and n > 3 else 0.0
    tau = (1 + min(max(rho, 0.0), 0.99)) / (1 - min(max(rho, 0.0), 0.99))
    w = max(5, n // 50, int(np.ceil(10 * tau)))
    if n < 2 * w:
        return None
    smooth = windowed_mean(x, w)
    full = slice(w // 2, n - (w - w // 2) + 1)  # positions whose window is complete (no edge shrink)
    k = w // 2 + int(np.argmin(smooth[full]))
    final = float(x[-w:].mean())  # = the last complete window
    # the minimum of ~n/w noisy window means sits below the truth: demand 4 standard errors of a
    # difference of two w-point means on top of final_rise
    noise_floor = 4.0 * sd * np.sqrt(2.0 * tau / w)
    threshold = max(final_rise, float(np.expm1(noise_floor)))
    level = float(smooth[k]) * (1.0 + threshold)
    if final <= level:
        return None
    cross = k + int(np.argmax(smooth[k:] > level))
    return {
        "step": int(steps[cross]), "kind": "final_rise",
        "final_smoothed": final, "min_smoothed": float(smooth[k]), "min_step": int(steps[k]),
        "rise": final / float(smooth[k]) - 1.0, "threshold": threshold, "window_points": w,
    }


def first_non_finite(steps, values) -> dict | None:
    """The first NaN or infinite value, as a divergence (``kind`` non_finite); None when every value is finite."""
    x = np.asarray(values, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(x))
    if not len(bad):
        return None
    i = int(bad[0])
    return {"step": int(np.asarray(steps)[i]), "kind": "non_finite", "value": str(x[i])}


def detect_divergence(steps, values, *, spike_sigma: float, spike_min_rise: float, recovery_fraction: float,
                      final_rise: float) -> dict | None:
    steps = np.asarray(steps, dtype=np.int64)
    x = np.asarray(values, dtype=np.float64)
    if hit := first_non_finite(steps, x):
        return hit
    if len(x) < 2 * _MIN_AFTER or np.any(x <= 0):
        return None
    hit = _spike(steps, np.log(x), spike_sigma=spike_sigma, spike_min_rise=spike_min_rise,
                 recovery_fraction=recovery_fraction)
    return hit or _final_rise(steps, x, final_rise=final_rise)
