"""Bound claims: a row column itself against a floor and/or a ceiling at every point
(``bw_fraction >= 0.8``, ``tflops_per_s >= 300``, ``time_median_s <= 1e-3``).

Each point (duplicate rows merged as :func:`~harness.analysis.frames.aggregate` merges them)
gets an interval: for a metric that is a time or a rate of one (``TIME_METRICS``: the median
time, tokens/s, TFLOP/s, ``bw_fraction``) the bootstrap of its median from the row's raw
samples (timing passes kept apart); for any other column none (the point value alone, said in
the group's words). The points are then judged along the axis as a ratio claim's are
(:func:`harness.analysis.ratios.regions`): confirmed when every point's interval lies inside
the bound, refuted when every one lies outside it, holds in part when some do, else
inconclusive (an interval straddles the bound: noise decides nothing).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness.analysis.claims import Claim
from harness.analysis.fits import N_BOOT
from harness.analysis.frames import TIME_METRICS, aggregate, group_keys, group_label, iter_groups
from harness.analysis.powerfit import sample_medians
from harness.analysis.ratios import along_axis, points_needed, regions, too_few

__all__ = ["bound_groups", "point_intervals"]


def point_intervals(part: pd.DataFrame, metric: str, seed: int = 0) -> tuple[np.ndarray, ...]:
    """(estimates, lows, highs) of each aggregated point's ``metric``: the 95 % bootstrap
    interval of a timed metric's median (each holding its estimate), the estimate itself
    otherwise (or where a point lacks two samples)."""
    est = part["y"].to_numpy(float)
    power = TIME_METRICS.get(metric)
    rel = None
    if power is not None:
        rel = sample_medians(list(part["samples"]), N_BOOT, np.random.default_rng(seed))
    if rel is None:
        return est, est.copy(), est.copy()
    boot = est * rel**power  # (B, k): a rate moves as 1/time
    lo, hi = np.quantile(boot, [0.025, 0.975], axis=0)
    return est, np.minimum(lo, est), np.maximum(hi, est)


def bound_groups(rows: pd.DataFrame, claim: Claim) -> list[dict]:
    """Per group of the claim's ok rows (the point fields that vary besides ``over``): the
    points' values (geometric mean as ``measured``, the envelope of their intervals), the
    verdict along the axis and the per-point values in words."""
    keys = group_keys(rows, claim.over, claim.hold)
    groups = []
    for values, part in iter_groups(aggregate(rows, claim.over, claim.metric, keys), keys):
        est, lo, hi = point_intervals(part, claim.metric)
        k, need = len(part), claim.min_points or points_needed(claim)
        label = group_label(values)
        spans = regions(part["x"].to_numpy(float), est, lo, hi, claim.band)
        verdict, why = along_axis(spans, claim.over)
        per_point = " ".join(
            f"{x:g}:{v:.4g} [{a:.4g}, {b:.4g}]"
            for x, v, a, b in zip(part["x"], est, lo, hi, strict=True)
        )
        noise = (
            ""
            if TIME_METRICS.get(claim.metric) is not None and (hi > lo).any()
            else f" (no per-call samples of {claim.metric}: each point's value alone)"
        )
        groups.append(
            {
                "group": label,
                "n_points": k,
                "measured": float(np.exp(np.log(est).mean())),
                "ci_low": float(lo.min()),
                "ci_high": float(hi.max()),
                "unjudged": too_few(part, need, claim) if k < need else None,
                "short": k < need,
                "verdict": verdict,
                "why": why,
                "regions": [
                    {
                        "group": label,
                        "over": claim.over,
                        **{key: v for key, v in r.items() if key != "last"},
                    }
                    for r in spans
                ],
                "detail": f"; {claim.metric} per {claim.over}: {per_point}{noise}",
            }
        )
    return groups
