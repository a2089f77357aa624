"""How each cost grows: result rows -> the report's scaling figures (PNG bytes, via
:mod:`harness.render.plots`) and the tables beside them: the exponent fits table, time and
peak memory against n (log-log, fitted and claimed slopes), time against the other swept
variables, forward and backward side by side, and the panels scenarios declare
(:mod:`harness.scenarios.figures`: a metric against a variable, or implementations against
baselines with their crossovers). (How well the device is used:
:mod:`harness.render.efficiency`.)"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness import fmt
from harness.analysis import fits, frames, powerfit
from harness.analysis.claims import Claim
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
from harness.scenarios.figures import CrossoverPanel, MetricPanel, ReportPanel

# what time is fitted against besides n (and each scenario's own Scenario.axes)
OVERS = ("d_model", "heads", "window", "document_len")
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
        for over in (*OVERS, *_own_axes(str(scenario))):
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


def _own_axes(word: str) -> tuple[str, ...]:
    """The scenario's own axes (none for a scenario this installation does not know)."""
    try:
        return interface.get(word).axes
    except interface.UnknownScenario:
        return ()


def panel(rows: pd.DataFrame, spec: ReportPanel) -> tuple[list[tuple[str, pd.DataFrame]], list]:
    """(tables, images) of a panel a scenario declares, from that scenario's rows."""
    if isinstance(spec, CrossoverPanel):
        table, images = crossover_panel(rows, spec)
        return [("crossover", table)], images
    if isinstance(spec, MetricPanel):
        panels, records = fit_panels(rows, spec.over, spec.metric)
        if not panels:
            return [], []
        panels, ylabel = in_units(panels, spec.metric)
        image = loglog_panels(panels, spec.over, ylabel, spec.title)
        return [(f"{spec.key}-fits", pd.DataFrame(records))], [(spec.key, image)]
    raise TypeError(f"no renderer for a {type(spec).__name__}")


def crossover_panel(rows: pd.DataFrame, spec: CrossoverPanel) -> tuple[pd.DataFrame, list]:
    """``spec.metric`` vs ``spec.over`` per group of the other fields, the scenario's
    implementations against its baselines, with measured crossovers (as multiples of
    ``spec.relative_to``), guide lines and the measured crossing."""
    ok = frames.select(rows, spec.metric)
    if not len(ok) or not ok["impl"].isin(spec.baselines).any():
        return pd.DataFrame(), []
    n, d = spec.names
    table, panels = [], []
    for impl in sorted(ok.loc[~ok["impl"].isin(spec.baselines), "impl"].unique()):
        for base in spec.baselines:
            claim = Claim(
                id=f"{impl}-vs-{base}", metric=spec.metric, over=spec.over, impl=impl,
                baseline=base, relative_to=spec.relative_to, expect_crossover_min=spec.expect_min,
            )
            found = crossovers(ok, claim)
            for g in found:
                table.append(
                    {
                        spec.subject: impl,
                        "baseline": base,
                        "group": g["group"],
                        f"crossover_{n}_over_{d}": g["measured"],
                        "ci_low": g["ci_low"],
                        "ci_high": g["ci_high"],
                        f"cheaper_below_{d}": g["verdict"],
                        "detail": g["reason"],
                    }
                )
    for values, part in split_rows(ok, _panel_keys(ok, spec)):
        series = _crossover_series(part, spec)
        vlines = list(spec.guides(float(part[spec.relative_to].iloc[0])))
        vlines += _measured_crossing(series, spec)
        panels.append(Panel(group_title(values), series, vlines))
    panels, ylabel = in_units(panels, spec.metric)
    image = loglog_panels(panels, spec.over, ylabel, spec.figure_title or spec.title)
    return pd.DataFrame(table), [(spec.key, image)]


def _panel_keys(ok: pd.DataFrame, spec: CrossoverPanel) -> list[str]:
    """The fields a crossover panel's figures are split by: those that vary, but for the
    implementation, the column its baseline is split by and the fields implementations set."""
    skip = {"impl", *frames.IMPL_FIELDS, *(spec.split[1:2] if spec.split else ())}
    return [k for k in frames.group_keys(ok, spec.over) if k not in skip]


def _crossover_series(part: pd.DataFrame, spec: CrossoverPanel) -> list[Series]:
    """A series per implementation and baseline; the split baseline once per value of its
    column, the others at their smallest value of it."""
    if spec.split is None:
        agg = frames.aggregate(part, spec.over, spec.metric, ["impl"])
        return [Series(str(impl), s["x"], s["y"]) for impl, s in agg.groupby("impl", sort=True)]
    split, column, label = spec.split
    agg = frames.aggregate(part, spec.over, spec.metric, ["impl", column])
    return [
        Series(f"{split} {label}={k}" if impl == split else str(impl), s["x"], s["y"])
        for (impl, k), s in agg.groupby(["impl", column], sort=True)
        if impl == split or k == part.loc[part["impl"] == impl, column].min()
    ]


def _measured_crossing(series: list[Series], spec: CrossoverPanel) -> list[tuple[float, str]]:
    """Where the first implementation's series crosses ``spec.measured_against``'s, as a
    vertical line (none when it does not cross inside the measured range)."""
    if spec.measured_against is None:
        return []
    att = [s for s in series if not s.label.startswith(spec.baselines)]
    other = [s for s in series if s.label.startswith(spec.measured_against)]
    if not (att and other):
        return []
    a = pd.Series(list(att[0].y), index=list(att[0].x))
    b = pd.Series(list(other[0].y), index=list(other[0].x))
    both = a.index.intersection(b.index).sort_values()
    if len(both) < 2:
        return []
    lr = np.log(a[both].to_numpy() / b[both].to_numpy())
    (lo,), (hi,) = crossing(both.to_numpy(float), lr)
    return [(float(lo), "measured")] if lo == hi else []  # interior, not a censored bound


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
