"""Coarse-to-fine point order: the order a time-limited run measures its points in, so that a
run cut anywhere is as decisive as it can be (docs/time_limit.md).

A *judged group* is the set of points one claim fits together: one implementation's points
along the claim's swept axis (``over``), the other fields fixed. Which points form which
group is the analysis' rule (:mod:`harness.analysis.groups` builds them from a suite and a
claims file, a layer above this one); this module only orders them, from plain data:

1. each group's swept values by *bisection in log space*: level 0 is the two ends of the axis,
   level 1 the value nearest the geometric middle of the ends, level 2 the middles of the two
   halves, and so on (breadth first), so a group cut after level L has its whole range at a
   spacing of about 2^-L octaves of it;
2. the groups interleaved level by level: every group's ends before any group's midpoints;
3. a value stands for every point of the group at that value: a ratio claim's impl and
   baseline rows at one x are one unit, measured back to back;
4. a point that several groups want comes at its earliest place; points no group reads
   follow, in the suite's order.

Pure functions over point ids: nothing here measures or reads a claim.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class Group(Protocol):
    """One judged group (:class:`harness.analysis.groups.JudgedGroup` is one): ``label``
    (claim id and the fixed fields, for ``--dry-run``) and ``units``: (x, point ids measured
    together at x), in any order."""

    @property
    def label(self) -> str: ...

    @property
    def units(self) -> tuple[tuple[float, tuple[str, ...]], ...]: ...


@dataclass(frozen=True)
class Slot:
    """A point's place in the coarse-to-fine order: its ``level`` (0 = an end of an axis;
    None = read by no group) and the ``group`` that put it there (its label)."""

    point_id: str
    level: int | None
    group: str | None


def bisection_levels(xs: Sequence[float]) -> list[list[float]]:
    """The values ``xs`` (any order, duplicates ignored) level by level: [[min, max],
    [nearest the log-middle of them], [middles of both halves], ...]. Positive values are
    bisected in log space (an octave sweep's middles), others linearly."""
    values = sorted(set(xs))
    if len(values) <= 2:
        return [values] if values else []
    log = all(v > 0 for v in values)
    pos = [math.log(v) if log else float(v) for v in values]
    levels: list[list[float]] = [[values[0], values[-1]]]
    spans = [(0, len(values) - 1)]
    while spans:
        level, nxt = [], []
        for lo, hi in spans:
            if hi - lo < 2:
                continue
            middle = (pos[lo] + pos[hi]) / 2
            mid = min(range(lo + 1, hi), key=lambda i: (abs(pos[i] - middle), i))
            level.append(values[mid])
            nxt += [(lo, mid), (mid, hi)]
        if level:
            levels.append(level)
        spans = nxt
    return levels


def coarse_to_fine(point_ids: Sequence[str], groups: Sequence[Group]) -> list[Slot]:
    """Every id of ``point_ids`` once, in coarse-to-fine order over ``groups`` (the module
    docstring's rules); ids that groups name but ``point_ids`` lacks are left out."""
    known = set(point_ids)
    per_group = []
    for group in groups:
        at: dict[float, list[str]] = {}
        for x, ids in group.units:
            at.setdefault(x, []).extend(i for i in ids if i in known)
        per_group.append((group, at, bisection_levels([x for x, ids in at.items() if ids])))
    slots: list[Slot] = []
    placed: set[str] = set()
    depth = max((len(levels) for _, _, levels in per_group), default=0)
    for level in range(depth):
        for group, at, levels in per_group:
            for x in levels[level] if level < len(levels) else ():
                for pid in at[x]:
                    if pid not in placed:
                        placed.add(pid)
                        slots.append(Slot(pid, level, group.label))
    slots += [Slot(pid, None, None) for pid in point_ids if pid not in placed]
    return slots


def describe(slots: Sequence[Slot], labels: dict[str, str]) -> list[str]:
    """The order as lines for ``--dry-run``: position, level, the point's label (``labels``:
    point id -> label) and the group that placed it."""
    width = len(str(len(slots)))
    lines = []
    for i, slot in enumerate(slots, 1):
        level = f"L{slot.level}" if slot.level is not None else "--"
        why = slot.group or "read by no claim"
        lines.append(f"{i:>{width}}  {level:<3} {labels.get(slot.point_id, slot.point_id)}"
                     f"  [{why}]")
    return lines
