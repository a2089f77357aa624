"""``attnbench baseline save|find|list``: committed baselines (:mod:`harness.compare.baseline`).

``save RUN_DIR`` writes one; ``find RUN_DIR`` prints the baseline directory that matches a
run's device fingerprint and suite (falling back to the closest one on the same device kind,
with a warning on stderr); ``list`` lists them (none: one line saying where it looked, exit 3).
Exit 2 on unusable input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.cli import output_dir
from harness.compare.baseline import (
    DEFAULT_ROOT,
    find_baseline,
    list_baselines,
    machine_key,
    run_suite,
    save_baseline,
)
from harness.errors import CliError
from harness.results import ResultsError, load_env

NOTHING = 3  # exit status of `baseline list` that found none (the CLI's "nothing to show")


def _cmd_save(args: argparse.Namespace) -> int:
    output_dir(args.root, "--root")
    try:
        path = save_baseline(args.run_dir, args.root, force=args.force)
    except ResultsError as exc:
        raise CliError(str(exc)) from None
    print(path)
    return 0


def _cmd_find(args: argparse.Namespace) -> int:
    try:
        env = load_env(args.run_dir)
        suite = args.suite or run_suite(Path(args.run_dir), env)
        path, exact = find_baseline(env, suite, args.root)
    except ResultsError as exc:
        raise CliError(str(exc)) from None
    if not exact:
        if args.exact:
            raise CliError(f"no baseline with fingerprint {machine_key(env)!r} for suite {suite!r}")
        print(
            f"attnbench: warning: no baseline for fingerprint {machine_key(env)!r}; "
            f"using the closest, {path}",
            file=sys.stderr,
        )
    print(path)
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    """One line per baseline; none: one line on stderr saying where it looked, exit 3."""
    found = list_baselines(args.root)
    for info in found:
        print(f"{info.path}\t{info.suite}\t{info.machine}")
    if not found:
        where = Path(args.root).absolute()
        state = "" if where.is_dir() else " (no such directory)"
        relative = (" (--root is relative to the current directory: run from a checkout, or give"
                    " --root DIR)" if not Path(args.root).is_absolute() else "")
        print(f"attnbench: no baselines found under {where}{state}{relative}", file=sys.stderr)
        return NOTHING
    return 0


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    """Add ``baseline save|find|list``; each sets ``func(args) -> exit code``."""
    parser = subparsers.add_parser("baseline", help="save or find committed baselines")
    sub = parser.add_subparsers(dest="baseline_command", required=True)
    save = sub.add_parser("save", help="copy a run to results/baselines/<fingerprint>/<suite>/")
    save.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    save.add_argument("--force", action="store_true", help="replace an existing baseline")
    find = sub.add_parser("find", help="print the baseline directory matching a run")
    find.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    find.add_argument("--suite", help="suite name (default: the run's)")
    find.add_argument("--exact", action="store_true", help="fail unless the fingerprint matches")
    listing = sub.add_parser("list", help="list stored baselines")
    for p in (save, find, listing):
        p.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="default: %(default)s")
    save.set_defaults(func=_cmd_save)
    find.set_defaults(func=_cmd_find)
    listing.set_defaults(func=_cmd_list)
