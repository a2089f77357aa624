"""``attnbench merge DIR... --out DIR``: the arguments of
:func:`harness.distributed.merge.merge_runs`."""

from __future__ import annotations

from pathlib import Path

from harness.distributed.merge import merge_runs, print_report


def add_cli(sub) -> None:
    """Add ``merge``."""
    p = sub.add_parser("merge", help="merge shard run directories into one run")
    p.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="shard run directories")
    p.add_argument("--out", type=Path, required=True, help="merged run directory")
    p.add_argument("--force", action="store_true", help="overwrite --out if it holds results")
    p.set_defaults(func=cmd_merge)


def cmd_merge(args) -> int:
    """Exit 0: complete; 1: written, but points or shards are missing; 2: refused."""
    report = merge_runs(args.dirs, args.out, overwrite=args.force)
    print_report(report)
    return 0 if report.complete else 1
