"""``attnbench`` command line. Errors at this edge are one line and a non-zero exit code.

Subcommands live in their own modules and add themselves with ``add_cli(subparsers)``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

from harness.errors import CliError

# Modules that contribute subcommands (each has ``add_cli(subparsers)``).
COMMAND_MODULES = (
    "harness.commands",  # list, run, table
    "harness.claims",  # claims
    "harness.report",  # report
    "harness.compare",  # compare, baseline
    "harness.maxlen",  # maxlen
    "harness.merge",  # merge
)
DEFAULT_SUITE = Path(__file__).resolve().parent.parent / "suites" / "smoke.toml"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse prints usage + error)
        raise CliError(f"{self.prog}: {message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="attnbench",
        description="Benchmark and complexity-profiling harness for attention implementations.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except CliError as exc:
        print(f"attnbench: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("attnbench: interrupted (finished rows are saved)", file=sys.stderr)
        return 130
    except Exception as exc:
        if os.environ.get("ATTNBENCH_DEBUG"):
            raise
        print(
            f"attnbench: internal error: {type(exc).__name__}: {exc} "
            "(set ATTNBENCH_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
