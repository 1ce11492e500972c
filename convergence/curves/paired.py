"""The paired verdict on held-out validation loss: a candidate against its baseline and baseline replicates.

Public: ``statistics(steps, candidate, baselines, batches, options, blocks=None) -> dict`` (the ``overall``,
``final_window``, ``noise`` and plotting parts of ``convergence.curves.compare``'s result for
``metric="val_loss"``), ``range_statistic``, ``jackknife_se``, ``between_runs``, ``within_blocks``,
``REPLICATE_DESIGN``.

The design (docs/protocol.md): the candidate (say MXFP8) and the first baseline (BF16)
start from the same weights and see the same data; the other baselines are *replicates*, BF16 runs that
differ from the first by a benign change only (other initial weights, or another reduction order), and
together they say how far apart two runs of one recipe end up on this data. Validation loss is measured
on one fixed held-out set, so it has no batch-to-batch sampling noise along the run; what is left is

* run-to-run noise: training is chaotic, and any change, benign or not, moves the end point. The
  replicates measure it: for a range of evaluations, each run's statistic is
  ``x_j = mean_t(L_j(t) / Lbar(t)) - 1`` with ``Lbar(t)`` the mean of the k baselines at evaluation t;
  the baselines' x_i have spread ``s`` (k - 1 degrees of freedom). One candidate run, when it differs
  from them by nothing but noise, has standard error ``s * sqrt(1 + 1/k)``: its own run's noise is in it,
  so no number of baselines brings the interval below ``z * s``. That takes the candidate's run-to-run spread
  to be BF16's, which one run cannot measure; where the candidate spreads more the interval is too narrow
  (``ONE_RUN_CAVEAT``: measured, truth 0, normal levels: 1.3x the spread at k = 16, 5.4 % not_equivalent and
  92.4 % coverage of a nominal 97.5 %; 2.3x at k = 4, 11.8 % and 86 %). With candidate replicates (below, Welch)
  the same spreads kept the nominal rates: 2.3x at k = m = 4, 1.4 % and 97.9 %. Candidate *replicates* (m runs of the
  candidate recipe, perturbed as the baselines are) remove that floor: the estimate is the mean of
  their x_j, its standard error ``sqrt(s^2/k + s_c^2/m)`` with ``s_c`` their own spread and the
  Welch-Satterthwaite degrees of freedom (the candidate's spread is not assumed equal to BF16's);
* the held-out set's sampling error: the set is a sample of the distribution the claim is about. Where
  the runs log every batch's loss (``val_batch_losses``), the jackknife over batches (leave one batch
  out of every run, recompute the estimate) gives its standard error, paired by construction (every run
  is scored on the same batches). Without per-batch losses it is left out and the result says so.

Both parts (the whole compared range and its final fraction) get ``se = sqrt(se_between^2 + se_set^2)`` on
``dof`` degrees of freedom. Under the ``two-ranges`` rule each part's interval is ``estimate +- t(level, dof) * se``
(Bonferroni over the two, as for the training loss); under a declared test (``options.test``: equivalence or
non-inferiority) each part is judged by ``convergence.curves.decision.equivalence.judge`` on the same se and dof,
and the verdict takes the declared endpoint's. Fewer than two baselines measure no run-to-run noise, so the verdict
is then ``inconclusive`` whatever the estimate.

Blocks (``blocks``: a label per baseline and per candidate run, the fork design's trunks): runs continued from one
trunk share what the trunk decided, which cancels in the difference of their means. ``within_blocks`` then gives
the run-to-run part: the estimate is the mean over blocks of (candidate runs' mean - baselines' mean), equal to the
unblocked one when every block holds as many of each (the design is balanced: ``BadInput`` otherwise), with
variance ``s_w^2 * sum_b (1/k_b + 1/m_b) / B^2``, ``s_w`` the spread of runs around their block-and-recipe mean,
pooled over both recipes, on ``sum (n - 1)`` degrees of freedom (``2n - 2B`` for n runs a recipe in B blocks:
``convergence.curves.decision.designs.Design.dof``). That takes the candidate's effect to be the same on every block
(no block-by-recipe interaction) and both recipes' spreads equal; the result reports the blocks' differences and
the F-test of their spread against what ``s_w`` predicts (``interaction_p``: small when the effect depends on the
block). One run of each per block leaves no spread within blocks: then the blocks' differences, their standard
error over B - 1 degrees of freedom.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from convergence.curves.decision.equivalence import LEGACY, judge

REPLICATE_DESIGN = ("the first baseline shares the candidate's initial weights and data; the others differ from it "
                    "by a benign change only; their spread is the run-to-run noise")
# one candidate run: its spread is taken to be the baselines' (module docstring: measured effect when it is not)
ONE_RUN_CAVEAT = ("one candidate run: its interval takes the candidate's run-to-run spread to equal the baselines' "
                  "(not measurable from one run); if it spreads more (MXFP8 1.2-1.3x on the proxy) the interval is "
                  "too narrow, e.g. 1.3x at 16 baselines: 92 % coverage for 97.5 %; pass --candidate-replicate runs")


def range_statistic(cand: np.ndarray, bases: np.ndarray) -> tuple[float, np.ndarray]:
    """The estimate and the baselines' ``x_i`` over evaluations: mean over t of L(t) / mean_i L_i(t), minus 1.
    ``cand`` is one run [t] or m candidate runs [m, t] (the estimate is then the mean of their x_j)."""
    mean = bases.mean(axis=0)
    return float((cand / mean).mean() - 1.0), (bases / mean).mean(axis=1) - 1.0


def candidate_levels(cand: np.ndarray, bases: np.ndarray) -> np.ndarray:
    """Each candidate run's x_j against the baselines' mean (one value for a single run [t])."""
    return np.atleast_1d((np.atleast_2d(cand) / bases.mean(axis=0)).mean(axis=-1) - 1.0)


def between_runs(k: int, spread, m: int = 1, cand_spread=None):
    """(standard error, degrees of freedom) of the run-to-run part: one candidate run ``s * sqrt(1 + 1/k)``
    with k - 1; m >= 2 candidate runs ``sqrt(s^2/k + s_c^2/m)`` with Welch-Satterthwaite's. Floats for float
    spreads; arrays for arrays of them (many simulated protocols at once, as the calibration tests judge them)."""
    if m < 2 or cand_spread is None:
        se = np.asarray(spread, dtype=float) * math.sqrt(1 + 1 / k)
        return (float(se), float(k - 1)) if se.ndim == 0 else (se, np.full(se.shape, float(k - 1)))
    a, b = np.square(np.asarray(spread, dtype=float)) / k, np.square(np.asarray(cand_spread, dtype=float)) / m
    total = a + b
    with np.errstate(divide="ignore", invalid="ignore"):  # no spread at all: the pooled k + m - 2
        dof = np.where(total == 0, float(k + m - 2), total ** 2 / (a ** 2 / (k - 1) + b ** 2 / (m - 1)))
    se = np.sqrt(total)
    return (float(se), float(dof)) if se.ndim == 0 else (se, dof)


def within_blocks(levels, cand_levels, blocks: tuple[list, list]) -> dict:
    """The run-to-run standard error and degrees of freedom of a blocked design (module docstring): ``levels`` of
    the baselines and ``cand_levels`` of the candidate runs, ``blocks`` their labels. Returns ``se_between``,
    ``dof``, ``spread`` (within blocks), ``block_differences`` and ``interaction_p`` (None without the numbers)."""
    from numerics.errors import BadInput

    base_blocks, cand_blocks = (list(b) for b in blocks)
    if len(base_blocks) != len(levels) or len(cand_blocks) != len(cand_levels):
        raise BadInput(f"blocks label {len(base_blocks)} baselines and {len(cand_blocks)} candidate runs, the "
                       f"comparison has {len(levels)} and {len(cand_levels)}")
    names = list(dict.fromkeys(base_blocks))
    groups = {(b, arm): [] for b in names for arm in (0, 1)}
    for x, b in zip(levels, base_blocks):
        groups[(b, 0)].append(float(x))
    for x, b in zip(cand_levels, cand_blocks):
        if (b, 1) not in groups:
            raise BadInput(f"candidate run in block {b!r}, which holds no baseline")
        groups[(b, 1)].append(float(x))
    sizes = {(len(groups[(b, 0)]), len(groups[(b, 1)])) for b in names}
    if len(sizes) != 1 or min(next(iter(sizes))) < 1:
        raise BadInput(f"a blocked comparison needs as many baselines, and as many candidate runs, in every block: "
                       f"got (baselines, candidate runs) {sorted(sizes)}")
    k_b, m_b = next(iter(sizes))
    n_blocks = len(names)
    diffs = np.array([np.mean(groups[(b, 1)]) - np.mean(groups[(b, 0)]) for b in names])
    dof = sum(len(g) - 1 for g in groups.values())
    out = {"blocks": n_blocks, "block_differences": [float(d) for d in diffs], "interaction_p": None}
    if dof >= 1:
        spread = math.sqrt(sum(float(((np.asarray(g) - np.mean(g)) ** 2).sum()) for g in groups.values()) / dof)
        se = spread * math.sqrt(1 / k_b + 1 / m_b) / math.sqrt(n_blocks)
        if n_blocks >= 2 and spread > 0:  # the blocks' differences spread as s_w^2 (1/k_b + 1/m_b) without interaction
            f = float(diffs.var(ddof=1)) / (spread ** 2 * (1 / k_b + 1 / m_b))
            out["interaction_p"] = float(stats.f.sf(f, n_blocks - 1, dof))
        return out | {"se_between": se, "dof": float(dof), "spread": spread, "estimator": "within blocks"}
    if n_blocks < 2:
        return out | {"se_between": None, "dof": None, "spread": None, "estimator": "none: one run each in one block"}
    se = float(diffs.std(ddof=1)) / math.sqrt(n_blocks)
    return out | {"se_between": se, "dof": float(n_blocks - 1), "spread": None, "estimator": "blocks' differences"}


def jackknife_se(cand_b: np.ndarray, bases_b: np.ndarray) -> float:
    """Standard error of the estimate from the held-out set's batches, by the jackknife over batches.

    ``cand_b`` [t, n] (or [m, t, n], m candidate runs) and ``bases_b`` [k, t, n]: every run's per-batch losses
    at the compared evaluations."""
    n = cand_b.shape[-1]
    total_c, total_b = cand_b.sum(axis=-1), bases_b.sum(axis=-1)
    loo = np.empty(n)
    for b in range(n):  # leave batch b out of every run: the per-evaluation means over the other n - 1
        c = (total_c - cand_b[..., b]) / (n - 1)
        base = (total_b - bases_b[..., b]) / (n - 1)
        loo[b] = range_statistic(c, base)[0]
    return float(math.sqrt((n - 1) / n * ((loo - loo.mean()) ** 2).sum()))


def _part(steps: np.ndarray, cand: np.ndarray, bases: np.ndarray, batches, opts, blocks=None) -> dict:
    k = len(bases)
    est, levels = range_statistic(cand, bases)
    cand_levels = candidate_levels(cand, bases)
    m = len(cand_levels) if cand.ndim == 2 else 1
    out = {"start_step": int(steps[0]), "end_step": int(steps[-1]), "points": len(steps),
           "windows": len(steps), "window_points": 1, "estimate": est, "replicate_levels": [float(v) for v in levels],
           "candidate_runs": m, "candidate_levels": [float(v) for v in cand_levels]}
    se_set = None
    if batches is not None:
        cand_b, bases_b = batches
        se_set = jackknife_se(cand_b, bases_b)
    out["se_set"] = se_set
    out["heldout_batches"] = None if batches is None else int(batches[1].shape[-1])  # what se_set is over
    if k < 2:
        return {**out, "interval": None, "half_width": None, "decision": "inconclusive",
                "why": "one baseline: run-to-run noise is not measured (pass replicates with --baseline)"}
    spread = float(levels.std(ddof=1))
    cand_spread = float(cand_levels.std(ddof=1)) if m >= 2 else None
    blocked = None
    if blocks is not None:
        blocked = within_blocks(levels, cand_levels, blocks)
        if blocked["se_between"] is None:
            return {**out, "blocked": blocked, "interval": None, "half_width": None, "decision": "inconclusive",
                    "why": "one run of each recipe in one block: run-to-run noise is not measured"}
        se_between, dof = blocked["se_between"], blocked["dof"]
    else:
        se_between, dof = between_runs(k, spread, m, cand_spread)
    se = math.sqrt(se_between ** 2 + (se_set or 0.0) ** 2)
    noise = {"se_between": se_between, "seed_spread": spread, "candidate_spread": cand_spread, "dof": dof,
             "se": se, "se_within": None, "noise_source": ("replicates within blocks" if blocked else "replicates")
             + ("+set" if se_set is not None else "")} | ({"blocked": blocked} if blocked else {})
    if opts.test != LEGACY:  # one declared test on this part (convergence.curves.decision.equivalence)
        return {**out, **noise, **judge(est, se, dof, test=opts.test, alpha=opts.alpha, margin=opts.margin)}
    level = 1 - (1 - opts.confidence) / 4  # two ranges (Bonferroni), two-sided
    half = float(stats.t.ppf(level, dof)) * se
    lo, hi = est - half, est + half
    m = opts.margin
    decision = "equivalent" if -m <= lo and hi <= m else "not_equivalent" if lo > m or hi < -m else "inconclusive"
    word = {"equivalent": "inside", "not_equivalent": "outside", "inconclusive": "straddles"}[decision]
    return {**out, "interval": [lo, hi], "half_width": half, "confidence_each": 2 * level - 1, **noise,
            "decision": decision, "why": f"interval [{lo:+.3%}, {hi:+.3%}] {word} +-{m:.3%}"}


def statistics(steps: np.ndarray, cand: np.ndarray, bases: np.ndarray, batches, opts, *, final_from: int,
               blocks: tuple[list, list] | None = None) -> dict:
    """The ``overall`` (all of ``steps``) and ``final_window`` (from index ``final_from``) parts, the noise
    summary and the plotted series. ``cand``: one run [t] or m runs [m, t]; ``batches``: (candidate [t, n] or
    [m, t, n], baselines [k, t, n]) or None; ``blocks``: each baseline's and candidate run's block (module
    docstring) or None."""

    def cut(sl):
        return None if batches is None else (batches[0][..., sl, :], batches[1][:, sl])

    overall = _part(steps, cand, bases, cut(slice(None)), opts, blocks)
    final = _part(steps[final_from:], cand[..., final_from:], bases[:, final_from:], cut(slice(final_from, None)),
                  opts, blocks)
    mean = bases.mean(axis=0)
    k = len(bases)
    runs = np.atleast_2d(cand)
    cand_mean = runs.mean(axis=0)
    noise = {"model": "replicates" if blocks is None else "replicates within blocks", "replicates": k,
             "replicate_spread": final.get("seed_spread"),
             "candidate_runs": len(runs), "candidate_spread": final.get("candidate_spread"),
             "se_set": final["se_set"], "heldout_batches": final["heldout_batches"], "evaluations": len(steps),
             "note": (f"{k} baselines: {REPLICATE_DESIGN}" if k >= 2 else
                      "one baseline: run-to-run noise is not measured") + (
                 f"; {len(runs)} candidate runs, perturbed as the baselines are: the estimate is their mean"
                 if len(runs) > 1 else f"; {ONE_RUN_CAVEAT}" if k >= 2 else "") + (
                 "; the held-out set's sampling error is included (jackknife over its batches)" if batches is not None
                 else "; no per-batch losses of the compared series were read (JSONL val_batch_losses, which belong "
                 "to val_loss), so the set's sampling error is not included")}
    series = {"steps": [int(s) for s in steps], "candidate": [float(v) for v in cand_mean],
              "baseline": [float(v) for v in mean], "candidate_smoothed": [float(v) for v in cand_mean],
              "baseline_smoothed": [float(v) for v in mean]}
    windows = {"end_steps": [int(s) for s in steps], "rel_diff": [float(v) for v in cand_mean / mean - 1.0],
               "replicates": [[float(v) for v in b / mean - 1.0] for b in bases]}
    if len(runs) > 1:
        windows["candidate_replicates"] = [[float(v) for v in c / mean - 1.0] for c in runs]
    return {"overall": overall, "final_window": final, "noise": noise, "series": series, "windows": windows}
