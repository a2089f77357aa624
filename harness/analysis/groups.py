"""The judged groups of a suite before it runs: which of its points each claim fits together,
by the analysis' own row rules, for the coarse-to-fine order of a time-limited run
(:mod:`harness.sweep.order`, which orders them: the analysis may not be imported there).

A claim's rows are chosen as its verdict chooses them (:func:`~harness.analysis.evidence.
subject_rows`: impl, scenario, ``where``, ``range``), here from the points' identity columns
instead of measured rows; they split into fits as the verdict splits them
(:func:`~harness.analysis.frames.group_keys` for an exponent claim; a ratio or crossover claim
matches its baseline's points field by field as :func:`~harness.analysis.ratios.matched`
does, and a pair at one x is one unit of the order).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd

from harness.analysis.claims import Claim
from harness.analysis.evidence import subject_rows
from harness.analysis.frames import column, group_keys, group_label, groupable
from harness.analysis.ratios import group_fields, match_keys
from harness.analysis.verdicts import evaluate
from harness.scenarios.interface import Point, scenario_of


@dataclass(frozen=True)
class JudgedGroup:
    """The points one claim fits together: ``label`` (claim id, implementation(s), the fixed
    fields), ``axis`` (the claim's ``over``) and ``units``: (x, the point ids at x: one, or a
    ratio claim's pair), sorted by x. A :class:`harness.sweep.order.Group`."""

    label: str
    axis: str
    units: tuple[tuple[float, tuple[str, ...]], ...]
    claim: str = ""  # the claim's id

    def point_ids(self) -> set[str]:
        return {pid for _, ids in self.units for pid in ids}


def point_frame(points: Sequence[Point]) -> pd.DataFrame:
    """One row per point: its identity columns and those its scenario knows before it runs
    (:meth:`~harness.scenarios.interface.Scenario.planned_columns`): what its result row will
    carry before any measurement."""
    return pd.DataFrame([{**planned_columns(p), **p.columns()} for p in points])


def planned_columns(point: Point) -> dict:
    """The scenario's planned columns of ``point`` (none when its scenario is unknown here)."""
    try:
        return scenario_of(point).planned_columns(point)
    except (KeyError, ValueError):
        return {}


def judged_groups(points: Sequence[Point], claims: Sequence[Claim],
                  min_values: int = 2) -> list[JudgedGroup]:
    """Every claim's groups over ``points``, in the claims' order: those with at least
    ``min_values`` values of the claim's axis (one value is no slope, ratio trend or crossover
    to order; ``attnbench verdicts`` still measures a ratio claim about one length)."""
    if not points:
        return []
    df = point_frame(points)
    out: list[JudgedGroup] = []
    for claim in claims:
        sub = subject_rows(df, claim)
        if not len(sub):
            continue
        if claim.kind in ("exponent", "bound"):  # one implementation's rows
            out += _exponent_groups(sub, claim)
        else:
            out += _paired_groups(sub, subject_rows(df, claim, baseline=True), claim)
    return [g for g in out if len(g.units) >= min_values]


def _units(part: pd.DataFrame, over: str) -> dict[float, list[str]]:
    x = pd.to_numeric(column(part, over), errors="coerce")
    units: dict[float, list[str]] = {}
    for value, pid in zip(x, part["point_id"], strict=True):
        if pd.notna(value):
            units.setdefault(float(value), []).append(pid)
    return units


def _group(claim: Claim, values: dict, units: dict[float, list[str]]) -> JudgedGroup:
    fixed = group_label(values)
    who = " vs ".join(str(w) for w in (values.get("impl", claim.impl), claim.baseline) if w)
    label = f"{claim.id}: {who}" + (f", {fixed}" if fixed != "all rows" else "")
    units_at = tuple((x, tuple(ids)) for x, ids in sorted(units.items()))
    return JudgedGroup(label, claim.over, units_at, claim.id)


def _exponent_groups(sub: pd.DataFrame, claim: Claim) -> list[JudgedGroup]:
    keys = group_keys(sub, claim.over, claim.hold)
    frame = groupable(sub[keys]) if keys else sub
    out = []
    for values, part in (frame.groupby(keys, sort=True) if keys else [((), sub)]):
        values = values if isinstance(values, tuple) else (values,)
        rows = sub.loc[part.index]
        out.append(_group(claim, dict(zip(keys, values, strict=True)), _units(rows, claim.over)))
    return out


def _paired_groups(sub: pd.DataFrame, base: pd.DataFrame, claim: Claim) -> list[JudgedGroup]:
    """A ratio, trend or crossover claim: its impl's and its baseline's points that match field
    by field (as the verdict matches rows, :func:`~harness.analysis.ratios.match_keys`), the
    pair at each x one unit."""
    if not len(base):
        return []
    keys = match_keys(sub, base, claim)

    def keyed(rows: pd.DataFrame) -> pd.DataFrame:
        out = groupable(rows[keys]) if keys else pd.DataFrame(index=rows.index)
        return out.assign(x=pd.to_numeric(column(rows, claim.over), errors="coerce"),
                          point_id=rows["point_id"])

    merged = keyed(sub).merge(keyed(base), on=[*keys, "x"], suffixes=("_s", "_b"))
    if not len(merged):
        return []
    varying = group_fields(merged, keys, claim)  # as the verdict groups them
    parts = merged.groupby(varying, sort=True) if varying else [((), merged)]
    out = []
    for values, part in parts:
        values = values if isinstance(values, tuple) else (values,)
        units: dict[float, list[str]] = {}
        for x, a, b in zip(part["x"], part["point_id_s"], part["point_id_b"], strict=True):
            ids = units.setdefault(float(x), [])
            ids += [pid for pid in (a, b) if pid not in ids]
        out.append(_group(claim, dict(zip(varying, values, strict=True)), units))
    return out


DECISIVE = ("confirmed", "refuted")


class StoppingRule:
    """The order's stopping rule: after each measured point, which judged groups are decided
    already, so that their points still to come may wait at the back of the queue. A group is
    decided when the verdict of its claim over the group's rows so far (ok first-pass rows,
    at least three values of the axis) is ``confirmed`` or ``refuted`` by the analysis' own
    rules (:func:`~harness.analysis.verdicts.evaluate`: for a time claim its interval wholly
    inside or outside the band over the plateau, contended and host-bound rows left out).
    Verdicts stay the analysis' job; this only says which points may wait.

    ``rule(rows, env)`` -> the point ids of decided groups (``env``: the run's env.json, for
    the calibration utilization needs). Only groups whose rows changed are judged again, and
    the rule spends at most ``share`` of the run's time so far (a verdict with its bootstrap
    took up to 1.3 s on a loaded 2-core CPU): over it, a call judges nothing new."""

    def __init__(self, groups: Sequence[JudgedGroup], claims: Sequence[Claim],
                 share: float = 0.05, clock: Callable[[], float] = time.perf_counter):
        by_id = {c.id: c for c in claims}
        self.groups = [(g, by_id[g.claim], g.point_ids()) for g in groups if g.claim in by_id]
        self._ends = [(g.point_ids(), set(g.units[0][1]) | set(g.units[-1][1]))
                      for g in groups if g.units]
        self.share, self.clock = share, clock
        self.spent, self._start = 0.0, None
        self._seen: dict[str, int] = {}
        self.decided: dict[str, str] = {}  # group label -> its verdict, once decisive

    def wanted(self, point_id: str, left_out: set[str]) -> bool:
        """Whether a point is still worth its time once the points ``left_out`` did not fit
        in a time-limited run: it is read by no group, or by one that still has both ends of
        its axis (a group without an end is no fit over its range: its middles are spent in
        vain)."""
        mine = [ends for ids, ends in self._ends if point_id in ids]
        return not mine or any(not ends & left_out for ends in mine)

    def __call__(self, rows: Sequence[dict], env: dict | None = None) -> set[str]:
        now = self.clock()
        self._start = now if self._start is None else self._start
        if self.spent > self.share * (now - self._start):
            return {pid for g, _, ids in self.groups if g.label in self.decided for pid in ids}
        out = self._judge(rows, env)
        self.spent += self.clock() - now
        return out

    def _judge(self, rows: Sequence[dict], env: dict | None) -> set[str]:
        frame = pd.DataFrame([r for r in rows if r.get("status") == "ok"])
        out: set[str] = set()
        if not len(frame) or "point_id" not in frame.columns:
            return out
        run_id = (env or {}).get("run_id") or "run"
        frame = frame.assign(run_id=run_id)
        for group, claim, ids in self.groups:
            part = frame[frame["point_id"].isin(ids)]
            if group.label not in self.decided and len(part) != self._seen.get(group.label):
                self._seen[group.label] = len(part)
                xs = pd.to_numeric(column(part, claim.over), errors="coerce").nunique()
                if xs >= 3:
                    verdict = evaluate(claim, part, {run_id: env or {}}).verdict
                    if verdict in DECISIVE:
                        self.decided[group.label] = verdict
            if group.label in self.decided:
                out |= ids
        return out
