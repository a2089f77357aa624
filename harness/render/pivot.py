"""How a run's points are laid out in a comparison table: one line per point shape, one column
per implementation.

The row axes are the point fields that vary *within* some implementation (``seq_len``,
``causal``, a scenario's setting); fields that differ only *between* implementations (a
suite's ``[[variant]]`` blocks: ``dilated`` at ``dilation = 2``) are said once, in a legend under
the table. An implementation with no measured point (unavailable here) gets no column: one line
under the table counts those points and says why. A point that ran but disagrees with the float64
reference (``mismatch``) is measured: its cell shows the value marked ``(!)``.
"""

from __future__ import annotations

import hashlib
import math
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from harness import bundled, fmt
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
    """Implementations in order of first appearance (:func:`in_suite_order` sorts the rows)."""
    return list(dict.fromkeys(frame["impl"].astype(str)))


def natural_key(value) -> tuple:
    """A sort key that orders numbers numerically, also the numbers inside a comma-separated
    value (a window ``127,0`` before ``1023,0``): missing values (None, NaN, ``-``) first, then
    numbers, then text; values of mixed kinds stay comparable."""
    if isinstance(value, bool):
        return ((1, float(value)),)
    if isinstance(value, int | float) or hasattr(value, "item"):
        number = float(value)
        return ((0,),) if math.isnan(number) else ((1, number),)
    if fmt.is_missing(value):
        return ((0,),)
    parts = []
    for part in str(value).split(","):
        part = part.strip()
        try:
            number = float(part)
        except ValueError:
            parts.append((0,) if part in ("", fmt.MISSING) else (2, part))
            continue
        parts.append((0,) if math.isnan(number) else (1, number))
    return tuple(parts)


def sort_key(column: pd.Series) -> pd.Series:
    """``column`` as the ranks of :func:`natural_key` (for ``sort_values(key=...)``)."""
    keys = [natural_key(v) for v in column]
    rank = {k: i for i, k in enumerate(sorted(set(keys)))}
    return pd.Series([rank[k] for k in keys], index=column.index)


def declared_impls(path: Path) -> list[str]:
    """The implementations a suite file declares, in its order: ``implementations``, then
    each ``[[variant]]``'s implementation not listed there ([] when unreadable)."""
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return []
    listed = doc.get("implementations", [])
    variants = doc.get("variant", [])
    named = [*(listed if isinstance(listed, list) else []),
             *(v.get("implementation") for v in variants if isinstance(v, dict))]
    return list(dict.fromkeys(n for n in named if isinstance(n, str)))


def suite_order(envs: Iterable[dict]) -> list[str]:
    """The implementations of the runs' suites in declared order, first run first. A run's
    suite is the file env.json names when it is unchanged (same ``suite_fingerprint``), else
    the bundled suite of the run's ``suite`` name (a run from another machine), else none."""
    order: list[str] = []
    for env in envs:
        named = Path(str(env.get("suite_path") or ""))
        try:
            same = named.is_file() and (
                hashlib.sha256(named.read_bytes()).hexdigest() == env.get("suite_fingerprint"))
        except OSError:
            same = False
        default = bundled(f"{env.get('suite')}.toml") if env.get("suite") else None
        source = named if same else default
        order += declared_impls(source) if source is not None else []
    return list(dict.fromkeys(order))


def in_suite_order(frame: pd.DataFrame, envs: Iterable[dict] = ()) -> pd.DataFrame:
    """``frame``'s rows by implementation in the suites' declared order (:func:`suite_order`;
    implementations no suite declares follow, by name), then by point (its fields in schema
    order, numbers numerically): not the shuffled order the passes ran in. Stable: rows of
    one point keep their run order."""
    if not len(frame) or "impl" not in frame.columns:
        return frame
    declared = suite_order(envs)
    names = frame["impl"].astype(str)
    rest = sorted(set(names) - set(declared))
    rank = {impl: i for i, impl in enumerate([*declared, *rest])}
    keys = ["_impl_rank", *(c for c in POINT_COLUMNS if c != "impl" and c in frame.columns)]
    ranked = frame.assign(_impl_rank=names.map(rank))
    ordered = ranked.sort_values(keys, key=sort_key, kind="stable")
    return ordered.drop(columns="_impl_rank").reset_index(drop=True)


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
    table = keyed.pivot_table(
        index=list(axes.columns), columns="impl", values="_v", aggfunc="median"
    )
    return table.sort_index(key=_level_key)  # numbers as numbers: 256 before 1024


def _level_key(level: pd.Index) -> pd.Index:
    """One index level as the ranks of :func:`natural_key` (``sort_index(key=...)``)."""
    return pd.Index(sort_key(pd.Series(list(level))).to_numpy())


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
