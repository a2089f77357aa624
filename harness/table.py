"""Comparison tables: long, tidy rows pivoted only when rendered (``attnbench table``)."""

from __future__ import annotations

import pandas as pd

from harness.point import POINT_FIELDS

# metric column -> (header, formatter)
METRICS: dict[str, tuple[str, callable]] = {
    "time_median_s": ("median time (ms)", lambda v: f"{v * 1e3:.3f}"),
    "tokens_per_s": ("tokens/s", lambda v: f"{v:,.0f}"),
    "tflops_per_s": ("useful TFLOP/s", lambda v: f"{v:.3f}"),
    "peak_mem_bytes": ("peak memory (MiB)", lambda v: f"{v / 2**20:.1f}"),
    "max_abs_err": ("max abs error vs float64", lambda v: f"{v:.1e}"),
}


def varying_fields(frame: pd.DataFrame, exclude: tuple[str, ...] = ("impl",)) -> list[str]:
    """Point fields that take more than one value in ``frame`` (the table's row labels)."""
    out = []
    for name in POINT_FIELDS:
        if name in exclude or name not in frame.columns:
            continue
        if frame[name].astype(str).nunique(dropna=False) > 1:
            out.append(name)
    return out or ["seq_len"]


def pivot(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Rows = varying point fields, columns = impl, cells = formatted metric or the status."""
    header, fmt = METRICS[metric]
    index = varying_fields(frame)

    def cell(row: pd.Series) -> str:
        if row.get("status") != "ok":
            return str(row.get("status"))
        value = row.get(metric)
        if value is None or pd.isna(value):
            return "n/a"
        text = fmt(value)
        return text if row.get("agree") is not False else f"{text} (!)"

    cells = frame.assign(_cell=frame.apply(cell, axis=1))
    table = cells.pivot_table(
        index=index, columns="impl", values="_cell", aggfunc="first", dropna=False, sort=True
    ).fillna("")
    table.columns.name = header
    return table


def render(
    frame: pd.DataFrame, metrics: tuple[str, ...] = ("time_median_s", "peak_mem_bytes")
) -> str:
    """Plain-text tables, one per metric, plus a line per non-ok point with its reason."""
    parts = []
    for metric in metrics:
        if metric in frame.columns:
            table = pivot(frame, metric)
            parts.append(f"{table.columns.name}\n{table.to_string()}")
    bad = frame[frame["status"] != "ok"]
    if len(bad):
        groups = bad.groupby(["impl", "status", "reason"], dropna=False).size()
        lines = [
            f"  {impl} ({count} points): {status}: {reason}"
            for (impl, status, reason), count in groups.items()
        ]
        parts.append("points not ok:\n" + "\n".join(lines))
    return "\n\n".join(parts)
