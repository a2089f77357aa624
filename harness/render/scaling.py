"""How each cost grows: result rows -> the report's scaling figures (PNG bytes, via
:mod:`harness.render.plots`) and the tables beside them: the exponent fits table, time and
peak memory against n (log-log, fitted and claimed slopes), time against the other swept
variables, forward and backward side by side, and per-layer mixer costs with their crossovers.
(How well the device is used: :mod:`harness.render.efficiency`.)"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness import fmt
from harness.analysis import fits, frames, powerfit, regime
from harness.analysis.ratios import crossing
from harness.analysis.verdicts import crossovers
from harness.render.panels import (
    LABEL_DIGITS,
    claimed_exponent,
    group_title,
    in_units,
    model_for,
    series_over_n,
    split_keys,
    split_rows,
    with_interval,
)
from harness.render.plots import Panel, Series, lines, loglog_panels
from harness.scenarios import interface

OVERS = ("d_model", "heads", "window", "conv_kernel", "document_len")
# what each other-variable plot holds fixed: heads at fixed d_model, d_model at fixed heads
HOLD = {"heads": ("d_model",), "d_model": ("heads",)}


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
    agg = with_interval(ok, frames.aggregate(ok, over, metric, keys), over, metric, keys)
    panel_keys, series_keys = split_keys(agg, keys)
    varies = agg.groupby("impl")[series_keys].nunique() if series_keys else pd.DataFrame()
    owner = {k: str(varies[k].idxmax()) for k in series_keys}
    power = frames.TIME_METRICS.get(metric)
    scenario = str(ok["scenario"].iloc[0])
    panels, records = [], []
    for values, part in frames.iter_groups(agg, panel_keys):
        panel = Panel(group_title(values))
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
            name = f"{impl} {group_title(own)}" if own else impl
            ci = (list(s["low"]), list(s["high"])) if "low" in s else (None, None)
            panel.series.append(Series(name, s["x"], s["y"], fit.as_dict(), claimed, *ci))
            slopes = " ".join(fmt.fixed(v, 2) for v in powerfit.local_slopes_xy(s["x"], s["y"]))
            records.append(
                {
                    "impl": impl,
                    "group": group_title({**values, **extra}, width=1000),
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
    for values, part in split_rows(ok, keys):
        d = float(part["d_model"].iloc[0])
        agg = frames.aggregate(part, "seq_len", "mixer_time_s", ["impl", "conv_kernel"])
        series = [
            Series(f"conv k={k}" if impl == "conv" else str(impl), s["x"], s["y"])
            for (impl, k), s in agg.groupby(["impl", "conv_kernel"], sort=True)
            if impl == "conv" or k == part.loc[part["impl"] == impl, "conv_kernel"].min()
        ]
        vlines = [(d, "n = d"), (regime.flop_crossover(int(d), "lstm"), "FLOPs: 4d (LSTM)")]
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
        panels.append(Panel(group_title(values), series, vlines))
    panels, ylabel = in_units(panels, "mixer_time_s")
    image = loglog_panels(panels, "seq_len", ylabel, "per-layer cost")
    return pd.DataFrame(table), [("layers-mixer-time", image)]


def forward_backward(rows: pd.DataFrame) -> list:
    """Forward and forward+backward time against seq_len, side by side, per scenario pair."""
    ok = frames.select(rows, "time_median_s")
    images = []
    for fwd in sorted(set(ok["scenario"])):
        bwd = interface.backward_pair(fwd)
        pair = ok[ok["scenario"].isin([fwd, bwd])]
        if bwd is None or bwd not in set(pair["scenario"]) or pair["seq_len"].nunique() < 2:
            continue
        keys = [k for k in frames.group_keys(pair, "seq_len") if k != "scenario"]
        panel_keys = [k for k in keys if k != "impl"]
        panels = []
        for values, part in split_rows(pair, panel_keys):
            extra = ", ".join(f"{k}={_num(v)}" for k, v in values.items())
            for word in (fwd, bwd):
                side = part[part["scenario"] == word]
                series = series_over_n(side, "time_median_s", ["impl"], k=1e3) if len(side) else []
                title = f"{word}" + (f" ({extra})" if extra else "")
                panels.append(Panel(title, [s for s in series if len(s.x) >= 2][:10]))
        panels = panels[:12]
        if any(p.series for p in panels):
            images.append(
                (
                    f"forward-backward-{fwd}",
                    lines(panels, "seq_len", "median time (ms)", log_y=True),
                )
            )
    return images
