"""Result rows -> the panels and series the plots draw (:class:`~harness.render.plots.Panel`,
:class:`~harness.render.plots.Series`): display units, confidence intervals, claimed
exponents, and which fields split panels and which label series. A legend names what varies:
each series is its implementation plus the fields that differ between that implementation's
series in the figure (never a field it does not have, shown as ``-``)."""

from __future__ import annotations

import textwrap

import pandas as pd

from harness import fmt, registry
from harness.analysis import frames
from harness.render.plots import Panel, Series
from harness.render.table import name as human_name
from harness.scenarios import interface
from harness.schema import BY_NAME

LABEL_DIGITS = 6  # significant digits of a number in a label (as "%g" writes it)
# metric -> (lower, upper) columns of its confidence interval, drawn as error bars
CI_COLUMNS = {"time_median_s": ("time_ci_low_s", "time_ci_high_s")}


def display_unit(metric: str, values) -> tuple[str, float]:
    """(unit, factor) for plotting ``metric``, from the kind the schema declares for it:
    seconds as ms, bytes as MiB or GiB, a share as %, a rate in its stored unit (TFLOP/s);
    a column the schema does not declare by its name's suffix (``_bytes``, ``_s``)."""
    declared = BY_NAME.get(metric)
    kind = declared.kind if declared is not None else (
        "bytes" if metric.endswith("_bytes")
        else "seconds" if metric.endswith("_s") and not metric.endswith("per_s") else "")
    if kind == "bytes":
        top = max((float(v) for v in values), default=0.0)
        return ("GiB", 2.0**-30) if top >= 2**30 else ("MiB", 2.0**-20)
    if kind == "seconds":
        return "ms", 1e3
    if kind == "share":
        return "%", 100.0
    if kind in ("rate", "number") and declared is not None:
        return declared.unit, 1.0
    return "", 1.0


def axis_label(metric: str, unit: str) -> str:
    """``median time (ms)``: the column's human name, then the unit it is drawn in."""
    return f"{human_name(metric)} ({unit})" if unit else human_name(metric)


def in_units(panels: list[Panel], metric: str) -> tuple[list[Panel], str]:
    """Panels rescaled to the metric's display unit (values, intervals and fits); the axis
    label."""
    values = [v for p in panels for s in p.series for v in s.y]
    unit, k = display_unit(metric, values)
    for panel in panels:
        for s in panel.series:
            s.y = [v * k for v in s.y]
            s.low = None if s.low is None else [v * k for v in s.low]
            s.high = None if s.high is None else [v * k for v in s.high]
            if s.fit:
                s.fit = {
                    **s.fit,
                    "prefactor": s.fit["prefactor"] * k,
                    "offset": s.fit["offset"] * k,
                }
    return panels, axis_label(metric, unit)


def with_interval(ok: pd.DataFrame, agg: pd.DataFrame, over: str, metric: str, keys: list[str]):
    """``agg`` with ``low``/``high`` columns: the median of the rows' CI bounds per point."""
    if metric not in CI_COLUMNS or not set(CI_COLUMNS[metric]) <= set(ok.columns):
        return agg
    bounds = [
        frames.aggregate(ok, over, col, keys)[[*keys, "x", "y"]].rename(columns={"y": name})
        for col, name in zip(CI_COLUMNS[metric], ("low", "high"), strict=True)
    ]
    for bound in bounds:
        agg = agg.merge(bound, on=[*keys, "x"], how="left")
    return agg


def claimed_exponent(impl: str, metric: str, over: str, scenario: str) -> float | None:
    """The exponent in n an attention implementation declares (registry ``cost``), for time or
    memory of a scenario that times the core alone (a block or decode step is not a pure power
    of n)."""
    try:
        core_alone = interface.get(scenario).core_exponents
    except interface.UnknownScenario:
        core_alone = False
    if over != "seq_len" or not core_alone:
        return None
    try:
        cost = registry.get(impl).cost
    except KeyError:
        return None
    return cost.memory_exponent if metric == "peak_mem_bytes" else cost.time_exponent


def model_for(metric: str) -> str:
    """Peak memory above the baseline has a fixed workspace: fit it with a constant term."""
    return "power+const" if metric == "peak_mem_bytes" else "power"


def series_label(values: dict) -> str:
    """A series' legend label: the implementation as is, other keys as ``key=value``."""
    return " ".join(
        str(v) if k == "impl" else f"{k}={fmt.number(v, LABEL_DIGITS)}" for k, v in values.items()
    )


def varying_labels(groups: list[dict]) -> list[str]:
    """Legend labels for series keyed by ``groups`` (``{field: value}``, ``impl`` among them):
    the implementation plus the fields whose values differ among that implementation's
    series; a field the series does not have (``-``) is never shown."""
    impls = [g.get("impl") for g in groups]
    labels = []
    for g, impl in zip(groups, impls, strict=True):
        mine = [h for h, i in zip(groups, impls, strict=True) if i == impl]
        shown = {
            k: v
            for k, v in g.items()
            if k != "impl" and v != frames.MISSING and len({str(h.get(k)) for h in mine}) > 1
        }
        labels.append(series_label({"impl": impl, **shown} if impl is not None else shown))
    return [label or "all rows" for label in labels]


def split_keys(agg: pd.DataFrame, keys: list[str]) -> tuple[list[str], list[str]]:
    """(panel keys, series keys): a field only one impl varies (local's window, conv's kernel)
    labels series; a field several impls vary splits panels; one fixed per impl is dropped."""
    panel, series = [], []
    for k in keys:
        if k == "impl":
            continue
        varying = (agg.groupby("impl")[k].nunique() > 1).sum()
        (series if varying == 1 else panel if varying > 1 else []).append(k)
    return panel, series


def series_by(
    ok: pd.DataFrame, metric: str, label_keys: list[str], min_points: int = 1
) -> list[Series]:
    """Series over seq_len, one per combination of ``label_keys`` (the impl first) with at
    least ``min_points`` points, labelled by what varies among those (:func:`varying_labels`)."""
    agg = frames.aggregate(ok, "seq_len", metric, label_keys)
    groups = [(v, p) for v, p in frames.iter_groups(agg, label_keys) if len(p) >= min_points]
    labels = varying_labels([v for v, _ in groups])
    return [
        Series(label, part["x"], part["y"])
        for label, (_, part) in zip(labels, groups, strict=True)
    ]


def split_rows(frame: pd.DataFrame, keys: list[str]):
    """(values, part) per combination of ``keys`` (None/NaN grouped as "-"); one group if none."""
    if not keys:
        yield {}, frame
        return
    for values, part in frame.assign(**frames.groupable(frame[keys])).groupby(keys, sort=True):
        yield dict(zip(keys, values if isinstance(values, tuple) else (values,), strict=True)), part


def group_title(values: dict, width: int = 70) -> str:
    """Readable group label for a panel title or a table: derived duplicates dropped (head_dim
    beside heads and d_model, window sides beside the window), wrapped to ``width``
    characters."""
    shown = dict(values)
    if {"heads", "d_model"} <= set(shown):
        shown.pop("head_dim", None)
    if "window" in shown:
        shown.pop("window_left", None), shown.pop("window_right", None)
    text = ", ".join(f"{k}={fmt.number(v, LABEL_DIGITS)}" for k, v in shown.items())
    return textwrap.fill(text or "all rows", width)


def series_over_n(
    part: pd.DataFrame, metric: str, keys: list[str], k: float = 1.0, min_points: int = 2
):
    """A series over seq_len per combination of ``keys`` (impl first) with at least
    ``min_points`` points, median over repeats, labelled by what varies among those, with the
    interval the time CI implies for ``metric`` (a time, or a rate: ``metric`` x time / CI
    bound), scaled by ``k``."""
    agg = frames.aggregate(part, "seq_len", metric, keys)
    scaled = part.assign(
        _lo=pd.to_numeric(part[metric])
        * pd.to_numeric(part["time_median_s"])
        / pd.to_numeric(part.get("time_ci_high_s", part["time_median_s"])),
        _hi=pd.to_numeric(part[metric])
        * pd.to_numeric(part["time_median_s"])
        / pd.to_numeric(part.get("time_ci_low_s", part["time_median_s"])),
    )
    if metric == "time_median_s":  # a time's interval is its own CI, not the rate's inverse
        scaled = scaled.assign(
            _lo=pd.to_numeric(part.get("time_ci_low_s", part[metric])),
            _hi=pd.to_numeric(part.get("time_ci_high_s", part[metric])),
        )
    for name, col in (("low", "_lo"), ("high", "_hi")):
        bound = frames.aggregate(scaled, "seq_len", col, keys)[[*keys, "x", "y"]]
        agg = agg.merge(bound.rename(columns={"y": name}), on=[*keys, "x"], how="left")
    groups = [(v, s) for v, s in frames.iter_groups(agg, keys) if len(s) >= min_points]
    labels = varying_labels([v for v, _ in groups])
    return [
        Series(label, s["x"], s["y"] * k, None, None, s["low"] * k, s["high"] * k)
        for label, (_, s) in zip(labels, groups, strict=True)
    ]
