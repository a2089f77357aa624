"""``attnbench report RUN_DIR... --out DIR``: load the runs, compute every section
(:mod:`harness.render.sections`) and write one self-contained HTML page, ``report.md`` with
``plots/*.png``, and ``tables/*.csv`` (``rows.csv``: every row of every run) with
:mod:`harness.render.page`.
"""

from __future__ import annotations

from pathlib import Path

from harness.analysis.claims import DEFAULT_CLAIMS
from harness.errors import CliError
from harness.render.page import write
from harness.render.sections import sections
from harness.results import env_or_note, load_runs


def build_report(
    run_dirs: list[Path],
    out: Path,
    claims_path: Path | None = DEFAULT_CLAIMS,
    title: str = "attnbench report",
    baseline: str | None = None,
) -> Path:
    """Load the runs, compute every section, write the files; returns the HTML page's path."""
    rows = load_runs(run_dirs)
    envs, runs = {}, []
    for run_dir in run_dirs:
        env = env_or_note(run_dir)
        envs[str(env.get("run_id", Path(run_dir).name))] = env
        runs.append(f"{Path(run_dir).name} ({env.get('suite', '?')})")
    if baseline is not None and baseline not in set(rows.get("impl", ())):
        raise CliError(f"--baseline {baseline}: no rows of it in these runs")
    return write(Path(out), sections(rows, envs, claims_path, baseline), title, runs)
