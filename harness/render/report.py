"""``attnbench report RUN_DIR... --out DIR``: load the runs, compute every section and write one
self-contained HTML page, ``report.md`` with ``plots/*.png``, and ``tables/*.csv``
(``rows.csv``: every row of every run) with :mod:`harness.render.page`.

The sections, in page order: claims and verdicts (:mod:`harness.render.verdict_views`, the
same verdicts as ``attnbench claims``); per-point results; speedup against a baseline
implementation; exponent fits (with local slopes); time and memory vs n (error bars: 95 % CI
of each median; fitted and claimed slopes); absolute TFLOP/s vs n; forward and backward side by
side; time against the other swept variables; throughput heat maps over heads x d_model; FLOP/s
as % of the measured peak and a roofline; per-layer costs (attention vs recurrent vs conv);
agreement errors against their tolerance; history of one suite across runs; row status; the
environment. A section with nothing to show is left out of the page.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness import fmt
from harness.analysis.claims import DEFAULT_CLAIMS
from harness.errors import CliError
from harness.render import checks, efficiency, pivot, scaling
from harness.render import table as tables
from harness.render.page import Section, write
from harness.render.verdict_views import claims_section
from harness.results import env_or_note, load_runs


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
    return [
        claims_section(rows, claims_path, envs, allow_contended),
        results_section(rows),
        *speedup_sections(rows, baseline),
        *scaling_sections(rows),
        *device_sections(rows, envs),
        *detail_sections(rows, envs),
    ]


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
            "(above 1: faster). Error bars: the two medians' 95% CIs combined "
            "conservatively. Pick the baseline with report --baseline IMPL.",
            [("speedup", speed_table)],
            speed_imgs,
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
            "d_model, heads, window, conv_kernel: the other exponents of the claims.",
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


def detail_sections(rows: pd.DataFrame, envs: dict[str, dict]) -> list[Section]:
    """Per-layer costs, agreement errors, history across runs, row status, environment."""
    layer_table, layer_imgs = scaling.layers(rows)
    hist_table, hist_imgs = checks.run_history(rows, envs)
    return [
        Section(
            "layers",
            "Per-layer cost: attention vs recurrent vs convolution",
            "Mixer time alone inside the block. Dashed lines: textbook FLOP crossover "
            "n = d, exact FLOP crossover with an LSTM (4·d, constants counted), "
            "measured crossover.",
            [("crossover", layer_table)],
            layer_imgs,
        ),
        Section(
            "agreement",
            "Agreement with the float64 reference",
            "Max abs and relative Frobenius error of each implementation's output over the "
            "bound that row must meet (k x a naive same-dtype error + one ulp, so each row has "
            "its own); dashed at 1: a point above it disagrees. Rows judged by the fixed "
            "allclose rule (no per-row bound kept): raw errors beside atol.",
            images=checks.agreement(rows),
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
            [("environment", environment_table(envs))],
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


def environment_table(envs: dict[str, dict]) -> pd.DataFrame:
    """One column per run, one row per env.json field that matters (calibration in readable
    units); fields no run has are left out. Transposed so long values wrap in their cell."""
    cols = {}
    for run_id, env in envs.items():
        cal = env.get("calibration") or {}
        peak, bw = cal.get("matmul_flops_per_s"), cal.get("mem_bandwidth_bytes_per_s")
        cols[run_id] = {
            **{k: env.get(k) for k in ENV_KEYS},
            "matmul peak (GFLOP/s)": fmt.number(peak / 1e9, 4) if peak else None,
            "bandwidth (GB/s)": fmt.number(bw / 1e9, 4) if bw else None,
        }
    frame = pd.DataFrame(cols).dropna(axis=0, how="all")
    return frame.rename_axis("field").reset_index()
