"""The report's sections, computed from result rows and run environments: claims and verdicts;
per-point results; speedup against a baseline implementation; exponent fits (with local slopes);
time and memory vs n (CI bands, fitted and claimed slopes); absolute TFLOP/s vs n; forward and
backward side by side; time against the other swept variables; throughput heat maps over heads x
d_model; FLOP/s as % of the measured peak and a roofline; per-layer costs (attention vs recurrent
vs conv); agreement errors; history of one suite across runs; row status; the environment. A
section with nothing to show is left out of the page (:mod:`harness.render.page`).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness import fmt
from harness.analysis.claims import load_claims
from harness.analysis.verdicts import evaluate_all, verdict_table
from harness.render import figures as data
from harness.render import figures_perf as perf
from harness.render import figures_roofline as roof
from harness.render import pivot
from harness.render import table as tables
from harness.render.page import Section


def sections(
    rows: pd.DataFrame,
    envs: dict[str, dict],
    claims_path: Path | None,
    baseline: str | None = None,
) -> list[Section]:
    """Every section of the report, in page order, computed from the rows and environments
    (some empty)."""
    return [
        claims_section(rows, claims_path, envs),
        results_section(rows),
        *speedup_sections(rows, baseline),
        *scaling_sections(rows),
        *device_sections(rows, envs),
        *detail_sections(rows, envs),
    ]


def speedup_sections(rows: pd.DataFrame, baseline: str | None) -> list[Section]:
    """Speedup against ``baseline`` (or the preferred one with ok rows); none without one."""
    base = perf.pick_baseline(rows, baseline)
    if not base:
        return []
    speed_table, speed_imgs = perf.speedup(rows, base)
    return [
        Section(
            "speedup",
            f"Speedup vs {base}",
            f"{base}'s median time / each implementation's at the same point shape "
            "(above 1: faster). Interval: the two medians' 95% CIs combined "
            "conservatively. Pick the baseline with report --baseline IMPL.",
            [("speedup", speed_table)],
            speed_imgs,
        )
    ]


def scaling_sections(rows: pd.DataFrame) -> list[Section]:
    """Exponent fits, time, throughput, forward/backward, memory and other variables vs n."""
    fits, time_imgs, mem_imgs, other_imgs = data.scaling(rows)
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
            "Markers: median time, bars and band: its 95% CI; solid: fit over the asymptotic "
            "region; dotted: the claimed exponent with its constant fitted to the same points.",
            images=time_imgs,
        ),
        Section(
            "throughput",
            "Throughput (TFLOP/s) vs sequence length",
            "Useful FLOPs (from the exact kept-pair count) per second; band from the time CI.",
            images=perf.throughput(rows),
        ),
        Section(
            "fwdbwd",
            "Forward and backward side by side",
            "Median time of the forward scenario (left) and forward+backward (right).",
            images=perf.forward_backward(rows),
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
    heat_table, heat_imgs = data.heat(rows)
    flops_table, flops_imgs, roof_imgs = roof.flops(rows, envs)
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
            "Useful FLOP/s against the matmul peak measured once per run (env.json "
            "calibration: best fp32 repeat), and against the roofline min(peak, intensity x "
            "bandwidth). Above 100% means the calibration ran while the machine was busier "
            "than during the row.",
            [("flops", flops_table)],
            flops_imgs,
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
    layer_table, layer_imgs = data.layers(rows)
    hist_table, hist_imgs = perf.run_history(rows, envs)
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
            "Max abs and relative Frobenius error of each implementation's output.",
            images=data.agreement(rows),
        ),
        Section(
            "history",
            "History across runs",
            "Per suite run more than once: each implementation's geometric-mean time over the "
            "points every run measured, oldest run first, and its ratio to the first run.",
            [("history", hist_table)],
            hist_imgs,
        ),
        Section(
            "status",
            "Row status",
            "Rows per scenario, implementation and status, with the first reason given.",
            [("status", status_table(rows))],
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
    metrics = [m for m in ("time_median_s", "tflops_per_s", "peak_mem_bytes") if m in rows]
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


def claims_section(
    rows: pd.DataFrame, claims_path: Path | None, envs: dict | None = None
) -> Section:
    """Each claim's verdict from the claims file (left out when there is none)."""
    intro = (
        "Each claim's verdict: confirmed (interval inside the claimed band), refuted "
        "(outside), inconclusive (interval spans the claim, thin data, missing rows). "
        "Time verdicts use only rows at the claim's saturation fraction of the roofline "
        "(utilization: the range over the rows used); work verdicts fit the cost model's "
        "counts over every swept point (docs/claims.md)."
    )
    if claims_path is None or not Path(claims_path).is_file():
        return Section("claims", "Claims", intro)  # no claims file: left out
    table = verdict_table(evaluate_all(load_claims(claims_path), rows, envs))
    texts = table[["claim", "text", "source"]]
    return Section(
        "claims",
        f"Claims ({Path(claims_path).name})",
        intro,
        [("claims", table), ("claim-texts", texts)],
    )
