"""The regime of each row: the analytic work it did and how busy it kept the device.

A row's *work* comes from its scenario's cost model (``PointCost.work``,
:mod:`harness.scenarios.interface`): the FLOPs or compulsory bytes of what its metric times.
Its *utilization* is the achieved rate ``FLOPs / time`` as a fraction of a bound from the run's
calibration (env.json):

- ``roofline`` (default): ``min(peak, intensity x bandwidth)`` with ``intensity = FLOPs /
  compulsory bytes`` of the point: a memory-bound point is saturated when it moves bytes at
  the measured bandwidth;
- ``peak``: the measured matmul peak for the row's dtype.

The CPU peak is measured with the run's thread count; a row timed with fewer threads is
compared with the peak scaled by ``row threads / calibration threads`` (compute scales with
cores). Rows without calibration get NaN: their regime is unknown, never assumed.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness.measure import calibrate
from harness.scenarios.interface import cost_of, point_from_row

RULES = ("roofline", "peak")
WORK_KINDS = ("flops", "bytes")
TIMED = {"time_median_s": "time_median_s", "mixer_time_s": "mixer_time_s"}
COLUMNS = ("work", "work_flops", "achieved_flops_per_s", "bound_flops_per_s", "utilization")


def _time_column(metric: str) -> str:
    """The time that a metric's utilization is judged by (the metric itself when timed)."""
    return TIMED.get(metric, "time_median_s")


def _row_costs(row: dict, metric: str, kind: str) -> tuple[float, float, float]:
    """(work for the metric, FLOPs of the timed call, compulsory bytes); NaN when unknown."""
    nan = float("nan")
    try:
        cost = cost_of(point_from_row(row))
        timed = _time_column(metric)
        work = cost.work(metric, kind)
        flops = cost.work(timed, "flops")
        nbytes = cost.work(timed, "bytes")
    except Exception:  # a row the cost model cannot rebuild (old schema, unknown impl): unknown
        return nan, nan, nan
    return work, flops, nbytes


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
    """``df`` plus :data:`COLUMNS`: ``work`` (analytic work behind ``metric``), ``work_flops``,
    the achieved and bound FLOP/s and ``utilization`` = achieved / bound (NaN if unknown).
    ``envs`` maps run_id to its env.json."""
    out = df.copy()
    values = {c: [] for c in COLUMNS}
    timed = _time_column(metric)
    for row in df.to_dict("records"):
        w, flops, nbytes = _row_costs(row, metric, work)
        t = pd.to_numeric(pd.Series([row.get(timed)]), errors="coerce").iloc[0]
        ok = row.get("status", "ok") == "ok" and np.isfinite(t) and t > 0
        achieved = flops / t if ok else float("nan")
        with np.errstate(all="ignore"):
            intensity = flops / nbytes if nbytes else float("nan")
        env = (envs or {}).get(str(row.get("run_id")))
        bound = _bound(row, env, intensity, rule)
        values["work"].append(w)
        values["work_flops"].append(flops)
        values["achieved_flops_per_s"].append(achieved)
        values["bound_flops_per_s"].append(bound)
        values["utilization"].append(achieved / bound if bound and np.isfinite(bound) else np.nan)
    for col, vals in values.items():
        out[col] = np.asarray(vals, float) if len(vals) else pd.Series(dtype=float)
    return out


def util_range(util: pd.Series) -> tuple[float | None, float | None]:
    """(min, max) of the finite utilizations, or (None, None)."""
    u = pd.to_numeric(util, errors="coerce")
    u = u[np.isfinite(u)]
    return (float(u.min()), float(u.max())) if len(u) else (None, None)
