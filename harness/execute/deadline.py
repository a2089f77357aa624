"""A whole-run time limit (``attnbench run --time-limit``, ``[measure] time_limit_s``): which
timing passes still fit, and which points it left out.

The clock starts when the first pass of the first point starts (after the run directory and
the device calibration are in place). Before each pass the runner asks :meth:`Deadline.fits`:
a pass fits when its expected seconds fit in the time left. The expected seconds are the
point's predicted seconds scaled by the pace of the passes done so far (actual over
predicted, first passes and later passes apart: a later pass skips the first call, the
agreement check and the memory measurement); without a predictor, the mean of the passes
done. The first pass of the run always runs, whatever the limit (the session says so when
it is expected to overrun). A pass that does not fit is left out together with every later
pass of its point, so a point never gets a row from passes with a gap; smaller passes later
in the queue may still fit. Once the time is up, nothing fits.

A point with no finished pass is *left out*; one with some passes but not all is *cut*: its
finished passes stay in ``passes.jsonl``, where readers find its partial row and ``--resume``
runs the passes it lacks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from harness.scenarios.interface import Point


@dataclass
class Deadline:
    """The time limit of one run (``limit_s`` seconds from the first pass's start)."""

    limit_s: float
    predict: Callable[[Point], float] | None = None  # predicted seconds of one pass
    clock: Callable[[], float] = time.monotonic
    started: float | None = None
    _pass_start: float = 0.0
    left_out: set[str] = field(default_factory=set)  # points with no pass run
    cut: set[str] = field(default_factory=set)  # points with some passes, cut before the last
    # (first pass?) -> [actual seconds, predicted seconds] of the passes done
    _pace: dict[bool, list[float]] = field(default_factory=lambda: {True: [0.0, 0.0],
                                                                    False: [0.0, 0.0]})
    _counts: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})

    def elapsed(self) -> float:
        return 0.0 if self.started is None else self.clock() - self.started

    def expected(self, point: Point, first: bool) -> float:
        """Expected seconds of a pass of ``point`` at the run's pace so far (0 before any)."""
        kind = first if self._counts[first] else True  # a later pass before any: first's pace
        actual, predicted = self._pace[kind]
        if not self._counts[kind]:
            return 0.0
        if self.predict is None:
            return actual / self._counts[kind]
        guess = self.predict(point)
        return guess * actual / predicted if predicted > 0 else actual / self._counts[kind]

    def fits(self, point: Point, first: bool) -> bool:
        """Whether a pass of ``point`` may start now; starts the clock on the first call."""
        now = self.clock()
        if self.started is None:
            self.started = self._pass_start = now
            return True
        self._pass_start = now
        return self.expected(point, first) <= self.limit_s - (now - self.started)

    def record(self, point: Point, first: bool, seconds: float | None = None) -> None:
        """A pass of ``point`` took ``seconds`` (default: since :meth:`fits` let it start)."""
        if seconds is None:
            seconds = self.clock() - self._pass_start
        self._counts[first] += 1
        self._pace[first][0] += seconds
        self._pace[first][1] += self.predict(point) if self.predict is not None else seconds

    def leave(self, point_id: str, pass_index: int) -> None:
        """Pass ``pass_index`` of a point did not fit: the point is left out (no pass) or cut."""
        (self.left_out if pass_index == 0 else self.cut).add(point_id)

    def dropped(self, point_id: str) -> bool:
        return point_id in self.left_out or point_id in self.cut
