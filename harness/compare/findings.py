"""Compare's plain data: a run as compare reads it (:class:`Run`: rows keyed by point, every
:class:`~harness.scenarios.interface.Point` field through its stable id, never by position), and
what a comparison produces -- one :class:`Finding` per point and metric, gathered in a
:class:`Comparison` with the warnings about its inputs. The rules that make the findings are in
:mod:`harness.compare.rules`, their presentation in :mod:`harness.render.comparison`.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from pathlib import Path

from harness.errors import CliError
from harness.results import read_run
from harness.scenarios.interface import point_from_row

# most severe first: ``fail`` is a regression (exit status 1), ``warn`` and ``info`` are
# reported and never fail, ``ok`` is unchanged
LEVELS = ("fail", "warn", "info", "ok")


class CompareError(CliError):
    """Unusable compare input (exit status 2)."""


@dataclass(frozen=True)
class Finding:
    """One point's verdict on one metric (status, time, mem, numerics or point presence).

    ``baseline``, ``current`` and ``change`` are the values as shown (e.g. ``2.1 ms``,
    ``+12.3% [+8.0%, +16.9%]``), formatted with :mod:`harness.fmt`."""

    point_id: str
    label: str
    metric: str
    level: str
    verdict: str
    baseline: str = ""
    current: str = ""
    change: str = ""
    # a time warning a rerun may still turn into a failure: the slowdown's point estimate is
    # beyond the report gate's margin though its interval is not wholly above it
    suspect: bool = False


@dataclass(frozen=True)
class Comparison:
    """All findings of one comparison plus warnings about the inputs.

    ``baseline_machine`` / ``current_machine``: each run's device fingerprint as a baseline is
    filed under (:func:`harness.compare.baseline.machine_key`).
    ``time_basis``: the basis the time gate used, ``absolute``, ``normalized``, ``cpu`` or
    ``cpu+<wall basis>`` (one-thread rows with CPU time in ``cpu``, the others in the wall
    basis: :func:`harness.compare.noise.basis_used`)."""

    baseline: str
    current: str
    baseline_machine: str
    current_machine: str
    findings: tuple[Finding, ...]
    warnings: tuple[str, ...]
    points: int
    time_basis: str = "absolute"

    def count(self, level: str) -> int:
        """How many findings have ``level``."""
        return sum(f.level == level for f in self.findings)

    @property
    def exit_code(self) -> int:
        """1 when any finding failed, else 0."""
        return 1 if self.count("fail") else 0


@dataclass(frozen=True)
class Run:
    """A run as compare reads it: point_id -> row (with the point's ``_label``) and env.json
    ({} when absent)."""

    rows: dict[str, dict]
    env: dict


def load_run(run_dir: Path, notes: list[str]) -> Run:
    """A run directory through the one loader (:func:`harness.results.read_run`), keyed by
    point. Rows left out (by the loader, or here as no valid point), partial rows, a point
    that repeats (the last row wins) and a missing env.json become ``notes``; a run with no
    usable row is a :class:`CompareError`."""
    run = read_run(run_dir)
    notes += list(run.problems)
    if run.partial:
        notes.append(f"{run_dir}: an interrupted run: {run.partial} point(s) from finished "
                     "passes only (partial)")
    if run.env is None:
        notes.append(f"{run_dir}: no env.json; fingerprints cannot be checked")
    index: dict[str, dict] = {}
    invalid: list[str] = []
    for number, row in enumerate(run.rows, 1):
        try:
            point = point_from_row(row)
            label, problem = point.label(), _missing_field(row, point)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            label, problem = "", f"{type(exc).__name__}: {exc}"
        if problem:
            invalid.append(f"{run_dir}: row {number} ({row.get('impl')}) is not a valid point "
                           f"({problem}); row left out")
            continue
        if point.point_id in index:
            notes.append(f"{run_dir}: point {label} appears more than once; using the last")
        index[point.point_id] = {**row, "_label": label}
    notes += invalid
    if not index:
        raise CompareError(f"{run_dir}: no usable rows ({len(invalid)} left out; the first: "
                           f"{invalid[0]})")
    return Run(index, run.env or {})


def _missing_field(row: dict, point) -> str | None:
    """A point field that has a value by default but none in the row (``seq_len: NaN``): the
    rebuilt point would silently take the default."""
    for item in fields(point):
        if item.default in (None, MISSING) or item.name not in row:
            continue
        value = row[item.name]
        if value is None or (isinstance(value, float) and value != value):
            return f"{item.name} is missing"
    return None
