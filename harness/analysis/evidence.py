"""The rows a claim is about, and the rows left out of its time evidence: rows measured under
contention (unless allowed) and host-bound rows (``host_frac`` >= 0.5: the GPU waited on the
host). Memory claims and work verdicts are allocations and analytic counts that neither
changes, so they keep every row. A claim without rows says why (none at all, none that pass
its filters, or none with a value on its axis).
"""

from __future__ import annotations

from dataclasses import fields

import pandas as pd

from harness import fmt
from harness.analysis.claims import Claim
from harness.analysis.frames import DERIVED, column, match_mask, select, with_derived
from harness.measure.contention import contended_mask
from harness.measure.timing import HOST_BOUND_FRAC

__all__ = ["ALLOW_CONTENDED", "HOST_WORDS", "Evidence", "describe", "dropped_points",
           "host_bound", "left_out", "missing", "missing_reason", "subject_rows"]
ALLOW_CONTENDED = "--allow-contended"


def subject_rows(df: pd.DataFrame, claim: Claim, baseline: bool = False) -> pd.DataFrame:
    """Rows the claim (or its baseline) is about, any status: the filters hold (columns the
    rows lack read as their schema default) and the row has a value on the claim's axis (a
    run without packed documents is not about a claim over ``document_len``)."""
    where = dict(claim.where)
    if baseline and claim.baseline_where is not None:
        where = dict(claim.baseline_where)
    impl = claim.baseline if baseline else claim.impl
    if impl is not None:
        where["impl"] = impl
    if claim.scenario is not None:
        where["scenario"] = claim.scenario
    out = df if df.attrs.get(DERIVED) else with_derived(df)  # only read: rows selected below
    x = pd.to_numeric(column(out, claim.over), errors="coerce")
    keep = x.notna().to_numpy(dtype=bool, copy=True)
    for col, value in where.items():  # every test is row by row: one mask, one selection
        keep &= match_mask(out, col, value)
    if claim.range is not None:
        keep &= ((x >= claim.range[0]) & (x <= claim.range[1])).to_numpy(bool, na_value=False)
    return out[keep]


def describe(claim: Claim, baseline: bool = False) -> str:
    """The row filter of a claim (or its baseline) in words, e.g. ``impl=full, scenario=decode``."""
    where = claim.baseline_where if baseline and claim.baseline_where is not None else claim.where
    impl = claim.baseline if baseline else claim.impl
    parts = {"impl": impl, "scenario": claim.scenario, **where}
    return ", ".join(f"{k}={v}" for k, v in parts.items() if v is not None) or "any rows"


def missing_reason(rows: pd.DataFrame, claim: Claim, who: str) -> str:
    """Why a claim has nothing to measure: no rows, or rows that did not produce the metric."""
    if not len(rows):
        return f"missing rows: none for {who}"
    if "status" in rows.columns and not rows["status"].eq("ok").any():
        reasons = rows.get("reason", pd.Series(dtype=str)).dropna().astype(str).unique()[:2]
        return (
            f"missing rows: {who} rows are {sorted(rows['status'].unique())}: {'; '.join(reasons)}"
        )
    return f"missing rows: {who} rows have no positive {claim.metric}"


HOST_WORDS = "host-bound: the GPU waits on the host"


def host_bound(rows: pd.DataFrame) -> pd.Series:
    """Rows whose timed calls kept the GPU waiting on the host: ``host_frac`` (host issue time
    over GPU event time) >= :data:`~harness.measure.timing.HOST_BOUND_FRAC`, the one threshold
    the tables mark too; absent or null = not host-bound."""
    frac = pd.to_numeric(column(rows, "host_frac"), errors="coerce")
    return frac.ge(HOST_BOUND_FRAC).fillna(False).astype(bool)


class Evidence:
    """The ok rows of one side of a claim; rows measured under contention, and host-bound rows,
    left out of time evidence."""

    def __init__(self, rows: pd.DataFrame, claim: Claim, allow: bool, who: str):
        ok = select(rows, claim.metric)
        flagged = (
            contended_mask(ok) if claim.timed and not allow else pd.Series(False, index=ok.index)
        )
        host = host_bound(ok) & ~flagged if claim.timed else pd.Series(False, index=ok.index)
        self.rows, self.left_out = ok[~flagged & ~host], int(flagged.sum())
        self.host_bound = int(host.sum())
        self.host_note = _host_note(ok[host], claim) if self.host_bound else ""
        if not len(ok):
            self.why = missing_reason(rows, claim, who)
        elif not len(self.rows) and self.host_bound:
            self.why = f"no time verdict: {HOST_WORDS} (every {who} row: {self.host_note})"
        elif not len(self.rows):
            example = ok.get("contention", pd.Series(dtype=object)).dropna().astype(str)
            self.why = (
                f"no time verdict: every {who} row ({len(ok)}) was measured under contention"
                + (f" (e.g. {example.iloc[0]})" if len(example) else "")
                + f"; re-run on a quiet machine, or judge them anyway with {ALLOW_CONTENDED}"
            )
        else:
            self.why = ""


def _host_note(rows: pd.DataFrame, claim: Claim) -> str:
    """``host_frac 0.6–0.9 at seq_len 1024..4096``: the host-bound rows in words."""
    frac = pd.to_numeric(rows["host_frac"], errors="coerce")
    x = pd.to_numeric(column(rows, claim.over), errors="coerce")
    lo, hi = fmt.number(frac.min(), 2), fmt.number(frac.max(), 2)
    span = lo if lo == hi else f"{lo}–{hi}"
    where = f"{x.min():g}" if x.min() == x.max() else f"{x.min():g}..{x.max():g}"
    return f"host_frac {span} at {claim.over} {where}"


def left_out(*sides: Evidence) -> dict:
    """Rows left out of time evidence on the sides of a claim: contended, host-bound."""
    notes = [e.host_note for e in sides if e.host_note]
    return {"contended_left_out": sum(e.left_out for e in sides),
            "host_bound_left_out": sum(e.host_bound for e in sides),
            "host_note": "; ".join(notes)}


def missing(df: pd.DataFrame, claim: Claim) -> str:
    """Why a claim has no rows: none at all, none that pass its filters, or rows that pass them
    but have no value on its axis (a run without packed documents, for ``document_len``)."""
    if not len(df):
        return "missing rows: no rows at all"
    who = describe(claim)
    bare = subject_rows(df, Claim(**{**_fields(claim), "over": "seq_len", "range": None}))
    if len(bare) and claim.over != "seq_len":
        return f"missing rows: the {len(bare)} {who} rows have no {claim.over}"
    return missing_reason(bare.iloc[0:0], claim, who)


def dropped_points(df: pd.DataFrame, claim: Claim) -> str:
    """The values of the claim's axis that its rows have and its evidence cannot use, and why:
    ``seq_len 256 (outside the claim's range 512..4096)``; ``""`` when none. What a "thin data"
    line adds, so a reader sees why a run with three sizes gave a fit two points."""
    if not len(df):
        return ""
    bare = subject_rows(df, Claim(**{**_fields(claim), "range": None}))
    x = pd.to_numeric(column(bare, claim.over), errors="coerce")
    ok = column(bare, "status").eq("ok") & (
        pd.to_numeric(column(bare, claim.metric), errors="coerce") > 0
    )
    why: dict[str, list[float]] = {}
    for value in sorted(set(x.dropna())):
        if claim.range is not None and not claim.range[0] <= value <= claim.range[1]:
            words = f"outside the claim's range {claim.range[0]:g}..{claim.range[1]:g}"
        elif claim.min_x is not None and value < claim.min_x:
            words = f"below the claim's min_x {claim.min_x:g}"
        elif not ok[x == value].any():
            statuses = sorted(column(bare, "status")[x == value].dropna().astype(str).unique())
            words = f"no ok row with a {claim.metric} ({', '.join(statuses) or 'no status'})"
        else:
            continue
        why.setdefault(words, []).append(value)
    return "; ".join(f"{claim.over} {', '.join(f'{v:g}' for v in values)} ({words})"
                     for words, values in why.items())


def _fields(claim: Claim) -> dict:
    return {f.name: getattr(claim, f.name) for f in fields(claim)}
