"""``attnbench compare BASELINE_DIR CURRENT_DIR``: regression checks between two runs, for CI.

Rows are matched by point (every :class:`~harness.sweep.point.Point` field, via its stable id),
never
by position. Per point and metric a :class:`Finding` with a level:

- ``fail``: a regression (exit status 1): status ok -> error/oom/mismatch/timeout/skipped, a
  missing point, peak memory above the threshold, ``agree`` going false or the error passing
  the tolerance, and a time regression by the noise-aware rule of :mod:`harness.compare.regression`
  (with ``--time-gate report``, only one whose whole confidence interval is above
  ``--time-fail`` and that stands out of the suite's run-to-run scatter; with ``--confirm``,
  only one that reproduces in the other runs; the rest are ``warn``);
  times are compared in the basis ``--time-basis`` picks: ``normalized`` (per reference-kernel
  time, ``ref_kernel_s``: survives a machine that is uniformly slower today), ``absolute``, or
  ``auto`` (normalized when every timed row of both runs has a reference time); the table's
  last line says which basis the gate used;
- ``warn`` / ``info``: reported, never fail (slower within noise, faster, new points, fixes);
- ``ok``: unchanged.

Rows flagged ``contended`` (measured while other processes took the CPU or GPU, see
:mod:`harness.measure.contention`) are still compared -- the normalized basis and the pass structure
are what make their times usable -- but the output says how many there were.

Exit 0 when nothing failed, 1 on any regression, 2 on unusable input (a :class:`CliError`).
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from harness.compare.baseline import add_baseline_cli, fingerprint
from harness.compare.regression import (
    BASES,
    LEVELS,
    CompareOptions,
    Finding,
    has_reference,
    parse_amount,
    parse_checks,
    point_findings,
    time_finding,
    time_scatter,
)
from harness.errors import CliError
from harness.measure import contention
from harness.results import ENV_FILE, ResultsError, load_env, load_rows
from harness.sweep.point import point_from_row


@dataclass(frozen=True)
class Comparison:
    """All findings of one comparison plus warnings about the inputs."""

    baseline: str
    current: str
    baseline_fingerprint: str
    current_fingerprint: str
    findings: tuple[Finding, ...]
    warnings: tuple[str, ...]
    points: int
    time_basis: str = "absolute"

    def count(self, level: str) -> int:
        return sum(f.level == level for f in self.findings)

    @property
    def exit_code(self) -> int:
        return 1 if self.count("fail") else 0


class CompareError(CliError):
    """Unusable compare input (exit status 2)."""


def _clean(value):
    return None if isinstance(value, float) and math.isnan(value) else value


def _index(run_dir: Path, notes: list[str]) -> dict[str, dict]:
    """point_id -> row (the last row wins when a point repeats)."""
    try:
        frame = load_rows(run_dir)
    except (ValueError, OSError) as exc:  # ResultsError is a ValueError
        raise CompareError(str(exc)) from None
    if frame.empty or "impl" not in frame.columns:
        raise CompareError(f"{run_dir}: no result rows (or rows without an 'impl' column)")
    index: dict[str, dict] = {}
    for number, raw in enumerate(frame.to_dict("records"), 1):
        row = {k: _clean(v) for k, v in raw.items()}
        try:
            point = point_from_row(row)
        except (TypeError, ValueError) as exc:
            raise CompareError(f"{run_dir}: row {number} is not a valid point ({exc})") from None
        if point.point_id in index:
            notes.append(f"{run_dir}: point {point.label()} appears more than once; using the last")
        index[point.point_id] = {**row, "_label": point.label()}
    return index


def _env(run_dir: Path, notes: list[str]) -> dict:
    if not (Path(run_dir) / ENV_FILE).is_file():
        notes.append(f"{run_dir}: no {ENV_FILE}; fingerprints cannot be checked")
        return {}
    try:
        return load_env(run_dir)
    except ResultsError as exc:
        raise CompareError(str(exc)) from None


def _peak_scale(base_env: dict, cur_env: dict) -> float:
    """current peak / baseline peak: multiplies current times into baseline-machine seconds."""
    peaks = [(e.get("calibration") or {}).get("matmul_flops_per_s") for e in (base_env, cur_env)]
    if not all(isinstance(p, (int, float)) and p > 0 for p in peaks):
        raise CompareError("--normalize-peak needs calibration.matmul_flops_per_s in both env.json")
    return peaks[1] / peaks[0]


def _env_notes(base: dict, cur: dict, opts: CompareOptions) -> list[str]:
    """Warnings when the two runs were not measured alike."""
    notes = []
    if fingerprint(base) != fingerprint(cur):
        hint = "" if opts.normalize_peak else "; consider --normalize-peak"
        notes.append(
            f"device fingerprints differ: baseline {fingerprint(base)!r}, current "
            f"{fingerprint(cur)!r}: times and CPU memory may not be comparable{hint}"
        )
    if base.get("torch") != cur.get("torch"):
        notes.append(
            f"torch versions differ ({base.get('torch')} vs {cur.get('torch')}): "
            "CPU memory figures (profiler allocation events) may differ slightly"
        )
    if base.get("suite") != cur.get("suite"):
        notes.append(f"suites differ: {base.get('suite')!r} vs {cur.get('suite')!r}")
    return notes


def _load(run_dir: Path, notes: list[str]) -> tuple[dict[str, dict], dict]:
    """A run's rows by point id and its env.json; row warnings (truncated lines) become notes."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = _index(Path(run_dir), notes)
    notes += [str(w.message) for w in caught]
    return rows, _env(Path(run_dir), notes)


def _scatter(runs: Sequence[tuple], opts: CompareOptions, what: str, notes: list[str]):
    """Run-to-run time scatter (largest over the run pairs ``((rows, env), (rows, env))``);
    None unless the report gate uses it. Rows timed in several shuffled passes need no
    scatter: a burst shows up in their own intervals, as disagreement between passes."""
    if opts.time_gate != "report":
        return None
    if all(_in_passes(rows) for pair in runs for rows, _ in pair):
        return None
    values = []
    for a, b in runs:
        common = [(a[0][p], b[0][p]) for p in a[0].keys() & b[0].keys()]
        values.append(time_scatter(common, opts.checks["time"].stat, opts.time_basis))
    scatter = max((v for v in values if v is not None), default=None)
    if scatter is not None and scatter > 0.1:
        notes.append(
            f"times of {what} scatter by x{math.exp(scatter):.2f} (robust sd of log ratios "
            f"over points): slowdowns under x{math.exp(opts.scatter_k * scatter):.2f} are "
            "reported, not failed"
        )
    return scatter


def _scale(base: tuple, cur: tuple, opts: CompareOptions) -> float:
    if opts.time_basis == "normalized":  # the reference kernel already cancels machine speed
        return 1.0
    return _peak_scale(base[1], cur[1]) if opts.normalize_peak else 1.0


def _in_passes(rows: dict[str, dict]) -> bool:
    """Every timed row was measured in two or more passes."""
    return all(len(r.get("pass_samples") or ()) >= 2 for r in _timed(rows))


def _timed(rows: dict[str, dict]) -> list[dict]:
    return [r for r in rows.values() if r.get("status") == "ok" and r.get("time_median_s")]


def resolve_basis(opts: CompareOptions, runs: Sequence[dict[str, dict]], notes: list[str]):
    """``opts`` with ``auto`` resolved: normalized when every timed row has a reference time
    and the threshold is relative; raises when ``normalized`` is asked for and impossible."""
    timed = [r for rows in runs for r in _timed(rows)]
    missing = sum(not has_reference(r) for r in timed)
    relative = opts.checks["time"].relative
    if opts.time_basis == "normalized" and (missing or not relative):
        why = f"{missing} timed rows have no ref_kernel_s" if missing else "threshold is absolute"
        raise CompareError(f"--time-basis normalized: impossible ({why})")
    if opts.time_basis == "auto":
        basis = "normalized" if timed and not missing and relative else "absolute"
        if basis == "absolute" and missing and len(timed) > missing:
            notes.append(f"{missing} timed rows have no reference-kernel time: absolute basis")
        return replace(opts, time_basis=basis)
    return opts


def contention_notes(runs: Sequence[tuple[str, dict[str, dict]]]) -> list[str]:
    """One note per run with rows measured under contention."""
    import pandas as pd

    out = []
    for name, rows in runs:
        if rows:
            line = contention.notice(pd.DataFrame(list(rows.values())), "rows")
            if line:
                out.append(f"{name}: {line}")
    return out


def _confirm(findings: list[Finding], base: tuple, run: tuple, name: str, opts, scatter):
    """Time failures that do not reproduce against another current run become warnings."""
    scale, out = _scale(base, run, opts), []
    for f in findings:
        if f.metric == "time" and f.level == "fail":
            pid, rows = f.point_id, run[0]
            again = pid in rows and time_finding(
                pid, "", base[0][pid], rows[pid], opts, scale, scatter
            )
            if not again or again.level != "fail":
                f = replace(f, level="warn", verdict=f"{f.verdict}, not in {name}")
        out.append(f)
    return out


def compare_runs(
    baseline: Path | str,
    current: Path | str,
    opts: CompareOptions,
    confirm: Sequence[Path | str] = (),
) -> Comparison:
    """Compare two run directories; raises :class:`CompareError` on unusable input.

    ``confirm``: more runs of the current code; a time regression fails only when it also
    fails against each of them (a burst of load on a shared machine rarely hits twice)."""
    notes: list[str] = []
    base, cur = _load(Path(baseline), notes), _load(Path(current), notes)
    (base_rows, base_env), (cur_rows, cur_env) = base, cur
    if base_env and cur_env:
        notes += _env_notes(base_env, cur_env, opts)
    others = [(_load(Path(d), notes), Path(d).name) for d in confirm]
    opts = resolve_basis(opts, [base_rows, cur_rows] + [run[0] for run, _ in others], notes)
    notes += contention_notes(
        [(str(baseline), base_rows), (str(current), cur_rows)]
        + [(str(d), run[0]) for (run, _), d in zip(others, confirm, strict=True)]
    )
    # Scatter over every pair of runs, the largest kept: between runs of the same code it is
    # pure noise (a real regression cannot inflate it); against the baseline it also covers
    # the baseline's own lucky or unlucky points, which the confirm runs cannot reveal.
    runs = [(base, cur)] + [p for run, _ in others for p in ((base, run), (cur, run))]
    scatter = _scatter(runs, opts, "the runs", notes)
    scale = _scale(base, cur, opts)
    findings: list[Finding] = []
    for pid, row in base_rows.items():
        if pid in cur_rows:
            findings += point_findings(pid, row, cur_rows[pid], opts, scale, scatter)
        else:
            status = row.get("status") or ""
            findings.append(Finding(pid, row["_label"], "point", "fail", "missing", status, "-"))
    for pid in cur_rows.keys() - base_rows.keys():
        status = cur_rows[pid].get("status") or ""
        findings.append(Finding(pid, cur_rows[pid]["_label"], "point", "info", "new", "-", status))
    for run, name in others:
        findings = _confirm(findings, base, run, name, opts, scatter)
    findings.sort(key=lambda f: (LEVELS.index(f.level), f.label, f.metric))
    return Comparison(
        str(baseline),
        str(current),
        fingerprint(base_env),
        fingerprint(cur_env),
        tuple(findings),
        tuple(notes),
        len(base_rows.keys() | cur_rows.keys()),
        opts.time_basis,
    )


_MARK = {"fail": "FAIL", "warn": "warn", "info": "info", "ok": "ok"}
_STYLE = {"fail": "bold red", "warn": "yellow", "info": "cyan", "ok": "dim"}
_COLUMNS = ("", "point", "metric", "baseline", "current", "change", "verdict")


def _cells(f: Finding) -> tuple[str, ...]:
    return (_MARK[f.level], f.label, f.metric, f.baseline, f.current, f.change, f.verdict)


def summary(result: Comparison) -> str:
    """One line: regressions or not, and the counts."""
    fails, warns = result.count("fail"), result.count("warn")
    head = f"{fails} regression{'s' * (fails != 1)}" if fails else "no regressions"
    basis = BASIS_TEXT.get(result.time_basis, result.time_basis)
    return f"{head}, {warns} warning{'s' * (warns != 1)} over {result.points} points " \
        f"(time gate: {basis})"


BASIS_TEXT = {"normalized": "normalized, time / ref_kernel_s", "absolute": "absolute time"}


def print_table(result: Comparison, show_all: bool = False, console=None) -> None:
    """The findings (all of them with ``show_all``, else those not ``ok``) as a rich table."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    if console is None:  # CI logs are not terminals: do not wrap the table at 80 columns
        console = Console(highlight=False)
        console = console if console.is_terminal else Console(highlight=False, width=200)
    for note in result.warnings:
        console.print(f"[yellow]warning:[/] {escape(note)}")
    rows = [f for f in result.findings if show_all or f.level != "ok"]
    if rows:
        table = Table(*_COLUMNS, title=f"{result.baseline} -> {result.current}")
        for f in rows:
            table.add_row(*(escape(c) for c in _cells(f)), style=_STYLE[f.level])
        console.print(table)
    style = "bold red" if result.exit_code else "bold green"
    console.print(f"[{style}]{escape(summary(result))}[/]")


def markdown(result: Comparison, show_all: bool = False) -> str:
    """A markdown summary for CI (e.g. appended to ``$GITHUB_STEP_SUMMARY``)."""
    verdict = "regressed" if result.exit_code else "passed"
    lines = [
        f"### attnbench compare: {verdict}",
        "",
        f"**{summary(result)}**",
        "",
        f"- baseline: `{result.baseline}` ({result.baseline_fingerprint or 'no env.json'})",
        f"- current: `{result.current}` ({result.current_fingerprint or 'no env.json'})",
    ]
    lines += [f"- warning: {note}" for note in result.warnings]
    rows = [f for f in result.findings if show_all or f.level != "ok"]
    if rows:
        lines += ["", "| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
        for f in rows:
            cells = (c.replace("|", "\\|") for c in _cells(f))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_markdown(result: Comparison, path: Path, show_all: bool = False) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(markdown(result, show_all), encoding="utf-8")


def options_from_args(args: argparse.Namespace) -> CompareOptions:
    """The :class:`CompareOptions` that parsed ``compare`` arguments ask for."""
    try:
        checks = parse_checks(args.threshold)
        fail, relative = parse_amount(args.time_fail)
    except ValueError as exc:
        raise CompareError(str(exc)) from None
    if not 0.5 <= args.confidence < 1:
        raise CompareError(f"--confidence must be in [0.5, 1), got {args.confidence}")
    if relative != checks["time"].relative:
        raise CompareError(
            "--time-fail must be relative (%) when the time threshold is, absolute otherwise"
        )
    return CompareOptions(
        checks, args.normalize_peak, args.time_gate, fail, args.confidence,
        time_basis=getattr(args, "time_basis", "auto"),
    )


def _cmd_compare(args: argparse.Namespace) -> int:
    opts = options_from_args(args)
    result = compare_runs(args.baseline_dir, args.current_dir, opts, args.confirm or ())
    print_table(result, show_all=args.all)
    if args.markdown:
        write_markdown(result, args.markdown, show_all=args.all)
    return result.exit_code


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    """Add ``compare`` and ``baseline`` subcommands; each sets ``func(args) -> exit code``."""
    p = subparsers.add_parser("compare", help="regression check: baseline run vs current run")
    p.add_argument("baseline_dir", type=Path, metavar="BASELINE_DIR")
    p.add_argument("current_dir", type=Path, metavar="CURRENT_DIR")
    p.add_argument(
        "--threshold",
        default="",
        metavar="RULES",
        help="e.g. time=median:10%%,mem=5%% (the defaults); absolute: time=0.002",
    )
    p.add_argument(
        "--normalize-peak",
        action="store_true",
        help="scale times by each run's measured matmul peak (different machines)",
    )
    p.add_argument(
        "--time-gate",
        choices=("hard", "report"),
        default="hard",
        help="report: time regressions warn; fail only beyond --time-fail and the runs' scatter",
    )
    p.add_argument(
        "--time-fail",
        default="50%",
        metavar="AMOUNT",
        help="with --time-gate report: fail when the slowdown's CI is above this",
    )
    p.add_argument(
        "--confirm",
        type=Path,
        action="append",
        metavar="RUN_DIR",
        help="another run of the current code: time regressions must reproduce in it",
    )
    p.add_argument(
        "--time-basis",
        choices=BASES,
        default="auto",
        help="normalized: time per reference-kernel time (ref_kernel_s); auto (default): "
        "normalized when every timed row has one",
    )
    p.add_argument("--confidence", type=float, default=0.99, help="CI level (default 0.99)")
    p.add_argument("--markdown", type=Path, metavar="FILE", help="write a markdown summary")
    p.add_argument("--all", action="store_true", help="show unchanged metrics too")
    p.set_defaults(func=_cmd_compare)
    add_baseline_cli(subparsers)


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python -m harness.compare.runs compare A B``) with the CLI's exit
    codes."""
    parser = argparse.ArgumentParser(prog="attnbench")
    add_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except CliError as exc:
        print(f"attnbench: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
