"""``attnbench report RUN_DIR... --out DIR``: one self-contained HTML page (plots embedded as
base64 PNG, no network resources), ``report.md`` with ``plots/*.png``, and ``tables/*.csv``
(``rows.csv``: every row of every run).

Sections: claims and verdicts; per-point results; speedup against a baseline implementation;
exponent fits (with local slopes); time and memory vs n (CI bands, fitted and claimed slopes);
absolute TFLOP/s vs n; forward and backward side by side; time against the other swept
variables; throughput heat maps over heads x d_model; FLOP/s as % of the measured peak and a
roofline; per-layer costs (attention vs recurrent vs conv); agreement errors; history of one
suite across runs; row status; the environment. A section with nothing to show is left out;
the page says which in one line.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from harness.analysis.claims import DEFAULT_CLAIMS, load_claims
from harness.analysis.runs import load_run_rows
from harness.render import figures as data
from harness.render import figures_perf as perf
from harness.render import markdown
from harness.render import table as tables
from harness.render.plots import css_width

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1120px;
 color:#222;padding:0 1em;line-height:1.4}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;font-size:13px;margin:.5em 0 1em}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f3f3f3}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.v-confirmed{background:#d9f2d9}td.v-refuted{background:#f7d4d4}
td.v-inconclusive{background:#f6efd0}
img{max-width:100%;height:auto;border:1px solid #eee;margin:.5em 0;display:block}
nav{line-height:1.8}nav a{margin-right:1em;white-space:nowrap}
.scroll{overflow-x:auto;max-width:100%}.note{color:#666;font-style:italic}
table.env{table-layout:fixed;width:100%}table.env td{overflow-wrap:anywhere}
table.env th:first-child{width:12em}
details{margin:.5em 0}ul.notes{font-size:13px;color:#444}
"""


FOLD_ROWS = 30
# columns kept in the CSV but not shown on the page (shown in another table)
HIDDEN = {"claims": ("text", "source", "kind")}


@dataclass
class Section:
    """One report section: a paragraph, tables (also written as CSV), figures, note lines."""

    key: str
    title: str
    intro: str
    tables: list[tuple[str, pd.DataFrame]] = field(default_factory=list)
    images: list[tuple[str, bytes]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    csv_only: list[tuple[str, pd.DataFrame]] = field(default_factory=list)
    captions: dict[str, str] = field(default_factory=dict)  # table name -> caption

    @property
    def empty(self) -> bool:
        return not any(len(t) for _, t in self.tables) and not self.images


def _fmt(frame: pd.DataFrame) -> pd.DataFrame:
    """Display copy: floats to 4 significant digits, missing values blank."""

    def cell(v):
        if isinstance(v, float):
            return "" if pd.isna(v) else f"{v:.4g}"
        return "" if v is None else v

    return frame.astype(object).map(cell)


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub-flavoured markdown table, numbers to 4 significant digits
    (:func:`harness.render.markdown.table` writes it)."""
    return markdown.table(_fmt(frame))


def html_table(frame: pd.DataFrame, css_class: str = "") -> str:
    """An escaped HTML table (verdict cells coloured, numbers right-aligned) that scrolls
    sideways inside its box when too wide."""
    shown = _fmt(frame)
    out = shown.to_html(index=False, escape=True, border=0, classes=css_class or None)
    for verdict in ("confirmed", "refuted", "inconclusive"):
        out = out.replace(f"<td>{verdict}</td>", f'<td class="v-{verdict}">{verdict}</td>')
    return f'<div class="scroll">{out}</div>'


def sections(
    rows: pd.DataFrame,
    envs: dict[str, dict],
    claims_path: Path | None,
    baseline: str | None = None,
) -> list[Section]:
    """Every section of the report, computed from the rows and environments (some empty)."""
    out = [_claims_section(rows, claims_path, envs), _results_section(rows)]
    base = perf.pick_baseline(rows, baseline)
    if base:
        speed_table, speed_imgs = perf.speedup(rows, base)
        out.append(
            Section(
                "speedup",
                f"Speedup vs {base}",
                f"{base}'s median time / each implementation's at the same point shape "
                "(above 1: faster). Interval: the two medians' 95% CIs combined "
                "conservatively. Pick the baseline with report --baseline IMPL.",
                [("speedup", speed_table)],
                speed_imgs,
            )
        )
    fits, time_imgs, mem_imgs, other_imgs = data.scaling(rows)
    out += [
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
    heat_table, heat_imgs = data.heat(rows)
    out.append(
        Section(
            "heatmaps",
            "Throughput over heads x d_model",
            "tokens/s (higher is better) at fixed n; only complete grids are drawn.",
            [("throughput", heat_table)],
            heat_imgs,
        )
    )
    flops_table, flops_imgs, roof_imgs = data.flops(rows, envs)
    out += [
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
    layer_table, layer_imgs = data.layers(rows)
    out.append(
        Section(
            "layers",
            "Per-layer cost: attention vs recurrent vs convolution",
            "Mixer time alone inside the block. Dashed lines: textbook FLOP crossover "
            "n = d, exact FLOP crossover with an LSTM (4·d, constants counted), "
            "measured crossover.",
            [("crossover", layer_table)],
            layer_imgs,
        )
    )
    out.append(
        Section(
            "agreement",
            "Agreement with the float64 reference",
            "Max abs and relative Frobenius error of each implementation's output.",
            images=data.agreement(rows),
        )
    )
    hist_table, hist_imgs = perf.run_history(rows, envs)
    out.append(
        Section(
            "history",
            "History across runs",
            "Per suite run more than once: each implementation's geometric-mean time over the "
            "points every run measured, oldest run first, and its ratio to the first run.",
            [("history", hist_table)],
            hist_imgs,
        )
    )
    out.append(
        Section(
            "status",
            "Row status",
            "Rows per scenario, implementation and status, with the first reason given.",
            [("status", status_table(rows))],
        )
    )
    out.append(
        Section(
            "environment",
            "Environment",
            "env.json of each run (one column per run).",
            [("environment", environment_table(envs))],
        )
    )
    return out


def _results_section(rows: pd.DataFrame) -> Section:
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
        lay = tables.layout(part)
        if not lay.shown:
            section.notes.append(f"{scenario}: no ok point")
            continue
        for metric in metrics:
            name = f"results-{scenario}-{metric}".replace("+", "-")
            section.tables.append((name, tables.cells(part, metric, lay)))
            section.captions[name] = f"{scenario}: {tables.title(metric)}"
        section.notes += [f"{scenario}: {n}" for n in tables.notes(part, lay)]
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
            "matmul peak (GFLOP/s)": f"{peak / 1e9:.4g}" if peak else None,
            "bandwidth (GB/s)": f"{bw / 1e9:.4g}" if bw else None,
        }
    frame = pd.DataFrame(cols).dropna(axis=0, how="all")
    return frame.rename_axis("field").reset_index()


def _claims_section(
    rows: pd.DataFrame, claims_path: Path | None, envs: dict | None = None
) -> Section:
    from harness.analysis.verdicts import evaluate_all, verdict_table

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


def _numeric_cells(rendered: str) -> str:
    """Right-align cells that hold a number (``<td>1.23</td>``, ``<td>2.10x</td>``)."""
    import re

    return re.sub(
        r"<td>(-?[0-9][0-9.,e+\-]*(?: ?[x%])?(?: \(!\))?)</td>",
        r'<td class="num">\1</td>',
        rendered,
    )


def write(out: Path, secs: list[Section], title: str, runs: list[str]) -> Path:
    """Write index.html, report.md, tables/*.csv and plots/*.png under ``out``; sections
    with nothing to show are left out (listed in one line)."""
    for sub, pattern in (("tables", "*.csv"), ("plots", "*.png")):  # ours: no stale files
        (out / sub).mkdir(parents=True, exist_ok=True)
        for stale in (out / sub).glob(pattern):
            stale.unlink()
    shown = [s for s in secs if not s.empty]
    left_out = [s.title for s in secs if s.empty]
    nav = " ".join(f'<a href="#{s.key}">{html.escape(s.title)}</a>' for s in shown)
    parts = [
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>",
        f"<p>Runs: {html.escape(', '.join(runs))}</p><nav>{nav}</nav>",
    ]
    md = [f"# {title}", "", f"Runs: {', '.join(runs)}", ""]
    if left_out:
        line = "Not shown (nothing to show for these runs): " + ", ".join(left_out) + "."
        parts.append(f'<p class="note">{html.escape(line)}</p>')
        md += [f"*{line}*", ""]
    for s in shown:
        parts.append(
            f'<section id="{s.key}"><h2>{html.escape(s.title)}</h2><p>{html.escape(s.intro)}</p>'
        )
        md += [f"## {s.title}", "", s.intro, ""]
        for name, table in s.csv_only:
            table.to_csv(out / "tables" / f"{name}.csv", index=False)
            parts.append(f'<p class="note">{len(table)} rows: tables/{name}.csv</p>')
            md += [f"{len(table)} rows: [tables/{name}.csv](tables/{name}.csv)", ""]
        for name, table in s.tables:
            if not len(table):
                continue
            table.to_csv(out / "tables" / f"{name}.csv", index=False)
            visible = table.drop(columns=list(HIDDEN.get(name, ())))
            css = "env" if name == "environment" else ""
            rendered = _numeric_cells(html_table(visible, css))
            caption = s.captions.get(name)
            if caption:
                parts.append(f"<h3>{html.escape(caption)}</h3>")
                md += [f"### {caption}", ""]
            if len(visible) > FOLD_ROWS and name != "claims":  # long tables fold (CSV has all)
                rendered = (
                    f"<details><summary>{name}: {len(visible)} rows</summary>{rendered}</details>"
                )
            parts.append(rendered)
            md += [markdown_table(visible), "", f"CSV: tables/{name}.csv", ""]
        if s.notes:
            items = "".join(f"<li>{html.escape(n)}</li>" for n in s.notes)
            parts.append(f'<ul class="notes">{items}</ul>')
            md += [*(f"- {n}" for n in s.notes), ""]
        for name, image in s.images:
            (out / "plots" / f"{name}.png").write_bytes(image)
            b64 = base64.b64encode(image).decode("ascii")
            parts.append(
                f'<img alt="{html.escape(name)}" width="{css_width(image)}" '
                f'src="data:image/png;base64,{b64}">'
            )
            md += [f"![{name}](plots/{name}.png)", ""]
        parts.append("</section>")
    parts.append("</body></html>")
    (out / "report.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    page = out / "index.html"
    page.write_text("\n".join(parts), encoding="utf-8")
    return page


def build_report(
    run_dirs: list[Path],
    out: Path,
    claims_path: Path | None = DEFAULT_CLAIMS,
    title: str = "attnbench report",
    baseline: str | None = None,
) -> Path:
    """Load the runs, compute every section, write the files; returns the HTML page's path."""
    from harness.results import ResultsError, load_env

    rows = load_run_rows(run_dirs)
    envs, runs = {}, []
    for run_dir in run_dirs:
        try:
            env = load_env(run_dir)
        except ResultsError:
            env = {"run_id": Path(run_dir).name, "note": "no env.json"}
        envs[str(env.get("run_id", Path(run_dir).name))] = env
        runs.append(f"{Path(run_dir).name} ({env.get('suite', '?')})")
    if baseline is not None and baseline not in set(rows.get("impl", ())):
        from harness.errors import CliError

        raise CliError(f"--baseline {baseline}: no rows of it in these runs")
    return write(Path(out), sections(rows, envs, claims_path, baseline), title, runs)


def add_cli(subparsers) -> None:
    """Add ``attnbench report RUN_DIR [RUN_DIR...] --out DIR [--claims FILE]``."""
    p = subparsers.add_parser("report", help="HTML + markdown + CSV report of run directories")
    p.add_argument(
        "run_dirs",
        nargs="+",
        type=Path,
        metavar="RUN_DIR",
        help="run directories; several runs of one suite also get a history section",
    )
    p.add_argument("--out", type=Path, required=True, help="report directory (created)")
    p.add_argument("--claims", type=Path, default=DEFAULT_CLAIMS, help="claims TOML to judge")
    p.add_argument(
        "--baseline",
        metavar="IMPL",
        help="speedups against this implementation (default: sdpa, sdpa-flash or "
        "full, the first with ok rows)",
    )
    p.add_argument(
        "--history",
        type=Path,
        nargs="+",
        metavar="RUN_DIR",
        default=[],
        help="earlier runs or baselines of the same suite(s), added to the report "
        "(history across runs)",
    )
    p.add_argument("--title", default="attnbench report")
    p.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    runs = list(dict.fromkeys([*args.history, *args.run_dirs]))  # oldest first, no repeats
    page = build_report(runs, args.out, args.claims, args.title, args.baseline)
    print(f"report: {page}")
    return 0
