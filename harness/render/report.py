"""``attnbench report RUN_DIR... --out DIR``: load the runs, compute every section and write one
self-contained HTML page, ``report.md`` with ``plots/*.png``, and ``tables/*.csv``
(``rows.csv``: every row of every run) with :mod:`harness.render.page`.

The sections, in page order: claims and verdicts (:mod:`harness.render.verdict_views`, the
same verdicts as ``attnbench claims``); per-point results; speedup against a baseline
implementation; exponent fits (with local slopes); time and memory vs n (error bars: 95 % CI
of each median; fitted and claimed slopes); absolute TFLOP/s vs n; forward and backward side by
side; time against the other swept variables; throughput heat maps over heads x d_model; FLOP/s
as % of the measured peak and a roofline; the panels each scenario declares
(``Scenario.panels``); agreement errors against their tolerance; history of one suite across
runs; row status; the environment. A section with nothing to show is left out of the page.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness import fmt
from harness.analysis.claims import DEFAULT_CLAIMS
from harness.errors import CliError
from harness.render import checks, efficiency, pivot, scaling, summary
from harness.render import table as tables
from harness.render.page import Section, write
from harness.render.verdict_views import claims_section, judge_file
from harness.results import env_or_note, load_runs
from harness.scenarios import interface


def build_report(
    run_dirs: list[Path],
    out: Path,
    claims_path: Path | None = DEFAULT_CLAIMS,
    title: str = "attnbench report",
    baseline: str | None = None,
    allow_contended: bool = False,
) -> Path:
    """Load the runs, compute every section, write the files; returns the HTML page's path.
    ``allow_contended``: rows measured under contention count in time verdicts too."""
    envs, runs = {}, []
    for run_dir in run_dirs:
        env = env_or_note(run_dir)
        envs[str(env.get("run_id", Path(run_dir).name))] = env
        runs.append(f"{Path(run_dir).name} ({env.get('suite', '?')})")
    rows = pivot.in_suite_order(load_runs(run_dirs), envs.values())
    if baseline is not None and baseline not in set(rows.get("impl", ())):
        raise CliError(f"--baseline {baseline}: no rows of it in these runs")
    secs = sections(rows, envs, claims_path, baseline, allow_contended)
    return write(Path(out), secs, title, runs)


def sections(
    rows: pd.DataFrame,
    envs: dict[str, dict],
    claims_path: Path | None,
    baseline: str | None = None,
    allow_contended: bool = False,
) -> list[Section]:
    """Every section of the report, in page order, computed from the rows and environments
    (some empty)."""
    judged = judge_file(rows, claims_path, envs, allow_contended)
    return [
        summary_section(rows, baseline, judged, claims_path),
        claims_section(rows, claims_path, envs, allow_contended, judged),
        results_section(rows),
        *speedup_sections(rows, baseline),
        *scaling_sections(rows),
        *device_sections(rows, envs),
        *detail_sections(rows, envs),
    ]


def summary_section(rows: pd.DataFrame, baseline: str | None, judged, claims_path) -> Section:
    """The answer first: a few sentences from the rows and verdicts (:mod:`summary`)."""
    verdicts = judged[1] if judged else None
    name = Path(claims_path).name if claims_path is not None else ""
    base = efficiency.pick_baseline(rows, baseline)
    return Section(
        "summary",
        "Summary",
        "Computed from the rows below: the fastest implementation per band of sizes, the "
        "speedups, memory, agreement with the float64 reference and the claims' verdicts.",
        sentences=summary.sentences(rows, base, verdicts, name),
    )


def speedup_sections(rows: pd.DataFrame, baseline: str | None) -> list[Section]:
    """Speedup against ``baseline`` (or the preferred one with ok rows); none without one."""
    base = efficiency.pick_baseline(rows, baseline)
    if not base:
        return []
    speed_table, speed_imgs = efficiency.speedup(rows, base)
    return [
        Section(
            "speedup",
            f"Speedup vs {base}",
            f"{base}'s median time / each implementation's at the same point shape "
            "(above 1: faster), with its interval in brackets (error bars: the two medians' "
            "95% CIs combined conservatively). Pick the baseline with report --baseline IMPL.",
            [("speedup-by-point", efficiency.speedup_by_point(speed_table))],
            speed_imgs,
            csv_only=[("speedup", speed_table)] if len(speed_table) else [],
        )
    ]


def scaling_sections(rows: pd.DataFrame) -> list[Section]:
    """Exponent fits, time, throughput, forward/backward, memory and other variables vs n."""
    fits, time_imgs, mem_imgs, other_imgs = scaling.scaling(rows)
    return [
        Section(
            "fits",
            "Exponent fits",
            "Slope of log(metric) against log(variable) over the asymptotic region "
            "(x_lo..x_hi, chosen by harness.analysis.fits), 95% bootstrap interval; "
            "'claimed' is the implementation's declared exponent in n.",
            [("fits", fits)],
        ),
        Section(
            "time",
            "Time vs sequence length",
            "Markers: median time; error bars: its 95% CI; solid: fit over the asymptotic "
            "region; dotted: the claimed exponent with its constant fitted to the same points.",
            images=time_imgs,
        ),
        Section(
            "throughput",
            "Throughput (TFLOP/s) vs sequence length",
            "Useful FLOPs (from the exact kept-pair count) per second; error bars from the "
            "time's 95% CI.",
            images=efficiency.throughput(rows),
        ),
        Section(
            "fwdbwd",
            "Forward and backward side by side",
            "Median time of the forward scenario (left) and forward+backward (right).",
            images=scaling.forward_backward(rows),
        ),
        Section(
            "memory",
            "Peak memory vs sequence length",
            "Peak bytes one call adds above its inputs (MiB or GiB).",
            images=mem_imgs,
        ),
        Section(
            "axes",
            "Time vs other swept variables",
            "d_model, heads, window, document_len and each scenario's own axes: the other "
            "exponents of the claims.",
            images=other_imgs,
        ),
    ]


def device_sections(rows: pd.DataFrame, envs: dict[str, dict]) -> list[Section]:
    """Throughput heat maps, FLOP/s against the measured peak, and the roofline."""
    heat_table, heat_imgs = efficiency.heat(rows)
    flops_table, flops_imgs, roof_imgs, beaten = efficiency.flops(rows, envs)
    return [
        Section(
            "heatmaps",
            "Throughput over heads x d_model",
            "tokens/s (higher is better) at fixed n; only complete grids are drawn.",
            [("throughput", heat_table)],
            heat_imgs,
        ),
        Section(
            "flops",
            "FLOP/s as % of device peak",
            "FLOP/s of the timed call (the cost model's executed FLOPs) against the matmul "
            "peak measured once per run (env.json calibration: best repeat, scaled by the "
            "row's threads), and against the roofline min(peak, intensity x bandwidth): the "
            "utilization the verdicts quote. Above 100% the calibration is beaten: it measured "
            "less than the row achieved (it ran while the machine was busier), and is flagged.",
            [("flops", flops_table)],
            flops_imgs,
            notes=beaten,
        ),
        Section(
            "roofline",
            "Roofline",
            "Achieved useful TFLOP/s against arithmetic intensity (useful FLOPs per compulsory "
            "byte moved: inputs read, output written), under the roofs calibrated in env.json "
            "(measured matmul peak, measured copy bandwidth).",
            images=roof_imgs,
        ),
    ]


def scenario_sections(rows: pd.DataFrame) -> list[Section]:
    """The panels each scenario declares (``Scenario.panels``), drawn from its rows, scenario
    by scenario in folder order."""
    out = []
    for scenario in interface.each_scenario():
        mine = rows[rows["scenario"].isin(list(scenario.serves))] if len(rows) else rows
        for spec in scenario.panels:
            tables_, images = scaling.panel(mine, spec)
            out.append(Section(spec.key, spec.title, spec.caption, tables_, images))
    return out


def detail_sections(rows: pd.DataFrame, envs: dict[str, dict]) -> list[Section]:
    """The scenarios' panels, agreement errors, history across runs, row status, environment."""
    hist_table, hist_imgs = checks.run_history(rows, envs)
    return [
        *scenario_sections(rows),
        Section(
            "agreement",
            "Agreement with the float64 reference",
            "Max abs and relative Frobenius error of each implementation's output over the "
            "bound that row must meet (k x a naive same-dtype error + one ulp, so each row has "
            "its own); dashed at 1: a point above it disagrees. Rows judged by the fixed "
            "allclose rule (no per-row bound kept): raw errors beside atol. The table: per "
            "implementation, rows checked, rows that agree, the largest errors and the "
            "largest error over its row's bound (at most 1 to agree).",
            [("agreement", summary.agreement_table(rows))],
            images=checks.agreement(rows),
            sentences=[s for s in [summary.agreement(rows)] if s],
        ),
        Section(
            "history",
            "History across runs",
            "Per suite run more than once: each implementation's geometric-mean time over its "
            "points that every run measured (points: how many), oldest run first, and its "
            "ratio to the first run.",
            [("history", hist_table)],
            hist_imgs,
        ),
        Section(
            "status",
            "Row status",
            "Rows per scenario, implementation and status, with the first reason given.",
            [("status", checks.status_table(rows))],
        ),
        Section(
            "environment",
            "Environment",
            "env.json of each run (one column per run).",
            [("environment", environment_table(envs, rows))],
        ),
    ]


def results_section(rows: pd.DataFrame) -> Section:
    """Per-point results: the comparison tables of ``attnbench table`` (one per scenario) and
    every row as CSV."""
    section = Section(
        "results",
        "Results per point",
        "One line per point shape, one column per implementation (as attnbench table). "
        "Every row of every run: tables/rows.csv.",
    )
    if not len(rows) or "impl" not in rows.columns:
        return section
    section.csv_only.append(("rows", rows.drop(columns=["time_samples_s"], errors="ignore")))
    if "partial" in rows:
        partial = rows["partial"].eq(True)
        for run_id, count in rows.loc[partial, "run_id"].fillna("?").value_counts().items():
            section.notes.append(
                f"run {run_id} was interrupted: {count} of its points come from their finished "
                "timing passes only (partial = true and passes in tables/rows.csv); "
                "attnbench run SUITE --out DIR --resume finishes it")
    shown = ("time_median_s", "tflops_per_s", "peak_mem_bytes", *tables.WHEN_PRESENT)
    metrics = [m for m in shown if m in rows]
    for scenario, part in rows.groupby("scenario", sort=True):
        part = part.reset_index(drop=True)
        lay = pivot.layout(part)
        if not lay.shown:
            section.notes.append(f"{scenario}: no ok point")
            continue
        for metric in metrics:
            name = f"results-{scenario}-{metric}".replace("+", "-")
            section.tables.append((name, tables.cells(part, metric, lay)))
            section.captions[name] = f"{scenario}: {tables.title(metric)}"
        section.notes += [f"{scenario}: {n}" for n in pivot.notes(part, lay)]
    return section


ENV_KEYS = (
    "suite",
    "device_name",
    "threads",
    "torch",
    "torch_cuda",
    "python",
    "platform",
    "git_sha",
    "git_dirty",
    "harness_version",
    "started_utc",
    "fingerprint",
    "note",
)


def environment_table(envs: dict[str, dict], rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """One column per run, one row per env.json field that matters (calibration in readable
    units), and the machine's load: at the start (env.json) and while the points ran (the
    rows' ``load_avg_1m`` and ``contended``); fields no run has are left out. Transposed so
    long values wrap in their cell."""
    cols = {}
    for run_id, env in envs.items():
        cal = env.get("calibration") or {}
        peak, bw = cal.get("matmul_flops_per_s"), cal.get("mem_bandwidth_bytes_per_s")
        cols[run_id] = {
            **{k: env.get(k) for k in ENV_KEYS},
            "matmul peak (GFLOP/s)": fmt.number(peak / 1e9, 4) if peak else None,
            "bandwidth (GB/s)": fmt.number(bw / 1e9, 4) if bw else None,
            **_load(env, rows, run_id),
        }
    frame = pd.DataFrame(cols).dropna(axis=0, how="all")
    return frame.rename_axis("field").reset_index()


def _load(env: dict, rows: pd.DataFrame | None, run_id: str) -> dict:
    """The load a run ran under: the 1/5/15-minute load average at its start, the 1-minute
    load over its points (lowest–highest) and how many points were measured under
    contention."""
    out: dict = {}
    start = env.get("loadavg_start")
    if isinstance(start, list | tuple) and start:
        out["load at start (1/5/15 min)"] = " / ".join(fmt.number(v, 3) for v in start)
    if rows is None or not len(rows) or "run_id" not in rows.columns:
        return out
    mine = rows[rows["run_id"].astype(str) == run_id]
    if "load_avg_1m" in mine.columns:
        load = pd.to_numeric(mine["load_avg_1m"], errors="coerce").dropna()
        if len(load):
            lo, hi = fmt.number(load.min(), 3), fmt.number(load.max(), 3)
            out["load during points (1 min)"] = lo if lo == hi else f"{lo}–{hi}"
    if "contended" in mine.columns:
        flagged = mine["contended"].eq(True)
        out["points measured under contention"] = f"{int(flagged.sum())} of {len(mine)}"
    return out
