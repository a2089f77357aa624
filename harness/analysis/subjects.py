"""The rows a claim is about: its subject (and baseline) rows, described in words, and the
subject and baseline points matched one to one for ratio and crossover claims."""

from __future__ import annotations

import pandas as pd

from harness.analysis.claims import Claim
from harness.analysis.frames import (
    KEY_FIELDS,
    MISSING,
    aggregate,
    groupable,
    iter_groups,
    select,
    with_derived,
)


def subject_rows(df: pd.DataFrame, claim: Claim, baseline: bool = False) -> pd.DataFrame:
    """Rows the claim (or its baseline) is about, before the status/metric filter."""
    where = dict(claim.where)
    if baseline and claim.baseline_where is not None:
        where = dict(claim.baseline_where)
    impl = claim.baseline if baseline else claim.impl
    if impl is not None:
        where["impl"] = impl
    if claim.scenario is not None:
        where["scenario"] = claim.scenario
    out = with_derived(df)
    for col, value in where.items():
        if col not in out.columns:
            return out.iloc[0:0]
        out = out[groupable(out[[col]])[col].eq(MISSING if value is None else value)]
    if claim.range is not None and claim.over in out.columns:
        x = pd.to_numeric(out[claim.over], errors="coerce")
        out = out[(x >= claim.range[0]) & (x <= claim.range[1])]
    return out


def describe(claim: Claim, baseline: bool = False) -> str:
    """The row filter of a claim (or its baseline) in words, e.g. ``impl=full, scenario=decode``."""
    where = claim.baseline_where if baseline and claim.baseline_where is not None else claim.where
    impl = claim.baseline if baseline else claim.impl
    parts = {"impl": impl, "scenario": claim.scenario, **where}
    return ", ".join(f"{k}={v}" for k, v in parts.items() if v is not None) or "any rows"


def missing_reason(rows: pd.DataFrame, claim: Claim, who: str) -> str:
    """Why a claim has nothing to fit: no rows, or rows that did not produce the metric."""
    if not len(rows):
        return f"missing rows: none for {who}"
    if "status" in rows.columns and not rows["status"].eq("ok").any():
        reasons = rows.get("reason", pd.Series(dtype=str)).dropna().astype(str).unique()[:2]
        return (
            f"missing rows: {who} rows are {sorted(rows['status'].unique())}: {'; '.join(reasons)}"
        )
    return f"missing rows: {who} rows have no positive {claim.metric}"


def group_label(values: dict) -> str:
    """A fitted group in words, e.g. ``causal=True, heads=8`` (``impl`` left out)."""
    return ", ".join(f"{k}={v}" for k, v in values.items() if k != "impl") or "all rows"


def matched(df: pd.DataFrame, claim: Claim) -> tuple[list[tuple[dict, pd.DataFrame]], str]:
    """Subject and baseline points matched point by point (every other point field equal):
    per group, (``{key: value}`` plus ``"_first"``: the group's first row as a dict, the
    merged points: keys, ``x``, and ``y_s``/``samples_s`` (subject), ``y_b``/``samples_b``
    (baseline) of :func:`~harness.analysis.frames.aggregate`), or ([], why there are none)."""
    sub_rows, base_rows = subject_rows(df, claim), subject_rows(df, claim, baseline=True)
    sub, base = select(sub_rows, claim.metric), select(base_rows, claim.metric)
    if not len(sub):
        return [], missing_reason(sub_rows, claim, describe(claim))
    if not len(base):
        return [], missing_reason(base_rows, claim, describe(claim, baseline=True))
    filters = set(claim.where) | set(claim.baseline_where or {})
    skip = filters | {"impl", "mixer", "point_id", claim.over}
    keys = [c for c in KEY_FIELDS if c in sub.columns and c in base.columns and c not in skip]
    merged = aggregate(sub, claim.over, claim.metric, keys).merge(
        aggregate(base, claim.over, claim.metric, keys),
        on=[*keys, "x"],
        suffixes=("_s", "_b"),
    )
    if not len(merged):
        return [], f"missing rows: no {claim.baseline} row matches a {claim.impl} point"
    varying = [k for k in keys if merged[k].nunique() > 1 or k in claim.hold]
    out = []
    for values, part in iter_groups(merged, varying):
        out.append(({**values, "_first": part.iloc[0].to_dict()}, part))
    return out, ""
