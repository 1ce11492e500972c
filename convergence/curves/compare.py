"""Is a candidate run's loss curve equivalent to its baseline's? The statistics and the verdict.

Public API (the training harness and the CLI call exactly these)
  ``compare_paths(baselines, candidate, *, margin=0.0025, each_once=True, **opts) -> dict``
      load the files (``convergence.curves.load.load_curve``; ``format``/``loss_key``/``step_key``/``tag``
      in ``opts`` go to the loader; a file given twice, or two baselines or two candidate runs that are one run
      by content (a copy, renamed, moved or gzip'd), is refused unless ``each_once`` is False), then
      ``compare_curves``. Returns the dict that ``python -m convergence compare --json`` writes.
  ``compare_curves(baselines, candidate, options=None) -> dict``  the same on loaded ``Curve``s.
  ``CompareOptions``  every knob, defaults from ``numerics.tolerances`` (each with its reason).
  ``resolution(result) -> str``, ``EXIT_CODES``  (``convergence.curves.decision.verdict``) what a result could
      resolve, one phrase for verdict lines; the exit code of each verdict.

``metric="val_loss"`` (the convergence protocol: a paired candidate against BF16 replicates on a fixed
held-out set) replaces steps 3-5 by ``convergence.curves.paired``; steps 1, 2 and 6 are the same.

How the verdict is decided
  1. Divergence (``convergence.curves.divergence``) on the candidate's raw curve: NaN/Inf, a
     non-recovering robust spike, or a final loss above its own minimum -> ``diverged``. A diverged
     baseline makes the comparison ``inconclusive``. The statistics below are still computed on
     the steps before the divergence, for the report.
  2. Alignment on common steps (``convergence.curves.align``); the first ``start_fraction`` of the overlap
     (the warm-up transient, where relative differences mean little) is not compared.
  3. The relative difference of smoothed loss: the compared range is cut into windows of ``L``
     consecutive points; per window, ``r_w = mean(candidate) / mean(mean of baselines) - 1``
     (windowed-mean smoothing, then the relative error). The estimate is the mean of ``r_w``.
  4. Noise model. Step-to-step noise: the residual of the per-point relative difference around its
     windowed mean gives the step noise and its lag-1 autocorrelation rho, hence the correlation
     time ``tau = (1 + rho) / (1 - rho)``. Windows are ``L = max(5 tau, sqrt(n))`` points long, so
     window means are close to independent (batch means), and the within-run standard error is
     ``sd(r_w) / sqrt(W)`` with ``W - 1`` degrees of freedom. With k >= 2 baselines, each
     baseline's level against the baselines' mean gives the seed-to-seed spread ``s`` and
     a between-run standard error ``s * sqrt(1 + 1/k)`` with ``k - 1`` degrees of freedom (one
     candidate run against the mean of k). The wider of the two t-intervals is used, and the
     output names the model (``"baseline_seeds"`` or ``"residual"``) and both numbers.
  5. The rule, ``test`` (``convergence.curves.decision.equivalence``). ``two-ranges`` (the default here, and the only
     rule of the training loss): for the whole compared range and for its final ``final_fraction``
     separately, a two-sided interval at ``1 - (1 - confidence)/2`` (Bonferroni over the two ranges).
     ``equivalent`` when both intervals lie inside ``[-margin, margin]``; ``not_equivalent`` when either
     lies entirely outside; otherwise ``inconclusive`` (too noisy, or too short: fewer than
     ``MIN_WINDOWS`` windows). With ``metric="val_loss"`` a declared test decides on one endpoint
     (``endpoint``: the final window, by default, or the whole range; the other part is reported, never
     deciding): ``equivalence`` (TOST at ``alpha``: the ``1 - 2 alpha`` interval inside the margin) or
     ``non-inferiority`` (``non_inferior`` / ``inferior``: the one-sided bounds against ``+margin``).
     ``python -m convergence compare --metric val_loss`` declares ``equivalence`` on the final window
     unless told otherwise.
  6. Coverage. The compared steps are the overlap of all runs. When any run (usually the candidate)
     starts later or stops earlier than the overlap by more than the tolerance (``coverage_fraction``
     of the longest span, or one logging interval if larger), the verdict is ``incomplete``: half a
     run is not evidence about the whole one. ``overlap_only=True`` judges the overlap anyway, and
     the reason says so. Order of verdicts: candidate ``diverged``, then a diverged baseline
     (``inconclusive``), then ``incomplete``, then steps 3-5 (which are computed on the overlap in
     every case, for the report).

Every verdict carries the numbers that decided it: margin, intervals, window sizes, noise, the
divergence step and kind, ``coverage`` (how much of each run was compared) and ``sensitivity``
(the interval half-width, hence the difference the data could detect: a true relative difference of ``margin +
half-width`` is called ``not_equivalent`` about half the time, since its estimate falls on either side of it with
about equal chance; measured through the val_loss verdict's code, 52 % +- 1 % at k = m = 8 and 57 % +- 3.5 % at
k = m = 16 with the proxy's 1 % spread; it is the 50 % point of the power curve, not a difference that is always
called ``not_equivalent``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np
from scipy import stats

from convergence.curves.align import align, block_means, windowed_mean
from convergence.curves.decision.equivalence import ENDPOINTS, LEGACY, PART_OF, TESTS
from convergence.curves.decision.verdict import EXIT_CODES, coverage, resolution, sensitivity, verdict
from convergence.curves.divergence import detect_divergence, first_non_finite
from convergence.curves.jsonl import load_field
from convergence.curves.load import VAL_KEYS, Curve, load_curves
from convergence.curves.tbevents import VAL_TAGS
from numerics.errors import BadInput
from numerics.files import check_once
from numerics.tolerances import floor

__all__ = ["EXIT_CODES", "METRICS", "CompareOptions", "compare_curves", "compare_paths", "resolution"]



def _tol(metric: str) -> float:
    return floor("training", "any", "loss_curve", metric).floor


MIN_WINDOWS = 4  # a t-interval on fewer than 4 window means (df < 3) is too wide to decide anything
TAU_WINDOWS = 5.0  # window length in correlation times: AR(1) adjacent window means correlate < 5%
MAX_TAU = 1000.0  # rho is clipped below 1; a curve that wanders this slowly is reported as too short
PLOT_POINTS = 1500  # points per curve kept in the result for plotting (block means)
METRICS = ("loss", "val_loss")


@dataclass(frozen=True)
class CompareOptions:
    # DeepSeek-V3 (arXiv:2412.19437, sec. 3.3): relative loss error below 0.25% vs BF16
    margin: float = _tol("relative_margin")
    confidence: float = _tol("confidence")
    start_fraction: float = 0.1  # warm-up transient excluded from the comparison
    final_fraction: float = 0.2  # the "final window" tested on its own
    spike_sigma: float = _tol("spike_sigma")
    spike_min_rise: float = _tol("spike_min_rise")
    recovery_fraction: float = _tol("recovery_fraction")
    final_rise: float = _tol("final_rise")
    coverage_fraction: float = _tol("coverage_fraction")
    overlap_only: bool = False  # judge the overlap even when a run is not covered (the reason says so)
    metric: str = "loss"  # "loss": training loss, step noise + seeds; "val_loss": held-out set, replicates
    # the rule (convergence.curves.decision.equivalence): LEGACY here, so that a caller that declares none (a plan or
    # result from before the field, the training harness) judges as before; compare's command line declares equivalence
    test: str = LEGACY
    alpha: float = _tol("alpha")  # each one-sided test's level (equivalence, non-inferiority)
    endpoint: str = "final"  # the part a declared test decides on; the other is reported, never deciding

    def check(self) -> CompareOptions:
        if self.metric not in METRICS:
            raise BadInput(f"--metric must be one of {', '.join(METRICS)}, got {self.metric!r}")
        if not 0 < self.margin < 1:
            raise BadInput(f"--margin must be in (0, 1), got {self.margin}")
        if not 0.5 < self.confidence < 1:
            raise BadInput(f"--confidence must be in (0.5, 1), got {self.confidence}")
        if not 0 <= self.start_fraction < 1 or not 0 < self.final_fraction <= 1:
            raise BadInput("--start-fraction must be in [0, 1) and --final-fraction in (0, 1]")
        if self.test not in TESTS or self.endpoint not in ENDPOINTS:
            raise BadInput(f"--test must be one of {', '.join(TESTS)} and --endpoint one of {', '.join(ENDPOINTS)}, "
                           f"got {self.test!r} and {self.endpoint!r}")
        if not 0 < self.alpha < 0.5:  # the 1 - 2 alpha interval must be a real one
            raise BadInput(f"--alpha must be in (0, 0.5), got {self.alpha}")
        if self.metric == "loss" and self.test != LEGACY:
            # the training-loss interval is the wider of two t-intervals (step noise, seed spread) with different
            # degrees of freedom, not one standard error, and one baseline (its usual use) measures no run-to-run
            # noise: no level alpha is attained, so a TOST p-value on it would mean nothing
            raise BadInput(f"--test {self.test} judges validation loss against replicates (--metric val_loss); the "
                           f"training-loss comparison keeps the {LEGACY} rule")
        if not 0 <= self.coverage_fraction < 0.5:
            raise BadInput(f"--coverage-fraction must be in [0, 0.5), got {self.coverage_fraction}")
        if not 0 < self.spike_sigma < math.inf or not 0 < self.final_rise < math.inf:
            # a spike is a rise of spike_sigma robust sigmas, a divergence a rise of final_rise over the minimum:
            # at or below zero every point would be one
            raise BadInput(f"--spike-sigma and --final-rise must be > 0, got {self.spike_sigma} and "
                           f"{self.final_rise}")
        return self


def _noise(d: np.ndarray) -> dict:
    """Step noise of the relative difference from its residual around a windowed mean."""
    n = len(d)
    w = max(25, n // 100)
    for _ in range(4):
        resid = d - windowed_mean(d, w)
        sd = float(np.std(resid))
        rho = float(np.corrcoef(resid[:-1], resid[1:])[0, 1]) if sd > 0 and n > 3 else 0.0
        rho = min(max(rho, 0.0), 1 - 2 / (MAX_TAU + 1))
        tau = (1 + rho) / (1 - rho)
        if w >= 5 * tau or w >= n // 4:  # the smoother must be much wider than the correlation
            break
        w = min(n // 4, 4 * w)
    return {"step_noise": sd, "autocorr_lag1": rho, "correlation_time": tau, "smoothing_points": w}


def _interval(cand: np.ndarray, bases: np.ndarray, steps: np.ndarray, tau: float, opts: CompareOptions) -> dict:
    n = len(cand)
    length = max(math.ceil(TAU_WINDOWS * tau), math.isqrt(n), 1)
    windows = n // length
    out = {"start_step": int(steps[0]), "end_step": int(steps[-1]), "points": n,
           "window_points": length, "windows": windows}
    if windows < MIN_WINDOWS:
        return {**out, "estimate": None, "interval": None, "decision": "inconclusive",
                "why": f"too short: {windows} windows of {length} points, need {MIN_WINDOWS}"}
    mb_each = np.vstack([block_means(b, length) for b in bases])
    mb = mb_each.mean(axis=0)
    r = block_means(cand, length) / mb - 1.0
    est = float(r.mean())
    level = 1 - (1 - opts.confidence) / 4  # two ranges (Bonferroni), two-sided
    se_w = float(r.std(ddof=1) / math.sqrt(windows))
    half_w = float(stats.t.ppf(level, windows - 1)) * se_w
    k = len(bases)
    se_b = half_b = spread = None
    if k >= 2:
        levels = (mb_each / mb - 1.0).mean(axis=1)
        spread = float(levels.std(ddof=1))
        se_b = spread * math.sqrt(1 + 1 / k)
        half_b = float(stats.t.ppf(level, k - 1)) * se_b
    half = max(half_w, half_b or 0.0)
    lo, hi = est - half, est + half
    m = opts.margin
    decision = "equivalent" if -m <= lo and hi <= m else "not_equivalent" if lo > m or hi < -m else "inconclusive"
    why = {"equivalent": f"interval [{lo:+.3%}, {hi:+.3%}] inside +-{m:.3%}",
           "not_equivalent": f"interval [{lo:+.3%}, {hi:+.3%}] outside +-{m:.3%}",
           "inconclusive": f"interval [{lo:+.3%}, {hi:+.3%}] straddles +-{m:.3%}"}[decision]
    return {**out, "estimate": est, "interval": [lo, hi], "half_width": half, "confidence_each": 2 * level - 1,
            "se_within": se_w, "se_between": se_b, "seed_spread": spread,
            "noise_source": "baseline_seeds" if (half_b or 0.0) > half_w else "residual",
            "decision": decision, "why": why}


def _downsample(steps: np.ndarray, *series: np.ndarray) -> list[list[float]]:
    b = max(1, -(-len(steps) // PLOT_POINTS))
    cut = len(steps) - (len(steps) // b) * b
    out = [[float(v) for v in steps[cut:][b - 1::b]]]
    for s in series:
        out.append([float(v) for v in block_means(s[cut:], b)] if b > 1 else [float(v) for v in s])
    return out


def _meta(c: Curve) -> dict:
    d = asdict(c.meta)
    d["points"] = len(c)
    d["steps"] = [int(c.steps[0]), int(c.steps[-1])]
    d["extras"] = sorted(c.extras)
    return d


def _divergence(c: Curve, o: CompareOptions) -> dict | None:
    return detect_divergence(c.steps, c.values, spike_sigma=o.spike_sigma, spike_min_rise=o.spike_min_rise,
                             recovery_fraction=o.recovery_fraction, final_rise=o.final_rise)


def _batch_arrays(batches: list[dict] | None, steps: np.ndarray, k: int, sources: list[str]):
    """(candidate [t, n] or candidates [m, t, n], baselines [k, t, n]) of per-batch validation losses at
    ``steps`` (``batches``: the k baselines' first, ``sources`` their names), or None unless every run logged the
    same number (>= 2) of them at every one of those steps. A non-finite one where the run's validation loss is
    finite (the steps compared are those before any divergence) is a damaged log: ``BadInput`` naming it."""
    if batches is None or any(b is None for b in batches):
        return None
    try:
        rows = [[b[int(s)] for s in steps] for b in batches]
        arr = np.asarray(rows, dtype=np.float64)
    except (KeyError, ValueError, TypeError):
        return None
    if arr.ndim != 3 or arr.shape[-1] < 2:
        return None
    if not np.isfinite(arr).all():
        run, t, _ = np.argwhere(~np.isfinite(arr))[0]
        raise BadInput(f"{sources[run]}: val_batch_losses at step {int(steps[t])} hold a non-finite loss while its "
                       "val_loss there is finite: the log is damaged")
    return (arr[k] if len(arr) == k + 1 else arr[k:]), arr[:k]


def compare_curves(baselines: list[Curve], candidate: Curve, options: CompareOptions | None = None, *,
                   candidate_replicates: list[Curve] | tuple = (),
                   divergence_runs: tuple[list[Curve], list[Curve]] | None = None,
                   batches: list[dict] | None = None, blocks: tuple[list, list] | None = None) -> dict:
    """``candidate_replicates``: more runs of the candidate recipe, perturbed as the baselines are (metric
    val_loss only: the estimate is then the mean of all candidate runs); ``divergence_runs``: (baselines,
    candidate runs) divergence is judged on, when those are not the compared ones (the training loss of
    val_loss runs); ``batches``: per run (baselines, then the candidate runs) a dict step -> per-batch
    validation losses, for the held-out set's sampling error (metric val_loss); ``blocks``: (a block label per
    baseline, one per candidate run), for runs continued from common trunks (``convergence.curves.paired``)."""
    o = (options or CompareOptions()).check()
    reps = list(candidate_replicates)
    if reps and o.metric != "val_loss":
        raise BadInput("candidate replicates are judged on validation loss only (--metric val_loss)")
    if blocks is not None and o.metric != "val_loss":
        raise BadInput("blocks are judged on validation loss only (--metric val_loss)")
    div_bases, div_cands = divergence_runs or (baselines, [candidate, *reps])
    div = next(((d | {"source": c.meta.source} if reps else d) for c in div_cands if (d := _divergence(c, o))), None)
    base_div = [{"source": b.meta.source, **d} for b in div_bases if (d := _divergence(b, o))]
    if divergence_runs is not None:  # judged on the training loss: a NaN validation loss diverges a run too
        div = div or next(((d | {"source": c.meta.source} if reps else d) for c in [candidate, *reps]
                           if (d := first_non_finite(c.steps, c.values))), None)
        seen = {d["source"] for d in base_div}
        base_div += [{"source": b.meta.source, **d} for b in baselines
                     if b.meta.source not in seen and (d := first_non_finite(b.steps, b.values))]
    k = len(baselines)
    al = align([*baselines, *reps], candidate)
    steps, bases = al.steps, al.baselines[:k]
    cand = np.vstack([al.candidate[None], al.baselines[k:]]) if reps else al.candidate
    cut_steps = [d["step"] for d in ([div] if div else []) + base_div]
    if cut_steps:  # statistics on the healthy part only
        keep = steps < min(cut_steps)
        steps, cand, bases = steps[keep], cand[..., keep], bases[:, keep]
    result = {
        "verdict": None, "reason": None, "metric": o.metric, "margin": o.margin, "confidence": o.confidence,
        "test": o.test, "alpha": None if o.test == LEGACY else o.alpha, "endpoint": None if o.test == LEGACY else
        o.endpoint,
        "interval": None, "estimate": None, "final_window": None, "overall": None,
        "divergence": div, "baseline_divergence": base_div or None, "baseline_runs": len(baselines),
        "noise": None, "options": asdict(o),
        "alignment": {"method": al.method, "points": len(al.steps),
                      "step_range": [int(al.steps[0]), int(al.steps[-1])], "not_compared": al.dropped},
        "coverage": coverage(baselines, [candidate, *reps], int(al.steps[0]), int(al.steps[-1]), o),
        "sensitivity": None,
        "inputs": {"baselines": [_meta(b) for b in baselines], "candidate": _meta(candidate)}
        | ({"candidate_replicates": [_meta(c) for c in reps]} if reps else {}),
    }
    first = int(np.searchsorted(steps, al.steps[0] + o.start_fraction * (al.steps[-1] - al.steps[0])))
    steps, cand, bases = steps[first:], cand[..., first:], bases[:, first:]
    if (bases <= 0).any():  # every difference is relative to the baselines' loss: else n/a intervals
        run, t = np.argwhere(bases <= 0)[0]
        raise BadInput(f"{baselines[run].meta.source}: loss {bases[run, t]:g} at step {int(steps[t])}: the "
                       "comparison is relative to the baselines' losses, which must be above 0 (a cross-entropy is)")
    if o.metric == "val_loss" and len(steps):
        from convergence.curves import paired

        fstart = int(np.searchsorted(steps, steps[-1] - o.final_fraction * (al.steps[-1] - al.steps[0])))
        sources = [c.meta.source for c in (*baselines, candidate, *reps)]
        result.update(paired.statistics(steps, cand, bases, _batch_arrays(batches, steps, k, sources), o,
                                        final_from=min(fstart, len(steps) - 1), blocks=blocks))
        result["series"] |= {"baseline_names": [b.name for b in baselines], "candidate_name": candidate.name}
        decides = result["overall" if o.test == LEGACY else PART_OF[o.endpoint]]  # two-ranges: the whole range's
        result.update(interval=decides["interval"], estimate=decides["estimate"])
        if o.test != LEGACY:  # the declared endpoint's numbers, where a reader of the result looks first
            result.update({key: decides.get(key) for key in ("interval_level", "p_no_difference", "p_test",
                                                             "half_width", "smallest_margin")})
    elif o.metric == "loss" and len(steps) >= 8:
        bmean = bases.mean(axis=0)
        noise = _noise(cand / bmean - 1.0)
        noise["model"] = "baseline_seeds" if len(baselines) >= 2 else "residual"
        noise["note"] = (
            f"spread of {len(baselines)} baseline seeds sets training randomness (with the step noise as a floor)"
            if len(baselines) >= 2 else
            "one baseline: noise is the step-to-step residual around the smoothed difference; "
            "seed-to-seed randomness is not measured (pass more --baseline runs for it)"
        )
        result["noise"] = noise
        overall = _interval(cand, bases, steps, noise["correlation_time"], o)
        fstart = int(np.searchsorted(steps, steps[-1] - o.final_fraction * (al.steps[-1] - al.steps[0])))
        final = _interval(cand[fstart:], bases[:, fstart:], steps[fstart:], noise["correlation_time"], o)
        result.update(overall=overall, final_window=final, interval=overall["interval"],
                      estimate=overall["estimate"])
        s_cand = windowed_mean(cand, overall["window_points"])
        s_base = windowed_mean(bmean, overall["window_points"])
        st, rc, rb, sc, sb = _downsample(steps, cand, bmean, s_cand, s_base)
        result["series"] = {"steps": st, "candidate": rc, "baseline": rb, "candidate_smoothed": sc,
                            "baseline_smoothed": sb, "baseline_names": [b.name for b in baselines],
                            "candidate_name": candidate.name}
        L = overall["window_points"]
        if overall["windows"]:
            ends = steps[len(steps) - overall["windows"] * L:][L - 1::L]
            r = block_means(cand, L) / block_means(bmean, L) - 1.0
            result["windows"] = {"end_steps": [int(s) for s in ends], "rel_diff": [float(v) for v in r]}
    result["sensitivity"] = sensitivity(result) if result["overall"] else None
    result["verdict"], result["reason"] = verdict(result, div, base_div)
    return result


# a run given twice would count twice: a baseline given twice shrinks the spread the candidate is judged by
EACH_RUN_ONCE = "each run counts once (as a baseline, the candidate or a replicate)"


def _run_digest(curve: Curve, batches) -> str:
    """What makes a run itself, whatever its file's name, folder or compression: the decoded curve (steps and
    values) and, where the file has them, the per-batch validation losses."""
    import hashlib
    import json

    h = hashlib.sha256(np.ascontiguousarray(curve.steps, dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(curve.values, dtype=np.float64).tobytes())
    if batches:
        h.update(json.dumps(sorted(batches.items()), allow_nan=True).encode())
    return h.hexdigest()


def _check_distinct_runs(paths, curves: list[Curve], batches=None) -> None:
    """Refuse (``BadInput``) two of ``paths`` whose runs are the same run: a byte copy, a gzip'd copy or a copy in
    another folder would count twice among the replicates, and their spread would shrink to nothing (a zero-width
    interval: a verdict the data cannot carry)."""
    seen: dict[str, object] = {}
    for path, curve, b in zip(paths, curves, batches or [None] * len(paths)):
        digest = _run_digest(curve, b)
        if digest in seen:
            raise BadInput(f"{seen[digest]} and {path} are the same run (the same losses at every step"
                           f"{', batch for batch' if b else ''}), whatever their names, folders or compression: "
                           f"{EACH_RUN_ONCE}")
        seen[digest] = path


def compare_paths(baselines, candidate, *, margin: float = CompareOptions.margin, candidate_replicates=(),
                  each_once: bool = True, blocks: tuple[list, list] | None = None, planted_shift: float = 0.0,
                  **opts) -> dict:
    """Load and compare; ``opts``: CompareOptions fields and loader keys (format, loss_key, step_key, tag).

    ``metric="val_loss"`` compares the validation loss (``load_curve``'s ``validation``; ``loss_key`` or
    ``tag`` names another series), judges divergence on the training loss where the files have one, and
    reads JSONL runs' ``val_batch_losses``; ``candidate_replicates`` (val_loss only) are more runs of the
    candidate recipe; ``blocks`` (val_loss only): ``compare_curves``'. A file given twice is ``BadInput`` unless
    ``each_once`` is False (a caller that reads only each run's levels, not the verdict).

    ``planted_shift`` (val_loss only): every candidate run's validation losses (and per-batch losses) multiplied
    by ``1 + planted_shift`` once loaded, a known true effect (the protocol's planted positive control: BF16 runs
    made that much worse); the result records it (``planted_shift``)."""
    load_keys = {k: opts.pop(k) for k in ("format", "loss_key", "step_key", "tag") if k in opts}
    if load_keys.get("loss_key") and load_keys.get("loss_key") == load_keys.get("step_key"):
        raise BadInput(f"--loss-key and --step-key name the same field ({load_keys['loss_key']!r}): the steps "
                       "would be compared as losses")  # else a bogus DIVERGED verdict
    options = replace(CompareOptions(), margin=margin, **opts).check()
    k = len(baselines)
    paths = [*baselines, candidate, *candidate_replicates]
    if candidate_replicates and options.metric != "val_loss":
        raise BadInput("candidate replicates are judged on validation loss only (--metric val_loss)")
    if planted_shift and options.metric != "val_loss":
        raise BadInput("a planted shift is judged on validation loss only (--metric val_loss)")
    if options.metric == "val_loss":
        curves = load_curves(paths, **load_keys, validation=True)
        if each_once:  # after loading: what is wrong inside a file is said first
            check_once(paths, counts=EACH_RUN_ONCE)
        if planted_shift:
            curves[k:] = [replace(c, values=c.values * (1 + planted_shift)) for c in curves[k:]]
        try:  # the training loss: the keys and tag named the validation loss
            train = load_curves(paths, **{k: v for k, v in load_keys.items() if k not in ("loss_key", "tag")})
            div_runs, div_note = (train[:k], train[k:]), "training loss"
        except BadInput as exc:  # no training loss in a file: divergence is judged on the validation curves
            div_runs, div_note = None, f"validation loss (no training loss to judge it on: {exc})"
        # the per-batch losses belong to val_loss (a --loss-key naming another series has none), found by the step
        # key the curves were read with
        own = (load_keys.get("loss_key") or "val_loss") == "val_loss"
        batches = [load_field(p, "val_batch_losses", step_key=load_keys.get("step_key") or "step")
                   if own and c.meta.format == "jsonl" else None for p, c in zip(paths, curves)]
        if planted_shift:
            batches[k:] = [None if b is None else {s: [x * (1 + planted_shift) for x in v] if isinstance(v, list)
                                                   else v for s, v in b.items()} for b in batches[k:]]
        if each_once:  # the replicates of each side: a baseline and the candidate alike is a finding, not a copy
            _check_distinct_runs(paths[:k], curves[:k], batches[:k])
            _check_distinct_runs(paths[k:], curves[k:], batches[k:])
        result = compare_curves(curves[:k], curves[k], options, candidate_replicates=curves[k + 1:],
                                divergence_runs=div_runs, batches=batches, blocks=blocks)
        result["divergence_judged_on"] = div_note
        if planted_shift:
            result["planted_shift"] = planted_shift
    else:
        named = [flag for flag, v, names in (("--loss-key", load_keys.get("loss_key"), VAL_KEYS),
                                             ("--tag", load_keys.get("tag"), VAL_TAGS)) if v in names]
        if named:  # the training-loss statistics (a point every step, step noise) on evaluations every N steps
            raise BadInput(f"{named[0]} names a validation loss: compare it with --metric val_loss")
        *base, cand = load_curves(paths, **load_keys)
        if each_once:
            check_once(paths, counts=EACH_RUN_ONCE)
            _check_distinct_runs(paths[:k], base)
        result = compare_curves(base, cand, options)
    from numerics.environment import describe

    result["environment"] = describe()
    return result
