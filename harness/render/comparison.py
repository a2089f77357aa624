"""A comparison (:class:`~harness.compare.findings.Comparison`) as people read it: a rich table
(the terminal's width on a terminal, never cut in a file or a pipe), a markdown summary for CI
(e.g. ``$GITHUB_STEP_SUMMARY``) and one summary line.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness import fmt
from harness.compare.findings import Comparison, Finding
from harness.fmt import markdown_table
from harness.terminal import console as make_console

_MARK = {"fail": "FAIL", "warn": "warn", "info": "info", "ok": "ok"}
_STYLE = {"fail": "bold red", "warn": "yellow", "info": "cyan", "ok": "dim"}
_COLUMNS = ("", "point", "metric", "baseline", "current", "change", "verdict")
BASIS_TEXT = {
    "normalized": "normalized, time / ref_kernel_s",
    "absolute": "absolute time",
    "cpu": "CPU time / ref_kernel_cpu_s",
    "cpu+normalized": "CPU time / ref_kernel_cpu_s for one-thread rows, else time / ref_kernel_s",
    "cpu+absolute": "CPU time / ref_kernel_cpu_s for one-thread rows, else absolute time",
}


def _cells(f: Finding) -> tuple[str, ...]:
    return (_MARK[f.level], f.label, f.metric, f.baseline, f.current, f.change, f.verdict)


def _shown(result: Comparison, show_all: bool) -> list[Finding]:
    """The findings a table lists: all of them with ``show_all``, else those not ``ok``."""
    return [f for f in result.findings if show_all or f.level != "ok"]


def summary(result: Comparison) -> str:
    """One line: regressions or not, and the counts."""
    fails, warns = result.count("fail"), result.count("warn")
    head = f"{fails} regression{'s' * (fails != 1)}" if fails else "no regressions"
    basis = BASIS_TEXT.get(result.time_basis, result.time_basis)
    return (
        f"{head}, {warns} warning{'s' * (warns != 1)} over {fmt.plural(result.points, 'point')} "
        f"(time gate: {basis})"
    )


def print_table(result: Comparison, show_all: bool = False, console: Console | None = None) -> None:
    """The warnings, the findings (all of them with ``show_all``, else those not ``ok``) as a
    rich table, and the summary line."""
    console = console or make_console()
    for note in result.warnings:
        console.print(f"[yellow]warning:[/] {escape(note)}")
    rows = _shown(result, show_all)
    if rows:
        table = Table(title=f"{result.baseline} -> {result.current}")
        for column in _COLUMNS:
            table.add_column(column, overflow="fold")
        for f in rows:
            table.add_row(*(escape(c) for c in _cells(f)), style=_STYLE[f.level])
        console.print(table)
    style = "bold red" if result.exit_code else "bold green"
    console.print(f"[{style}]{escape(summary(result))}[/]")


def markdown(result: Comparison, show_all: bool = False) -> str:
    """A markdown summary for CI: verdict, summary line, the two runs, warnings, findings."""
    verdict = "regressed" if result.exit_code else "passed"
    lines = [
        f"### attnbench compare: {verdict}",
        "",
        f"**{summary(result)}**",
        "",
        f"- baseline: `{result.baseline}` ({result.baseline_machine or 'no env.json'})",
        f"- current: `{result.current}` ({result.current_machine or 'no env.json'})",
    ]
    lines += [f"- warning: {note}" for note in result.warnings]
    rows = _shown(result, show_all)
    if rows:
        frame = pd.DataFrame([_cells(f) for f in rows], columns=list(_COLUMNS))
        lines += ["", markdown_table(frame)]
    return "\n".join(lines) + "\n"


def write_markdown(result: Comparison, path: Path, show_all: bool = False) -> None:
    """:func:`markdown` into ``path`` (its folder is created)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(markdown(result, show_all), encoding="utf-8")
