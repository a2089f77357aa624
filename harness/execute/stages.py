"""The order of a session over several suites (``attnbench verdicts``): which points are
measured, in which :class:`Stage`\\ s, in what order. Pure functions of the suites, their
judged groups, the claims judged on time and predicted seconds; :mod:`harness.execute.multisuite`
runs the stages.

The order is ``run --time-limit``'s (docs/time_limit.md), over every suite at once:

- each suite's judged groups (:func:`harness.analysis.groups.judged_groups`) are bisected in
  log space (:func:`harness.sweep.order.bisection_levels`): level 0 the two ends of a group's
  axis, level 1 the middle, ...; a point's level is the earliest any group gives it, and the
  points of one unit (a ratio claim's pair at one x) share it, so they run back to back;
- a group of a claim judged on time comes :data:`TIME_LAG` levels later than the others: a
  memory, error or byte count is decided by its rows on any machine, a time only where the
  machine was quiet (cheapest decisive first); a claim's groups are ranked (the one with the
  most affordable axis values first) and each further group starts a level later: one group
  with enough points decides a claim;
- a *dear* point, predicted (at the nominal rate) to take more than :data:`DEAR_SHARE` of the
  limit, is not an end of its group's axis: the axis is bisected without it, and dear points
  come after every other first pass, cheapest first;
- within a level, the points that serve a counted claim come before those that serve only
  time claims; then the suites whose points serve the most claims per point (a first pass
  costs mostly its fixed checks); within a suite, each claim's first group before its others,
  else the suite's own coarse-to-fine order: one :class:`Stage` per (level, tier, suite);
- points no claim reads are not measured (they decide nothing);
- every first pass comes before any later pass: the later passes of the suites run last, as a
  stage per suite, while time is left.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from harness.errors import CliError
from harness.scenarios.interface import Point
from harness.sweep.order import bisection_levels, coarse_to_fine
from harness.sweep.suite import Suite

# a point predicted (at the nominal rate) over this share of the limit is measured last: the
# nominal rate leaves out a first pass's checks, which grow faster than the call (claims-cpu's
# eight ends took 139 s at load 4.5 with n = 4096 among them (3 %), 34 s without it (1 %))
DEAR_SHARE = 0.01
LATER = 1000  # the level of the later passes' stages (after every first pass)
TIME_LAG = 2  # levels a group of a claim judged on time comes after counted ones
DEAR = 100  # dear points' levels start here (after every affordable first pass)


class ClaimGroup(Protocol):
    """A judged group (:class:`harness.analysis.groups.JudgedGroup`): a
    :class:`harness.sweep.order.Group` that names its claim."""

    @property
    def label(self) -> str: ...

    @property
    def units(self) -> tuple[tuple[float, tuple[str, ...]], ...]: ...

    @property
    def claim(self) -> str: ...


class Rule(Protocol):
    """The order's stopping rule (:class:`harness.analysis.groups.StoppingRule`)."""

    decided: dict[str, str]

    def __call__(self, rows: Sequence[dict], env: dict | None = None) -> set[str]: ...

    def wanted(self, point_id: str, left_out: set[str]) -> bool: ...


def point_ids(group: ClaimGroup) -> set[str]:
    return {pid for _, ids in group.units for pid in ids}


@dataclass
class Member:
    """One suite of the session: its run directory (``OUT/runs/<suite name>``), the judged
    groups of the claims over its points, its stopping rule (kept across stages), the claims
    judged on time (their groups come a level later) and ``predict(point)``: the predicted
    seconds of a first pass (the shard planner's model)."""

    suite: Suite
    run_dir: Path
    groups: Sequence[ClaimGroup]
    rule: Rule
    time_judged: frozenset[str]
    predict: Callable[[Point], float]

    def read(self) -> set[str]:
        """Point ids of this suite that some judged group reads."""
        return {pid for g in self.groups for pid in point_ids(g)}


@dataclass(frozen=True)
class Stage:
    """One call of the session: ``suite``'s points ``point_ids`` (in their order) at ``level``
    (:data:`DEAR` and up: dear points; :data:`LATER`: later passes), predicted ``seconds``
    (first passes at the nominal rate), and the claims they serve."""

    suite: str
    level: int
    point_ids: tuple[str, ...]
    seconds: float
    claims: tuple[str, ...] = ()

    @property
    def later(self) -> bool:
        return self.level >= LATER


def check_names(suites: Sequence[Suite]) -> None:
    """Refuse two suites of one name (each suite's rows go to ``OUT/runs/<name>``)."""
    seen: dict[str, str] = {}
    for suite in suites:
        if suite.name in seen:
            raise CliError(
                f"{suite.path}: suite name {suite.name!r} is taken by "
                f"{seen[suite.name]} (each suite's rows go to OUT/runs/<name>)"
            )
        seen[suite.name] = suite.path


def point_levels(member: Member, limit_s: float) -> dict[str, int]:
    """point id -> level in the session's order (module docstring) for every point a group
    reads."""
    points = {p.point_id: p for p in member.suite.points}
    dear = {pid for pid in member.read() if member.predict(points[pid]) > DEAR_SHARE * limit_s}
    cheap = {g.label: [x for x, ids in g.units if not set(ids) & dear] for g in member.groups}
    rank = _ranks(member, cheap, points)
    level: dict[str, int] = {}
    for group in member.groups:
        lag = (TIME_LAG if group.claim in member.time_judged else 0) + rank[group.label]
        at = dict(group.units)
        for depth, xs in enumerate(bisection_levels(cheap[group.label])):
            for x in xs:
                for pid in at[x]:
                    level[pid] = min(level.get(pid, depth + lag), depth + lag)
        for _, ids in group.units:  # dear units: after every cheap point, cheapest first
            if set(ids) & dear:
                for pid in ids:
                    level.setdefault(pid, DEAR)
    for group in member.groups:  # a unit (a ratio pair) runs as one: its earliest level
        for _, ids in group.units:
            first = min(level[pid] for pid in ids)
            for pid in ids:
                level[pid] = first
    return level


def _ranks(
    member: Member, cheap: dict[str, list[float]], points: dict[str, Point]
) -> dict[str, int]:
    """group label -> its rank among its claim's groups in this suite: 0 for the group with
    the most affordable axis values (the cheaper on a tie), 1 for the next, ... One group with
    enough points decides a claim (thin groups beside it are not judged), so a claim's first
    group runs to its middles before its second group starts."""

    def cost(group: ClaimGroup) -> float:
        return sum(
            member.predict(points[pid])
            for x, ids in group.units
            if x in cheap[group.label]
            for pid in ids
        )

    ranks: dict[str, int] = {}
    for claim in dict.fromkeys(g.claim for g in member.groups):
        mine = sorted(
            (g for g in member.groups if g.claim == claim),
            key=lambda g: (-len(cheap[g.label]), cost(g)),
        )
        ranks.update({g.label: r for r, g in enumerate(mine)})
    return ranks


def schedule(
    members: Sequence[Member],
    limit_s: float,
    skip: Callable[[Member, str], bool] = lambda m, pid: False,
) -> list[Stage]:
    """The session's stages in order (module docstring); points ``skip`` names (done, or
    serving only decided claims) are left out, and stages left empty dropped."""
    by_level: dict[tuple[int, int], list[Stage]] = {}
    for member in members:
        points = {p.point_id: p for p in member.suite.points}
        order = [s.point_id for s in coarse_to_fine(list(points), member.groups)]
        levels = point_levels(member, limit_s)
        dear = sorted(
            (pid for pid in order if levels.get(pid, -1) >= DEAR),
            key=lambda pid: member.predict(points[pid]),
        )
        for pid, k in zip(dear, _dear_levels(dear, member, points), strict=True):
            levels[pid] = k
        tier = _tiers(member)
        first = _primary(member, limit_s)
        for level, rank in sorted({(lv, tier[pid]) for pid, lv in levels.items()}):
            ids = tuple(
                sorted(
                    (
                        pid
                        for pid in (dear if level >= DEAR else order)
                        if levels.get(pid) == level and tier[pid] == rank and not skip(member, pid)
                    ),
                    key=lambda pid: first[pid] if level < DEAR else 0,
                )
            )
            if ids:
                served = sorted({g.claim for g in member.groups if point_ids(g) & set(ids)})
                seconds = sum(member.predict(points[pid]) for pid in ids)
                by_level.setdefault((level, rank), []).append(
                    Stage(member.suite.name, level, ids, seconds, tuple(served))
                )
    timed = frozenset().union(*(m.time_judged for m in members))

    def value(stage: Stage) -> tuple[float, float]:
        """Claims served per point (a claim judged on counts or allocations twice: any machine
        decides it), then the cheaper per point: a first pass costs mostly its fixed checks."""
        served = sum(1 if claim in timed else 2 for claim in stage.claims)
        return (-served / len(stage.point_ids), stage.seconds / len(stage.point_ids))

    stages = []
    for level in sorted(by_level):
        stages += sorted(by_level[level], key=value)
    later = [  # later passes refine times: the points of time claims' groups
        Stage(
            m.suite.name,
            LATER,
            tuple(pid for pid in sorted(_timed_points(m)) if not skip(m, pid)),
            0.0,
        )
        for m in members
        if m.suite.measure.passes > 1
    ]
    return stages + [s for s in later if s.point_ids]


def _primary(member: Member, limit_s: float) -> dict[str, int]:
    """point id -> the best rank among the groups that read it (a time claim's group counts
    after every other's), shared by a unit: within a stage, the points of each claim's first
    group come first (sorted is stable: the coarse-to-fine order within a rank)."""
    points = {p.point_id: p for p in member.suite.points}
    dear = {pid for pid in member.read() if member.predict(points[pid]) > DEAR_SHARE * limit_s}
    cheap = {g.label: [x for x, ids in g.units if not set(ids) & dear] for g in member.groups}
    rank = _ranks(member, cheap, points)
    best: dict[str, int] = {}
    for group in member.groups:
        mine = rank[group.label] + (LATER if group.claim in member.time_judged else 0)
        for _, ids in group.units:
            unit = min([mine, *(best.get(pid, mine) for pid in ids)])
            for pid in ids:
                best[pid] = unit
    return best


def _tiers(member: Member) -> dict[str, int]:
    """point id -> 0 when its unit serves a claim judged on counts, allocations or errors, 1
    when it serves only time claims: within a level the first come first (contention cannot
    undo them), a ratio pair keeping one tier."""
    counted = {
        pid for g in member.groups if g.claim not in member.time_judged for pid in point_ids(g)
    }
    tier = {}
    for group in member.groups:
        for _, ids in group.units:
            rank = 0 if counted & set(ids) else 1
            for pid in ids:
                tier[pid] = min(tier.get(pid, rank), rank)
    return tier


def _timed_points(member: Member) -> set[str]:
    return {pid for g in member.groups if g.claim in member.time_judged for pid in point_ids(g)}


def _dear_levels(dear: list[str], member: Member, points: dict[str, Point]) -> list[int]:
    """Dear points one level each in a unit (so a ratio pair stays together), cheapest first."""
    unit_of = {pid: tuple(ids) for g in member.groups for _, ids in g.units for pid in ids}
    levels, seen = [], {}
    for pid in dear:
        unit = unit_of.get(pid, (pid,))
        seen.setdefault(unit, DEAR + len(seen))
        levels.append(seen[unit])
    return levels


def describe(
    stages: Sequence[Stage], members: Sequence[Member], limit_s: float, decided: set[str]
) -> list[str]:
    """``--dry-run``: the stages in order with their predicted seconds (nominal rate) and
    where the limit falls among them, then the time per suite and per claim."""
    lines = [
        f"attnbench verdicts: {len(stages)} stages over {len(members)} suites, "
        f"{limit_s:.0f} s to measure; seconds predicted at the nominal rate (a loaded "
        "machine is slower: the session's own pace decides what fits)"
    ]
    if decided:
        lines.append(f"decided already in --out (not measured again): {', '.join(sorted(decided))}")
    total, said = 0.0, False
    by_name = {m.suite.name: m for m in members}
    for number, stage in enumerate(stages, 1):
        total += stage.seconds
        if total > limit_s and not said:
            lines.append(f"--- the limit ({limit_s:.0f} s) falls here at the nominal rate ---")
            said = True
        what = (
            "later passes" if stage.later else f"L{stage.level}" if stage.level < DEAR else "dear"
        )
        lines.append(
            f"{number:>3}  {what:<12} {stage.suite:<26} "
            f"{len(stage.point_ids):>3} points "
            + (
                f"{stage.seconds:6.1f} s  (total {total:6.1f} s)  "
                if not stage.later
                else "while time is left  "
            )
            + ", ".join(stage.claims)
        )
        if not stage.later:
            labels = {p.point_id: p.label() for p in by_name[stage.suite].suite.points}
            lines.append("       " + "; ".join(labels[pid] for pid in stage.point_ids))
    lines.append("time per suite (first passes, predicted):")
    per_claim: dict[str, float] = {}
    for member in members:
        points = {p.point_id: p for p in member.suite.points}
        mine = [s for s in stages if s.suite == member.suite.name and not s.later]
        lines.append(
            f"  {member.suite.name}: "
            f"{sum(s.seconds for s in mine):.1f} s, "
            f"{sum(len(s.point_ids) for s in mine)} points "
            f"({len(points) - len(member.read())} points no claim reads: not measured)"
        )
        ids = {pid for s in mine for pid in s.point_ids}
        for group in member.groups:
            mine_ids = point_ids(group) & ids
            per_claim[group.claim] = per_claim.get(group.claim, 0.0) + sum(
                member.predict(points[pid]) for pid in mine_ids
            )
    lines.append(
        "time per claim (first passes of its points, predicted; a point read by "
        "several claims counts in each):"
    )
    lines += [
        f"  {claim}: {seconds:.1f} s"
        for claim, seconds in sorted(per_claim.items(), key=lambda kv: kv[1])
    ]
    return lines
