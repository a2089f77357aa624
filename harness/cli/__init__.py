"""``attnbench`` command line. Errors at this edge are one line and a non-zero exit code.

Subcommands live in their own modules and add themselves with ``add_cli(subparsers)``. Only the
module of the subcommand being run is imported (torch, pandas and matplotlib load after the
arguments are parsed): ``attnbench --help`` lists the subcommands from :data:`COMMANDS` alone.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from harness.errors import CliError

# subcommand -> (module with ``add_cli(subparsers)``, one-line help for ``attnbench --help``)
COMMANDS: dict[str, tuple[str, str]] = {
    "list": ("harness.cli.listing", "every implementation, available or not, and why"),
    "run": ("harness.cli.run", "run a suite; rows go to DIR/rows.jsonl"),
    "table": ("harness.cli.table", "comparison table of a run directory (text, markdown, CSV)"),
    "claims": ("harness.cli.claims", "verdicts on the claims file from run directories"),
    "report": ("harness.cli.report", "HTML + markdown + CSV report of run directories"),
    "compare": ("harness.cli.compare", "regression check: baseline run vs current run"),
    "baseline": ("harness.cli.baseline", "save or find committed baselines"),
    "maxlen": ("harness.cli.maxlen", "largest seq_len that fits a memory budget"),
    "merge": ("harness.cli.merge", "merge shard run directories into one run"),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse prints usage + error)
        # printed as "attnbench: table: ...": one program prefix, then the subcommand
        command = self.prog.removeprefix("attnbench").strip()
        where = f"{command}: " if command else ""
        raise CliError(f"{where}{message} (see {self.prog} --help)")


def _command_of(argv: list[str]) -> str | None:
    """The subcommand named in ``argv`` (the first word that is not an option)."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``command`` (a key of :data:`COMMANDS`) that subcommand's full
    arguments, otherwise every subcommand as a name and a line of help (nothing imported)."""
    parser = _Parser(
        prog="attnbench",
        description="Benchmark and complexity-profiling harness for attention implementations.",
    )
    sub = parser.add_subparsers(
        dest="command", required=True, parser_class=_Parser, metavar="COMMAND"
    )
    if command in COMMANDS:
        importlib.import_module(COMMANDS[command][0]).add_cli(sub)
    for name, (_, text) in COMMANDS.items():
        if name not in sub.choices:
            sub.add_parser(name, help=text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = build_parser(_command_of(argv)).parse_args(argv)
        return int(args.func(args) or 0)
    except CliError as exc:
        print(f"attnbench: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("attnbench: interrupted (finished rows are saved)", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `attnbench table RUN | head`: the reader left; say nothing
        _silence_stdout()
        return 141  # 128 + SIGPIPE, what a shell reports for a writer killed by a closed pipe
    except Exception as exc:
        if os.environ.get("ATTNBENCH_DEBUG"):
            raise
        print(
            f"attnbench: internal error: {type(exc).__name__}: {exc} "
            "(set ATTNBENCH_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return 1


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass

