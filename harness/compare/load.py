"""Run directories as compare reads them: rows keyed by point (every field of its
:class:`~harness.scenarios.interface.Point`, via its stable id, never by position) and env.json.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

from harness.compare.findings import CompareError
from harness.errors import CliError
from harness.results import ENV_FILE, ResultsError, load_env, load_rows
from harness.scenarios.interface import point_from_row

Run = tuple[dict[str, dict], dict]  # (point_id -> row with its "_label", env.json)


def _clean(value):
    return None if isinstance(value, float) and math.isnan(value) else value


def index_rows(run_dir: Path, notes: list[str]) -> dict[str, dict]:
    """point_id -> row (NaN cells as None, plus the point's ``_label``); the last row wins when
    a point repeats, with a note."""
    try:
        frame = load_rows(run_dir)
    except (ValueError, OSError) as exc:  # ResultsError is a ValueError
        raise CompareError(str(exc)) from None
    if frame.empty or "impl" not in frame.columns:
        raise CompareError(f"{run_dir}: no result rows (or rows without an 'impl' column)")
    index: dict[str, dict] = {}
    for number, raw in enumerate(frame.to_dict("records"), 1):
        row = {k: _clean(v) for k, v in raw.items()}
        try:
            point = point_from_row(row)
        except (TypeError, ValueError) as exc:
            raise CompareError(f"{run_dir}: row {number} is not a valid point ({exc})") from None
        if point.point_id in index:
            notes.append(f"{run_dir}: point {point.label()} appears more than once; using the last")
        index[point.point_id] = {**row, "_label": point.label()}
    return index


def _env(run_dir: Path, notes: list[str]) -> dict:
    if not (Path(run_dir) / ENV_FILE).is_file():
        notes.append(f"{run_dir}: no {ENV_FILE}; fingerprints cannot be checked")
        return {}
    try:
        return load_env(run_dir)
    except ResultsError as exc:
        raise CompareError(str(exc)) from None


def load_run(run_dir: Path, notes: list[str]) -> Run:
    """A run's rows by point id and its env.json ({} when absent); row warnings (truncated
    lines) and missing files become ``notes``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = index_rows(Path(run_dir), notes)
    notes += [str(w.message) for w in caught]
    return rows, _env(Path(run_dir), notes)


def check_same_suite(baseline_dir: Path, current_dir: Path) -> None:
    """``compare`` of runs of two different suites is a usage error (every point would be
    missing from the other run), not a list of regressions."""
    suites = []
    for run_dir in (baseline_dir, current_dir):
        try:
            suites.append(load_env(run_dir).get("suite"))
        except ResultsError:  # compare itself reports an unusable run
            return
    if all(suites) and suites[0] != suites[1]:
        raise CliError(
            f"compare: {baseline_dir} is a run of suite {suites[0]!r} and "
            f"{current_dir} of {suites[1]!r}; compare two runs of one suite"
        )
