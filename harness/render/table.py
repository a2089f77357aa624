"""Comparison tables: tidy rows pivoted only when rendered (``attnbench table``, the table
printed after ``attnbench run`` and the report's results section).

Layout (text and markdown): one line per point shape and one column per implementation. The
row axes are the point fields that vary *within* some implementation (``seq_len``, ``causal``,
a decode suite's ``cache``); fields that differ only *between* implementations (a suite's
``[[variant]]`` blocks: ``dilated`` at ``dilation = 2``) are said once, in a legend under the
table. An implementation with no ok point (unavailable here) gets no column: one line under
the table counts those points and says why. CSV is the tidy form: one line per point, raw
units, the varying axes and every requested metric as columns.

Which columns are metrics, and their units, follows from the documented row columns
(:data:`harness.results.ROW_COLUMNS`) by their unit suffix (``_s``, ``_bytes``, ``_err``...).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd

from harness.render import markdown
from harness.results import ROW_COLUMNS

FORMATS = ("text", "markdown", "csv")
MISSING = "-"  # a row axis with no value (an unbounded window side, kv_heads = heads)


@dataclass(frozen=True)
class Unit:
    """How a metric column is shown: ``value * scale`` formatted with ``fmt``, named ``label``."""

    label: str
    scale: float
    fmt: str

    def show(self, value: float) -> str:
        value *= self.scale
        if self.fmt == "sig":  # 3 significant digits, no exponent for large values
            return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
        return self.fmt.format(value)


MS = Unit("ms", 1e3, "sig")
MIB = Unit("MiB", 2**-20, "sig")
ERROR = Unit("", 1.0, "{:.1e}")
COUNT = Unit("", 1.0, "{:.0f}")
# (name suffix, unit): the first suffix a column name ends with gives its unit; None = not a
# metric (the raw sample list).
UNIT_RULES: tuple[tuple[str, Unit | None], ...] = (
    ("_samples_s", None),
    ("tflops_per_s", Unit("TFLOP/s", 1.0, "{:.3g}")),
    ("tokens_per_s", Unit("tokens/s", 1.0, "{:,.0f}")),
    ("_flops", Unit("GFLOP", 1e-9, "{:.4g}")),
    ("_bytes", MIB),
    ("_bytes_analytic", MIB),
    ("_s", MS),
    ("_err", ERROR),
    ("tolerance", ERROR),
    ("_share", Unit("%", 100.0, "{:.1f}")),
    ("samples", COUNT),
    ("_sample", COUNT),
    ("_keys", COUNT),
)
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
    unit = unit_of(metric) or Unit("", 1.0, "{:.4g}")
    return unit.show(float(value))


@dataclass
class Layout:
    """How a frame's points are laid out: row axes, per-implementation variant labels, the
    implementations shown as columns and the points left out (no ok point in their column)."""

    rows: list[str]
    variants: dict[str, str]
    shown: list[str]
    hidden: pd.DataFrame


def _point_fields() -> tuple[str, ...]:
    from harness.sweep.point import POINT_FIELDS

    return POINT_FIELDS


def _axis_values(frame: pd.DataFrame) -> pd.DataFrame:
    """The point fields as display values: the two window sides merged into ``window``
    ("255,0"; "-" unbounded), missing values "-". Same index as ``frame``."""
    out = {}
    for name in _point_fields():
        if name == "impl" or name not in frame.columns:
            continue
        if name == "window_left":
            right = frame.get("window_right", pd.Series(None, index=frame.index, dtype=object))
            out["window"] = [
                "none" if _missing(lo) and _missing(hi) else f"{_text(lo)},{_text(hi)}"
                for lo, hi in zip(frame[name], right, strict=True)
            ]
        elif name != "window_right":
            out[name] = [_text(v) for v in frame[name]]
    return pd.DataFrame(out, index=frame.index)


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _text(value) -> str:
    if _missing(value):
        return MISSING
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def layout(frame: pd.DataFrame) -> Layout:
    """Row axes, variant legend and shown/hidden implementations of ``frame`` (rows)."""
    axes = _axis_values(frame)
    varying = [c for c in axes.columns if axes[c].nunique() > 1]
    per_impl = axes[varying].groupby(frame["impl"]).nunique() if varying else pd.DataFrame()
    rows = [c for c in varying if (per_impl[c] > 1).any()]
    between = [c for c in varying if c not in rows]
    ok = frame["status"].eq("ok").groupby(frame["impl"]).any()
    shown = [impl for impl in _impl_order(frame) if ok.get(impl, False)]
    variants = {}
    for impl in shown:
        part = axes.loc[frame["impl"] == impl, between]
        common = {c: axes[c].mode().iloc[0] for c in between}
        own = {c: part[c].iloc[0] for c in between if part[c].iloc[0] != common[c]}
        if own:
            variants[impl] = ", ".join(f"{k}={v}" for k, v in own.items())
    if "seq_len" in rows:  # scaling reads down a column: seq_len varies fastest
        rows = [c for c in rows if c != "seq_len"] + ["seq_len"]
    return Layout(rows, variants, shown, frame[~frame["impl"].isin(shown)])


def _impl_order(frame: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(frame["impl"].astype(str)))


def _sort_key(column: pd.Series) -> pd.Series:
    """Numbers in numeric order, then text (``-`` first)."""
    numbers = pd.to_numeric(column.replace(MISSING, "-inf"), errors="coerce")
    return numbers if numbers.notna().all() else column.astype(str)


def cells(frame: pd.DataFrame, metric: str, lay: Layout) -> pd.DataFrame:
    """One metric pivoted: index = row axes, columns = shown implementations, cells = the
    formatted value ("(!)" when it disagrees with the reference) or the point's status."""
    axes = _axis_values(frame)[lay.rows] if lay.rows else pd.DataFrame(index=frame.index)
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
    table = table.reset_index()
    if lay.rows:
        table = table.sort_values(lay.rows, key=_sort_key, kind="stable")
    else:
        table = table.drop(columns="_all")
    table.columns.name = None
    return table.reset_index(drop=True)


def _cell(row: dict, metric: str) -> str:
    if row.get("status") != "ok":
        return str(row.get("status"))
    value = row.get(metric)
    if _missing(value) or isinstance(value, (list, dict, str)):
        return "n/a"
    text = fmt_value(metric, value)
    return f"{text} (!)" if row.get("agree") is False else text


def time_pivot(frame: pd.DataFrame, lay: Layout, column: str) -> pd.DataFrame | None:
    """Median of a numeric column over the ok points: index = row axes (``_all`` when there are
    none), columns = implementations. None when no ok point has the column."""
    if column not in frame.columns:
        return None
    values = pd.to_numeric(frame[column], errors="coerce")
    ok = frame["status"].eq("ok") & values.gt(0)
    if not ok.any():
        return None
    axes = _axis_values(frame)[lay.rows] if lay.rows else pd.DataFrame({"_all": ""}, frame.index)
    keyed = axes.assign(impl=frame["impl"].astype(str), _v=values)[ok]
    return keyed.pivot_table(
        index=list(axes.columns), columns="impl", values="_v", aggfunc="median"
    )


def speedup(frame: pd.DataFrame, baseline: str, lay: Layout) -> pd.DataFrame | None:
    """Baseline time / implementation time per row of the layout, formatted ("2.31x"; >1:
    faster than the baseline); the baseline's own column is left out."""
    times = time_pivot(frame, lay, "time_median_s")
    if times is None or baseline not in times.columns:
        return None
    ratio = times.rdiv(times[baseline], axis=0).drop(columns=baseline)
    ratio = ratio.reindex(columns=[c for c in lay.shown if c in ratio.columns])
    shown = ratio.map(lambda v: "" if _missing(v) else f"{v:.2f}x").reset_index()
    if lay.rows:
        shown = shown.sort_values(lay.rows, key=_sort_key, kind="stable")
    else:
        shown = shown.drop(columns="_all")
    shown.columns.name = None
    return shown.reset_index(drop=True)


def _text_table(frame: pd.DataFrame) -> str:
    return frame.to_string(index=False)


def tidy(frame: pd.DataFrame, metrics: Sequence[str], baseline: str | None = None):
    """One line per point: implementation, the varying axes, status and raw metric values
    (SI units as in the rows), plus ``speedup_vs_<baseline>`` when asked."""
    lay = layout(frame)
    axes = _axis_values(frame)
    varying = [c for c in axes.columns if axes[c].nunique() > 1]
    out = pd.concat([frame[["impl"]], axes[varying].replace(MISSING, "")], axis=1)
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


def skipped_line(lay: Layout) -> str:
    """One line: how many points have no column and why, grouped by status and reason."""
    if not len(lay.hidden):
        return ""
    hidden = lay.hidden.assign(
        reason=lay.hidden.get("reason", pd.Series(index=lay.hidden.index, dtype=object))
    ).fillna({"reason": ""})
    groups = hidden.groupby(["status", "reason"], sort=True)["impl"]
    parts = [
        f"{status} ({len(impls)}: {', '.join(dict.fromkeys(impls))})"
        + (f": {reason}" if reason else "")
        for (status, reason), impls in groups
    ]
    return f"not shown (no ok point): {len(hidden)} points " + "; ".join(parts)


def notes(frame: pd.DataFrame, lay: Layout) -> list[str]:
    """Lines under the tables: variants, points not shown, non-ok cells that are shown."""
    lines = []
    if lay.variants:
        lines.append("variants: " + "; ".join(f"{k}: {v}" for k, v in lay.variants.items()))
    if line := skipped_line(lay):
        lines.append(line)
    shown = frame[frame["impl"].isin(lay.shown) & frame["status"].ne("ok")]
    if len(shown):
        reasons = shown.get("reason", pd.Series(index=shown.index, dtype=object)).fillna("")
        groups = shown.assign(reason=reasons).groupby(["impl", "status", "reason"], sort=True)
        lines.append(
            "not ok: "
            + "; ".join(
                f"{impl} ({len(g)}): {status}" + (f": {reason}" if reason else "")
                for (impl, status, reason), g in groups
            )
        )
    if "agree" in frame.columns and frame["agree"].eq(False).any():
        lines.append("(!) disagrees with the float64 reference beyond tolerance")
    return lines


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
