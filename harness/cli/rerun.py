"""``attnbench compare``'s confirm rerun: the points whose time regressed beyond noise, measured
again now, from the current run's own suite, with the code and plug-ins this process has.

A burst of load on a shared machine rarely hits the same point twice, a real regression always
does: plain ``compare`` fails a time regression only when this rerun shows it again
(:func:`harness.compare.noise.confirm_by_rerun`). Only the suspects run (a few seconds each,
in the suite's passes and thread count), into ``--rerun-out DIR`` or a fresh temporary folder
that is kept, and named in the output, as the evidence.

The suite comes from the current run's ``env.json`` (``suite_path``; a bundled suite moved by
an install is found by its file name). Its rows are measured like the run's (CPU time beside
wall time on a CPU) and judged by the same rule, in the same time basis per point
(:func:`harness.compare.rules.pair_basis`): a suspect the rerun shows slower only in wall time
is cleared where the point is compared in CPU time. The rerun measures *this* process's code:
it confirms a run of the code installed here, which is what CI's ``run`` then ``compare`` has;
comparing two old run directories from other commits, give ``--confirm DIR`` (or
``--no-rerun``) instead.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from harness import bundled
from harness.compare.findings import Run, load_run
from harness.compare.noise import Rerun
from harness.errors import CliError
from harness.execute.runner import run_points
from harness.results import ResultsError, RowWriter, load_env, write_env
from harness.sweep.suite import Suite, load_suite

# at least this many passes: a median over 5 passes shrugs off two disturbed ones, and the
# suspects are few, so the rerun stays a matter of seconds
RERUN_PASSES = 5


def suite_of(run_dir: Path) -> tuple[Suite | None, str]:
    """The suite ``run_dir`` was a run of (from its env.json), or None and why not."""
    try:
        env = load_env(run_dir)
    except ResultsError as exc:
        return None, f"{run_dir}: {exc}"
    path = env.get("suite_path")
    if not path:
        return None, f"{run_dir}/env.json names no suite_path"
    candidates = [Path(path), bundled(Path(path).name)]
    found = next((p for p in candidates if p.is_file()), None)
    if found is None:
        return None, f"its suite {path} is not here"
    try:
        return load_suite(found), str(found)
    except CliError as exc:
        return None, str(exc)


def make_rerun(current_dir: Path, out: Path | None = None) -> Rerun:
    """The ``rerun(point_ids)`` :func:`harness.compare.runs.compare_runs` calls: measures those
    points of ``current_dir``'s suite again, in as many passes as the current rows had and at
    least :data:`RERUN_PASSES`."""
    current_env: dict = {}
    with contextlib.suppress(ResultsError):
        current_env = load_env(current_dir)
    tries = [0]

    def rerun(point_ids: list[str]) -> tuple[Run | None, str]:
        suite, where = suite_of(current_dir)
        if suite is None:
            return None, where
        wanted = set(point_ids)
        points = [p for p in suite.points if p.point_id in wanted]
        if not points:
            return None, f"{where} no longer has these points"
        tries[0] += 1
        target = _target(out, tries[0])
        passes = max(_passes_of(current_dir, wanted) or suite.measure.passes, RERUN_PASSES)
        measure = replace(suite.measure, passes=passes)
        if measure.threads:
            torch.set_num_threads(measure.threads)
        print(f"attnbench: compare: {len(points)} time regression(s) beyond noise; measuring "
              f"them again ({passes} passes) to confirm -> {target}", file=sys.stderr)
        run_points(points, RowWriter(target), measure, run_id=f"rerun-{tries[0]}",
                   suite_name=suite.name)
        write_env(target, {**current_env, "run_id": f"rerun-{tries[0]}"})
        return load_run(target, []), str(target)

    return rerun


def _target(out: Path | None, attempt: int) -> Path:
    if out is None:
        return Path(tempfile.mkdtemp(prefix=f"attnbench-rerun{attempt}-"))
    return out if attempt == 1 else out.with_name(f"{out.name}-{attempt}")


def _passes_of(run_dir: Path, point_ids: set[str]) -> int | None:
    """The passes the current run timed these points in (its rows' ``passes``)."""
    try:
        rows = load_run(run_dir, []).rows
    except CliError:
        return None
    counts = [r.get("passes") for pid, r in rows.items() if pid in point_ids]
    counts = [c for c in counts if isinstance(c, int) and c > 0]
    return max(counts) if counts else None
