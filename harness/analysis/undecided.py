"""One line per claim for ``attnbench verdicts``: its verdict, the figure and interval, the axis
range and points it used, how its metric was measured, and for a claim not decided what would
decide it: which points of its groups have no row, which rows were left out of time evidence
(contended, host-bound), how many more minutes those points are expected to take; or, for a
claim without rows, which bundled suite has its points.

Pure functions over verdicts, claims, judged groups and rows; nothing here measures.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import pandas as pd

from harness.analysis.claims import TIMED_METRICS, Claim
from harness.analysis.evidence import subject_rows
from harness.analysis.groups import DECISIVE, JudgedGroup
from harness.analysis.judging import head
from harness.analysis.verdicts import Verdict
from harness.scenarios.interface import Point

MAX_VALUES = 6  # axis values listed before they are given as a range


@dataclass(frozen=True)
class Reach:
    """Where a claim's points are in a session: ``groups`` over the measured suites (with the
    suite each came from and its points), and ``elsewhere``: bundled suites of this device that
    have its points but were not measured."""

    groups: tuple[tuple[str, JudgedGroup], ...] = ()
    points: dict[str, Point] | None = None
    elsewhere: tuple[str, ...] = ()
    here: tuple[str, ...] = ()  # measured suites with its points, when they form no group


@dataclass(frozen=True)
class VerdictLine:
    """A claim's line of the verdict table (``verdicts.md``, ``verdicts.json``, the text)."""

    claim: str
    statement: str
    verdict: str
    measured: float | None
    ci_low: float | None
    ci_high: float | None
    expected: str
    kind: str
    metric: str
    over: str
    axis: str  # "seq_len 512..4096", or "" without rows
    points: int  # points the deciding fit or ratio used
    timing: str  # how the metric was measured
    decide: str  # what would decide it ("" once decided)
    reason: str
    suites: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def decided(self) -> bool:
        return self.verdict in DECISIVE


def verdict_line(
    v: Verdict, claim: Claim, rows: pd.DataFrame, reach: Reach, seconds: Callable[[Point], float]
) -> VerdictLine:
    """The line of ``claim`` (verdict ``v``) over ``rows`` (every row of the session);
    ``seconds(point)``: expected seconds of a point not measured yet."""
    mine = subject_rows(rows, claim) if len(rows) else rows
    usable = mine[mine["status"] == "ok"] if len(mine) and "status" in mine else mine
    decide = "" if v.verdict in DECISIVE else what_decides(v, claim, rows, reach, seconds)
    return VerdictLine(
        claim=claim.id,
        statement=claim.text or claim.id,
        verdict=v.verdict,
        measured=v.measured,
        ci_low=v.ci_low,
        ci_high=v.ci_high,
        expected=v.expected,
        kind=claim.kind,
        metric=claim.metric,
        over=claim.over,
        axis=_axis(v, claim, usable),
        points=int(v.n_points or 0),
        timing=timing_mode(claim, usable),
        decide=decide,
        reason=v.reason,
        suites=tuple(dict.fromkeys(s for s, _ in reach.groups)),
    )


def what_decides(
    v: Verdict, claim: Claim, rows: pd.DataFrame, reach: Reach, seconds: Callable[[Point], float]
) -> str:
    """For a claim not decided: the points its groups lack and their expected minutes, the
    rows left out of its time evidence, or where its points are when it has none here."""
    if not reach.groups:
        if reach.here:
            return (
                f"its points in {', '.join(reach.here)} hold one value of {claim.over}: too few "
                f"to judge it here; a suite with more values of {claim.over} in its range"
            )
        if reach.elsewhere:
            named = ", ".join(reach.elsewhere)
            return (
                f"no rows here: its points are in {named} (not a claim suite of this "
                f"device); add --suite {reach.elsewhere[0]}"
            )
        return "no rows: no bundled suite of this device has its points (another device's claim)"
    have = _statuses(rows)
    parts = []
    missing = [
        (g, x, ids)
        for _, g in reach.groups
        for x, ids in g.units
        if any(pid not in have for pid in ids)
    ]
    if missing:
        pids = {pid for _, _, ids in missing for pid in ids if pid not in have}
        xs = sorted({x for _, x, _ in missing})
        minutes = sum(seconds(reach.points[pid]) for pid in pids if pid in reach.points) / 60
        parts.append(
            f"not measured: {len(pids)} point{'s' if len(pids) != 1 else ''} at "
            f"{claim.over} {_values(xs)} (about {minutes:.1f} more min)"
        )
    unable = sorted(
        {
            f"{have[pid]}"
            for _, g in reach.groups
            for pid in g.point_ids()
            if have.get(pid) not in (None, "ok")
        }
    )
    if unable:
        parts.append("rows not ok here: " + ", ".join(unable))
    if v.contended_left_out:
        parts.append(
            f"{v.contended_left_out} rows measured under contention left out of the "
            "time verdict: measure again on a quiet machine (a new --out)"
        )
    if v.host_bound_left_out:
        parts.append(f"{v.host_bound_left_out} rows host-bound (the GPU waited on Python)")
    if not parts:
        why = head(v.reason)
        more = (
            "more values of " + claim.over + " in its suites (a longer or denser sweep)"
            if why.startswith(("thin data", "one point", "too few"))
            else "more timing passes (--resume with more minutes) or a quiet machine"
        )
        parts.append(f"every point of its suites measured: {why}; {more}")
    return "; ".join(parts)


def _statuses(rows: pd.DataFrame) -> dict[str, str]:
    """point id -> status of its row (partial rows included)."""
    if not len(rows) or "point_id" not in rows:
        return {}
    return dict(zip(rows["point_id"], rows["status"].astype(str), strict=True))


def _values(xs: Sequence[float]) -> str:
    shown = [f"{x:g}" for x in xs]
    return ", ".join(shown) if len(shown) <= MAX_VALUES else f"{shown[0]}..{shown[-1]}"


def _axis(v: Verdict, claim: Claim, usable: pd.DataFrame) -> str:
    """The axis range of the deciding group's points (its plateau when the time was fitted on
    one), else of every usable row."""
    if v.plateau_region:
        lo, hi = v.plateau_region
        return f"{claim.over} {lo:g}..{hi:g} (plateau)"
    deciding = next((g for g in v.groups if g.get("group") == v.group), None) or {}
    xs = list((deciding.get("_evidence") or {}).get("x") or ())
    xs += [r[k] for r in deciding.get("regions") or () for k in ("from", "to") if k in r]
    if not xs and len(usable) and claim.over in usable:
        xs = pd.to_numeric(usable[claim.over], errors="coerce").dropna().tolist()
    if not xs:
        return ""
    lo, hi = min(xs), max(xs)
    return f"{claim.over} {lo:g}" if lo == hi else f"{claim.over} {lo:g}..{hi:g}"


def timing_mode(claim: Claim, usable: pd.DataFrame) -> str:
    """How the claim's metric was measured in the rows used: the timer, threads, launch and
    passes of a time; the method of a peak memory; else the metric (a count or an error)."""
    if not len(usable):
        return ""
    if claim.metric == "peak_mem_bytes":
        methods = _distinct(usable, "mem_method")
        return "peak memory" + (f" ({', '.join(methods)})" if methods else "")
    if claim.metric not in TIMED_METRICS:
        return f"{claim.metric} (not timed)"
    parts = []
    for device in _distinct(usable, "device"):
        if str(device).startswith("cuda"):
            launch = _distinct(usable, "cuda_graph")
            parts.append("CUDA events" + (f", {'/'.join(dict.fromkeys(launch))}" if launch else ""))
        else:
            threads = _distinct(usable, "threads")
            parts.append(
                "wall clock (perf_counter)"
                + (f", {'/'.join(threads)} thread(s)" if threads else "")
            )
    passes = pd.to_numeric(usable.get("passes"), errors="coerce").dropna()
    if len(passes):
        lo, hi = int(passes.min()), int(passes.max())
        parts.append(f"{lo} pass{'es' if hi > 1 else ''}" if lo == hi else f"{lo}-{hi} passes")
    return ", ".join(parts)


def _distinct(rows: pd.DataFrame, col: str) -> list[str]:
    if col not in rows:
        return []
    values = rows[col].dropna()
    return [
        str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)
        for v in dict.fromkeys(values.tolist())
    ]
