"""What a scenario hands the runner for one point: a :class:`Case` (the timed zero-argument
callable, its check and its extra columns), built under :class:`CaseOptions` (how much of the
output to check, the scenario's own ``[measure]`` options), and how the runner launches the
timed call (:func:`launch_case`: eagerly or from a CUDA graph, for every scenario alike).

How far the ``auto`` check goes is decided here for every scenario: all of the output up to
:data:`FULL_CHECK_MAX_PAIRS` (query, key) pairs, sampled query rows beyond (a scenario's memory
prediction reads the same rule: the float64 check is part of a point's peak).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from harness.measure import graphs
from harness.measure.graphs import NO_CUDA, TimedCall
from harness.measure.timing import Measurement

# [measure] check: how much of the output is compared with the float64 reference
CHECK_EXTENTS = ("auto", "full", "rows", "none")
# how a scenario may ask its timed call to be launched (Case.graph): ``auto`` leaves it to
# ``[measure] cuda_graph`` and then to the scenario's default; the others are graphs.MODES
GRAPH_MODES = ("auto", *graphs.MODES)
# Full float64 checks above this many (query, key) pairs cost more than the point itself;
# beyond it we check sampled query rows (forward) and say so in the `check` column.
FULL_CHECK_MAX_PAIRS = 4096 * 4096


def full_check_fits(n_q: int, n_k: int) -> bool:
    """Whether ``auto`` checks n_q queries over n_k keys in full: n_q · n_k <=
    FULL_CHECK_MAX_PAIRS."""
    return n_q * n_k <= FULL_CHECK_MAX_PAIRS


@dataclass(frozen=True)
class CheckChoice:
    """What agreement check a point gets: ``full``, ``rows`` (sampled query rows) or ``none``."""

    extent: str
    grads: bool

    def describe(self) -> str:
        return f"{self.extent}{'+grads' if self.grads else ''}"


def choose_check(requested: str, n_q: int, n_k: int, backward: bool) -> CheckChoice:
    """The check of n_q queries over n_k keys: ``auto`` = full (grads too for backward) up to
    FULL_CHECK_MAX_PAIRS, else rows."""
    if requested not in CHECK_EXTENTS:
        raise ValueError(f"check must be {'|'.join(CHECK_EXTENTS)}, got {requested!r}")
    if requested == "auto":
        requested = "full" if full_check_fits(n_q, n_k) else "rows"
    return CheckChoice(requested, grads=backward and requested == "full")


@dataclass(frozen=True)
class MeasureOption:
    """A ``[measure]`` key that a scenario declares for its own suites
    (:attr:`harness.scenarios.interface.Scenario.measure_options`): one of ``choices``,
    ``default`` when a suite does not set it."""

    choices: tuple[str, ...]
    default: str
    doc: str

    def __post_init__(self) -> None:
        if self.default not in self.choices:
            raise ValueError(f"default {self.default!r} is not one of {self.choices}")


@dataclass(frozen=True)
class CaseOptions:
    """How the runner wants a Case built: ``check`` (a CHECK_EXTENTS word) and ``options``, the
    scenario's own ``[measure]`` options as the suite set them (name -> value; a name left out
    is at its declared default)."""

    check: str = "auto"
    options: Mapping[str, str] = field(default_factory=dict)


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
    # makes the form of ``run`` a CUDA graph captures (static buffers, no host sync), called
    # only when a graph is made; None: ``run`` itself is capturable
    capture: Callable[[], Callable[[], object]] | None = None
    graph: str = "auto"  # the launch the scenario's own option asks for (GRAPH_MODES)
    graph_default: str = "none"  # the launch on CUDA when nothing asks for one
    # columns the scenario adds about the launch (decode's own names for it)
    launch_columns: Callable[[TimedCall], dict] = field(default=lambda launch: {})
    eager: Callable[[], object] | None = None  # set by launch_case: ``run`` before launching


def launch_mode(requested: str, cuda_graph: bool | None, default: str,
                device_kind: str) -> tuple[str, str | None]:
    """(mode, reason it differs from what was asked): the scenario's own request when not
    ``auto``, else ``[measure] cuda_graph`` when set, else the scenario's ``default`` on CUDA
    (eager on a CPU, without a reason: nobody asked). A graph asked for on a CPU is eager with
    :data:`~harness.measure.graphs.NO_CUDA`."""
    if requested not in GRAPH_MODES:
        raise ValueError(f"launch must be one of {GRAPH_MODES}, got {requested!r}")
    if requested == "auto" and cuda_graph is not None:
        requested = "cuda-graph" if cuda_graph else "none"
    if requested == "auto":
        return (default if device_kind == "cuda" else "none"), None
    if requested != "none" and device_kind != "cuda":
        return "none", NO_CUDA
    return requested, None


def launch_case(case: Case, cuda_graph: bool | None, device_kind: str) -> TimedCall:
    """Launch ``case.run`` as :func:`launch_mode` says (captured or compiled here, outside the
    timing); ``case.run`` becomes the launched call, ``case.eager`` the call before, and the
    row's ``cuda_graph`` / ``cuda_graph_reason`` (plus the scenario's ``launch_columns``) say
    how it ran."""
    mode, reason = launch_mode(case.graph, cuda_graph, case.graph_default, device_kind)
    launched = graphs.launch(case.run, mode, reason, case.capture)
    case.eager, case.run = case.run, launched.run
    case.columns.update(cuda_graph=launched.mode, cuda_graph_reason=launched.reason)
    case.columns.update(case.launch_columns(launched))
    return launched
