"""``--plugin FILE`` on every verb that reads rows, and the plug-ins a run recorded.

A verb adds the option with :func:`add_plugin_option` (``--plugin FILE``, repeatable) and, before
it reads rows, calls :func:`use_plugins` with the files given and the run directories it reads.
Rows of an implementation that nobody registered are judged without its declared data (cost,
family, work model), so their verdicts and tables differ from those of a process that has the
plug-in; that must never happen silently. :func:`use_plugins` loads the ``--plugin`` files, then
for each implementation the rows name that is still not registered says so in one line on
stderr, and loads the plug-in file the run's ``env.json`` recorded (``plugins``: path and sha256
of the bytes the run imported) when that file is still there with the same bytes; a file that
changed or is gone is said, not loaded (``--plugin`` loads it as it is now).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from harness import plugins, scenarios
from harness.analysis.claims import Claim, check_names
from harness.plugins import add_plugin_option
from harness.results import ENV_FILE, ResultsError, json_lines, load_env, rows_path

__all__ = ["add_plugin_option", "check_claim_names", "implementations_in", "use_plugins"]


def use_plugins(paths: Iterable[Path], run_dirs: Iterable[Path] = ()) -> list[str]:
    """Load the ``--plugin`` files ``paths`` (and ``ATTNBENCH_PLUGINS``); then, for every
    implementation the rows of ``run_dirs`` name that is not registered, one line on stderr
    and the plug-in its run recorded, loaded while unchanged. Returns the lines said (each
    also printed, ``attnbench: ...``). A file that cannot be used is one line and exit 2
    (:class:`harness.plugins.PluginError`)."""
    _registry().load_plugins(list(paths))
    lines: list[str] = []
    for run_dir in run_dirs:
        missing = implementations_in(run_dir) - known_implementations()
        if missing:
            lines += _recover(Path(run_dir), missing)
    for line in lines:
        print(f"attnbench: {line}", file=sys.stderr)
    return lines


def check_claim_names(claims: list[Claim], where: Path, run_dirs: Iterable[Path]) -> None:
    """Refuse in one line (exit 2, with "did you mean") a claim of ``claims`` (read from
    ``where``) naming a metric no row schema has, or an implementation that neither this
    registry (plug-ins loaded) nor a row of ``run_dirs`` has: call after :func:`use_plugins`
    (:func:`harness.analysis.claims.check_names`)."""
    impls, columns = set(), set()
    for run_dir in run_dirs:
        for row in _raw_rows(run_dir):
            columns.update(row)
            impls.add(row.get("impl"))
    check_names(claims, known_implementations() | impls, columns, str(where))


def _registry():
    """:mod:`harness.registry`, imported when a verb runs: it imports torch, and a verb's
    module is imported to build its parser, so ``attnbench table --help`` would load torch
    (as :func:`harness.cli.build_parser` imports the verbs' modules, by name)."""
    return importlib.import_module("harness.registry")


def known_implementations() -> set[str]:
    """Every name a row may carry here: the registry's and the scenarios' own baselines."""
    return set(_registry().names()) | set(scenarios.declared_baselines())


def implementations_in(run_dir: Path) -> set[str]:
    """The ``impl`` of every row of ``run_dir`` (a run directory or its rows.jsonl), read
    without checks: the verb's own loader says what is wrong with a row or a directory."""
    return {row["impl"] for row in _raw_rows(run_dir) if isinstance(row.get("impl"), str)}


def _raw_rows(run_dir: Path) -> Iterator[dict]:
    """The JSON objects of ``run_dir``'s rows.jsonl, unchecked (none if it has none)."""
    try:
        path = rows_path(run_dir)
    except ResultsError:
        return
    for _, value, problem in json_lines(path):
        if problem is None and isinstance(value, dict):
            yield value


def _recover(run_dir: Path, missing: set[str]) -> list[str]:
    """Load what ``run_dir``'s env.json recorded for the ``missing`` implementations; one line
    per plug-in file (loaded, changed or gone) and one for names no recorded file registered."""
    folder = run_dir.parent if run_dir.is_file() else run_dir
    try:
        records = load_env(folder).get("plugins") or []
    except ResultsError:
        records = []
    lines, left = [], set(missing)
    for record in records:
        names = sorted(left & set(record.get("implementations") or ()))
        if not names or not isinstance(record.get("path"), str):
            continue
        left -= set(names)
        path, which = Path(record["path"]), _names(names)
        head = f"{which} not registered; {folder / ENV_FILE} records the plug-in {path}"
        if not path.is_file():
            lines.append(f"warning: {head}, which no longer exists: {_without(names)}")
        elif plugins.file_digest(path) != record.get("sha256"):
            lines.append(
                f"warning: {head}, which has changed since the run (sha256 differs): "
                f"not loaded; {_without(names, path)}"
            )
        else:
            _registry().load_plugins([path])
            lines.append(f"{head}, unchanged since the run: loaded")
    if left:
        lines.append(
            f"warning: {_names(sorted(left))} not registered and no plug-in file "
            f"recorded for it in {folder / ENV_FILE}: {_without(sorted(left))}"
        )
    return lines


def _names(names: list[str]) -> str:
    return ("implementation " if len(names) == 1 else "implementations ") + ", ".join(names)


def _without(names: list[str], path: Path | None = None) -> str:
    """What reading rows without the registration means, and the way out."""
    them = "its" if len(names) == 1 else "their"
    way = f"--plugin {path} to load it as it is now" if path else "--plugin FILE to load it"
    return (
        f"{them} rows are read without {them} declared cost and family (work verdicts, "
        f"utilization); give {way}"
    )
