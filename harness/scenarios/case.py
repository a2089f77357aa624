"""What a scenario hands the runner for one point: a :class:`Case` (the timed zero-argument
callable, its check and its extra columns), built under :class:`CaseOptions` (how much of the
output to check, how a step is launched).

How far the ``auto`` check goes is decided here for every scenario: all of the output up to
:data:`FULL_CHECK_MAX_PAIRS` (query, key) pairs, sampled query rows beyond (a scenario's memory
prediction reads the same rule: the float64 check is part of a point's peak).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from harness.measure.timing import Measurement

# [measure] check: how much of the output is compared with the float64 reference
CHECK_MODES = ("auto", "full", "rows", "none")
# [measure] decode_graph: how a scenario launches a timed step it can capture (decode's step)
GRAPH_MODES = ("auto", "none", "cuda-graph", "compile")
# Full float64 checks above this many (query, key) pairs cost more than the point itself;
# beyond it we check sampled query rows (forward) and say so in the `check` column.
FULL_CHECK_MAX_PAIRS = 4096 * 4096


def full_check_fits(n_q: int, n_k: int) -> bool:
    """Whether ``auto`` checks n_q queries over n_k keys in full: n_q · n_k <=
    FULL_CHECK_MAX_PAIRS."""
    return n_q * n_k <= FULL_CHECK_MAX_PAIRS


@dataclass(frozen=True)
class CheckPlan:
    """What agreement check a point gets: ``full``, ``rows`` (sampled query rows) or ``none``."""

    mode: str
    grads: bool

    def describe(self) -> str:
        return f"{self.mode}{'+grads' if self.grads else ''}"


def plan_check(requested: str, n_q: int, n_k: int, backward: bool) -> CheckPlan:
    """The check of n_q queries over n_k keys: ``auto`` = full (grads too for backward) up to
    FULL_CHECK_MAX_PAIRS, else rows."""
    if requested not in CHECK_MODES:
        raise ValueError(f"check must be {'|'.join(CHECK_MODES)}, got {requested!r}")
    if requested == "auto":
        requested = "full" if full_check_fits(n_q, n_k) else "rows"
    return CheckPlan(requested, grads=backward and requested == "full")


@dataclass(frozen=True)
class CaseOptions:
    """How the runner wants a Case built: ``check`` (a CHECK_MODES word) and ``graph``, how a
    scenario with a capturable step launches it (a GRAPH_MODES word; the others ignore it)."""

    check: str = "auto"
    graph: str = "auto"

    def __post_init__(self) -> None:
        if self.graph not in GRAPH_MODES:
            raise ValueError(f"decode_graph must be one of {GRAPH_MODES}, got {self.graph!r}")


Timer = Callable[[Callable[[], object]], Measurement]


@dataclass
class Case:
    """One point ready to run. ``run`` is what gets timed; everything else stays outside."""

    run: Callable[[], object]
    tokens: int  # tokens processed per call (tokens/s = tokens / time)
    check: Callable[[], dict]  # agreement columns, run once, untimed
    # columns measured after timing: extra(measurement_of_run, timer) where timer(fn) -> Measurement
    extra: Callable[[Measurement, Timer], dict] = field(default=lambda m, timer: {})
    columns: dict = field(default_factory=dict)  # static extra columns (e.g. check mode)
