"""Result rows -> FLOP/s as a share of the device's measured matmul peak and of the roofline
(per-row table, % of peak against seq_len) and the roofline plot (achieved TFLOP/s against
arithmetic intensity under the roofs calibrated in env.json)."""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd

from harness.analysis import frames
from harness.measure import calibrate
from harness.render.draw import Panel, Series
from harness.render.panels import series_by
from harness.render.plots import Roofs, lines, roofline
from harness.scenarios.interface import cost_of, point_from_row


def flops(rows: pd.DataFrame, envs: dict[str, dict]) -> tuple[pd.DataFrame, list, list]:
    """% of the measured matmul peak and of the roofline, per row; figures vs seq_len; the
    roofline plot (intensity against FLOP/s under the calibrated roofs)."""
    ok = frames.select(rows, "tflops_per_s")
    recs = []
    for row in ok.to_dict("records"):
        cal = (envs.get(str(row.get("run_id"))) or {}).get("calibration")
        peak = calibrate.peak_for(cal, str(row.get("dtype", "float32")))
        if not peak:
            continue
        achieved = row["tflops_per_s"] * 1e12
        try:
            intensity = row["useful_flops"] / cost_of(point_from_row(row)).compulsory_bytes
        except Exception:  # a point the cost model cannot rebuild: leave the roofline out
            intensity = float("nan")
        roof = min(peak, intensity * cal.get("mem_bandwidth_bytes_per_s", float("inf")))
        recs.append(
            {
                **row,
                "pct_peak": 100 * achieved / peak,
                "pct_roofline": 100 * achieved / roof,
                "intensity": intensity,
                "_roof": (peak, cal.get("mem_bandwidth_bytes_per_s") or 0.0),
            }
        )
    if not recs:
        return pd.DataFrame(), [], []
    frame = pd.DataFrame(recs)
    table = (
        frame.groupby(["scenario", "impl"], sort=True)
        .agg(
            rows=("pct_peak", "size"),
            median_pct_peak=("pct_peak", "median"),
            max_pct_peak=("pct_peak", "max"),
            max_pct_roofline=("pct_roofline", "max"),
            median_flops_per_byte=("intensity", "median"),
        )
        .reset_index()
    )
    panels = []
    for scenario, part in frame.groupby("scenario", sort=True):
        if part["seq_len"].nunique() >= 2:
            keys = frames.group_keys(part, "seq_len")
            swept = [s for s in series_by(part, "pct_peak", keys) if len(s.x) >= 2]
            for s in swept:
                s.label = textwrap.shorten(s.label, 60, placeholder="...")
            panels.append(Panel(str(scenario), swept[:10]))
    images = (
        [("flops-pct-peak", lines(panels, "seq_len", "% of measured matmul peak"))]
        if panels
        else []
    )
    return table.drop(columns="_roof", errors="ignore"), images, roofline_figure(frame)


def roofline_figure(frame: pd.DataFrame) -> list:
    """Achieved TFLOP/s against arithmetic intensity per scenario and impl, under the roofs."""
    frame = frame[np.isfinite(frame["intensity"]) & (frame["intensity"] > 0)]
    roofs = [
        Roofs(peak, bw, f"roof {i + 1}: " if len(set(frame["_roof"])) > 1 else "roof: ")
        for i, (peak, bw) in enumerate(sorted(set(frame["_roof"])))
        if peak and bw
    ]
    if not len(frame) or not roofs:
        return []
    by = ["scenario", "impl"] if frame["scenario"].nunique() > 1 else ["impl"]
    series = [
        Series(
            " ".join(map(str, key if isinstance(key, tuple) else (key,))),
            part["intensity"],
            part["tflops_per_s"],
        )
        for key, part in frame.groupby(by, sort=True)
    ]
    return [("roofline", roofline(series[:20], roofs, "achieved TFLOP/s vs arithmetic intensity"))]
