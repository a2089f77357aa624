"""Result rows -> the report's performance views (PNG bytes via :mod:`harness.render.plots`, and
the tables beside them): speedup against a baseline implementation, absolute TFLOP/s against n,
forward and backward side by side, and one suite's history across runs."""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness import fmt
from harness.analysis import frames
from harness.render import pivot
from harness.render.draw import Panel, Series
from harness.render.panels import LABEL_DIGITS, series_label
from harness.render.plots import history, lines
from harness.scenarios import interface

BASELINE_PREFERENCE = ("sdpa", "sdpa-flash", "full")  # the default speedup yardstick


def pick_baseline(rows: pd.DataFrame, asked: str | None) -> str | None:
    """``asked`` when given; else the first preferred implementation with ok rows."""
    if asked:
        return asked
    ok = set(rows.loc[rows["status"].eq("ok"), "impl"]) if len(rows) else set()
    return next((b for b in BASELINE_PREFERENCE if b in ok), None)


def _x_split(lay: pivot.Layout) -> tuple[list[str], str | None]:
    """(panel axes, x axis): seq_len is the x axis when it varies."""
    if "seq_len" in lay.rows:
        return [r for r in lay.rows if r != "seq_len"], "seq_len"
    return lay.rows, None


def speedup(rows: pd.DataFrame, baseline: str) -> tuple[pd.DataFrame, list]:
    """Baseline time / each implementation's time per point shape, per scenario: a table
    (with a conservative interval from the two time CIs) and speedup-vs-n panels."""
    tables, panels = [], []
    for scenario, part in rows.groupby("scenario", sort=True):
        part = part.reset_index(drop=True)
        if baseline not in set(part.loc[part["status"].eq("ok"), "impl"]):
            continue
        lay = pivot.layout(part)
        med = pivot.time_pivot(part, lay, "time_median_s")
        if med is None or baseline not in med.columns or med.shape[1] < 2:
            continue
        low = pivot.time_pivot(part, lay, "time_ci_low_s")
        high = pivot.time_pivot(part, lay, "time_ci_high_s")
        ratio = med.rdiv(med[baseline], axis=0).drop(columns=baseline)
        long = ratio.stack().rename("speedup").reset_index().drop(columns="_all", errors="ignore")
        if low is not None and high is not None:
            lo = (1 / high).mul(low[baseline], axis=0).drop(columns=baseline)
            hi = (1 / low).mul(high[baseline], axis=0).drop(columns=baseline)
            long["ci_low"] = lo.stack().reindex(ratio.stack().index).to_numpy()
            long["ci_high"] = hi.stack().reindex(ratio.stack().index).to_numpy()
        tables.append(long.assign(scenario=scenario, baseline=baseline))
        panel_axes, x = _x_split(lay)
        if x is None:
            continue
        for values, sub in _by(long, panel_axes):
            title = ", ".join([str(scenario), *(f"{k}={v}" for k, v in values.items())])
            series = []
            for impl, s in sub.groupby("impl", sort=False):
                s = s.assign(x=pd.to_numeric(s[x])).dropna(subset=["speedup"]).sort_values("x")
                if len(s) >= 1:
                    band = (s["ci_low"], s["ci_high"]) if "ci_low" in s else (None, None)
                    series.append(Series(str(impl), s["x"], s["speedup"], None, None, *band))
            if series:
                panels.append(Panel(title, series[:10]))
    frame = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    if len(frame):
        front = ["scenario", "impl", "baseline"]
        frame = frame[front + [c for c in frame.columns if c not in front]]
    images = []
    if panels:
        ylabel = f"speedup vs {baseline} (x)"
        images.append(
            ("speedup", lines(panels, "seq_len", ylabel, log_y=True, hline=(1, baseline)))
        )
    return frame, images


def _by(frame: pd.DataFrame, keys: list[str]):
    if not keys:
        yield {}, frame
        return
    for values, part in frame.groupby(keys, sort=True):
        values = values if isinstance(values, tuple) else (values,)
        yield dict(zip(keys, values, strict=True)), part


def _series_over_n(part: pd.DataFrame, metric: str, keys: list[str], k: float = 1.0):
    """A series over seq_len per combination of ``keys`` (impl first), median over repeats,
    with the band the time CI implies for a rate (``metric`` x time / CI bound)."""
    agg = frames.aggregate(part, "seq_len", metric, keys)
    scaled = part.assign(
        _lo=pd.to_numeric(part[metric])
        * pd.to_numeric(part["time_median_s"])
        / pd.to_numeric(part.get("time_ci_high_s", part["time_median_s"])),
        _hi=pd.to_numeric(part[metric])
        * pd.to_numeric(part["time_median_s"])
        / pd.to_numeric(part.get("time_ci_low_s", part["time_median_s"])),
    )
    for name, col in (("low", "_lo"), ("high", "_hi")):
        bound = frames.aggregate(scaled, "seq_len", col, keys)[[*keys, "x", "y"]]
        agg = agg.merge(bound.rename(columns={"y": name}), on=[*keys, "x"], how="left")
    out = []
    for values, s in frames.iter_groups(agg, keys):
        band = (s["low"] * k, s["high"] * k)
        out.append(Series(series_label(values), s["x"], s["y"] * k, None, None, *band))
    return out


def throughput(rows: pd.DataFrame) -> list:
    """Absolute useful TFLOP/s against seq_len, a panel per scenario (CI bands from time)."""
    ok = frames.select(rows, "tflops_per_s")
    panels = []
    for scenario, part in ok.groupby("scenario", sort=True):
        if part["seq_len"].nunique() < 2:
            continue
        keys = frames.group_keys(part, "seq_len")
        series = [s for s in _series_over_n(part, "tflops_per_s", keys) if len(s.x) >= 2]
        if series:
            panels.append(Panel(str(scenario), series[:10]))
    if not panels:
        return []
    return [("tflops-vs-seq_len", lines(panels, "seq_len", "useful TFLOP/s", log_y=True))]


def forward_backward(rows: pd.DataFrame) -> list:
    """Forward and forward+backward time against seq_len, side by side, per scenario pair."""
    ok = frames.select(rows, "time_median_s")
    images = []
    for fwd in sorted(set(ok["scenario"])):
        bwd = interface.backward_pair(fwd)
        pair = ok[ok["scenario"].isin([fwd, bwd])]
        if bwd is None or bwd not in set(pair["scenario"]) or pair["seq_len"].nunique() < 2:
            continue
        keys = [k for k in frames.group_keys(pair, "seq_len") if k != "scenario"]
        panel_keys = [k for k in keys if k != "impl"]
        panels = []
        for values, part in _by(pair.assign(**frames.groupable(pair[panel_keys])), panel_keys):
            extra = ", ".join(f"{k}={fmt.number(v, LABEL_DIGITS)}" for k, v in values.items())
            for word in (fwd, bwd):
                side = part[part["scenario"] == word]
                series = _series_over_n(side, "time_median_s", ["impl"], k=1e3) if len(side) else []
                title = f"{word}" + (f" ({extra})" if extra else "")
                panels.append(Panel(title, [s for s in series if len(s.x) >= 2][:10]))
        panels = panels[:12]
        if any(p.series for p in panels):
            images.append(
                (
                    f"forward-backward-{fwd}",
                    lines(panels, "seq_len", "median time (ms)", log_y=True),
                )
            )
    return images


def run_history(rows: pd.DataFrame, envs: dict[str, dict]) -> tuple[pd.DataFrame, list]:
    """Per suite with two or more runs: each implementation's geometric-mean time over the
    points every run measured ok, run by run (oldest first), and its ratio to the first run."""
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
        logs = np.log(pd.to_numeric(part["time_median_s"]))
        gm = np.exp(logs.groupby([part["impl"], part["run_id"]]).mean()).rename("geomean_time_s")
        frame = gm.reset_index()
        first = frame[frame["run_id"] == runs[0]].set_index("impl")["geomean_time_s"]
        frame["vs_first_run"] = frame["geomean_time_s"] / frame["impl"].map(first)
        labels = {r: _run_label(r, envs.get(r, {})) for r in runs}
        frame["run"] = frame["run_id"].map(labels)
        frame["order"] = frame["run_id"].map({r: i for i, r in enumerate(runs)})
        frame = frame.sort_values(["impl", "order"])
        tables.append(frame.drop(columns="order").assign(suite=suite, points=len(common)))
        series = [
            Series(str(impl), s["order"], s["geomean_time_s"] * 1e3)
            for impl, s in frame.groupby("impl", sort=True)
        ]
        title = f"suite {suite}: geometric mean over {len(common)} common points"
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
