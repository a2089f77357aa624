"""Ratio and crossover claims, judged per group of matched points.

A ratio claim's measured value is the geometric mean of the metric ratios (subject/baseline,
or the inverse) at matched points; its interval is the envelope of the per-point bootstrap
intervals, so "2-4x at n = 1k..8k" must hold at every n. A crossover claim measures the
largest ``over`` up to which the subject is cheaper than the baseline, in units of
``relative_to`` (e.g. n/d), censored at the ends of the sweep.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness.analysis.claims import Claim
from harness.analysis.fits import log_ratio_boot
from harness.analysis.frames import TIME_METRICS
from harness.analysis.judging import N_BOOT, judge
from harness.analysis.subjects import group_label, matched


def _log_ratios(part: pd.DataFrame, claim: Claim) -> tuple[np.ndarray, np.ndarray]:
    """Point estimates (k,) and bootstrap replicates (B, k) of log(subject / baseline)."""

    def side(s: str) -> pd.DataFrame:
        return part[[f"y_{s}", f"samples_{s}"]].set_axis(["y", "samples"], axis=1)

    power = TIME_METRICS.get(claim.metric)
    boot = log_ratio_boot(side("s"), side("b"), power, N_BOOT, seed=0)
    est = np.log(part["y_s"].to_numpy(float) / part["y_b"].to_numpy(float))
    return est, boot


def _no_samples(claim: Claim) -> str:
    if claim.metric in TIME_METRICS:
        return ""
    return f" (no per-call samples of {claim.metric}: the interval has no measurement noise)"


def ratio_groups(df: pd.DataFrame, claim: Claim) -> tuple[list[dict], str]:
    """Per group of matched points: verdict, measured ratio (geometric mean), interval (the
    envelope of the per-point intervals), reason; or ([], why there are no matched points)."""
    pairs, reason = matched(df, claim)
    sign = -1.0 if claim.ratio == "baseline/impl" else 1.0
    groups = []
    for values, part in pairs:
        est, boot = _log_ratios(part, claim)
        est, boot = sign * est, sign * boot
        lo, hi = np.quantile(boot, [0.025, 0.975], axis=0)
        ci_lo, ci_hi = (
            float(np.exp(min(lo.min(), est.min()))),
            float(np.exp(max(hi.max(), est.max()))),
        )
        k = len(part)
        need = claim.min_points or 1
        verdict, why = (
            judge(ci_lo, ci_hi, claim.band)
            if k >= need
            else ("inconclusive", f"too few matched points ({k}, need {need})")
        )
        per_point = " ".join(f"{x:g}:{np.exp(v):.3g}" for x, v in zip(part["x"], est, strict=True))
        values.pop("_first")
        groups.append(
            {
                "group": group_label(values),
                "verdict": verdict,
                "n_points": k,
                "reason": f"{why}; {claim.ratio} per {claim.over}: {per_point}"
                + _no_samples(claim),
                "measured": float(np.exp(est.mean())),
                "ci_low": ci_lo,
                "ci_high": ci_hi,
            }
        )
    return groups, reason


def crossing(x: np.ndarray, log_ratio: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bounds (lower, upper) on the x up to which the subject is cheaper (log_ratio < 0), for
    each row of ``log_ratio`` (..., k): at the first sign change, both are the log-interpolated
    crossing; cheaper at every point: (x[-1], inf); never cheaper: (0, x[0])."""
    lr = np.atleast_2d(log_ratio)
    lx = np.log(np.asarray(x, float))
    lower = np.full(lr.shape[0], float(x[-1]))
    upper = np.full(lr.shape[0], np.inf)
    for row in range(lr.shape[0]):
        bad = np.flatnonzero(lr[row] >= 0)
        if not bad.size:
            continue
        i = bad[0]
        if i == 0:
            lower[row], upper[row] = 0.0, float(x[0])
            continue
        a, b = lr[row, i - 1], lr[row, i]
        lower[row] = upper[row] = np.exp(lx[i - 1] + (lx[i] - lx[i - 1]) * (-a) / (b - a))
    return lower, upper


def crossover_groups(df: pd.DataFrame, claim: Claim) -> tuple[list[dict], str]:
    """Per group of matched points: verdict, measured crossover (in units of
    ``claim.relative_to``), its bootstrap interval, reason; or ([], why there are none)."""
    pairs, reason = matched(df, claim)
    groups = []
    for values, part in pairs:
        first = values.pop("_first")
        unit = float(values.get(claim.relative_to, first.get(claim.relative_to, np.nan)))
        x = part["x"].to_numpy(float)
        est, boot = _log_ratios(part, claim)
        (p_lo,), (p_hi,) = crossing(x, est)
        b_lo, b_hi = crossing(x, boot)
        lo = min(np.quantile(b_lo, 0.025, method="inverted_cdf"), p_lo) / unit
        hi = max(np.quantile(b_hi, 0.975, method="inverted_cdf"), p_hi) / unit
        point = (p_hi if p_lo == 0 else p_lo) / unit  # the crossing, or the bound we have
        censor = (
            " (cheaper at every point: a lower bound)"
            if np.isinf(p_hi)
            else " (never cheaper: an upper bound)"
            if p_lo == 0
            else ""
        )
        verdict, why = (
            judge(lo, hi, claim.band)
            if len(part) >= 2
            else ("inconclusive", "too few matched points (need 2)")
        )
        per_point = " ".join(f"{v:g}:{np.exp(r):.3g}" for v, r in zip(x, est, strict=True))
        groups.append(
            {
                "group": group_label(values),
                "verdict": verdict,
                "n_points": len(part),
                "reason": f"{why}; crossover at {point * unit:g}{censor}; "
                f"{claim.impl}/{claim.baseline} per {claim.over}: {per_point}" + _no_samples(claim),
                "measured": point,
                "ci_low": float(lo),
                "ci_high": float(hi),
            }
        )
    return groups, reason


def crossovers(
    rows: pd.DataFrame,
    impl: str,
    baseline: str,
    *,
    metric: str,
    over: str,
    relative_to: str,
    expect_min: float | None = None,
    expect_max: float | None = None,
) -> list[dict]:
    """Where ``impl`` stops being cheaper than ``baseline`` in ``metric`` as ``over`` grows, per
    group of matched rows: dicts with ``group``, ``measured`` (the crossover in units of
    ``relative_to``, e.g. n/d), ``ci_low``, ``ci_high``, ``n_points``, ``reason`` and
    ``verdict`` (the crossover against ``[expect_min, expect_max]``; give at least one)."""
    if expect_min is None and expect_max is None:
        raise ValueError("crossovers needs expect_min or expect_max")
    claim = Claim(
        id=f"{impl}-vs-{baseline}",
        metric=metric,
        over=over,
        impl=impl,
        baseline=baseline,
        relative_to=relative_to,
        expect_crossover_min=expect_min,
        expect_crossover_max=expect_max,
    )
    return crossover_groups(rows, claim)[0]
