"""``attnbench claims RUN_DIR [RUN_DIR...] [--claims FILE] [--json] [--allow-contended]``:
the verdict on every claim of a claims file from the rows of run directories."""

from __future__ import annotations

import sys
from pathlib import Path

from harness.analysis.claims import DEFAULT_CLAIMS, load_claims
from harness.analysis.verdicts import judge_claims
from harness.render.verdict_views import render_text
from harness.results import dumps_json, load_envs, load_runs


def add_cli(subparsers) -> None:
    """Add ``attnbench claims RUN_DIR [RUN_DIR...] [--claims FILE] [--json]``."""
    p = subparsers.add_parser("claims", help="verdicts on the claims file from run directories")
    p.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    p.add_argument(
        "--claims",
        type=Path,
        default=DEFAULT_CLAIMS,
        help=f"claims TOML (default: {DEFAULT_CLAIMS.name} in suites/)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="a JSON list: claim, verdict, measured, ci_low, ci_high, ...",
    )
    p.add_argument(
        "--allow-contended",
        action="store_true",
        help="use rows measured under contention for time verdicts (left out of them by "
        "default; memory and work verdicts always use them)",
    )
    p.set_defaults(func=cmd_claims)


def cmd_claims(args) -> int:
    """Load the claims and the rows, judge, print the verdicts (text or ``--json``); exit 0."""
    claims = load_claims(args.claims)
    rows, envs = load_runs(args.run_dirs), load_envs(args.run_dirs)
    verdicts, note = judge_claims(claims, rows, envs, allow_contended=args.allow_contended)
    if note:
        print(f"attnbench: warning: {note}", file=sys.stderr)
    if args.json:
        print(dumps_json([{**v.as_dict(), "utilization": v.utilization()} for v in verdicts]))
    else:
        print(render_text(verdicts))
    return 0
