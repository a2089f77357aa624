"""``attnbench compare BASELINE_DIR CURRENT_DIR``: the regression check of
:mod:`harness.compare.runs` from the command line. Exit 0 when nothing failed, 1 on any
regression, 2 on unusable input (runs of two different suites included). The exit status is
the verdict even when the reader of the output leaves early (``| head``): a CI job that pipes
the gate's output gets the gate's answer, never a false regression.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli import output_file, silence_stdout
from harness.compare.findings import CompareError
from harness.compare.rules import BASES, CompareOptions, parse_amount, parse_thresholds
from harness.compare.runs import check_same_suite, compare_runs
from harness.render.comparison import print_table, write_markdown


def options_from_args(args: argparse.Namespace) -> CompareOptions:
    """The :class:`CompareOptions` that parsed ``compare`` arguments ask for."""
    try:
        checks = parse_thresholds(args.threshold)
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
        checks,
        args.normalize_peak,
        args.time_gate,
        fail,
        args.confidence,
        time_basis=getattr(args, "time_basis", "auto"),
    )


def cmd_compare(args: argparse.Namespace) -> int:
    """Compare, print the findings, write the markdown summary; the exit code."""
    if args.markdown:
        output_file(args.markdown, "--markdown")
    check_same_suite(args.baseline_dir, args.current_dir)
    opts = options_from_args(args)
    result = compare_runs(args.baseline_dir, args.current_dir, opts, args.confirm or ())
    if args.markdown:  # first: the summary is written whatever happens to stdout
        write_markdown(result, args.markdown, show_all=args.all)
    try:
        print_table(result, show_all=args.all)
    except BrokenPipeError:  # the reader left (`| head`): the verdict stands
        silence_stdout()
    return result.exit_code


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``compare`` subcommand; it sets ``func(args) -> exit code``."""
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
    p.set_defaults(func=cmd_compare)
