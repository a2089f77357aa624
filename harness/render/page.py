"""The report's page: ``index.html`` (one self-contained HTML page, plots embedded as base64
PNG, no network resources), ``report.md`` with ``plots/*.png``, and ``tables/*.csv``, written
from a list of :class:`Section` (built by :mod:`harness.render.report`). Numbers in tables are
written by :mod:`harness.fmt`; markdown tables by :func:`harness.fmt.markdown_table`.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pandas as pd

from harness import fmt
from harness.analysis.claims import VERDICTS
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
td.v-inconclusive{background:#f6efd0}td.v-mixed{background:#eadcf5}
td.v-holds-in-part{background:#d8e8f7}
img{max-width:100%;height:auto;border:1px solid #eee;margin:.5em 0;display:block}
nav{line-height:1.8}nav a{margin-right:1em;white-space:nowrap}
.scroll{overflow-x:auto;max-width:100%}.note{color:#666;font-style:italic}
table.env{table-layout:fixed;width:100%}table.env td{overflow-wrap:anywhere}
table.env th:first-child{width:12em}
table.claims{table-layout:fixed;width:100%}
table.claims td{overflow-wrap:anywhere}
table.claims th:nth-child(1){width:18%}table.claims th:nth-child(2){width:7.5em}
table.claims th:nth-child(3){width:19%}
details{margin:.5em 0}ul.notes{font-size:13px;color:#444}
ul.summary{font-size:1.05em}ul.summary li{margin:.3em 0}
"""


FOLD_ROWS = 30
LINE_BREAK = "\ue000"  # a cell's line break through pandas' escaping (a private-use character)
FIXED_LAYOUT = ("environment", "claims")  # tables laid out to the page's width (CSS), no scroll


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
    # table name -> (rows shown open, summary of the rest): the rest is folded on the page
    folds: dict[str, tuple[int, str]] = field(default_factory=dict)
    sentences: list[str] = field(default_factory=list)  # the section's text, a list on the page
    # table name -> the frame the page shows in its place (the CSV keeps the table itself)
    views: dict[str, pd.DataFrame] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return (not any(len(t) for _, t in self.tables) and not self.images
                and not self.sentences)


def _shown(frame: pd.DataFrame) -> pd.DataFrame:
    """Display copy: numbers to 4 significant digits, missing values blank."""
    return frame.astype(object).map(partial(fmt.number, digits=4, missing=""))


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub-flavoured markdown table, numbers to 4 significant digits
    (:func:`harness.fmt.markdown_table` writes it)."""
    return fmt.markdown_table(_shown(frame))


def html_table(frame: pd.DataFrame, css_class: str = "") -> str:
    """An escaped HTML table (verdict cells coloured, numbers right-aligned) that scrolls
    sideways inside its box when too wide."""
    shown = _shown(frame).map(lambda cell: cell.replace("\n", LINE_BREAK))
    out = shown.to_html(index=False, escape=True, border=0, classes=css_class or None)
    out = out.replace(LINE_BREAK, "<br>")  # pandas writes a newline in a cell as a literal \n
    for verdict in VERDICTS:
        css = "v-" + verdict.replace(" ", "-")
        out = out.replace(f"<td>{verdict}</td>", f'<td class="{css}">{verdict}</td>')
    return f'<div class="scroll">{out}</div>'


def _numeric_cells(rendered: str) -> str:
    """Right-align cells that hold a number (``<td>1.23</td>``, ``<td>2.10x</td>``)."""
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
        section_html, section_md = _section(out, s)
        parts += section_html
        md += section_md
    parts.append("</body></html>")
    (out / "report.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    page = out / "index.html"
    page.write_text("\n".join(parts), encoding="utf-8")
    return page


def _section(out: Path, s: Section) -> tuple[list[str], list[str]]:
    """One section as (HTML parts, markdown lines); its CSV tables and PNG plots are written
    under ``out``."""
    parts = [f'<section id="{s.key}"><h2>{html.escape(s.title)}</h2><p>{html.escape(s.intro)}</p>']
    md = [f"## {s.title}", "", s.intro, ""]
    if s.sentences:
        items = "".join(f"<li>{html.escape(t)}</li>" for t in s.sentences)
        parts.append(f'<ul class="summary">{items}</ul>')
        md += [*(f"- {t}" for t in s.sentences), ""]
    for name, table in s.csv_only:
        table.to_csv(out / "tables" / f"{name}.csv", index=False)
        parts.append(f'<p class="note">{len(table)} rows: tables/{name}.csv</p>')
        md += [f"{len(table)} rows: [tables/{name}.csv](tables/{name}.csv)", ""]
    for name, table in s.tables:
        if len(table):
            table.to_csv(out / "tables" / f"{name}.csv", index=False)
            shown = s.views.get(name, table)
            _table(parts, md, name, shown, s.captions.get(name), s.folds.get(name))
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
    return parts, md


def _table(
    parts: list[str],
    md: list[str],
    name: str,
    table: pd.DataFrame,
    caption: str | None,
    fold: tuple[int, str] | None = None,
):
    """Append one table to the HTML parts and markdown lines, under its caption. ``fold`` =
    (k, summary): the first k rows open, the rest folded under the summary; else a long table
    folds whole (its CSV has every row)."""
    visible = table
    css = {"environment": "env"}.get(name, name) if name in FIXED_LAYOUT else ""
    if caption:
        parts.append(f"<h3>{html.escape(caption)}</h3>")
        md += [f"### {caption}", ""]
    if fold is not None and 0 <= fold[0] < len(visible):
        head, rest = visible.iloc[: fold[0]], visible.iloc[fold[0] :]
        if len(head):
            parts.append(_numeric_cells(html_table(head, css)))
            md += [markdown_table(head), ""]
        parts.append(
            f"<details><summary>{html.escape(fold[1])} ({len(rest)})</summary>"
            f"{_numeric_cells(html_table(rest, css))}</details>"
        )
        md += [f"<details><summary>{fold[1]} ({len(rest)})</summary>", "",
               markdown_table(rest), "", "</details>", "", f"CSV: tables/{name}.csv", ""]
        return
    rendered = _numeric_cells(html_table(visible, css))
    if len(visible) > FOLD_ROWS and name != "claims":
        rendered = f"<details><summary>{name}: {len(visible)} rows</summary>{rendered}</details>"
    parts.append(rendered)
    md += [markdown_table(visible), "", f"CSV: tables/{name}.csv", ""]
