"""The run's own checks, as the report shows them: agreement with the float64 reference
against its tolerance, each suite's history across runs (a slowdown between runs), and the row
status (what failed, was skipped or mismatched, and why)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness import fmt
from harness.analysis import frames
from harness.render.panels import series_by
from harness.render.plots import Panel, Series, history, lines

# error column -> the row column holding the bound it must meet (harness/oracle/agreement.py)
TOLERANCE_COLUMNS = {"max_abs_err": "tolerance", "rel_err": "rel_tolerance"}
ERRORS = ("max_abs_err", "rel_err")
OWN_BOUND = "each row's own bound"


def over_bound(rows: pd.DataFrame, metric: str) -> pd.Series:
    """Each row's ``metric`` over the bound that row was judged against (<= 1: within it; the
    bound is k x the naive same-dtype error + one ulp, so it differs from row to row). NaN for
    a row that keeps no such bound: only rows judged by the naive-relative rule carry both
    ``tolerance`` and ``rel_tolerance``; the fixed allclose rule's ``tolerance`` is its atol,
    and its bound, atol + rtol·|ref|, is per element."""
    nothing = pd.Series(np.nan, index=rows.index)
    if not {metric, *TOLERANCE_COLUMNS.values()} <= set(rows.columns):
        return nothing
    bound = pd.to_numeric(rows[TOLERANCE_COLUMNS[metric]], errors="coerce")
    judged = pd.to_numeric(rows["rel_tolerance"], errors="coerce").gt(0) & bound.gt(0)
    return (pd.to_numeric(rows[metric], errors="coerce") / bound).where(judged)


def _atol_guides(part: pd.DataFrame) -> list[Series]:
    """The allclose rule's atol against seq_len, one dashed line per dtype (each element must
    be within atol + rtol·|ref|, so an agreeing row's max abs error may pass atol by
    rtol·max|ref|)."""
    if "tolerance" not in part:
        return []
    guides = []
    dtypes = part["dtype"] if "dtype" in part else pd.Series("", index=part.index)
    for dtype, rows in part.groupby(dtypes, sort=True):
        bound = pd.to_numeric(rows["tolerance"], errors="coerce")
        per_n = bound[bound > 0].groupby(rows["seq_len"]).median()
        if len(per_n):
            label = "atol (+ rtol·|ref| per element)" + (
                f" ({dtype})" if dtypes.nunique() > 1 else "")
            guides.append(Series(label, per_n.index.to_numpy(float), per_n.to_numpy(float)))
    return guides


def _panel(title: str, rows: pd.DataFrame, column: str, guides: list[Series]) -> Panel | None:
    """Series of ``column`` over seq_len (rows with a positive value), one per point shape."""
    sub = rows[pd.to_numeric(rows[column], errors="coerce") > 0].assign(status="ok")
    if not len(sub):
        return None
    keys = frames.group_keys(sub, "seq_len")
    return Panel(title, series_by(sub, column, keys)[:10], guides=guides)


@dataclass
class Figure:
    """One figure's data before drawing: its name, panels, y label and horizontal line."""

    name: str
    panels: list[Panel]
    ylabel: str
    hline: tuple[float, str] | None = None


def agreement_figures(rows: pd.DataFrame) -> list[Figure]:
    """Per scenario, each row's max abs and relative error over its own bound against seq_len,
    with the line at 1 (a row above it disagrees); rows judged by the fixed allclose rule
    (no per-row bound kept) as raw errors beside their atol, in a figure of their own."""
    figures = []
    for scenario, part in rows.groupby("scenario", sort=True):
        part = part[part["status"].isin(["ok", "mismatch"])] if "status" in part else part
        if "max_abs_err" not in part or part["seq_len"].nunique() < 2:
            continue
        ratios = part.assign(**{f"{m}_over_bound": over_bound(part, m) for m in ERRORS})
        bounded = ratios["max_abs_err_over_bound"].notna()
        own = [_panel(f"{scenario}: {m} / its bound", ratios[bounded], f"{m}_over_bound", [])
               for m in ERRORS]
        if any(own):
            figures.append(Figure(f"agreement-{scenario}", [p for p in own if p],
                                  "error / the row's own bound", (1.0, f"1 = {OWN_BOUND}")))
        rest = part[~bounded]
        fixed = [_panel(f"{scenario}: {m}", rest, m,
                        _atol_guides(rest) if m == "max_abs_err" else [])
                 for m in ERRORS if m in rest]
        if any(fixed):
            figures.append(Figure(f"agreement-{scenario}-allclose", [p for p in fixed if p],
                                  "error vs float64"))
    return figures


def agreement(rows: pd.DataFrame) -> list[tuple[str, bytes]]:
    """The agreement figures (:func:`agreement_figures`) as (name, PNG bytes)."""
    return [(f.name, lines(f.panels, "seq_len", f.ylabel, log_y=True, hline=f.hline))
            for f in agreement_figures(rows)]


def run_history(rows: pd.DataFrame, envs: dict[str, dict]) -> tuple[pd.DataFrame, list]:
    """Per suite with two or more runs: each implementation's geometric-mean time over its
    points that every run measured ok (``points``: how many, per implementation), run by run
    (oldest first), and its ratio to the first run."""
    tables, images = [], []
    if not {"run_id", "suite", "point_id"} <= set(rows.columns):
        return pd.DataFrame(), []
    ok = frames.select(rows, "time_median_s")
    for suite, part in ok.groupby("suite", sort=True):
        runs = sorted(set(part["run_id"]), key=lambda r: str(envs.get(r, {}).get("started_utc")))
        if len(runs) < 2:
            continue
        per_run = [set(part.loc[part["run_id"] == r, "point_id"]) for r in runs]
        common = set.intersection(*per_run)
        if not common:
            continue
        part = part[part["point_id"].isin(common)]
        points = part.groupby("impl")["point_id"].nunique()
        logs = np.log(pd.to_numeric(part["time_median_s"]))
        gm = np.exp(logs.groupby([part["impl"], part["run_id"]]).mean()).rename("geomean_time_s")
        frame = gm.reset_index()
        first = frame[frame["run_id"] == runs[0]].set_index("impl")["geomean_time_s"]
        frame["vs_first_run"] = frame["geomean_time_s"] / frame["impl"].map(first)
        labels = {r: _run_label(r, envs.get(r, {})) for r in runs}
        frame["run"] = frame["run_id"].map(labels)
        frame["order"] = frame["run_id"].map({r: i for i, r in enumerate(runs)})
        frame["points"] = frame["impl"].map(points)
        frame = frame.sort_values(["impl", "order"])
        tables.append(frame.drop(columns="order").assign(suite=suite))
        series = [
            Series(f"{impl} ({fmt.plural(points[impl], 'point')})", s["order"],
                   s["geomean_time_s"] * 1e3)
            for impl, s in frame.groupby("impl", sort=True)
        ]
        title = f"suite {suite}: geometric mean over the points every run measured"
        images.append(
            (
                f"history-{suite}",
                history([labels[r] for r in runs], series[:10], "geomean time (ms)", title),
            )
        )
    out = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    if len(out):
        out = out[["suite", "impl", "run", "run_id", "points", "geomean_time_s", "vs_first_run"]]
    return out, images


def _run_label(run_id: str, env: dict) -> str:
    sha = env.get("git_sha")
    when = str(env.get("started_utc") or "")[:16].replace("T", " ")
    parts = [p for p in (when, (sha or "")[:8] + ("+" if env.get("git_dirty") else "")) if p]
    return " ".join(parts) or run_id


def status_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows per (scenario, impl, status) with the first reason given."""
    if not len(rows) or "status" not in rows:
        return pd.DataFrame(columns=["scenario", "impl", "status", "rows", "reason"])
    frame = rows.assign(reason=rows.get("reason", pd.Series(index=rows.index, dtype=object)))
    return (
        frame.groupby(["scenario", "impl", "status"], sort=True, dropna=False)
        .agg(rows=("status", "size"), reason=("reason", "first"))
        .reset_index()
    )
