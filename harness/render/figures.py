"""Result rows -> the report's figures (PNG bytes, via :mod:`harness.render.plots`) and the tables
beside them: scaling fits and log-log plots, throughput heat maps, per-layer mixer costs with
crossovers, agreement errors. (FLOP/s against the peak and the roofline:
:mod:`harness.render.figures_roofline`.)"""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd

from harness import fmt
from harness.analysis import fits, frames, powerfit
from harness.analysis.ratios import crossing, crossovers
from harness.cost.components import flop_crossover
from harness.render.draw import Panel, Series
from harness.render.panels import (
    LABEL_DIGITS,
    claimed_exponent,
    in_units,
    model_for,
    series_by,
    split_keys,
    with_band,
)
from harness.render.plots import heatmaps, lines, loglog_panels

OVERS = ("d_model", "heads", "window", "conv_kernel")
# what each other-variable plot holds fixed: heads at fixed d_model, d_model at fixed heads
HOLD = {"heads": ("d_model",), "d_model": ("heads",)}


def _split(frame: pd.DataFrame, keys: list[str]):
    """(values, part) per combination of ``keys`` (None/NaN grouped as "-"); one group if none."""
    if not keys:
        yield {}, frame
        return
    for values, part in frame.assign(**frames.groupable(frame[keys])).groupby(keys, sort=True):
        yield dict(zip(keys, values if isinstance(values, tuple) else (values,), strict=True)), part


def _label(values: dict, width: int = 70) -> str:
    """Readable group label: derived duplicates dropped (head_dim beside heads and d_model,
    window sides beside the window), wrapped to ``width`` characters."""
    shown = dict(values)
    if {"heads", "d_model"} <= set(shown):
        shown.pop("head_dim", None)
    if "window" in shown:
        shown.pop("window_left", None), shown.pop("window_right", None)
    text = ", ".join(f"{k}={_num(v)}" for k, v in shown.items()) or "all rows"
    return textwrap.fill(text, width)


def _num(value) -> str:
    """A number in a label or the fits table (as "%g" writes it)."""
    return fmt.number(value, LABEL_DIGITS)


def fit_panels(
    df: pd.DataFrame, over: str, metric: str, hold: tuple[str, ...] = ()
) -> tuple[list[Panel], list[dict]]:
    """Panels (one per combination of the fields several impls vary) with a series per impl
    (and impl-specific variant), its fit and claimed slope, plus one fits-table record each."""
    ok = frames.select(frames.with_derived(df), metric)
    if not len(ok) or ok[over].nunique() < 2:
        return [], []
    keys = frames.group_keys(ok, over, hold)
    agg = with_band(ok, frames.aggregate(ok, over, metric, keys), over, metric, keys)
    panel_keys, series_keys = split_keys(agg, keys)
    varies = agg.groupby("impl")[series_keys].nunique() if series_keys else pd.DataFrame()
    owner = {k: str(varies[k].idxmax()) for k in series_keys}
    power = frames.TIME_METRICS.get(metric)
    scenario = str(ok["scenario"].iloc[0])
    panels, records = [], []
    for values, part in frames.iter_groups(agg, panel_keys):
        panel = Panel(_label(values))
        for extra, s in frames.iter_groups(part, ["impl", *series_keys]):
            if len(s) < 2:
                continue
            impl = str(extra.pop("impl"))
            samples = list(s["samples"]) if power is not None else None
            fit = fits.fit_exponent(
                s["x"], s["y"], samples, sample_power=power or 1.0, model=model_for(metric)
            )
            claimed = claimed_exponent(impl, metric, over, scenario)
            own = {k: v for k, v in extra.items() if owner.get(k) == impl}  # its variant axes
            name = f"{impl} {_label(own)}" if own else impl
            band = (list(s["low"]), list(s["high"])) if "low" in s else (None, None)
            panel.series.append(Series(name, s["x"], s["y"], fit.as_dict(), claimed, *band))
            slopes = " ".join(fmt.fixed(v, 2) for v in powerfit.local_slopes_xy(s["x"], s["y"]))
            records.append(
                {
                    "impl": impl,
                    "group": _label({**values, **extra}, width=1000),
                    "metric": metric,
                    "over": over,
                    "model": fit.model,
                    "exponent": fit.exponent,
                    "ci_low": fit.ci_low,
                    "ci_high": fit.ci_high,
                    "claimed": claimed,
                    "region": f"{_num(fit.x_lo)}..{_num(fit.x_hi)}",
                    "n_points": f"{fit.n_points}/{fit.n_total}",
                    "local_slopes": slopes,
                }
            )
        if panel.series:
            panels.append(panel)
    return panels, records


def scaling(rows: pd.DataFrame) -> tuple[pd.DataFrame, list, list, list]:
    """Fits table plus time-vs-n, memory-vs-n and other-variable figures, per scenario."""
    records, time_imgs, mem_imgs, other_imgs = [], [], [], []
    for scenario, part in rows.groupby("scenario", sort=True):
        for metric, bucket in (("time_median_s", time_imgs), ("peak_mem_bytes", mem_imgs)):
            panels, recs = fit_panels(part, "seq_len", metric)
            records += [{"scenario": scenario, **r} for r in recs]
            if panels:
                panels, ylabel = in_units(panels, metric)
                bucket.append(
                    (
                        f"{metric}-vs-seq_len-{scenario}",
                        loglog_panels(panels, "seq_len", ylabel, f"{scenario}: {ylabel}"),
                    )
                )
        for over in OVERS:
            if over not in part.columns and over != "window":
                continue
            panels, recs = fit_panels(part, over, "time_median_s", HOLD.get(over, ()))
            records += [{"scenario": scenario, **r} for r in recs]
            if panels:
                panels, ylabel = in_units(panels, "time_median_s")
                other_imgs.append(
                    (
                        f"time-vs-{over}-{scenario}",
                        loglog_panels(panels, over, ylabel, f"{scenario}: time vs {over}"),
                    )
                )
    return pd.DataFrame(records), time_imgs, mem_imgs, other_imgs


def heat(rows: pd.DataFrame) -> tuple[pd.DataFrame, list]:
    """tokens/s heat maps over heads x d_model, one per impl and other varying fields."""
    ok = frames.select(rows, "tokens_per_s")
    if not len(ok) or ok["heads"].nunique() < 2 or ok["d_model"].nunique() < 2:
        return pd.DataFrame(), []
    maps, tables = [], []
    for scenario, srows in ok.groupby("scenario", sort=True):
        keys = frames.group_keys(srows, "heads", covary=("head_dim", "d_model", "point_id"))
        for values, part in _split(srows, keys):
            title = _label({"scenario": scenario, **values}, width=48)
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


def layers(rows: pd.DataFrame) -> tuple[pd.DataFrame, list]:
    """Mixer time vs n per d_model (attention, LSTM, conv) with FLOP and measured crossovers."""
    ok = frames.select(rows, "mixer_time_s")
    if not len(ok) or not ok["mixer"].isin(["lstm", "conv"]).any():
        return pd.DataFrame(), []
    table, panels = [], []
    for impl in sorted(ok.loc[ok["mixer"] == "attention", "impl"].unique()):
        for base in ("lstm", "conv"):
            found = crossovers(
                ok, impl, base, metric="mixer_time_s", over="seq_len", relative_to="d_model",
                expect_min=1.0,
            )
            for g in found:
                table.append(
                    {
                        "attention": impl,
                        "baseline": base,
                        "group": g["group"],
                        "crossover_n_over_d": g["measured"],
                        "ci_low": g["ci_low"],
                        "ci_high": g["ci_high"],
                        "cheaper_below_d": g["verdict"],
                        "detail": g["reason"],
                    }
                )
    skip = ("impl", "conv_kernel", "mixer")
    keys = [k for k in frames.group_keys(ok, "seq_len") if k not in skip]
    for values, part in _split(ok, keys):
        d = float(part["d_model"].iloc[0])
        agg = frames.aggregate(part, "seq_len", "mixer_time_s", ["impl", "conv_kernel"])
        series = [
            Series(f"conv k={k}" if impl == "conv" else str(impl), s["x"], s["y"])
            for (impl, k), s in agg.groupby(["impl", "conv_kernel"], sort=True)
            if impl == "conv" or k == part.loc[part["impl"] == impl, "conv_kernel"].min()
        ]
        vlines = [(d, "n = d"), (flop_crossover(int(d), "lstm"), "FLOPs: 4d (LSTM)")]
        att = [s for s in series if not s.label.startswith(("lstm", "conv"))]
        lstm = [s for s in series if s.label.startswith("lstm")]
        if att and lstm:
            a = pd.Series(list(att[0].y), index=list(att[0].x))
            b = pd.Series(list(lstm[0].y), index=list(lstm[0].x))
            both = a.index.intersection(b.index).sort_values()
            if len(both) >= 2:
                lr = np.log(a[both].to_numpy() / b[both].to_numpy())
                (lo,), (hi,) = crossing(both.to_numpy(float), lr)
                if lo == hi:  # an interior crossing, not a censored bound
                    vlines.append((float(lo), "measured"))
        panels.append(Panel(_label(values), series, vlines))
    panels, ylabel = in_units(panels, "mixer_time_s")
    image = loglog_panels(panels, "seq_len", ylabel, "per-layer cost")
    return pd.DataFrame(table), [("layers-mixer-time", image)]


def agreement(rows: pd.DataFrame) -> list:
    """Max abs and relative error vs seq_len per scenario (one figure per scenario)."""
    images = []
    for scenario, part in rows.groupby("scenario", sort=True):
        part = part[part["status"].isin(["ok", "mismatch"])] if "status" in part else part
        if "max_abs_err" not in part or part["seq_len"].nunique() < 2:
            continue
        panels = []
        for metric in ("max_abs_err", "rel_err"):
            sub = part[pd.to_numeric(part[metric], errors="coerce") > 0]
            if len(sub):
                keys = frames.group_keys(sub.assign(status="ok"), "seq_len")
                panels.append(
                    Panel(
                        f"{scenario}: {metric}",
                        series_by(sub.assign(status="ok"), metric, keys)[:10],
                    )
                )
        if panels:
            images.append(
                (f"agreement-{scenario}", lines(panels, "seq_len", "error vs float64", log_y=True))
            )
    return images
