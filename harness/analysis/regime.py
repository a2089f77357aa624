"""The device's regime: the analytic work of each row, how busy it kept the device, and where
along a swept axis that busyness is level.

A row's *work* comes from its scenario's cost model (``PointCost.work``,
:mod:`harness.scenarios.interface`): the FLOPs or compulsory bytes of what its metric times.
Its *utilization* is the achieved rate ``FLOPs / time`` as a fraction of a bound from the run's
calibration (env.json):

- ``roofline`` (default): ``min(peak, intensity x bandwidth)`` with ``intensity = FLOPs /
  compulsory bytes`` of the point: a memory-bound point is busy when it moves bytes at the
  measured bandwidth;
- ``peak``: the measured matmul peak for the row's dtype.

The CPU peak is measured with the run's thread count; a row timed with fewer threads is
compared with the peak scaled by ``row threads / calibration threads`` (compute scales with
cores). Rows without calibration get NaN: their regime is unknown, never assumed. A row above
100 % has *beaten its calibration* (the calibration ran slower than the row, e.g. under
contention): :func:`beaten` says so wherever utilization is shown.

**The plateau, per fitted series.** Time = work / achieved rate, so a time exponent is the work
exponent minus the exponent of the achieved rate. Where utilization is level along the axis,
the time exponent measures the algorithm; where it climbs (a device filling up, a
launch-bound kernel) or falls (data falling out of cache), it measures the device.
:func:`find_plateau` finds the largest contiguous region of the axis, its upper end included
and at least 3 points, where the fitted exponent of utilization is within ``±band`` and no
window of 3 or more of its points has an interval that excludes the band (so a rise followed
by a fall cannot average out to "level"). A window's points carry their own noise and the
scatter between neighbouring points that the candidate region shows beyond it
(:func:`point_scatter`): a point keeps whatever state it was measured in through all its
passes, so three close points of a flat series can lie on a slope their pass-to-pass errors
alone would call real. Leading points outside it are left out of the time fit, and the
verdict says how utilization moved there.

Every call into the cost model from the analysis and the report goes through this module
(:func:`row_costs`), so a new cost interface is re-pointed here once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness.analysis.fits import fit_exponent
from harness.analysis.powerfit import Fit, sample_medians
from harness.measure import calibrate
from harness.scenarios.interface import cost_of, point_from_row
from harness.schema import COLUMNS

RULES = ("roofline", "peak")
WORK_KINDS = ("flops", "bytes")
# a timed duration (a scenario's own timing among them) -> itself: its own clock; a rate of the
# timed call is judged by the call's time
TIMED = {c.name: c.name for c in COLUMNS if c.timed and c.kind == "seconds"}
COLUMNS = (
    "work",
    "work_flops",
    "intensity",
    "achieved_flops_per_s",
    "bound_flops_per_s",
    "utilization",
)
PLATEAU_MIN_POINTS = 3  # a level region needs a fitted exponent with an interval
PLATEAU_BOOT = 400  # bootstrap replicates per window of the plateau search
CHI2_1_MEDIAN = 0.4549  # the median of χ² with one degree of freedom (point_scatter)


# --- the cost model, called from here only -------------------------------------------------


def _time_column(metric: str) -> str:
    """The time that a metric's utilization is judged by (the metric itself when timed)."""
    return TIMED.get(metric, "time_median_s")


def row_costs(row: dict, metric: str, kind: str = "flops") -> tuple[float, float, float]:
    """(work behind ``metric``, FLOPs of the timed call, compulsory bytes of the timed call)
    for one result row; NaN where the cost model cannot rebuild the row's point.

    The FLOPs of ``time_median_s``'s call are the row's own ``executed_flops`` where it has
    them: the cost model asked where the kernel ran, at the block sizes its autotuner chose
    there (this process may not know them: a GPU row judged on a CPU)."""
    nan = float("nan")
    try:
        cost = cost_of(point_from_row(row))
        timed = _time_column(metric)
        flops = _recorded_flops(row) if timed == "time_median_s" else None
        flops = cost.work(timed, "flops") if flops is None else flops
        work = flops if kind == "flops" and metric in _CALL_METRICS else cost.work(metric, kind)
        nbytes = cost.work(timed, "bytes")
    except Exception:  # a row the cost model cannot rebuild (old schema, unknown impl): unknown
        return nan, nan, nan
    return work, flops, nbytes


_CALL_METRICS = ("time_median_s", "tokens_per_s", "tflops_per_s")  # their work: the call's FLOPs


def _recorded_flops(row: dict) -> float | None:
    """The row's ``executed_flops`` (positive and finite), or None."""
    value = row.get("executed_flops")
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if number and np.isfinite(value) and value > 0 else None


# --- utilization per row -------------------------------------------------------------------


def _bound(row: dict, env: dict | None, intensity: float, rule: str) -> float:
    """FLOP/s the row is compared against (NaN without calibration)."""
    cal = (env or {}).get("calibration")
    peak = calibrate.peak_for(cal, str(row.get("dtype") or "float32"))
    if not peak:
        return float("nan")
    cal_threads, threads = cal.get("threads"), row.get("threads")
    if cal_threads and isinstance(threads, int | float) and np.isfinite(threads) and threads > 0:
        peak *= min(1.0, float(threads) / float(cal_threads))
    if rule == "peak":
        return float(peak)
    bandwidth = cal.get("mem_bandwidth_bytes_per_s") or float("inf")
    return float(min(peak, intensity * bandwidth)) if np.isfinite(intensity) else float(peak)


def attach(
    df: pd.DataFrame,
    envs: dict[str, dict] | None,
    metric: str,
    *,
    work: str = "flops",
    rule: str = "roofline",
) -> pd.DataFrame:
    """``df`` plus :data:`COLUMNS`: ``work`` (analytic work behind ``metric``), ``work_flops``
    (FLOPs of the timed call), ``intensity`` (those FLOPs per compulsory byte), the achieved
    and bound FLOP/s and ``utilization`` = achieved / bound (NaN if unknown). ``envs`` maps
    run_id to its env.json."""
    out = df.copy()
    values = {c: [] for c in COLUMNS}
    timed = _time_column(metric)
    times = pd.to_numeric(df[timed], errors="coerce") if timed in df else pd.Series(
        np.nan, index=df.index)
    for row, t in zip(df.to_dict("records"), times.to_numpy(float, na_value=np.nan), strict=True):
        w, flops, nbytes = row_costs(row, metric, work)
        ok = row.get("status", "ok") == "ok" and np.isfinite(t) and t > 0
        achieved = flops / t if ok else float("nan")
        with np.errstate(all="ignore"):
            intensity = flops / nbytes if nbytes else float("nan")
        env = (envs or {}).get(str(row.get("run_id")))
        bound = _bound(row, env, intensity, rule)
        values["work"].append(w)
        values["work_flops"].append(flops)
        values["intensity"].append(intensity)
        values["achieved_flops_per_s"].append(achieved)
        values["bound_flops_per_s"].append(bound)
        values["utilization"].append(achieved / bound if bound and np.isfinite(bound) else np.nan)
    for col, vals in values.items():
        out[col] = np.asarray(vals, float) if len(vals) else pd.Series(dtype=float)
    return out


def util_range(util) -> tuple[float | None, float | None]:
    """(min, max) of the finite utilizations, or (None, None)."""
    u = pd.to_numeric(pd.Series(util, dtype=float), errors="coerce")
    u = u[np.isfinite(u)]
    return (float(u.min()), float(u.max())) if len(u) else (None, None)


def beaten(high: float | None) -> bool:
    """Has a row beaten its calibration (utilization above 100 %)?"""
    return high is not None and np.isfinite(high) and high > 1.0


# --- where utilization is level along an axis ----------------------------------------------


@dataclass(frozen=True)
class Plateau:
    """Where a series' utilization is level along the axis (:func:`find_plateau`).

    ``start``: index, into the x-sorted points, of the level region's first point (it runs to
    the last point); None when no region is level. ``exponent``/``ci_low``/``ci_high``: the
    utilization exponent over that region, or over every point when there is none.
    ``lead_exponent``: over the left-out leading points and the region's first point (how
    utilization moved before it levelled off); None when nothing was left out."""

    start: int | None
    exponent: float
    ci_low: float
    ci_high: float
    lead_exponent: float | None = None

    @property
    def found(self) -> bool:
        return self.start is not None


def point_scatter(x: np.ndarray, y: np.ndarray, sigma: np.ndarray | None = None) -> float:
    """τ², the variance of log ``y`` between neighbouring points beyond their own errors
    (``sigma``: per point, the standard error of log y; None: 0). Each inner point's distance
    from the line through its two neighbours in log-log, over the factor a shared τ² gives it,
    is taken as a normal draw: the median of their squares over 0.455 (the median of χ² with
    one degree of freedom) estimates that variance, less the points' own share; 0 when they
    scatter no more than their errors say. A median, so a knee or a peak (one or two large
    distances where the trend bends) does not count as scatter: it is the wobble of points
    about the trend. x sorted, positive; fewer than 3 points: 0."""
    if len(x) < 3:
        return 0.0
    lx, ly = np.log(np.asarray(x, float)), np.log(np.asarray(y, float))
    s2 = np.zeros(len(lx)) if sigma is None else np.nan_to_num(np.asarray(sigma, float) ** 2)
    w = (lx[1:-1] - lx[:-2]) / (lx[2:] - lx[:-2])
    gap = ly[1:-1] - ((1 - w) * ly[:-2] + w * ly[2:])
    shared = 1 + (1 - w) ** 2 + w**2
    own = (s2[1:-1] + (1 - w) ** 2 * s2[:-2] + w**2 * s2[2:]) / shared
    return float(max(0.0, np.median(gap**2 / shared) / CHI2_1_MEDIAN - np.median(own)))


def find_plateau(
    x: Sequence[float],
    util: Sequence[float],
    samples: Sequence | None = None,
    *,
    sigma: Sequence[float] | None = None,
    band: float = 0.15,
    floor: float = 0.0,
    min_points: int = PLATEAU_MIN_POINTS,
) -> Plateau:
    """The largest level region of ``util`` (positive, finite) along ``x``; see the module
    docstring. ``samples``: per point, the raw per-call *times* behind it (utilization goes as
    1/time); ``sigma``: per point, the standard error of log time when there are no samples.
    ``floor``: every point of the region must be at or above it (the claim's saturation)."""
    order = np.argsort(np.asarray(x, float))
    xs, us = np.asarray(x, float)[order], np.asarray(util, float)[order]
    sig = None if sigma is None else np.asarray(sigma, float)[order]
    if samples is not None:  # each point's noise once (not once per window): σ of log time
        ratios = sample_medians([samples[i] for i in order], PLATEAU_BOOT,
                                np.random.default_rng(0))
        sig = sig if ratios is None else np.log(ratios).std(axis=0)
    known = sig is not None and bool(np.isfinite(sig).all())
    k = len(xs)
    fits: dict[tuple[int, int, int], Fit] = {}
    scatter: dict[int, float] = {}  # candidate region start -> its τ², once

    def window(i: int, j: int, s: int = 0) -> Fit:
        """The utilization exponent over points i..j-1, each point's error joined by the
        scatter between neighbours over the candidate region s.. (docstring)."""
        if (i, j, s) not in fits:
            if s not in scatter:
                scatter[s] = point_scatter(xs[s:], us[s:], sig[s:] if known else None)
            err = sig[i:j] if known else None
            if scatter[s] > 0:
                err = np.sqrt((err**2 if err is not None else np.zeros(j - i)) + scatter[s])
            fits[(i, j, s)] = fit_exponent(xs[i:j], us[i:j], sigma=err, model="power",
                                           min_points=2, n_boot=PLATEAU_BOOT, whole=True)
        return fits[(i, j, s)]

    def level(f: Fit) -> bool:
        return f.ok and abs(f.exponent) <= band and f.ci_low <= band and f.ci_high >= -band

    def excludes(f: Fit) -> bool:  # an interval wholly outside the band: not level there
        return f.ok and (f.ci_low > band or f.ci_high < -band)

    above = us >= floor
    first = k - int(np.argmin(above[::-1])) if not above.all() else 0  # all of [first, k) >= floor
    for s in range(first, k - min_points + 1):
        if not level(window(s, k, s)):
            continue
        inner = [(i, j) for i in range(s, k) for j in range(i + min_points, k + 1)]
        if any(excludes(window(i, j, s)) for i, j in inner if (i, j) != (s, k)):
            continue
        region = window(s, k, s)
        lead = window(0, s + 1).exponent if s else None
        return Plateau(s, region.exponent, region.ci_low, region.ci_high, lead)
    if k < 2:
        return Plateau(None, float("nan"), float("nan"), float("nan"))
    every = window(0, k)
    return Plateau(None, every.exponent, every.ci_low, every.ci_high)
