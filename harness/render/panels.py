"""Result rows -> the panels and series the plots draw (:class:`~harness.render.draw.Panel`,
:class:`~harness.render.draw.Series`): display units, confidence bands, claimed exponents,
group labels, and which fields split panels and which label series."""

from __future__ import annotations

import pandas as pd

from harness import fmt, registry
from harness.analysis import frames
from harness.render.draw import Panel, Series
from harness.scenarios import interface

LABEL_DIGITS = 6  # significant digits of a number in a label (as "%g" writes it)
METRIC_LABELS = {
    "time_median_s": "median time",
    "peak_mem_bytes": "peak memory",
    "mixer_time_s": "mixer time",
}
# metric -> (lower, upper) columns of its confidence interval, drawn as a band
CI_COLUMNS = {"time_median_s": ("time_ci_low_s", "time_ci_high_s")}


def display_unit(metric: str, values) -> tuple[str, float]:
    """(unit, factor) for plotting ``metric``: seconds as ms, bytes as MiB or GiB."""
    if metric.endswith("_bytes"):
        top = max((float(v) for v in values), default=0.0)
        return ("GiB", 2.0**-30) if top >= 2**30 else ("MiB", 2.0**-20)
    if metric.endswith("_s") and not metric.endswith("per_s"):
        return "ms", 1e3
    return "", 1.0


def in_units(panels: list[Panel], metric: str) -> tuple[list[Panel], str]:
    """Panels rescaled to the metric's display unit (values, bands and fits); the axis label."""
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
    name = METRIC_LABELS.get(metric, metric)
    return panels, f"{name} ({unit})" if unit else name


def with_band(ok: pd.DataFrame, agg: pd.DataFrame, over: str, metric: str, keys: list[str]):
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


def series_by(ok: pd.DataFrame, metric: str, label_keys: list[str]) -> list[Series]:
    """Series over seq_len, one per combination of ``label_keys`` (the impl first)."""
    agg = frames.aggregate(ok, "seq_len", metric, label_keys)
    return [
        Series(series_label(v), part["x"], part["y"])
        for v, part in frames.iter_groups(agg, label_keys)
    ]
