"""A whole-run time limit (``attnbench run --time-limit``, ``[measure] time_limit_s``): which
timing passes still fit, and which points it left out.

The clock starts when the first pass of the first point starts (after the run directory and
the device calibration are in place). Before each pass the runner asks :meth:`Deadline.fits`:
a pass fits when its expected seconds fit in the time left. The expected seconds are the
point's predicted seconds scaled by the pace of the passes done so far (actual over
predicted, first passes and later passes apart: a later pass skips the first call, the
agreement check and the memory measurement); without a predictor, the mean of the passes
done. That pace is learnt mostly on small points, whose passes are fixed overhead, and a
large point's calls may be far slower than the predictor's nominal FLOP rate says (a loaded
CPU ran eager attention at n=4096 20x under it); so the expected seconds are also at least the
calls a pass cannot skip (``calls``: first call, agreement check, memory, warm-up and the
minimum samples of a first pass; warm-up and minimum samples of a later one) at the call time
measured on the same implementation's nearest point, scaled by predicted FLOPs (to the power
:data:`UPWARD` for a larger point: its calls leave the caches the small one fitted in).
In-process, a point that has started cannot be stopped: these are estimates, and a pass that
takes longer than expected makes the run end after its limit (docs/time_limit.md says by how
much on a loaded CPU).
The first pass of the run always runs, whatever the limit (the session says so when
it is expected to overrun). A pass that does not fit is left out together with every later
pass of its point, so a point never gets a row from passes with a gap; smaller passes later
in the queue may still fit. Once the time is up, nothing fits.

A point with no finished pass is *left out*; one with some passes but not all is *cut*: its
finished passes stay in ``passes.jsonl``, where readers find its partial row and ``--resume``
runs the passes it lacks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from harness.scenarios.interface import Point, scenario_of

UPWARD = 1.25  # call time ~ FLOPs^UPWARD when extrapolating to a larger point


def predicted_flops(point: Point) -> float | None:
    """The FLOPs one call of ``point`` is predicted to execute (None when its cost model fails)."""
    try:
        return float(scenario_of(point).cost(point).predicted_flops)
    except Exception:  # a cost-model gap: the pace alone decides
        return None


@dataclass
class Deadline:
    """The time limit of one run (``limit_s`` seconds from the first pass's start)."""

    limit_s: float
    predict: Callable[[Point], float] | None = None  # predicted seconds of one pass
    clock: Callable[[], float] = time.monotonic
    started: float | None = None
    calls: tuple[int, int] = (0, 0)  # calls a (first, later) pass cannot skip
    flops: Callable[[Point], float | None] = predicted_flops
    _pass_start: float = 0.0
    # impl -> [(predicted FLOPs, seconds per call)] of its measured points
    _call_s: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    left_out: set[str] = field(default_factory=set)  # points with no pass run
    cut: set[str] = field(default_factory=set)  # points with some passes, cut before the last
    # False: only first passes fit (a session that runs every first pass, over several suites,
    # before any later pass); a later pass refused so is not a cut: it may run when this is True
    later_passes: bool = True
    # (first pass?) -> [actual seconds, predicted seconds] of the passes done
    _pace: dict[bool, list[float]] = field(default_factory=lambda: {True: [0.0, 0.0],
                                                                    False: [0.0, 0.0]})
    _counts: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})

    def elapsed(self) -> float:
        return 0.0 if self.started is None else self.clock() - self.started

    def expected(self, point: Point, first: bool) -> float:
        """Expected seconds of a pass of ``point``: the run's pace so far, and at least its
        unskippable calls at the measured call time (0 before any pass)."""
        return max(self._paced(point, first), self._calls_s(point, first))

    def _paced(self, point: Point, first: bool) -> float:
        kind = first if self._counts[first] else True  # a later pass before any: first's pace
        actual, predicted = self._pace[kind]
        if not self._counts[kind]:
            return 0.0
        if self.predict is None:
            return actual / self._counts[kind]
        guess = self.predict(point)
        return guess * actual / predicted if predicted > 0 else actual / self._counts[kind]

    def _calls_s(self, point: Point, first: bool) -> float:
        """The unskippable calls of a pass at the call time of the same implementation's
        measured point nearest in predicted FLOPs, scaled by FLOPs (0 when none is known)."""
        known, flops = self._call_s.get(point.impl), self.flops(point)
        if not known or not flops:
            return 0.0
        ref_flops, ref_s = min(known, key=lambda k: abs(math.log(k[0] / flops)))
        ratio = flops / ref_flops
        # upwards, faster than the FLOPs: a larger call leaves the caches (eager attention's
        # n x n scores: n=512 -> 4096 took 75-392x the time for 64x the FLOPs on a loaded CPU;
        # 1.5 kept a 90 s run off every large end: docs/time_limit.md)
        return self.calls[0 if first else 1] * ref_s * ratio ** (UPWARD if ratio > 1 else 1)

    def fits(self, point: Point, first: bool) -> bool:
        """Whether a pass of ``point`` may start now; starts the clock on the first call."""
        now = self.clock()
        if not first and not self.later_passes:
            return False
        if self.started is None:
            self.started = self._pass_start = now
            return True
        self._pass_start = now
        return self.expected(point, first) <= self.limit_s - (now - self.started)

    def record(self, point: Point, first: bool, seconds: float | None = None,
               record: dict | None = None) -> None:
        """A pass of ``point`` took ``seconds`` (default: since :meth:`fits` let it start);
        ``record``: its row or pass record, whose median call time is learnt."""
        if seconds is None:
            seconds = self.clock() - self._pass_start
        median = _median_call_s(record or {})
        flops = self.flops(point) if median else None
        if median and flops:
            self._call_s.setdefault(point.impl, []).append((flops, median))
        self._counts[first] += 1
        self._pace[first][0] += seconds
        self._pace[first][1] += self.predict(point) if self.predict is not None else seconds

    def leave(self, point_id: str, pass_index: int) -> None:
        """Pass ``pass_index`` of a point did not fit: the point is left out (no pass) or cut
        (not when only first passes may run: its later passes wait, they are not cut)."""
        if pass_index > 0 and not self.later_passes:
            return
        (self.left_out if pass_index == 0 else self.cut).add(point_id)

    def dropped(self, point_id: str) -> bool:
        return point_id in self.left_out or point_id in self.cut


def _median_call_s(record: dict) -> float | None:
    """Seconds per call of an ok pass: its ``time_median_s`` (a first pass's row) or the
    median of its ``time_samples_s`` (a later pass's record)."""
    if record.get("status") != "ok":
        return None
    median = record.get("time_median_s")
    if not isinstance(median, int | float):
        samples = sorted(x for x in record.get("time_samples_s") or () if isinstance(x, float))
        median = samples[len(samples) // 2] if samples else None
    return float(median) if isinstance(median, int | float) and median > 0 else None
