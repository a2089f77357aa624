"""``attnbench report RUN_DIR [RUN_DIR...] --out DIR``: arguments only; the report is built by
:func:`harness.render.report.build_report`."""

from __future__ import annotations

import sys
from pathlib import Path

from harness.analysis.claims import DEFAULT_CLAIMS, load_claims
from harness.cli import output_dir
from harness.cli.claims import SKIPPED, usable_runs
from harness.cli.plugin_use import add_plugin_option, check_claim_names, use_plugins
from harness.errors import CliError
from harness.render.report import build_report


def add_cli(subparsers) -> None:
    """Add ``attnbench report RUN_DIR [RUN_DIR...] --out DIR [--claims FILE]
    [--allow-contended]``."""
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
    p.add_argument(
        "--allow-contended",
        action="store_true",
        help="use rows measured under contention for time verdicts (as attnbench claims)",
    )
    add_plugin_option(p)
    p.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    """Build the report of ``args.history`` then ``args.run_dirs``; print the page's path.
    A directory without usable rows or env.json is skipped with one warning line and the exit
    status is :data:`~harness.cli.claims.SKIPPED`, as ``claims`` does; none usable: exit 2."""
    output_dir(args.out)  # before any work: a file named by --out is refused at once
    runs = list(dict.fromkeys([*args.history, *args.run_dirs]))  # oldest first, no repeats
    use_plugins(args.plugin, runs)
    if args.claims.is_file() or args.claims != DEFAULT_CLAIMS:  # the report goes on without
        check_claim_names(load_claims(args.claims), args.claims, runs)  # a bundled file
    _, kept, skipped = usable_runs(runs)  # read once more by the report: small next to it
    if not kept:
        raise CliError("; ".join(skipped) if len(skipped) == 1 else
                       f"nothing to report: every run directory was skipped ({'; '.join(skipped)})")
    for line in skipped:
        print(f"attnbench: warning: {line}", file=sys.stderr)
    page = build_report(
        kept, args.out, args.claims, args.title, args.baseline, args.allow_contended
    )
    print(f"report: {page}")
    return SKIPPED if skipped else 0
