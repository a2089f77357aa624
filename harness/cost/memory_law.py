"""A core's workspace where it declares no ``memory_model``: its declared memory exponent,
calibrated on one small measured call.

A plug-in that says ``Cost(time_exponent=2, memory_exponent=2)`` and nothing more still says
how its memory grows: the workspace of one call at ``n`` is predicted as the workspace measured
at a short length ``n0`` scaled by ``(n / n0) ** memory_exponent`` (queries scaled with the
keys; a query count that cannot shrink, such as one decode query, makes it an upper bound).
The measured call is made by whoever may touch a device (the runner, ``maxlen``), which hands a
:data:`Measure` to :func:`calibrating`; analytic readers without one (tables, fits, the shard
planner) get the inputs alone, as does a declared exponent <= 1 (a workspace at most linear in
n is of the inputs' order) and a mask that does not fit the short length.

Every prediction says how it was made (the row column ``mem_prediction``): ``model`` (the
declared ``memory_model``), ``declared-exponent (calibrated at n=...)`` or ``inputs``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, replace

from harness import registry
from harness.masks import MaskError, check_fits
from harness.spec import Problem, itemsize

CALIBRATION_LEN = 256  # keys of the measured call (the call itself when it is no longer)

Measure = Callable[[str, Problem], int]
"""(implementation, a short forward problem) -> the measured peak bytes of one call above its
live inputs (its output and workspace), as ``peak_mem_bytes`` measures it."""

_MEASURE: ContextVar[Measure | None] = ContextVar("attnbench_memory_measure", default=None)


@contextlib.contextmanager
def calibrating(measure: Measure) -> Iterator[None]:
    """Within the block, a core without a ``memory_model`` is predicted from its declared
    exponent, calibrated by ``measure``."""
    token = _MEASURE.set(measure)
    try:
        yield
    finally:
        _MEASURE.reset(token)


@dataclass(frozen=True)
class Workspace:
    """A predicted workspace in bytes and how it was predicted (``mem_prediction``)."""

    nbytes: int
    how: str


def calibration_problem(problem: Problem) -> Problem | None:
    """The short forward call the law is calibrated on: n0 = min(n_k, CALIBRATION_LEN) keys,
    the queries scaled alike (at least one); None when the mask does not fit it."""
    n0 = min(problem.n_k, CALIBRATION_LEN)
    q0 = max(1, problem.n_q * n0 // problem.n_k)
    try:
        check_fits(problem.mask, q0, n0)
    except MaskError:
        return None
    return replace(problem, n_q=q0, n_k=n0, backward=False)


def workspace(impl: str, problem: Problem) -> Workspace:
    """The workspace of one forward call of ``impl`` on ``problem`` beyond its inputs and
    output: its ``memory_model``, else its declared exponent calibrated on a measured short call
    (inside :func:`calibrating`), else 0 (the inputs alone)."""
    cost = registry.get(impl).cost
    if cost.memory_model is not None:
        return Workspace(int(cost.memory_model(problem)), "model")
    measure = _MEASURE.get()
    short = calibration_problem(problem) if measure is not None else None
    if measure is None or short is None or cost.memory_exponent <= 1:
        return Workspace(0, "inputs")
    out = short.batch * short.heads * short.n_q * short.head_dim * itemsize(short.dtype)
    measured = max(measure(impl, short) - out, 0)
    scale = (problem.n_k / short.n_k) ** cost.memory_exponent
    return Workspace(round(measured * scale), f"declared-exponent (calibrated at n={short.n_k})")
