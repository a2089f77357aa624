"""Comparison tables: tidy rows pivoted only when rendered (``attnbench table``, the table
printed after ``attnbench run`` and the report's results section).

Text and markdown: one line per point shape and one column per implementation, laid out by
:mod:`harness.render.pivot` (variants and points not shown are said in lines under the table).
CSV is the tidy form: one line per point, raw units, the varying axes and every requested metric
as columns.

Which columns are metrics, and how each is shown, follows from its declaration in
:mod:`harness.schema` (its ``kind``: seconds as ms, bytes as MiB, ...); numbers are written by
:mod:`harness.fmt`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial

import pandas as pd

from harness import fmt, scenarios
from harness.measure.timing import host_bound
from harness.render.pivot import (
    HOST_MARK,
    MEASURED,
    Layout,
    axis_values,
    layout,
    notes,
    sort_key,
    time_pivot,
)
from harness.results import ROW_COLUMNS
from harness.schema import BY_NAME, COLUMNS, IDENTITY

# leads of a schema description that name rows of a device or a pass, not of a scenario
ONLY_SOME_ROWS = ("CUDA", "backward")

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


# schema kind -> display unit; None: not shown as a number. A ``rate`` is shown in the unit the
# column stores (TFLOP/s, tokens/s), so its label comes from the schema's ``unit``.
KIND_UNITS: dict[str, Unit | None] = {
    "seconds": Unit("ms", 1e3, fmt.readable),
    "bytes": Unit("MiB", 2**-20, fmt.readable),
    "flops": Unit("GFLOP", 1e-9, partial(fmt.number, digits=4)),
    "rate": Unit("", 1.0, fmt.readable),
    "error": Unit("", 1.0, partial(fmt.scientific, digits=1)),
    "share": Unit("%", 100.0, partial(fmt.fixed, decimals=1)),
    "int": Unit("", 1.0, partial(fmt.fixed, decimals=0)),
    "number": Unit("", 1.0, partial(fmt.number, digits=4)),
    "text": None,
    "bool": None,
}

# Human names of the columns tables show and plots and claims measure: each column's declared
# title (the schema's, or its scenario folder's); the rest keep their column name.
TITLES: dict[str, str] = {c.name: c.title for c in COLUMNS if c.title}
DEFAULT_METRICS = ("time_median_s", "peak_mem_bytes")
# the timed call's figures: marked HOST_MARK where the GPU waited on the host (host_frac)
TIMED_METRICS = ("time_median_s", "tokens_per_s", "tflops_per_s")
# shown by default too when a row of the run has a value: the columns declared so (an
# approximation's distance from softmax attention, what a decode step keeps)
WHEN_PRESENT: tuple[str, ...] = tuple(c.name for c in COLUMNS if c.when_present)


def default_metrics(frame: pd.DataFrame) -> tuple[str, ...]:
    """:data:`DEFAULT_METRICS`, then each of :data:`WHEN_PRESENT` that a row of ``frame`` has."""
    present = [
        m for m in WHEN_PRESENT if m in frame.columns and not frame[m].isna().all()
    ]
    return (*DEFAULT_METRICS, *present)


_IDENTITY = frozenset(c.name for c in IDENTITY)  # which run and point (schema_version, d_model)


def unit_of(column: str) -> Unit | None:
    """The display unit of a documented column (from its schema kind), None for a column that
    is not one number per row (text, a flag, a point field, a list per sample or pass)."""
    declared = BY_NAME.get(column)
    if declared is None or declared.many or declared.point or column in _IDENTITY:
        return None
    unit = KIND_UNITS[declared.kind]
    if unit is not None and declared.kind in ("rate", "number") and declared.unit:
        return replace(unit, label=declared.unit)
    return unit


# Every documented row column that is a metric (``attnbench table --metric`` accepts these).
METRICS: tuple[str, ...] = tuple(c for c in ROW_COLUMNS if unit_of(c) is not None)


def metric_problem(column: str) -> str | None:
    """Why ``column`` cannot be a ``--metric`` (None when it can)."""
    declared = BY_NAME.get(column)
    if declared is None:
        return "not a documented row column (results/README.md lists them)"
    if declared.many:
        return "a list per row (one value per sample or pass), not one number"
    if declared.point:
        return "a point field: tables show it as a row axis, not as a metric"
    if column in _IDENTITY:
        return "it says which run or point a row is, not what was measured"
    if unit_of(column) is None:
        return f"a {declared.kind} column, not a number"
    return None


def name(column: str) -> str:
    """A column's human name (:data:`TITLES`), else the column name itself."""
    return TITLES.get(column, column)


def title(metric: str) -> str:
    """'median time (ms)', 'peak memory (MiB)', 'naive_err' ..."""
    unit = unit_of(metric)
    return f"{name(metric)} ({unit.label})" if unit and unit.label else name(metric)


def fmt_value(metric: str, value) -> str:
    """``value`` of column ``metric`` in its display unit (``0.0123`` s -> ``12.3``)."""
    unit = unit_of(metric) or KIND_UNITS["number"]
    return unit.show(float(value))


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
    """The formatted value, marked ``(!)`` when the row disagrees with the reference and, in a
    time column, ``(h)`` when the row is host-bound; a row that holds no measurement shows its
    status."""
    if row.get("status") not in MEASURED:
        return str(row.get("status"))
    value = row.get(metric)
    if fmt.is_missing(value) or isinstance(value, (list, dict, str)):
        return "n/a"
    text = fmt_value(metric, value)
    wrong = row.get("agree") is False or row.get("status") == "mismatch"
    if metric in TIMED_METRICS and host_bound(row.get("host_frac")):
        text = f"{text} {HOST_MARK}"
    return f"{text} (!)" if wrong else text


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
    nothing = pd.Series(index=frame.index, dtype=float)
    for metric in metrics:  # a metric no row has stays a column, empty (not dropped)
        out[metric] = pd.to_numeric(frame.get(metric, nothing), errors="coerce")
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
    form: str = "text",
    baseline: str | None = None,
) -> str:
    """The tables of ``frame`` (result rows) for ``metrics`` as text, markdown or CSV. A
    metric no row has a value of gets a line saying so instead of a table."""
    if form == "csv":
        return tidy(frame, metrics, baseline).to_csv(index=False)
    empty = [m for m in metrics if m not in frame.columns or frame[m].isna().all()]
    metrics = [m for m in metrics if m not in empty]
    lay = layout(frame)
    write: Callable[[pd.DataFrame], str] = (
        fmt.markdown_table if form == "markdown" else _text_table
    )

    def block(head: str, table: pd.DataFrame) -> str:
        return f"### {head}\n\n{write(table)}" if form == "markdown" else f"{head}\n{write(table)}"

    parts = [block(title(m), cells(frame, m, lay)) for m in metrics] if lay.shown else []
    if baseline and lay.shown:
        ratio = speedup(frame, baseline, lay)
        if ratio is not None and len(ratio.columns) > len(lay.rows):
            head = f"speedup vs {baseline} (its time / each time; >1 is faster)"
            parts.append(block(head, ratio))
    lines = [f"{m}: no row of this run has a value ({_why_empty(m)})" for m in empty]
    lines += notes(frame, lay)
    if lines:
        parts.append("\n".join(f"- {n}" if form == "markdown" else n for n in lines))
    return "\n\n".join(parts)


def _why_empty(metric: str) -> str:
    """Where a column is recorded, for the line that says a run has none of it: the scenarios
    whose folders declare it (``harness/scenarios/<name>/__init__.py``), or for a column of
    every scenario that only a device or a backward pass records, its schema description's
    lead ("CUDA: ...", "backward scenarios: ...")."""
    owners = scenarios.declaring(metric)
    if owners and len(owners) < len(scenarios.folders()):
        return f"recorded for {' and '.join(owners)} rows only"
    doc = BY_NAME[metric].doc if metric in BY_NAME else ""
    where = doc.split(":", 1)[0] if ":" in doc else ""
    if where.startswith(ONLY_SOME_ROWS):
        return f"recorded for {where} rows only"
    return "not recorded for these rows"
