"""A usage check of ``attnbench compare``: both runs come from one suite."""

from __future__ import annotations

from pathlib import Path

from harness.errors import CliError
from harness.results import ResultsError, load_env


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
        raise CliError(f"compare: {baseline_dir} is a run of suite {suites[0]!r} and "
                       f"{current_dir} of {suites[1]!r}; compare two runs of one suite")
