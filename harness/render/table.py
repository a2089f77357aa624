"""Comparison tables: tidy rows pivoted only when rendered (``attnbench table``, the table
printed after ``attnbench run`` and the report's results section).

Text and markdown: one line per point shape and one column per implementation, laid out by
:mod:`harness.render.pivot` (variants and points not shown are said in lines under the table).
CSV is the tidy form: one line per point, raw units, the varying axes and every requested metric
as columns.

Which columns are metrics, and their units, follows from the documented row columns
(:data:`harness.results.ROW_COLUMNS`) by their unit suffix (``_s``, ``_bytes``, ``_err``...);
numbers are written by :mod:`harness.fmt`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import pandas as pd

from harness import fmt, markdown
from harness.render.pivot import Layout, axis_values, layout, notes, sort_key, time_pivot
from harness.results import ROW_COLUMNS

FORMATS = ("text", "markdown", "csv")


@dataclass(frozen=True)
class Unit:
    """How a metric column is shown: ``value * scale`` written by ``text`` (a
    :mod:`harness.fmt` function), named ``label``."""

    label: str
    scale: float
    text: Callable[[float], str]

    def show(self, value: float) -> str:
        return self.text(value * self.scale)


MS = Unit("ms", 1e3, fmt.readable)
MIB = Unit("MiB", 2**-20, fmt.readable)
ERROR = Unit("", 1.0, partial(fmt.scientific, digits=1))
COUNT = Unit("", 1.0, partial(fmt.fixed, decimals=0))
# (name suffix, unit): the first suffix a column name ends with gives its unit; None = not a
# metric (the raw sample list).
UNIT_RULES: tuple[tuple[str, Unit | None], ...] = (
    ("_samples_s", None),
    ("tflops_per_s", Unit("TFLOP/s", 1.0, partial(fmt.number, digits=3))),
    ("tokens_per_s", Unit("tokens/s", 1.0, partial(fmt.fixed, decimals=0, grouped=True))),
    ("_flops", Unit("GFLOP", 1e-9, partial(fmt.number, digits=4))),
    ("_bytes", MIB),
    ("_bytes_analytic", MIB),
    ("_s", MS),
    ("_err", ERROR),
    ("tolerance", ERROR),
    ("_share", Unit("%", 100.0, partial(fmt.fixed, decimals=1))),
    ("samples", COUNT),
    ("_sample", COUNT),
    ("_keys", COUNT),
)
PLAIN = Unit("", 1.0, partial(fmt.number, digits=4))  # a column without a unit rule

# Readable titles for the columns people ask for most; the rest are "<column> (<unit>)".
TITLES = {
    "time_median_s": "median time",
    "peak_mem_bytes": "peak memory",
    "tflops_per_s": "useful throughput",
    "tokens_per_s": "throughput",
    "max_abs_err": "max abs error vs float64",
    "rel_err": "relative error vs float64",
}
DEFAULT_METRICS = ("time_median_s", "peak_mem_bytes")


def unit_of(column: str) -> Unit | None:
    """The display unit of a documented metric column, None for a column that is not one."""
    for suffix, unit in UNIT_RULES:
        if column.endswith(suffix):
            return unit
    return None


# Every documented row column that is a metric (``attnbench table --metric`` accepts these).
METRICS: tuple[str, ...] = tuple(c for c in ROW_COLUMNS if unit_of(c) is not None)


def title(metric: str) -> str:
    """'median time (ms)', 'peak memory (MiB)', 'naive_err' ..."""
    unit = unit_of(metric)
    name = TITLES.get(metric, metric)
    return f"{name} ({unit.label})" if unit and unit.label else name


def fmt_value(metric: str, value) -> str:
    """``value`` of column ``metric`` in its display unit (``0.0123`` s -> ``12.3``)."""
    return (unit_of(metric) or PLAIN).show(float(value))


def cells(frame: pd.DataFrame, metric: str, lay: Layout) -> pd.DataFrame:
    """One metric pivoted: index = row axes, columns = shown implementations, cells = the
    formatted value ("(!)" when it disagrees with the reference) or the point's status."""
    axes = axis_values(frame)[lay.rows] if lay.rows else pd.DataFrame(index=frame.index)
    keyed = axes.assign(
        impl=frame["impl"].astype(str),
        _cell=[_cell(row, metric) for row in frame.to_dict("records")],
    )
    keyed = keyed[keyed["impl"].isin(lay.shown)]
    index = lay.rows or ["_all"]
    if not lay.rows:
        keyed = keyed.assign(_all="")
    table = keyed.pivot_table(index=index, columns="impl", values="_cell", aggfunc="first")
    table = table.reindex(columns=[c for c in lay.shown if c in table.columns]).fillna("")
    return _ordered(table.reset_index(), lay)


def _cell(row: dict, metric: str) -> str:
    if row.get("status") != "ok":
        return str(row.get("status"))
    value = row.get(metric)
    if fmt.is_missing(value) or isinstance(value, (list, dict, str)):
        return "n/a"
    text = fmt_value(metric, value)
    return f"{text} (!)" if row.get("agree") is False else text


def speedup(frame: pd.DataFrame, baseline: str, lay: Layout) -> pd.DataFrame | None:
    """Baseline time / implementation time per row of the layout, formatted ("2.31x"; >1:
    faster than the baseline); the baseline's own column is left out."""
    times = time_pivot(frame, lay, "time_median_s")
    if times is None or baseline not in times.columns:
        return None
    ratio = times.rdiv(times[baseline], axis=0).drop(columns=baseline)
    ratio = ratio.reindex(columns=[c for c in lay.shown if c in ratio.columns])
    return _ordered(ratio.map(partial(fmt.ratio, missing="")).reset_index(), lay)


def _ordered(table: pd.DataFrame, lay: Layout) -> pd.DataFrame:
    """A pivoted table (row axes as columns) sorted by the layout's row axes; without row
    axes, the placeholder ``_all`` column dropped."""
    if lay.rows:
        table = table.sort_values(lay.rows, key=sort_key, kind="stable")
    else:
        table = table.drop(columns="_all")
    table.columns.name = None
    return table.reset_index(drop=True)


def _text_table(frame: pd.DataFrame) -> str:
    return frame.to_string(index=False)


def tidy(frame: pd.DataFrame, metrics: Sequence[str], baseline: str | None = None):
    """One line per point: implementation, the varying axes, status and raw metric values
    (SI units as in the rows), plus ``speedup_vs_<baseline>`` when asked."""
    lay = layout(frame)
    axes = axis_values(frame)
    varying = [c for c in axes.columns if axes[c].nunique() > 1]
    out = pd.concat([frame[["impl"]], axes[varying].replace(fmt.MISSING, "")], axis=1)
    out["status"] = frame["status"]
    for metric in metrics:
        if metric in frame.columns:
            out[metric] = pd.to_numeric(frame[metric], errors="coerce")
    if baseline and "time_median_s" in frame.columns:
        key = [c for c in lay.rows]
        base = out[(out["impl"] == baseline) & (out["status"] == "ok")]
        times = pd.to_numeric(frame.loc[base.index, "time_median_s"], errors="coerce")
        base = base.assign(_base=times)
        if key:
            merged = (
                out[key]
                .merge(base.groupby(key)["_base"].median().reset_index(), on=key, how="left")[
                    "_base"
                ]
                .to_numpy()
            )
        else:
            merged = times.median()
        own = pd.to_numeric(frame["time_median_s"], errors="coerce").where(frame["status"] == "ok")
        out[f"speedup_vs_{baseline}"] = merged / own.to_numpy()
    return out.reset_index(drop=True)


def render(
    frame: pd.DataFrame,
    metrics: Sequence[str] = DEFAULT_METRICS,
    fmt: str = "text",
    baseline: str | None = None,
) -> str:
    """The tables of ``frame`` (result rows) for ``metrics`` as text, markdown or CSV."""
    metrics = [m for m in metrics if m in frame.columns]
    if fmt == "csv":
        return tidy(frame, metrics, baseline).to_csv(index=False)
    lay = layout(frame)
    write: Callable[[pd.DataFrame], str] = markdown.table if fmt == "markdown" else _text_table

    def block(head: str, table: pd.DataFrame) -> str:
        return f"### {head}\n\n{write(table)}" if fmt == "markdown" else f"{head}\n{write(table)}"

    parts = [block(title(m), cells(frame, m, lay)) for m in metrics] if lay.shown else []
    if baseline and lay.shown:
        ratio = speedup(frame, baseline, lay)
        if ratio is not None and len(ratio.columns) > len(lay.rows):
            head = f"speedup vs {baseline} (its time / each time; >1 is faster)"
            parts.append(block(head, ratio))
    lines = notes(frame, lay)
    if lines:
        parts.append("\n".join(f"- {n}" if fmt == "markdown" else n for n in lines))
    return "\n\n".join(parts)
