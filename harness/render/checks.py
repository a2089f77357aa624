"""The run's own checks, as the report shows them: agreement with the float64 reference
against its tolerance, each suite's history across runs (a slowdown between runs), and the row
status (what failed, was skipped or mismatched, and why)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness import fmt
from harness.analysis import frames
from harness.render.panels import series_by
from harness.render.plots import Panel, Series, history, lines

# error column -> the row column holding the bound it must meet (harness/oracle/agreement.py)
TOLERANCE_COLUMNS = {"max_abs_err": "tolerance", "rel_err": "rel_tolerance"}


def _tolerance_guides(part: pd.DataFrame, metric: str) -> list[Series]:
    """The bound ``metric`` must meet against seq_len, one dashed line per dtype (the median
    over the rows at each n: the bound is k x the naive error + ε, so it moves with n)."""
    col = TOLERANCE_COLUMNS[metric]
    if col not in part:
        return []
    guides = []
    dtypes = part["dtype"] if "dtype" in part else pd.Series("", index=part.index)
    for dtype, rows in part.groupby(dtypes, sort=True):
        bound = pd.to_numeric(rows[col], errors="coerce")
        per_n = bound[bound > 0].groupby(rows["seq_len"]).median()
        if len(per_n):
            label = "tolerance" + (f" ({dtype})" if dtypes.nunique() > 1 else "")
            guides.append(Series(label, per_n.index.to_numpy(float), per_n.to_numpy(float)))
    return guides


def agreement(rows: pd.DataFrame) -> list:
    """Max abs and relative error vs seq_len per scenario (one figure per scenario), each
    panel with the tolerance the errors are judged against."""
    images = []
    for scenario, part in rows.groupby("scenario", sort=True):
        part = part[part["status"].isin(["ok", "mismatch"])] if "status" in part else part
        if "max_abs_err" not in part or part["seq_len"].nunique() < 2:
            continue
        panels = []
        for metric in ("max_abs_err", "rel_err"):
            sub = part[pd.to_numeric(part[metric], errors="coerce") > 0]
            if len(sub):
                keys = frames.group_keys(sub.assign(status="ok"), "seq_len")
                panels.append(
                    Panel(
                        f"{scenario}: {metric}",
                        series_by(sub.assign(status="ok"), metric, keys)[:10],
                        guides=_tolerance_guides(sub, metric),
                    )
                )
        if panels:
            images.append(
                (f"agreement-{scenario}", lines(panels, "seq_len", "error vs float64", log_y=True))
            )
    return images


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
