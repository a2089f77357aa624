"""Errors that reach the command line as one readable line and a non-zero exit code."""


class CliError(Exception):
    """A user-facing error: printed as ``attnbench: <message>``, exit code ``exit_code``."""

    exit_code = 2


class SuiteError(CliError):
    """A suite file that cannot be run: names the file, the key and the value."""


class DeviceUnavailable(CliError):
    """A device a suite asks for is not usable on this machine (e.g. cuda without a GPU)."""


def first_line(exc: BaseException, limit: int = 500) -> str:
    """``Type: first line of the message``, at most ``limit`` characters: how an exception is
    told in one row ``reason`` or one availability line."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".strip()[:limit]


class Interrupted(CliError):
    """Ctrl-C, with what is true about the interrupted command's output (exit 130)."""

    exit_code = 130


class ResultsWarning(UserWarning):
    """A results file the loader read only in part: a row left out (the line says where and
    why) or an interrupted run's partial rows. The command line prints each as one line."""
