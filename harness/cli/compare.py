"""``attnbench compare BASELINE_DIR CURRENT_DIR``: the regression check of
:mod:`harness.compare.runs` from the command line. Exit 0 when nothing failed, 1 on any
regression, 2 on unusable input (runs of two different suites included). The exit status is
the verdict even when the reader of the output leaves early (``| head``): a CI job that pipes
the gate's output gets the gate's answer, never a false regression.

Plain ``compare`` is the gate that holds on a shared machine (:data:`GATE_HELP`): status,
memory and numerics regressions fail at once; a time regression fails only when its whole
interval is above ``--time-fail`` (+50 %) and it shows again when measured once more
(``--confirm DIR``, or the rerun compare makes itself: :mod:`harness.cli.rerun`). ``--strict``
is the old hard rule (any slowdown beyond ``median:10%`` and noise fails, no rerun), for quiet,
dedicated machines.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli import output_dir, output_file, silence_stdout
from harness.cli.plugin_use import add_plugin_option, use_plugins
from harness.cli.rerun import make_rerun
from harness.compare.findings import CompareError
from harness.compare.rules import BASES, CompareOptions, parse_amount, parse_thresholds
from harness.compare.runs import check_same_suite, compare_runs
from harness.render.comparison import print_table, write_markdown

GATE_HELP = """\
the gate: status, memory and numerics regressions fail (exit 1). Times are compared per
reference matmul with an interval over the passes: in CPU time for one-thread CPU rows (the
wait for a time-shared core is not in it), else in wall time (normalized). A slowdown whose
interval is above +10% is a warning; it becomes a suspect when its estimate is above
--time-fail (+50%), and a suspect fails only when it shows again, interval above +50%, in a
rerun: compare measures the suspect points once more itself (from CURRENT_DIR's suite, with
this installation's code and --plugin files, at least 5 passes, a few seconds each) or reads
--confirm DIR. A rerun row measured under contention (other processes took the cores, or this
process waited for a CPU) is measured once more; only a clean rerun can clear a suspect.
--strict: every slowdown beyond median:10% and its noise fails, no rerun (quiet, dedicated
machines). CI: attnbench run --out run1; attnbench compare "$(attnbench baseline find run1)"
run1"""


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
        "hard" if args.strict else args.time_gate,
        fail,
        args.confidence,
        time_basis=getattr(args, "time_basis", "auto"),
    )


def cmd_compare(args: argparse.Namespace) -> int:
    """Compare, print the findings, write the markdown summary; the exit code."""
    if args.markdown:
        output_file(args.markdown, "--markdown")
    if args.rerun_out:
        output_dir(args.rerun_out, "--rerun-out")
    check_same_suite(args.baseline_dir, args.current_dir)
    opts = options_from_args(args)
    # both runs' rows read with their plug-ins; a rerun measures with them too
    use_plugins(args.plugin, [args.baseline_dir, args.current_dir])
    rerun = None
    if opts.time_gate == "report" and not args.confirm and not args.no_rerun:
        rerun = make_rerun(args.current_dir, args.rerun_out)
    result = compare_runs(args.baseline_dir, args.current_dir, opts, args.confirm or (), rerun)
    if args.markdown:  # first: the summary is written whatever happens to stdout
        write_markdown(result, args.markdown, show_all=args.all)
    try:
        print_table(result, show_all=args.all)
    except BrokenPipeError:  # the reader left (`| head`): the verdict stands
        silence_stdout()
    return result.exit_code


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``compare`` subcommand; it sets ``func(args) -> exit code``."""
    p = subparsers.add_parser(
        "compare",
        help="regression check: baseline run vs current run",
        description=GATE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
        "--strict",
        action="store_true",
        help="fail every time regression beyond the threshold and its noise, without a rerun "
        "(= --time-gate hard; for quiet, dedicated machines)",
    )
    p.add_argument(
        "--time-gate",
        choices=("hard", "report"),
        default="report",
        help="report (default): time regressions fail only beyond --time-fail and the runs' "
        "scatter, and confirmed by a rerun; hard: --strict",
    )
    p.add_argument(
        "--time-fail",
        default="50%",
        metavar="AMOUNT",
        help="the margin a time regression's whole CI must exceed to fail (default 50%%)",
    )
    p.add_argument(
        "--confirm",
        type=Path,
        action="append",
        metavar="RUN_DIR",
        help="another run of the current code: time regressions must reproduce in it "
        "(instead of compare's own rerun)",
    )
    p.add_argument(
        "--no-rerun",
        action="store_true",
        help="do not measure suspect points again: time regressions beyond --time-fail fail "
        "unconfirmed (runs made by other code than this installation's)",
    )
    p.add_argument(
        "--rerun-out",
        type=Path,
        metavar="DIR",
        help="where the confirm rerun's rows go (default: a new temporary folder, kept)",
    )
    add_plugin_option(p)
    p.add_argument(
        "--time-basis",
        choices=BASES,
        default="auto",
        help="normalized: time per reference-kernel time (ref_kernel_s); cpu: CPU time per "
        "the reference kernel's CPU time (ref_kernel_cpu_s; the wait for a time-shared core "
        "is not in it); auto (default): cpu for one-thread rows with CPU time on both sides, "
        "the rest normalized when every timed row has a reference time",
    )
    p.add_argument("--confidence", type=float, default=0.99, help="CI level (default 0.99)")
    p.add_argument("--markdown", type=Path, metavar="FILE", help="write a markdown summary")
    p.add_argument("--all", action="store_true", help="show unchanged metrics too")
    p.set_defaults(func=cmd_compare)
