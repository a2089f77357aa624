"""Verdicts as plain text, for a terminal: one headline per claim with the reason below it,
then the counts. Numbers go through :func:`harness.fmt.number`."""

from __future__ import annotations

import math

from harness import fmt
from harness.analysis.claims import TIMED_METRICS, VERDICTS
from harness.analysis.verdicts import Verdict


def format_value(value: float | None) -> str:
    """A measured value or interval end to 3 significant digits; ``n/a`` when it is None,
    NaN or infinite (a censored interval end)."""
    finite = value is not None and math.isfinite(value)
    return fmt.number(float(value) if finite else None, digits=3, missing="n/a")


def render_text(verdicts: list[Verdict]) -> str:
    """A plain-text verdict list: one headline per claim, the reason indented below it."""
    width = max((len(v.claim) for v in verdicts), default=5)
    lines = []
    for v in verdicts:
        interval = f"[{format_value(v.ci_low)}, {format_value(v.ci_high)}]"
        aspect = "work" if v.aspect == "work" else "time" if v.metric in TIMED_METRICS else ""
        lines.append(
            f"{v.claim:<{width}}  {v.verdict:<12}  measured {format_value(v.measured):>7} "
            f"{interval:<18} expected {v.expected}  {v.utilization()}"
            + (f"  [{aspect}]" if aspect else "")
        )
        lines.append(f"{'':<{width}}  {v.group + ': ' if v.group else ''}{v.reason}")
        if v.work_verdict is not None:
            lines.append(
                f"{'':<{width}}  work: {v.work_verdict}, exponent "
                f"{format_value(v.work_measured)} ({v.work_reason})"
            )
    counts = {k: sum(v.verdict == k for v in verdicts) for k in VERDICTS}
    lines.append(", ".join(f"{n} {k}" for k, n in counts.items()))
    work = {k: sum(v.work_verdict == k for v in verdicts) for k in VERDICTS}
    if any(work.values()):
        lines.append("work: " + ", ".join(f"{n} {k}" for k, n in work.items()))
    return "\n".join(lines)
