"""``attnbench report RUN_DIR... --out DIR``: one self-contained HTML page (plots embedded as
base64 PNG, no network resources), ``report.md`` with ``plots/*.png``, and ``tables/*.csv``.

Sections: claims and verdicts; exponent fits (with local slopes); time and memory vs n (fitted
and claimed slopes drawn); time against the other swept variables; throughput heat maps over
heads x d_model; FLOP/s as % of the device's measured peak and of the roofline; per-layer costs
(attention vs recurrent vs conv, measured vs FLOP crossover); agreement errors; row status; the
environment. Sections without rows say so instead of disappearing.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from harness import figures as data
from harness.claims import DEFAULT_CLAIMS, load_claims, load_run_rows

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1200px;
 color:#222;padding:0 1em}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;font-size:12px;margin:.5em 0 1em}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.v-confirmed{background:#d9f2d9}td.v-refuted{background:#f7d4d4}
td.v-inconclusive{background:#f6efd0}img{max-width:100%;border:1px solid #eee;margin:.5em 0}
nav a{margin-right:1em}.scroll{overflow-x:auto}.note{color:#666;font-style:italic}
details{margin:.5em 0}
"""


FOLD_ROWS = 30
# columns kept in the CSV but not shown on the page (shown in another table)
HIDDEN = {"claims": ("text", "source", "kind")}


@dataclass
class Section:
    """One report section: a paragraph, tables (also written as CSV) and figures."""

    key: str
    title: str
    intro: str
    tables: list[tuple[str, pd.DataFrame]] = field(default_factory=list)
    images: list[tuple[str, bytes]] = field(default_factory=list)
    note: str = ""


def _fmt(frame: pd.DataFrame) -> pd.DataFrame:
    """Display copy: floats to 4 significant digits, missing values blank."""

    def cell(v):
        if isinstance(v, float):
            return "" if pd.isna(v) else f"{v:.4g}"
        return "" if v is None else v

    return frame.astype(object).map(cell)


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub-flavoured markdown table (no tabulate dependency)."""
    shown = _fmt(frame)
    esc = [[str(v).replace("|", "\\|").replace("\n", " ") for v in row] for row in shown.values]
    head = "| " + " | ".join(str(c) for c in shown.columns) + " |"
    rule = "|" + "---|" * len(shown.columns)
    return "\n".join([head, rule, *("| " + " | ".join(r) + " |" for r in esc)])


def html_table(frame: pd.DataFrame) -> str:
    """An escaped HTML table (verdict cells coloured) that scrolls sideways when too wide."""
    out = _fmt(frame).to_html(index=False, escape=True, border=0)
    for verdict in ("confirmed", "refuted", "inconclusive"):
        out = out.replace(f"<td>{verdict}</td>", f'<td class="v-{verdict}">{verdict}</td>')
    return f'<div class="scroll">{out}</div>'


def sections(rows: pd.DataFrame, envs: dict[str, dict], claims_path: Path | None) -> list[Section]:
    """Every section of the report, computed from the rows and environments."""
    out = [_claims_section(rows, claims_path, envs)]
    fits, time_imgs, mem_imgs, other_imgs = data.scaling(rows)
    out.append(
        Section(
            "fits",
            "Exponent fits",
            "Slope of log(metric) against log(variable) over the asymptotic region "
            "(x_lo..x_hi, chosen by harness.analysis), 95% bootstrap interval; "
            "'claimed' is the implementation's declared exponent in n.",
            [("fits", fits)] if len(fits) else [],
            note=_empty(fits, "no sweep"),
        )
    )
    out.append(
        Section(
            "time",
            "Time vs sequence length",
            "Markers: median time; solid: fit; dotted: claimed slope through the largest point.",
            images=time_imgs,
            note="" if time_imgs else "No rows sweep seq_len.",
        )
    )
    out.append(
        Section(
            "memory",
            "Peak memory vs sequence length",
            "Peak bytes above the pre-call baseline.",
            images=mem_imgs,
            note="" if mem_imgs else "No rows sweep seq_len with peak memory.",
        )
    )
    out.append(
        Section(
            "axes",
            "Time vs other swept variables",
            "d_model, heads, window, conv_kernel: the other exponents of the claims.",
            images=other_imgs,
            note="" if other_imgs else "No rows sweep another variable.",
        )
    )
    heat_table, heat_imgs = data.heat(rows)
    out.append(
        Section(
            "heatmaps",
            "Throughput over heads x d_model",
            "tokens/s (higher is better) at fixed n.",
            [("throughput", heat_table)] if len(heat_table) else [],
            heat_imgs,
            note="" if heat_imgs else "No rows sweep heads and d_model together.",
        )
    )
    flops_table, flops_imgs = data.flops(rows, envs)
    out.append(
        Section(
            "flops",
            "FLOP/s as % of device peak",
            "Useful FLOP/s against the matmul "
            "peak measured once per run (env.json calibration: best fp32 repeat), and "
            "against the roofline min(peak, intensity x bandwidth). Above 100% means the "
            "calibration ran while the machine was busier than during the row.",
            [("flops", flops_table)] if len(flops_table) else [],
            flops_imgs,
            note=_empty(flops_table, "no FLOP/s or no calibration"),
        )
    )
    layer_table, layer_imgs = data.layers(rows)
    out.append(
        Section(
            "layers",
            "Per-layer cost: attention vs recurrent vs convolution",
            "Mixer time alone inside the block. Dashed lines: textbook FLOP crossover "
            "n = d, exact FLOP crossover with an LSTM (4·d, constants counted), "
            "measured crossover.",
            [("crossover", layer_table)] if len(layer_table) else [],
            layer_imgs,
            note=_empty(layer_table, "no block rows with mixers"),
        )
    )
    err_imgs = data.agreement(rows)
    out.append(
        Section(
            "agreement",
            "Agreement with the float64 reference",
            "Max abs and relative Frobenius error of each implementation's output.",
            images=err_imgs,
            note="" if err_imgs else "No agreement errors in rows.",
        )
    )
    out.append(
        Section(
            "status",
            "Row status",
            "Points that did not produce numbers and why.",
            [("status", status_table(rows))],
        )
    )
    out.append(
        Section(
            "environment",
            "Environment",
            "env.json of each run.",
            [("environment", environment_table(envs))],
        )
    )
    return out


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
    """One row per run: the env.json fields that matter, and the calibration in readable units."""
    out = []
    for run_id, env in envs.items():
        cal = env.get("calibration") or {}
        peak, bw = cal.get("matmul_flops_per_s"), cal.get("mem_bandwidth_bytes_per_s")
        out.append(
            {
                "run_id": run_id,
                **{k: env.get(k) for k in ENV_KEYS},
                "matmul_peak_gflops": peak / 1e9 if peak else None,
                "bandwidth_gb_s": bw / 1e9 if bw else None,
            }
        )
    return pd.DataFrame(out).dropna(axis=1, how="all")


def _empty(frame: pd.DataFrame, what: str) -> str:
    return "" if len(frame) else f"Nothing to show ({what})."


def _claims_section(
    rows: pd.DataFrame, claims_path: Path | None, envs: dict | None = None
) -> Section:
    from harness.verdicts import evaluate_all, verdict_table

    intro = (
        "Each claim's verdict: confirmed (interval inside the claimed band), refuted "
        "(outside), inconclusive (interval spans the claim, thin data, missing rows). "
        "Time verdicts use only rows at the claim's saturation fraction of the roofline "
        "(utilization: the range over the rows used); work verdicts fit the cost model's "
        "counts over every swept point (docs/claims.md)."
    )
    if claims_path is None or not Path(claims_path).is_file():
        return Section("claims", "Claims", intro, note=f"No claims file ({claims_path}).")
    table = verdict_table(evaluate_all(load_claims(claims_path), rows, envs))
    texts = table[["claim", "text", "source"]]
    return Section(
        "claims",
        f"Claims ({Path(claims_path).name})",
        intro,
        [("claims", table), ("claim-texts", texts)],
    )


def write(out: Path, secs: list[Section], title: str, runs: list[str]) -> Path:
    """Write index.html, report.md, tables/*.csv and plots/*.png under ``out``."""
    for sub, pattern in (("tables", "*.csv"), ("plots", "*.png")):  # ours: no stale files
        (out / sub).mkdir(parents=True, exist_ok=True)
        for stale in (out / sub).glob(pattern):
            stale.unlink()
    nav = " ".join(f'<a href="#{s.key}">{html.escape(s.title)}</a>' for s in secs)
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
        f"</title><style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>",
        f"<p>Runs: {html.escape(', '.join(runs))}</p><nav>{nav}</nav>",
    ]
    md = [f"# {title}", "", f"Runs: {', '.join(runs)}", ""]
    for s in secs:
        parts.append(
            f'<section id="{s.key}"><h2>{html.escape(s.title)}</h2><p>{html.escape(s.intro)}</p>'
        )
        md += [f"## {s.title}", "", s.intro, ""]
        if s.note:
            parts.append(f'<p class="note">{html.escape(s.note)}</p>')
            md += [f"*{s.note}*", ""]
        for name, table in s.tables:
            table.to_csv(out / "tables" / f"{name}.csv", index=False)
            shown = table.drop(columns=list(HIDDEN.get(name, ())))
            rendered = html_table(shown)
            if len(shown) > FOLD_ROWS and name != "claims":  # long tables fold (CSV has all)
                rendered = (
                    f"<details><summary>{name}: {len(shown)} rows</summary>{rendered}</details>"
                )
            parts.append(rendered)
            md += [markdown_table(shown), "", f"CSV: tables/{name}.csv", ""]
        for name, image in s.images:
            (out / "plots" / f"{name}.png").write_bytes(image)
            b64 = base64.b64encode(image).decode("ascii")
            parts.append(f'<img alt="{html.escape(name)}" src="data:image/png;base64,{b64}">')
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
) -> Path:
    """Load the runs, compute every section, write the files; returns the HTML page's path."""
    from harness.results import ResultsError, load_env

    rows = load_run_rows(run_dirs)
    envs = {}
    for run_dir in run_dirs:
        try:
            env = load_env(run_dir)
        except ResultsError:
            env = {"run_id": Path(run_dir).name, "note": "no env.json"}
        envs[str(env.get("run_id", Path(run_dir).name))] = env
    runs = [
        f"{Path(d).name} ({e.get('suite', '?')})"
        for d, e in zip(run_dirs, envs.values(), strict=False)
    ]
    return write(Path(out), sections(rows, envs, claims_path), title, runs)


def add_cli(subparsers) -> None:
    """Add ``attnbench report RUN_DIR [RUN_DIR...] --out DIR [--claims FILE]``."""
    p = subparsers.add_parser("report", help="HTML + markdown + CSV report of run directories")
    p.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    p.add_argument("--out", type=Path, required=True, help="report directory (created)")
    p.add_argument("--claims", type=Path, default=DEFAULT_CLAIMS, help="claims TOML to judge")
    p.add_argument("--title", default="attnbench report")
    p.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    page = build_report(args.run_dirs, args.out, args.claims, args.title)
    print(f"report: {page}")
    return 0
