"""Judging a measured interval against a claim's band, per fitted group and across groups.

Per group: confirmed (the interval lies inside the band), refuted (outside), inconclusive (it
straddles an edge or is wider than the band, or there is no interval). Across groups: any
refuted -> refuted (one counterexample refutes a general statement); all confirmed ->
confirmed; otherwise inconclusive (:func:`combine`).
"""

from __future__ import annotations

import numpy as np

N_BOOT = 2000  # bootstrap replicates behind every verdict interval


def judge(lo: float, hi: float, band: tuple[float, float]) -> tuple[str, str]:
    """(verdict, reason) of an interval ``[lo, hi]`` against the claim's ``band``."""
    b_lo, b_hi = band
    if lo is None or hi is None or np.isnan(lo) or np.isnan(hi):
        return "inconclusive", "no interval (too few points)"
    if b_lo <= lo and hi <= b_hi:
        return "confirmed", "interval inside the claimed band"
    if hi < b_lo or lo > b_hi:
        return "refuted", "interval outside the claimed band"
    if hi - lo > b_hi - b_lo:
        return "inconclusive", "interval spans the claim (wider than the claimed band)"
    return "inconclusive", "interval spans the claim (straddles an edge of the claimed band)"


def thin(n_points: int, model: str, min_points: int) -> bool:
    """Too few points for an interval that could decide: fewer than 3 residual degrees of
    freedom beyond the model's parameters (3 points for a power law, 4 with a constant)."""
    return n_points < max(min_points, 3) + (model == "power+const") + 2


def thin_reason(k: int) -> str:
    """The reason of a verdict limited by its ``k`` points: ``"thin data (k points)"``."""
    return f"thin data ({k} point{'' if k == 1 else 's'})"


def combine(groups: list[dict]) -> tuple[str, dict]:
    """Across groups: any refuted -> refuted; all confirmed -> confirmed; else inconclusive.
    Groups without a time verdict (below saturation, ``judged`` False) count only when no
    group has one. Returns the verdict and the group that decided it."""
    judged = [g for g in groups if g.get("judged", True)] or groups
    verdicts = [g["verdict"] for g in judged]
    overall = (
        "refuted"
        if "refuted" in verdicts
        else "confirmed"
        if all(v == "confirmed" for v in verdicts)
        else "inconclusive"
    )
    return overall, next(g for g in judged if g["verdict"] == overall)
