"""Visible runs: the geometry of global tokens and of plug-in features such as attention sinks.

A *runs feature* makes some key positions visible to every query (``key_runs``) and some
query positions see every key (``row_runs``), before causality cuts the future (rule 2 of
:mod:`harness.masks`). Global tokens are both (:mod:`.globals`); attention sinks
(StreamingLLM, Xiao et al. 2023: the first s keys kept on top of a sliding window) are keys
only. Any such feature is counted in closed form by :mod:`harness.paircount` (runs are its
``keys_g``/``rows_g``), planned by the block plan, tiled by the CPU tiles and masked by Flex
with no code of its own beyond this class: a subclass states its runs, and the element
predicate follows from them (:meth:`RunsFeature.keep`).

A subclass must be a frozen dataclass (a MaskSpec is hashed as a cache key) and name the
capability its paths need (``needs``): a path runs it when it runs that capability, and
refuses it by the feature's own ``name`` otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

Runs = tuple[tuple[int, int], ...]  # sorted, disjoint [start, end) intervals


def merge_runs(*groups: Runs) -> Runs:
    """The union of groups of ``[start, end)`` runs, sorted, touching runs joined."""
    out: list[list[int]] = []
    for a, b in sorted(r for g in groups for r in g if r[1] > r[0]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return tuple((a, b) for a, b in out)


MAX_CONSTANT_RUNS = 4  # runs tested as constant ranges; more read one bool table


def positions(runs: Runs, documents: tuple[int, ...] | None, n: int, first: int = 0
              ) -> tuple[int, ...]:
    """The absolute positions of ``runs`` below ``n``, ascending. With documents a run's
    positions are each document's own (document ``[s, s + l)`` holds ``s + x`` for each ``x <
    l`` in the runs, rule 5 of :mod:`harness.masks`); without them a run at 0 reaches down to
    ``first`` (< 0: rows before the first key count as position 0)."""
    if documents is None:
        out = [x for a, e in runs for x in range(a, min(e, n))]
        if runs and runs[0][0] == 0 and first < 0:
            out = list(range(first, 0)) + out
        return tuple(out)
    out, start = [], 0
    for length in documents:
        out.extend(start + x for a, e in runs for x in range(a, min(e, length)))
        start += length
    return tuple(x for x in out if x < n)


def in_runs(x: Tensor, runs: Runs) -> Tensor:
    """``x`` lies in one of ``runs``, elementwise bool (x any integer tensor; one below 0
    counts as 0, a row before the first key). Out of place
    (no tensor is created and written to), so it also runs under vmap and Flex's tracing."""
    out = None
    for a, b in runs:
        inside = (x < b) if a <= 0 else ((x >= a) & (x < b))  # x >= 0 or a member (see below)
        out = inside if out is None else out | inside
    return x < x if out is None else out


@lru_cache(maxsize=64)
def membership(runs: Runs, device: str) -> Callable[[Tensor], Tensor] | None:
    """``x -> x in runs`` for positions x, where a position below 0 counts as 0 (a row before
    the first key); None without runs. Up to :data:`MAX_CONSTANT_RUNS` runs are range tests
    on Python constants (:func:`in_runs`); more read one captured bool table (one entry past
    the last run, so a clamped lookup is right for every x). Cached: the same runs give the
    same function, and a mask whose row and key runs agree reads one table."""
    if not runs:
        return None
    if len(runs) <= MAX_CONSTANT_RUNS:
        return lambda x: in_runs(x, runs)
    table = torch.zeros(runs[-1][1] + 1, dtype=torch.bool)  # (last run's end + 1,)
    for a, b in runs:
        table[a:b] = True
    table, last = table.to(device), runs[-1][1]
    return lambda x: table[x.clamp(0, last)]


@dataclass(frozen=True)
class RunsFeature:
    """A plug-in mask feature made of visible runs (rule 2 of :mod:`harness.masks`)."""

    name = "runs"  # the feature's name in refusals and labels (a class attribute)
    needs = "global_positions"  # the capability a path needs to run it

    def key_runs(self) -> Runs:
        """Keys every query keeps (before causality), in document-local positions."""
        return ()

    def row_runs(self) -> Runs:
        """Query positions that keep every key (before causality); a row before the first
        key (p < 0) counts as position 0."""
        return ()

    def check(self) -> None:
        """Raise ``ValueError`` for fields out of range (called by MaskSpec)."""

    def label(self) -> str:
        """A short label for :meth:`MaskSpec.describe`."""
        return self.name

    def keep(self, p: Tensor, j: Tensor) -> Tensor:
        """The element predicate: (r, 1) query positions, (1, c) keys -> bool (r, c)."""
        return in_runs(p.clamp_min(0), self.row_runs()) | in_runs(j, self.key_runs())
