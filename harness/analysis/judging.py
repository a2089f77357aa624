"""How a measurement is judged against a claim's band, and how the groups of a claim make one
verdict (docs/claims.md, "How groups make a verdict").

Per group (e.g. causal and non-causal rows of one implementation): confirmed when the interval
lies inside the claim's band, refuted when it lies outside, inconclusive when it straddles an
edge, is wider than the band or does not exist; a ratio claim is judged along its axis
(:mod:`harness.analysis.ratios`: confirmed, refuted or holds in part). A group with too few
points to decide that did not decide is *thin*: listed as not judged, never counted. Across the
groups that decide: confirmed and refuted together -> mixed (each listed); any holds in part ->
holds in part; any refuted -> refuted; all confirmed -> confirmed; else inconclusive.
"""

from __future__ import annotations

import numpy as np

from harness import fmt
from harness.analysis.claims import Claim

__all__ = ["combine", "head", "judge", "judged", "thin_words"]


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


def judged(group: dict, claim: Claim) -> dict:
    """A measured group with its ``verdict``, its ``reason`` (the judging words, then the
    group's own detail) and ``thin`` (True: too few points to decide, and it did not)."""
    if group.get("unjudged"):
        verdict, why, short = "inconclusive", group["unjudged"], bool(group.get("short"))
    elif group.get("verdict"):  # judged by its own rule (a ratio along the axis)
        verdict, why, short = group["verdict"], group["why"], False
    else:
        verdict, why = judge(group["ci_low"], group["ci_high"], claim.band)
        short = verdict == "inconclusive" and bool(group.get("thin"))
        if short:
            k = group["n_points"]
            why = (f"thin data ({k} point{'' if k == 1 else 's'}: too few for an interval "
                   "narrow enough to decide)")
        elif group.get("untestable"):  # the work itself leaves the band: no verdict on time
            verdict, why = "inconclusive", group["untestable"]
        elif verdict == "refuted" and group.get("unrefutable"):  # work not clearly inside
            verdict, why = "inconclusive", group["unrefutable"]
    drop = ("unjudged", "thin", "detail", "short", "untestable", "unrefutable", "why")
    out = {k: v for k, v in group.items() if k not in drop}
    return {**out, "verdict": verdict, "reason": why + group.get("detail", ""), "thin": short}


def _rank(verdicts: set[str]) -> str:
    """The verdict of a claim from the verdicts of its deciding groups."""
    if {"confirmed", "refuted"} <= verdicts:
        return "mixed"
    for verdict in ("holds in part", "refuted"):
        if verdict in verdicts:
            return verdict
    return "confirmed" if verdicts == {"confirmed"} else "inconclusive"


def combine(groups: list[dict]) -> tuple[str, dict, str]:
    """Across groups, from those with enough data (thin groups are listed, not counted; groups
    without a time verdict, ``judged`` False, count only when no group has one): confirmed
    and refuted groups together -> mixed; any holds in part -> holds in part; any refuted ->
    refuted (one counterexample refutes a general statement); all confirmed -> confirmed;
    else inconclusive. Returns the verdict, the group that decided it (for mixed: the first
    refuted one) and the words after its reason (the groups of a mixed verdict, the groups
    not judged)."""
    timed = [g for g in groups if g.get("judged", True)] or groups
    enough = [g for g in timed if not g.get("thin")]
    pool = enough or timed
    overall = _rank({g["verdict"] for g in pool})
    pick = "refuted" if overall == "mixed" else overall
    decisive = next(g for g in pool if g["verdict"] == pick)
    words = ""
    if overall == "mixed":
        words += "; groups disagree: " + "; ".join(
            f"{g['group']}: {g['verdict']} {_value(g)}" for g in pool
            if g["verdict"] in ("confirmed", "refuted")
        )
    thin = [g for g in timed if g.get("thin")] if enough else []
    if thin:
        words += "; not judged: " + ", ".join(
            f"{g['group']} (thin data: {g['n_points']} point{'' if g['n_points'] == 1 else 's'})"
            for g in thin
        )
    return overall, decisive, words


def head(reason: str) -> str:
    """A group's reason without its detail: ``thin data (2 points: seq_len 512, 1024; ...)``
    keeps its parentheses, the words after the first top-level ``"; "`` go."""
    depth = 0
    for i, ch in enumerate(reason):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and reason.startswith("; ", i):
            return reason[:i]
    return reason


def thin_words(x, over: str, need: int, model: str | None = None) -> str:
    """``thin data (2 points: seq_len 512, 1024; a power+const fit needs 4)``: a group with
    too few points to fit, the points it has, and how many it needs."""
    xs = [float(v) for v in x]
    fit = f"a {model} fit" if model else "a fit"
    return (f"thin data ({len(xs)} point{'' if len(xs) == 1 else 's'}: {over} "
            f"{', '.join(f'{v:g}' for v in xs)}; {fit} needs {need})")


def _value(group: dict) -> str:
    """``1.98 [1.95, 2.01]``: a group's measurement in words."""
    return f"{fmt.number(group['measured'], 3)} [{fmt.number(group['ci_low'], 3)}, " \
        f"{fmt.number(group['ci_high'], 3)}]"
