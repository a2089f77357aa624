"""Errors that reach the command line as one readable line and a non-zero exit code."""


class CliError(Exception):
    """A user-facing error: printed as ``attnbench: <message>``, exit code ``exit_code``."""

    exit_code = 2


class SuiteError(CliError):
    """A suite file that cannot be run: names the file, the key and the value."""


class DeviceUnavailable(CliError):
    """A device a suite asks for is not usable on this machine (e.g. cuda without a GPU)."""
