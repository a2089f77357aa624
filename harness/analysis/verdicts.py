"""Verdicts: each claim of :mod:`harness.analysis.claims` judged against result rows.

A complexity claim (an exponent of a timed metric) is judged twice (docs/claims.md): on the
*work*, the cost model's FLOPs or bytes over every swept point (exact counts), and on the
*device*, over only the rows that saturate it (utilization >= ``saturation`` of the roofline or
peak, :mod:`harness.analysis.regime`); :mod:`harness.analysis.exponents` fits both. Below
saturation there is no time verdict and never "refuted". Ratio and crossover claims are judged
at matched points (:mod:`harness.analysis.ratios`). Every verdict carries the utilization range
of the rows it used.

Per fitted group (e.g. causal and non-causal rows of one implementation) the measured interval
is compared with the claim's band, and the groups are combined
(:mod:`harness.analysis.judging`); the verdict reports the group that decided it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import pandas as pd

from harness import fmt
from harness.analysis import regime
from harness.analysis.claims import Claim
from harness.analysis.exponents import device_groups, work_groups
from harness.analysis.frames import select
from harness.analysis.judging import combine
from harness.analysis.ratios import crossover_groups, ratio_groups
from harness.analysis.subjects import subject_rows
from harness.results import json_safe

__all__ = ["Verdict", "evaluate", "evaluate_all", "verdict_table"]
NO_ROWS = ([], "missing rows: no rows at all")
TABLE_COLUMNS = (
    "claim",
    "verdict",
    "measured",
    "ci_low",
    "ci_high",
    "expected",
    "utilization",
    "work_verdict",
    "work_measured",
    "kind",
    "impl",
    "metric",
    "over",
    "n_points",
    "group",
    "reason",
    "source",
    "text",
)


@dataclass(frozen=True)
class Verdict:
    """The outcome of one claim: ``measured`` with ``[ci_low, ci_high]`` and why."""

    claim: str
    verdict: str
    measured: float | None
    ci_low: float | None
    ci_high: float | None
    expected: str
    reason: str
    kind: str
    metric: str
    over: str
    impl: str | None
    n_points: int = 0
    group: str = ""
    text: str = ""
    source: str = ""
    groups: tuple[dict, ...] = ()
    aspect: str = "device"  # what ``verdict`` judges: "device" (time/memory) or "work"
    work_verdict: str | None = None  # the work verdict beside a device verdict ("both")
    work_measured: float | None = None
    work_reason: str = ""
    util_low: float | None = None  # utilization range (fraction of the bound) of the rows used
    util_high: float | None = None
    util_basis: str = "roofline"
    regime: str = ""  # "saturated", "latency-bound", "efficiency varies", "unknown", ""

    def as_dict(self) -> dict:
        """JSON-ready: NaN and infinities become None, at any depth."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["groups"] = [dict(g) for g in self.groups]
        return json_safe(out)

    def utilization(self) -> str:
        """``"util 12–48% of roofline"`` or ``"util n/a"``."""
        span = fmt.percent_range(self.util_low, self.util_high)
        return f"util {span}" + (f" of {self.util_basis}" if span != "n/a" else "")


def _device_groups(claim: Claim, df: pd.DataFrame, envs: dict | None):
    if claim.kind == "exponent":
        return device_groups(df, claim, envs)
    groups, reason = (ratio_groups if claim.kind == "ratio" else crossover_groups)(df, claim)
    if groups:  # utilization of the subject rows the ratios used
        ok = select(subject_rows(df, claim), claim.metric)
        data = regime.attach(ok, envs, claim.metric, rule=claim.saturation_rule)
        lo, hi = regime.util_range(data["utilization"])
        for g in groups:
            g.update(util_low=lo, util_high=hi, regime="not gated" if lo is not None else "unknown")
    return groups, reason


def _work(claim: Claim, df: pd.DataFrame) -> dict:
    """The work verdict of a claim: verdict, measured, reason, group, interval, n_points and
    every group; inconclusive with the reason when nothing could be fitted."""
    groups, reason = work_groups(df, claim) if len(df) else NO_ROWS
    if not groups:
        return {"verdict": "inconclusive", "measured": None, "reason": reason,
                "group": "", "ci_low": None, "ci_high": None, "n_points": 0, "groups": []}
    overall, decisive = combine(groups)
    return {"verdict": overall, "measured": decisive["measured"],
            "reason": decisive["reason"], "group": decisive["group"],
            "ci_low": decisive["ci_low"], "ci_high": decisive["ci_high"],
            "n_points": decisive["n_points"], "groups": groups}


def evaluate(claim: Claim, df: pd.DataFrame, envs: dict[str, dict] | None = None) -> Verdict:
    """The verdict of one claim over result rows (see the module docstring); ``envs`` (run_id ->
    env.json) give the calibration that utilization and saturation need."""
    common = {
        "claim": claim.id,
        "expected": claim.expected(),
        "kind": claim.kind,
        "metric": claim.metric,
        "over": claim.over,
        "impl": claim.impl,
        "text": claim.text,
        "source": claim.source,
        "util_basis": claim.saturation_rule,
    }
    work = _work(claim, df) if "work" in claim.aspects else {}
    if "device" not in claim.aspects:
        return Verdict(
            verdict=work["verdict"], measured=work["measured"], ci_low=work["ci_low"],
            ci_high=work["ci_high"], reason=work["reason"], n_points=work["n_points"],
            group=work["group"], groups=tuple(work["groups"]), aspect="work", **common,
        )
    beside = {"work_verdict": work.get("verdict"), "work_measured": work.get("measured"),
              "work_reason": work.get("reason", "")}
    groups, reason = _device_groups(claim, df, envs) if len(df) else NO_ROWS
    if not groups:
        return Verdict(verdict="inconclusive", measured=None, ci_low=None, ci_high=None,
                       reason=reason, regime="unknown", **beside, **common)
    overall, decisive = combine(groups)
    used = [g for g in groups if g.get("judged", True)] or groups
    lows = [g["util_low"] for g in used if g.get("util_low") is not None]
    highs = [g["util_high"] for g in used if g.get("util_high") is not None]
    why = decisive["reason"]
    waiting = sum(not g.get("judged", True) for g in groups)
    if waiting and waiting < len(groups):
        why += f" ({waiting} of {len(groups)} groups below saturation: no time verdict there)"
    return Verdict(
        verdict=overall,
        measured=decisive["measured"],
        ci_low=decisive["ci_low"],
        ci_high=decisive["ci_high"],
        reason=why,
        n_points=decisive["n_points"],
        group=decisive["group"],
        groups=tuple({k: v for k, v in g.items() if k != "judged"} for g in groups),
        util_low=min(lows) if lows else None,
        util_high=max(highs) if highs else None,
        regime=decisive.get("regime", ""),
        **beside,
        **common,
    )


def evaluate_all(
    claims: list[Claim], df: pd.DataFrame, envs: dict[str, dict] | None = None
) -> list[Verdict]:
    """One :class:`Verdict` per claim, in the claims' order."""
    return [evaluate(claim, df, envs) for claim in claims]


def verdict_table(verdicts: list[Verdict]) -> pd.DataFrame:
    """One row per claim: id, verdict, measured, interval, expected, group, reason."""
    cols = list(TABLE_COLUMNS)
    records = [{**v.as_dict(), "utilization": v.utilization()} for v in verdicts]
    return pd.DataFrame([{c: r[c] for c in cols} for r in records], columns=cols)
