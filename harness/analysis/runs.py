"""Run directories as the analysis reads them: their result rows and each run's env.json."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness.errors import CliError
from harness.results import ResultsError, load_env, load_runs


def load_run_rows(run_dirs) -> pd.DataFrame:
    """Rows of several run directories; a bad directory becomes a one-line CliError."""
    try:
        return load_runs(run_dirs)
    except ResultsError as exc:
        raise CliError(str(exc)) from None


def env_or_note(run_dir) -> dict:
    """A run directory's env.json, or ``{"run_id": <folder>, "note": "no env.json"}``."""
    try:
        return load_env(run_dir)
    except ResultsError:
        return {"run_id": Path(run_dir).name, "note": "no env.json"}


def load_envs(run_dirs) -> dict[str, dict]:
    """run_id -> env.json for run directories (a directory without env.json is left out)."""
    envs = {}
    for run_dir in run_dirs:
        try:
            env = load_env(run_dir)
        except ResultsError:
            continue
        envs[str(env.get("run_id", Path(run_dir).name))] = env
    return envs
