"""How well the device is used: result rows -> the report's efficiency figures (PNG bytes via
:mod:`harness.render.plots`) and the tables beside them: speedup against a baseline
implementation, absolute TFLOP/s against n, throughput heat maps over heads x d_model, FLOP/s as
a share of the measured peak and of the roofline, and the roofline plot. Utilization is
:func:`harness.analysis.regime.attach`'s, the same number the verdicts quote; a row above 100 %
has beaten its calibration, and the figures, tables and notes say so.
(How each cost grows: :mod:`harness.render.scaling`.)"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness import fmt
from harness.analysis import frames, regime
from harness.render import pivot
from harness.render.panels import group_title, series_by, series_over_n, split_rows
from harness.render.plots import BEATEN, Panel, Roofs, Series, heatmaps, lines, roofline

BASELINE_PREFERENCE = ("sdpa", "sdpa-flash", "full")  # the default speedup yardstick


def pick_baseline(rows: pd.DataFrame, asked: str | None) -> str | None:
    """``asked`` when given; else the first preferred implementation with ok rows."""
    if asked:
        return asked
    ok = set(rows.loc[rows["status"].eq("ok"), "impl"]) if len(rows) else set()
    return next((b for b in BASELINE_PREFERENCE if b in ok), None)


def _x_split(lay: pivot.Layout) -> tuple[list[str], str | None]:
    """(panel axes, x axis): seq_len is the x axis when it varies."""
    if "seq_len" in lay.rows:
        return [r for r in lay.rows if r != "seq_len"], "seq_len"
    return lay.rows, None


def speedup(rows: pd.DataFrame, baseline: str) -> tuple[pd.DataFrame, list]:
    """Baseline time / each implementation's time per point shape, per scenario: a table
    (with a conservative interval from the two time CIs) and speedup-vs-n panels."""
    tables, panels = [], []
    for scenario, part in rows.groupby("scenario", sort=True):
        part = part.reset_index(drop=True)
        if baseline not in set(part.loc[part["status"].eq("ok"), "impl"]):
            continue
        lay = pivot.layout(part)
        med = pivot.time_pivot(part, lay, "time_median_s")
        if med is None or baseline not in med.columns or med.shape[1] < 2:
            continue
        low = pivot.time_pivot(part, lay, "time_ci_low_s")
        high = pivot.time_pivot(part, lay, "time_ci_high_s")
        order = [c for c in lay.shown if c in med.columns]  # the suite's order, not a-z
        med, low, high = (t if t is None else t.reindex(columns=order) for t in (med, low, high))
        ratio = med.rdiv(med[baseline], axis=0).drop(columns=baseline)
        long = ratio.stack().rename("speedup").reset_index().drop(columns="_all", errors="ignore")
        if low is not None and high is not None:
            lo = (1 / high).mul(low[baseline], axis=0).drop(columns=baseline)
            hi = (1 / low).mul(high[baseline], axis=0).drop(columns=baseline)
            long["ci_low"] = lo.stack().reindex(ratio.stack().index).to_numpy()
            long["ci_high"] = hi.stack().reindex(ratio.stack().index).to_numpy()
        tables.append(long.assign(scenario=scenario, baseline=baseline))
        panel_axes, x = _x_split(lay)
        if x is None:
            continue
        for values, sub in _by(long, panel_axes):
            title = ", ".join([str(scenario), *(f"{k}={v}" for k, v in values.items())])
            series = []
            for impl, s in sub.groupby("impl", sort=False):
                s = s.assign(x=pd.to_numeric(s[x])).dropna(subset=["speedup"]).sort_values("x")
                if len(s) >= 1:
                    ci = (s["ci_low"], s["ci_high"]) if "ci_low" in s else (None, None)
                    series.append(Series(str(impl), s["x"], s["speedup"], None, None, *ci))
            if series:
                panels.append(Panel(title, series[:10]))
    frame = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    if len(frame):
        front = ["scenario", "impl", "baseline"]
        frame = frame[front + [c for c in frame.columns if c not in front]]
        # the suite's implementation order, then each axis in numeric order (256 before 1024)
        rank = {impl: i for i, impl in enumerate(dict.fromkeys(rows["impl"].astype(str)))}
        axes = [c for c in frame.columns if c not in (*front, "speedup", "ci_low", "ci_high")]
        frame = frame.assign(_rank=frame["impl"].map(rank)).sort_values(
            ["scenario", "_rank", *axes], key=lambda c: c if c.name == "_rank" else
            pivot.sort_key(c), kind="stable").drop(columns="_rank").reset_index(drop=True)
    images = []
    if panels:
        ylabel = f"speedup vs {baseline} (x)"
        images.append(
            ("speedup", lines(panels, "seq_len", ylabel, log_y=True, hline=(1, baseline)))
        )
    return frame, images


def speedup_by_point(long: pd.DataFrame) -> pd.DataFrame:
    """The speedup table as a reader scans it: one line per point (the axes in numeric order),
    one column per implementation, each cell ``1.03 [0.89, 1.06]`` (the speedup and its
    interval); :func:`speedup`'s long table is the CSV."""
    if not len(long):
        return long
    axes = [c for c in long.columns
            if c not in ("impl", "speedup", "ci_low", "ci_high", "baseline")]
    cells = long.assign(cell=[
        f"{fmt.number(s, 3)} [{fmt.number(lo, 3)}, {fmt.number(hi, 3)}]"
        if "ci_low" in long else fmt.number(s, 3)
        for s, lo, hi in zip(long["speedup"], long.get("ci_low", long["speedup"]),
                             long.get("ci_high", long["speedup"]), strict=True)])
    order = list(dict.fromkeys(long["impl"]))
    wide = cells.pivot_table(index=axes, columns="impl", values="cell", aggfunc="first",
                             sort=False)
    wide = wide.sort_index(key=lambda level: pd.Index(
        pivot.sort_key(pd.Series(list(level))).to_numpy()))
    wide = wide[[c for c in order if c in wide.columns]]
    return wide.reset_index().rename_axis(columns=None)


def _by(frame: pd.DataFrame, keys: list[str]):
    if not keys:
        yield {}, frame
        return
    for values, part in frame.groupby(keys, sort=True):
        values = values if isinstance(values, tuple) else (values,)
        yield dict(zip(keys, values, strict=True)), part


def throughput(rows: pd.DataFrame) -> list:
    """Absolute useful TFLOP/s against seq_len, a panel per scenario (error bars from the time's
    95 % CI)."""
    ok = frames.select(rows, "tflops_per_s")
    panels = []
    for scenario, part in ok.groupby("scenario", sort=True):
        if part["seq_len"].nunique() < 2:
            continue
        keys = frames.group_keys(part, "seq_len")
        series = series_over_n(part, "tflops_per_s", keys)
        if series:
            panels.append(Panel(str(scenario), series[:10]))
    if not panels:
        return []
    return [("tflops-vs-seq_len", lines(panels, "seq_len", "useful TFLOP/s", log_y=True))]


def heat(rows: pd.DataFrame) -> tuple[pd.DataFrame, list]:
    """tokens/s heat maps over heads x d_model, one per impl and other varying fields."""
    ok = frames.select(rows, "tokens_per_s")
    if not len(ok) or ok["heads"].nunique() < 2 or ok["d_model"].nunique() < 2:
        return pd.DataFrame(), []
    maps, tables = [], []
    for scenario, srows in ok.groupby("scenario", sort=True):
        keys = frames.group_keys(srows, "heads", covary=("head_dim", "d_model", "point_id"))
        for values, part in split_rows(srows, keys):
            title = group_title({"scenario": scenario, **values}, width=48)
            table = part.pivot_table(
                index="heads", columns="d_model", values="tokens_per_s", aggfunc="median"
            )
            # only complete grids: runs of unrelated suites leave holes, not heat maps
            if table.shape[0] >= 2 and table.shape[1] >= 2 and table.notna().all().all():
                maps.append((title, table))
                tables.append(
                    table.stack().rename("tokens_per_s").reset_index().assign(group=title)
                )
    if not maps:
        return pd.DataFrame(), []
    return pd.concat(tables, ignore_index=True), [
        ("throughput-heads-x-d_model", heatmaps(maps, "tokens/s"))
    ]


def utilization_rows(rows: pd.DataFrame, envs: dict[str, dict]) -> pd.DataFrame:
    """The ok timed rows with a calibration, with ``pct_peak`` and ``pct_roofline`` (FLOP/s of
    the timed call against the thread-scaled matmul peak, and against the roofline: the
    verdicts' utilization) and ``intensity`` (FLOPs per compulsory byte)."""
    ok = frames.select(rows, "time_median_s")
    if not len(ok):
        return ok
    peak = regime.attach(ok, envs, "time_median_s", rule="peak")
    roof = regime.attach(ok, envs, "time_median_s", rule="roofline")
    bandwidth = [
        ((envs.get(str(run)) or {}).get("calibration") or {}).get("mem_bandwidth_bytes_per_s")
        for run in ok.get("run_id", pd.Series(None, index=ok.index))
    ]
    out = peak.assign(
        pct_peak=100 * peak["utilization"],
        pct_roofline=100 * roof["utilization"],
        peak_flops_per_s=peak["bound_flops_per_s"],
        bandwidth=pd.to_numeric(pd.Series(bandwidth, index=ok.index), errors="coerce"),
    )
    return out[np.isfinite(out["pct_peak"])]


def beaten_notes(frame: pd.DataFrame) -> list[str]:
    """One line per (run, implementation) with a row above 100 % of its calibrated bound."""
    notes = []
    over = frame[frame["pct_roofline"] > 100]
    for (run, impl), part in over.groupby(["run_id", "impl"], sort=True):
        top = part.loc[part["pct_roofline"].idxmax()]
        notes.append(
            f"calibration beaten: {impl} reaches {top['pct_roofline']:.0f}% of the roofline "
            f"({top['pct_peak']:.0f}% of the peak) in run {run} at seq_len "
            f"{fmt.number(top['seq_len'], 6)}: the run's calibration measured less than this "
            "row achieved (it likely ran under contention); % of peak and utilization from it "
            "are too high, so re-run on an idle machine before trusting them"
        )
    return notes


def flops(rows: pd.DataFrame, envs: dict[str, dict]) -> tuple[pd.DataFrame, list, list, list]:
    """% of the measured matmul peak and of the roofline: a table per (scenario, impl), the
    %-of-peak figure against seq_len (a dashed line at 100 %, a title note where a row beats
    its calibration), the roofline plot and the beaten-calibration notes."""
    frame = utilization_rows(rows, envs)
    if not len(frame):
        return pd.DataFrame(), [], [], []
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
    table["calibration"] = np.where(table["max_pct_roofline"] > 100, "beaten", "")
    panels = []
    for scenario, part in frame.groupby("scenario", sort=True):
        if part["seq_len"].nunique() >= 2:
            keys = frames.group_keys(part, "seq_len")
            swept = series_by(part, "pct_peak", keys, min_points=2)
            top = float(part["pct_peak"].max())
            title = str(scenario) + (f"\n{BEATEN}: up to {top:.0f}% of the peak" if top > 100
                                     else "")
            guide = Series("calibrated peak (100%)", sorted(set(part["seq_len"])),
                           [100.0] * part["seq_len"].nunique())
            panels.append(Panel(title, swept[:10], guides=[guide]))
    images = (
        [("flops-pct-peak", lines(panels, "seq_len", "% of measured matmul peak"))]
        if panels
        else []
    )
    return table, images, roofline_figure(frame), beaten_notes(frame)


def roofline_figure(frame: pd.DataFrame) -> list:
    """Achieved TFLOP/s against arithmetic intensity per scenario and impl, under the roofs."""
    frame = frame[np.isfinite(frame["intensity"]) & (frame["intensity"] > 0)]
    cals = {
        (float(p), float(b))
        for p, b in zip(frame["peak_flops_per_s"], frame["bandwidth"], strict=True)
        if np.isfinite(p) and np.isfinite(b) and p > 0 and b > 0
    }
    roofs = [
        Roofs(peak, bw, f"roof {i + 1}: " if len(cals) > 1 else "roof: ")
        for i, (peak, bw) in enumerate(sorted(cals))
    ]
    if not len(frame) or not roofs:
        return []
    by = ["scenario", "impl"] if frame["scenario"].nunique() > 1 else ["impl"]
    series = [
        Series(
            " ".join(map(str, key if isinstance(key, tuple) else (key,))),
            part["intensity"],
            part["achieved_flops_per_s"] / 1e12,
        )
        for key, part in frame.groupby(by, sort=True)
    ]
    return [("roofline", roofline(series[:20], roofs, "achieved TFLOP/s vs arithmetic intensity"))]
