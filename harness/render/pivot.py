"""How a run's points are laid out in a comparison table: one line per point shape, one column
per implementation.

The row axes are the point fields that vary *within* some implementation (``seq_len``,
``causal``, a decode suite's ``cache``); fields that differ only *between* implementations (a
suite's ``[[variant]]`` blocks: ``dilated`` at ``dilation = 2``) are said once, in a legend under
the table. An implementation with no measured point (unavailable here) gets no column: one line
under the table counts those points and says why. A point that ran but disagrees with the float64
reference (``mismatch``) is measured: its cell shows the value marked ``(!)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

from harness import fmt
from harness.measure.timing import HOST_BOUND_FRAC, host_bound
from harness.schema import POINT_COLUMNS

MEASURED = ("ok", "mismatch")  # statuses whose rows hold measurements
HOST_MARK = "(h)"  # a time cell of a host-bound row (host_frac >= HOST_BOUND_FRAC)


@dataclass
class Layout:
    """How a frame's points are laid out: row axes, per-implementation variant labels, the
    implementations shown as columns and the points left out (no measured point in their
    column)."""

    rows: list[str]
    variants: dict[str, str]
    shown: list[str]
    hidden: pd.DataFrame


def axis_values(frame: pd.DataFrame) -> pd.DataFrame:
    """The point fields as display values: the two window sides merged into ``window``
    ("255,0"; "-" unbounded), missing values "-". Same index as ``frame``."""
    out = {}
    for name in POINT_COLUMNS:
        if name == "impl" or name not in frame.columns:
            continue
        if name == "window_left":
            right = frame.get("window_right", pd.Series(None, index=frame.index, dtype=object))
            out["window"] = [
                "none"
                if fmt.is_missing(lo) and fmt.is_missing(hi)
                else f"{fmt.exact(lo)},{fmt.exact(hi)}"
                for lo, hi in zip(frame[name], right, strict=True)
            ]
        elif name != "window_right":
            out[name] = [fmt.exact(v) for v in frame[name]]
    return pd.DataFrame(out, index=frame.index)


def layout(frame: pd.DataFrame) -> Layout:
    """Row axes, variant legend and shown/hidden implementations of ``frame`` (rows)."""
    axes = axis_values(frame)
    varying = [c for c in axes.columns if axes[c].nunique() > 1]
    per_impl = axes[varying].groupby(frame["impl"]).nunique() if varying else pd.DataFrame()
    rows = [c for c in varying if (per_impl[c] > 1).any()]
    between = [c for c in varying if c not in rows]
    measured = frame["status"].isin(MEASURED).groupby(frame["impl"]).any()
    shown = [impl for impl in _impl_order(frame) if measured.get(impl, False)]
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


def sort_key(column: pd.Series) -> pd.Series:
    """Numbers in numeric order, then text (``-`` first)."""
    numbers = pd.to_numeric(column.replace(fmt.MISSING, "-inf"), errors="coerce")
    return numbers if numbers.notna().all() else column.astype(str)


def time_pivot(frame: pd.DataFrame, lay: Layout, column: str) -> pd.DataFrame | None:
    """Median of a numeric column over the ok points: index = row axes (``_all`` when there are
    none), columns = implementations. None when no ok point has the column."""
    if column not in frame.columns:
        return None
    values = pd.to_numeric(frame[column], errors="coerce")
    ok = frame["status"].eq("ok") & values.gt(0)
    if not ok.any():
        return None
    axes = axis_values(frame)[lay.rows] if lay.rows else pd.DataFrame({"_all": ""}, frame.index)
    keyed = axes.assign(impl=frame["impl"].astype(str), _v=values)[ok]
    return keyed.pivot_table(
        index=list(axes.columns), columns="impl", values="_v", aggfunc="median"
    )


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
    return f"not shown (no measured point): {fmt.plural(len(hidden), 'point')} " + "; ".join(parts)


def notes(frame: pd.DataFrame, lay: Layout) -> list[str]:
    """Lines under the tables: variants, points not shown, non-ok cells that are shown (reasons
    that differ only in their numbers grouped), and what ``(!)`` marks."""
    lines = []
    if lay.variants:
        lines.append("variants: " + "; ".join(f"{k}: {v}" for k, v in lay.variants.items()))
    if line := skipped_line(lay):
        lines.append(line)
    shown = frame[frame["impl"].isin(lay.shown)]
    failed = shown[~shown["status"].isin(MEASURED)]
    if len(failed):
        lines.append("not ok: " + _grouped(failed))
    mismatched = shown[shown["status"].eq("mismatch")]
    if len(mismatched):
        lines.append("(!) disagrees with the float64 reference beyond tolerance: "
                     + _grouped(mismatched, with_status=False))
    elif "agree" in frame.columns and frame["agree"].eq(False).any():
        lines.append("(!) disagrees with the float64 reference beyond tolerance")
    if line := host_bound_line(shown):
        lines.append(line)
    return lines


def host_bound_line(rows: pd.DataFrame) -> str:
    """The footnote of :data:`HOST_MARK`: which implementations have host-bound rows, or ""."""
    if "host_frac" not in rows.columns:
        return ""
    bound = rows[rows["status"].isin(MEASURED) & rows["host_frac"].map(host_bound)]
    if not len(bound):
        return ""
    counts = bound["impl"].astype(str).value_counts(sort=False)
    which = ", ".join(f"{impl} ({n})" for impl, n in counts.items())
    return (f"{HOST_MARK} host-bound: issuing the timed calls took at least "
            f"{HOST_BOUND_FRAC:.0%} of their GPU time (host_frac), so the GPU waited on the "
            f"host and the time measures Python and launches, not the kernels: {which}")


def _grouped(rows: pd.DataFrame, with_status: bool = True) -> str:
    """``impl (n): status: reason`` per implementation and status, reasons that differ only
    in their numbers said once ("and 3 more like it")."""
    reasons = rows.get("reason", pd.Series(index=rows.index, dtype=object)).fillna("").astype(str)
    keyed = rows.assign(reason=reasons, _shape=reasons.map(_shape_of))
    parts = []
    for (impl, status, _), group in keyed.groupby(["impl", "status", "_shape"], sort=True):
        first, more = group["reason"].iloc[0], len(group) - 1
        text = f"{impl} ({len(group)})" + (f": {status}" if with_status else "")
        text += f": {first}" if first else ""
        parts.append(text + (f" (and {more} more like it)" if more and first else ""))
    return "; ".join(parts)


def _shape_of(reason: str) -> str:
    """A reason with its numbers blanked: reasons of one kind share it."""
    return re.sub(r"[-+]?\d[\d.]*(?:e[-+]?\d+)?", "#", reason)
