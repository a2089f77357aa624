"""What a person sees while attnbench works, on a terminal and in a file or pipe.

- :func:`console`: a rich Console that fits the terminal's width, and on a file or a pipe never
  wraps or cuts a line (a table is as wide as its cells). When the reader of a pipe leaves
  (``| head``, ``| true``), writing raises :class:`BrokenPipeError`, which the command line
  turns into a quiet exit 0 (``compare``: its verdict). rich's own handling,
  ``Console.on_broken_pipe``, raises ``SystemExit(1)`` -- the exit status of a regression --
  so it is replaced here.
- :func:`text_width` and :func:`word_table`: prose-like cells (reasons, feature lists) wrapped
  at word boundaries to the terminal's width, or to :data:`PIPE_WIDTH` on a file or a pipe;
  never a word cut in two.
- :class:`Progress`: a run's progress as the pass and the points done of that pass
  (``pass 2/3: 12/36 points``; neither total changes while shown): a bar on a terminal;
  elsewhere one plain line at most every :data:`LINE_EVERY_S` seconds, each with the time so
  far and the expected time left (ETA), which starts from a prediction and follows the pace
  the run actually keeps.
"""

from __future__ import annotations

import errno
import os
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn
from rich.progress import Progress as RichProgress

WIDE = 10_000  # columns on a file or pipe: wide enough that nothing is ever wrapped or cut
PIPE_WIDTH = 100  # columns of wrapped text on a file or pipe when $COLUMNS does not say
LINE_EVERY_S = 10.0  # plain progress lines, at most one per this many seconds


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """The reader left: stop writing and say so as the exception the CLI expects."""
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, "the reader closed the pipe")


def console(stream: TextIO | None = None) -> Console:
    """A rich Console on ``stream`` (default stdout): the terminal's width on a terminal; on a
    file or pipe no colour and no wrapping or cutting at any width."""
    stream = sys.stdout if stream is None else stream
    probe = _Console(file=stream, highlight=False)
    if probe.is_terminal:
        return probe
    return _Console(file=stream, highlight=False, width=WIDE, no_color=True)


def text_width(stream: TextIO | None = None) -> int:
    """Columns to wrap text to on ``stream`` (default stdout): the terminal's width on a
    terminal; on a file or a pipe ``$COLUMNS`` when set, else :data:`PIPE_WIDTH`."""
    stream = sys.stdout if stream is None else stream
    try:
        if stream.isatty():
            return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):  # no descriptor (a StringIO, pytest capture)
        pass
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else PIPE_WIDTH


def word_table(header: Sequence[str], rows: Sequence[Sequence[str]], width: int,
               gap: int = 2, max_lines: int | None = None) -> str | None:
    """A plain-text table in ``width`` columns whose cells wrap at spaces, never inside a word
    (nor at a hyphen: ``block-sparse`` stays whole), a rule under the header. Columns get their
    full width when all fit, else their longest word plus a share of the room left in
    proportion to what they lack. None when even the longest words side by side do not fit,
    or a row would take more than ``max_lines`` lines: the caller lays the rows out another
    way."""
    cells = [list(header), *(list(r) for r in rows)]
    count = len(header)
    natural = [max(len(r[j]) for r in cells) for j in range(count)]
    longest = [max((len(w) for r in cells for w in r[j].split()), default=0)
               for j in range(count)]
    room = width - gap * (count - 1)
    if sum(longest) > room:
        return None
    widths = natural if sum(natural) <= room else _shares(natural, longest, room)
    spacer = " " * gap
    lines = []
    for i, row in enumerate(cells):
        wrapped = [textwrap.wrap(cell, w, break_long_words=False, break_on_hyphens=False) or [""]
                   for cell, w in zip(row, widths, strict=True)]
        height = max(len(c) for c in wrapped)
        if max_lines is not None and height > max_lines:
            return None
        for k in range(height):
            parts = [(c[k] if k < len(c) else "").ljust(w)
                     for c, w in zip(wrapped, widths, strict=True)]
            lines.append(spacer.join(parts).rstrip())
        if i == 0:
            lines.append(spacer.join("-" * w for w in widths))
    return "\n".join(lines)


def _shares(natural: list[int], least: list[int], room: int) -> list[int]:
    """Column widths in ``room``: a column whose full width is within a fair share of the room
    left gets it (narrow columns stay on one line), repeatedly; the others start at their
    longest word and share what is left in proportion to their shortfall."""
    widths = list(least)
    open_ = set(range(len(natural)))
    left = room
    settled = True
    while settled and open_:
        settled = False
        for j in sorted(open_, key=lambda j: natural[j]):
            others = sum(least[k] for k in open_ if k != j)
            if natural[j] <= left / len(open_) and left - natural[j] >= others:
                widths[j], left = natural[j], left - natural[j]
                open_.remove(j)
                settled = True
                break
    want = {j: natural[j] - least[j] for j in open_}
    spare = left - sum(least[j] for j in open_)
    for j in open_:
        widths[j] += spare * want[j] // max(sum(want.values()), 1)
    for j in sorted(open_, key=lambda j: -want[j])[: left - sum(widths[j] for j in open_)]:
        widths[j] += 1
    return widths


def duration(seconds: float) -> str:
    """``42 s``, ``3.5 min``, ``1.2 h``: how long something takes, to a person."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


class Progress:
    """A run's progress pass by pass: ``pass 2/3: 12/36 points``. Neither total moves while
    it is shown: the passes are fixed, and a pass's points are counted when it begins (a point
    that failed its first pass has left the later passes by then). :meth:`step` after each
    point's pass, :meth:`forget` a point that will not run again.

    ``schedule`` maps (point id, pass index) to the predicted seconds of every pass still to run.
    The expected time left is the prediction of the remaining steps scaled by how the run's
    pace so far compares with the prediction of the steps done (a machine twice as slow as
    predicted doubles it). With ``limit_s`` (a run's time limit) it is never more than the
    time left."""

    def __init__(self, schedule: Mapping[tuple[str, int], float], passes: int,
                 stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic,
                 limit_s: float | None = None):
        self.schedule = dict(schedule)
        self.limit_s = limit_s
        self.passes = passes
        self.per_pass = Counter(k for _, k in self.schedule)  # steps still scheduled per pass
        self.left_s = float(sum(self.schedule.values()))
        self.stream = sys.stderr if stream is None else stream
        self.clock = clock
        self.start = self.last_line = clock()
        self.current: int | None = None  # the pass being shown
        self.done = 0  # its points done
        self.total = 0  # its points, counted when it began
        self.done_s = 0.0  # predicted seconds of every step done
        self._bar: RichProgress | None = None
        self._task = None

    def __enter__(self) -> Progress:
        out = console(self.stream)
        if out.is_terminal:
            columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TextColumn("points, {task.fields[so_far]} so far {task.fields[eta]}"),
                       TextColumn("{task.fields[last]}"))
            self._bar = RichProgress(*columns, console=out)
            self._bar.__enter__()
            first = min((k for _, k in self.schedule), default=0)
            self._task = self._bar.add_task(f"pass {first + 1}/{self.passes}",
                                            total=self.per_pass[first], so_far="0 s",
                                            eta=f"ETA {duration(self.left_s)}", last="")
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def eta_s(self) -> float:
        """Expected seconds left."""
        left = self.left_s
        if self.done_s > 0:
            left = self.left_s * (self.clock() - self.start) / self.done_s
        if self.limit_s is not None:
            left = min(left, max(self.limit_s - (self.clock() - self.start), 0.0))
        return left

    def forget(self, point_id: str) -> None:
        """A point failed its first pass: its later passes will not run."""
        for k in range(1, self.passes):
            if (point_id, k) in self.schedule:
                self.left_s = max(self.left_s - self.schedule.pop((point_id, k)), 0.0)
                self.per_pass[k] -= 1

    def step(self, point_id: str, k: int, what: str) -> None:
        """Pass ``k`` of ``point_id`` finished (``what`` says which: ``sdpa n=512: ok``)."""
        if k != self.current:  # a new pass: count its points now
            self.current, self.done = k, 0
            self.total = self.per_pass[k]
            if self._bar is not None:
                self._bar.reset(self._task, total=self.total,
                                description=f"pass {k + 1}/{self.passes}")
        predicted = self.schedule.get((point_id, k), 0.0)
        self.done += 1
        self.done_s += predicted
        self.left_s = max(self.left_s - predicted, 0.0)
        finished = self.done >= self.total and k == max(j for j, n in self.per_pass.items() if n)
        eta = "" if finished else f"ETA {duration(self.eta_s())}"
        now = self.clock()
        if self._bar is not None:
            self._bar.update(self._task, advance=1, so_far=duration(now - self.start),
                             eta=eta, last=what)
            return
        if now - self.last_line >= LINE_EVERY_S or finished:
            self.last_line = now
            share = 100 * self.done / max(self.total, 1)
            noun = "point" if self.total == 1 else "points"
            print(f"attnbench: pass {k + 1}/{self.passes}: {self.done}/{self.total} {noun} "
                  f"({share:.0f}%), {duration(now - self.start)} so far"
                  + (f", {eta}" if eta else "") + f"; last: {what}",
                  file=self.stream, flush=True)
