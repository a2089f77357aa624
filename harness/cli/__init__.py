"""``attnbench`` command line. Errors at this edge are one line and a non-zero exit code.

Subcommands live in their own modules and add themselves with ``add_cli(subparsers)``. Only the
module of the subcommand being run is imported (torch, pandas and matplotlib load after the
arguments are parsed): ``attnbench --help`` lists the subcommands from :data:`COMMANDS` alone.

Exit codes: 0 done, or the reader of the output left early (``| head``: quietly, whether the
output was long or short; ``compare`` exits with its verdict instead); 1 a regression
(``compare``), a failed point (``run`` with an ``error`` or ``mismatch`` row) or an internal
error; 2 a usage error or unusable input; 3 nothing to show (``run``: no point measured;
``claims``/``report``: a run directory without usable rows; ``baseline list``: no baseline);
130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import warnings
from pathlib import Path

from harness.errors import CliError, ResultsWarning

# subcommand -> (module with ``add_cli(subparsers)``, one-line help for ``attnbench --help``)
COMMANDS: dict[str, tuple[str, str]] = {
    "list": ("harness.cli.listing", "every implementation, available or not, and why"),
    "run": ("harness.cli.run", "run a suite; rows go to DIR/rows.jsonl"),
    "table": ("harness.cli.table", "comparison table of a run directory (text, markdown, CSV)"),
    "claims": ("harness.cli.claims", "verdicts on the claims file from run directories"),
    "verdicts": ("harness.cli.verdicts", "measure the claim suites; the verdict on each claim"),
    "report": ("harness.cli.report", "HTML + markdown + CSV report of run directories"),
    "compare": ("harness.cli.compare", "regression check: baseline run vs current run"),
    "baseline": ("harness.cli.baseline", "save or find committed baselines"),
    "maxlen": ("harness.cli.maxlen", "largest seq_len that fits a memory budget"),
    "merge": ("harness.cli.run", "merge shard run directories into one run"),
}
SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20,
              "gib": 2**30, "tib": 2**40, "tb": 10**12}


def parse_size(text: str) -> int:
    """``type=`` for memory budgets: '8GiB', '500MB', '1e9B' -> bytes. The unit is required: a
    bare '64' would be a 64-byte budget that skips everything, almost never what was meant."""
    match = re.fullmatch(r"\s*([-+]?[0-9.eE+]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in SIZE_UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 8GiB, 500MB, 64B)")
    try:
        value = float(match.group(1)) * SIZE_UNITS[match.group(2).lower()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be > 0: {text!r}")
    if not match.group(2):
        raise argparse.ArgumentTypeError(
            f"{text!r} has no unit: a size needs one (e.g. {text.strip()}MiB, "
            f"{text.strip()}GiB; {text.strip()}B for bytes)"
        )
    return int(value)


def output_dir(path: Path, flag: str = "--out") -> None:
    """Refuse, before any work, a directory the command could not write into: an existing
    file, a path under a file, or a folder this user may not write (CliError, exit 2). The
    directory itself need not exist yet."""
    if path.exists() and not path.is_dir():
        raise CliError(f"{flag} {path}: exists and is not a directory")
    _writable_parent(path if path.exists() else path.parent, path, flag)


def output_file(path: Path, flag: str) -> None:
    """Refuse, before any work, a file path the command could not write: an existing
    directory, a path under a file, a folder this user may not write (CliError, exit 2)."""
    if path.is_dir():
        raise CliError(f"{flag} {path}: is a directory, not a file")
    _writable_parent(path.parent, path, flag)


def _writable_parent(folder: Path, path: Path, flag: str) -> None:
    """The nearest existing folder at or above ``folder`` is a directory we may write in."""
    existing = next(p for p in (folder, *folder.parents) if p.exists())  # "/" or "." at last
    if not existing.is_dir():
        raise CliError(f"{flag} {path}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise CliError(f"{flag} {path}: cannot write in {existing} (permission denied)")


class _Parser(argparse.ArgumentParser):
    def parse_known_args(self, args=None, namespace=None):
        return super().parse_known_args(self._negative_values(args), namespace)

    def _negative_values(self, args: list[str] | None) -> list[str] | None:
        """``--budget -64MB`` as ``--budget=-64MB``: argparse takes a value that starts with
        '-' and is not a plain number for an option and says "expected one argument"; given to
        its option, the option's own check says what is wrong with it ("size must be > 0")."""
        if args is None:
            return None
        out = list(args)
        for i in range(len(out) - 1, 0, -1):
            value, option = out[i], out[i - 1]
            action = self._option_string_actions.get(option)
            if (re.match(r"-[0-9.]", value) and action is not None and action.nargs is None
                    and self._negative_number_matcher.match(value) is None):
                out[i - 1 : i + 1] = [f"{option}={value}"]
        return out

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
    with warnings.catch_warnings():
        warnings.simplefilter("always", ResultsWarning)  # every row left out gets its line
        warnings.showwarning = _one_line_warning
        return _run(argv)


def _run(argv: list[str]) -> int:
    try:
        args = build_parser(_command_of(argv)).parse_args(argv)
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
        return code
    except CliError as exc:
        print(f"attnbench: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:  # a verb with output to keep says so with an Interrupted
        print("attnbench: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `attnbench list | head -1`: the reader has what it wanted
        silence_stdout()
        # 0, not 141 (128 + SIGPIPE): whether a write meets the closed pipe depends only on
        # how much was written, and a script under `set -o pipefail` must not fail on `| head`
        return 0
    except Exception as exc:
        if os.environ.get("ATTNBENCH_DEBUG"):
            raise
        print(
            f"attnbench: internal error: {type(exc).__name__}: {exc} "
            "(set ATTNBENCH_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return 1


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Our own warnings as ``attnbench: warning: ...`` (one line, no source line); others as
    Python prints them."""
    if issubclass(category, ResultsWarning):
        print(f"attnbench: warning: {message}", file=sys.stderr)
    else:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def silence_stdout() -> None:
    """Point stdout at /dev/null so no later write (the interpreter's final flush included)
    can raise again once the reader of a pipe has left."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
