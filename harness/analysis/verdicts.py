"""Verdicts: each claim of :mod:`harness.analysis.claims` judged against result rows. This is
the one judging path: ``attnbench claims`` and ``attnbench report`` both call
:func:`judge_claims`, so they show the same verdicts.

**Which rows.** The claim's subject (and baseline) rows, less those left out of time evidence
(contended unless allowed, host-bound): :mod:`harness.analysis.evidence`.

**What is measured.** A complexity claim (an exponent of a timed metric) is measured twice
(docs/claims.md): on the *work*, the cost model's FLOPs or bytes over every swept point, and
on the *device*, the time exponent over the region where utilization is level along the axis
(:mod:`harness.analysis.exponents`, :mod:`harness.analysis.regime`), judged against the
executed work there. Outside any plateau there is no time verdict and never "refuted". Ratio,
trend and crossover claims are measured at matched points (:mod:`harness.analysis.ratios`), bound
claims point by point on the subject's rows (:mod:`harness.analysis.bounds`).

**How it is judged.** Per group, then across the groups with enough data:
:mod:`harness.analysis.judging`. The verdict reports the group that decided it, and every
verdict carries the utilization range of the rows it used.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import pandas as pd

from harness import fmt
from harness.analysis import regime
from harness.analysis.bounds import bound_groups
from harness.analysis.claims import TIMED_METRICS, Claim
from harness.analysis.evidence import (
    ALLOW_CONTENDED,
    HOST_WORDS,
    Evidence,
    describe,
    dropped_points,
    host_bound,
    left_out,
    missing,
    subject_rows,
)
from harness.analysis.exponents import device_groups, work_groups
from harness.analysis.frames import normalized_time, select, with_derived
from harness.analysis.judging import combine, head, judge, judged
from harness.analysis.ratios import crossover_groups, matched, ratio_groups, trend_groups
from harness.measure.contention import contended_mask, notice
from harness.results import json_safe

__all__ = [
    "Verdict",
    "combine",
    "crossovers",
    "evaluate",
    "evaluate_all",
    "host_bound",
    "judge",
    "judge_claims",
    "subject_rows",
    "verdict_table",
]
TABLE_COLUMNS = (
    "claim",
    "verdict",
    "measured",
    "ci_low",
    "ci_high",
    "expected",
    "utilization",
    "plateau",
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


# --- the verdict -----------------------------------------------------------------------------


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
    regime: str = ""  # plateau, rising, falling, varies, thin, unknown, not gated (memory, ratios)
    plateau_region: tuple[float, float] | None = None  # where the time verdict was fitted
    utilization_exponent: float | None = None  # of utilization along ``over``, and its interval
    utilization_exponent_ci: tuple[float, float] | None = None
    calibration_beaten: bool = False  # a row above 100 % of its calibrated bound
    rows_seen: int = 0  # subject rows in the runs, any status (0: the claim is about other runs)
    contended_left_out: int = 0  # subject rows left out of time evidence (contention)
    host_bound_left_out: int = 0  # rows left out of time evidence (host_frac >= HOST_BOUND_FRAC)
    regions: tuple[dict, ...] = ()  # a ratio claim along its axis: where it is inside/above/below
    absent: bool = False  # no usable rows on a side: its implementation or device is not here

    @property
    def about_these_runs(self) -> bool:
        """Do these runs have rows for both sides of the claim? Views fold the others (no
        rows at all, or an implementation, baseline or device these runs lack)."""
        return self.rows_seen > 0 and not self.absent

    @property
    def timed(self) -> bool:
        """Is the claim about a time (or a rate from one)? Only those show utilization."""
        return self.metric in TIMED_METRICS

    def as_dict(self) -> dict:
        """JSON-ready: NaN and infinities become None, at any depth; the groups' plot data
        (keys starting with ``_``) left out."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["groups"] = [{k: v for k, v in g.items() if not k.startswith("_")}
                         for g in self.groups]
        return json_safe(out)

    def utilization(self) -> str:
        """``"util 12–48% of roofline"``, with ``(calibration beaten)`` when a row is above
        100 %, or ``"util n/a"``."""
        span = fmt.percent_range(self.util_low, self.util_high)
        if span == "n/a":
            return "util n/a"
        return f"util {span} of {self.util_basis}" + (
            " (calibration beaten: rows above 100%)" if self.calibration_beaten else ""
        )

    def plateau(self) -> str:
        """``"512..4096"`` (where the time verdict was fitted), or ``""``."""
        if self.plateau_region is None:
            return ""
        return f"{self.plateau_region[0]:g}..{self.plateau_region[1]:g}"


def _common(claim: Claim) -> dict:
    return {
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


def _work(claim: Claim, rows: pd.DataFrame) -> dict:
    """The work verdict of a claim: verdict, measured, reason, group, interval, n_points and
    every group; inconclusive with the reason when nothing could be fitted."""
    groups, reason = work_groups(rows, claim) if len(rows) else ([], "no rows")
    if not groups:
        return {"verdict": "inconclusive", "measured": None, "reason": reason,
                "group": "", "ci_low": None, "ci_high": None, "n_points": 0, "groups": []}
    groups = [judged(g, claim) for g in groups]
    overall, decisive, words = combine(groups)
    return {"verdict": overall, "measured": decisive["measured"],
            "reason": decisive["reason"] + words, "group": decisive["group"],
            "ci_low": decisive["ci_low"], "ci_high": decisive["ci_high"],
            "n_points": decisive["n_points"], "groups": groups}


def _device(claim: Claim, df: pd.DataFrame, rows: pd.DataFrame, envs, allow: bool):
    """(measured groups, why there are none, rows left out of time evidence) of the device
    side."""
    subject = Evidence(rows, claim, allow, describe(claim))
    if subject.why:
        return [], subject.why, left_out(subject)
    if claim.kind == "exponent":
        return device_groups(subject.rows, claim, envs), "", left_out(subject)
    if claim.kind == "bound":
        groups = bound_groups(subject.rows, claim)
        _attach_utilization(groups, subject.rows, envs, claim)
        return groups, "", left_out(subject)
    base = Evidence(subject_rows(df, claim, baseline=True), claim, allow,
                     describe(claim, baseline=True))
    if base.why:
        return [], base.why, left_out(subject, base)
    pairs, why = matched(subject.rows, base.rows, claim)
    measure = {"ratio": ratio_groups, "trend": trend_groups}.get(claim.kind, crossover_groups)
    groups = measure(pairs, claim)
    _attach_utilization(groups, subject.rows, envs, claim)
    return groups, why, left_out(subject, base)


def _attach_utilization(groups: list[dict], rows: pd.DataFrame, envs, claim: Claim) -> None:
    """Each group of a ratio, crossover or bound claim gets the utilization range of the
    subject rows it used (not gated: the plateau rule is for exponents)."""
    if not groups:
        return
    data = regime.attach(rows, envs, claim.metric, rule=claim.saturation_rule)
    lo, hi = regime.util_range(data["utilization"])
    for g in groups:
        g.update(util_low=lo, util_high=hi, regime="not gated" if lo is not None else "unknown")


def evaluate(
    claim: Claim,
    df: pd.DataFrame,
    envs: dict[str, dict] | None = None,
    *,
    allow_contended: bool = False,
) -> Verdict:
    """The verdict of one claim over result rows (see the module docstring); ``envs`` (run_id ->
    env.json) give the calibration that utilization needs; ``allow_contended`` lets rows
    measured under contention into time evidence."""
    common = _common(claim)
    if claim.time_basis == "normalized":  # claims.py: time / the pass's reference kernel
        df = normalized_time(df)
    rows = subject_rows(df, claim) if len(df) else df
    seen = len(rows)
    work = _work(claim, rows) if "work" in claim.aspects else {}
    if "device" not in claim.aspects:
        return Verdict(
            verdict=work["verdict"], measured=work["measured"], ci_low=work["ci_low"],
            ci_high=work["ci_high"], reason=work["reason"], n_points=work["n_points"],
            group=work["group"], groups=tuple(work["groups"]), aspect="work", rows_seen=seen,
            **common,
        )
    beside = {"work_verdict": work.get("verdict"), "work_measured": work.get("measured"),
              "work_reason": work.get("reason", ""), "rows_seen": seen}
    if not seen:
        reason = missing(df, claim)
        groups, left = [], left_out()
    else:
        groups, reason, left = _device(claim, df, rows, envs, allow_contended)
    note = left.pop("host_note")
    if not groups:
        return Verdict(verdict="inconclusive", measured=None, ci_low=None, ci_high=None,
                       reason=reason, regime="unknown", absent=_absent(df, claim, rows),
                       **left, **beside, **common)
    fields = _combined([judged(g, claim) for g in groups], left["contended_left_out"])
    if any(_short(g) for g in fields["groups"]):  # say which points the thin data lacks
        dropped = dropped_points(df, claim)
        fields["reason"] += f"; left out: {dropped}" if dropped else ""
    if left["host_bound_left_out"]:
        fields["reason"] += (f" ({left['host_bound_left_out']} rows left out: {HOST_WORDS}, "
                             f"{note})")
    return Verdict(**fields, host_bound_left_out=left["host_bound_left_out"], **beside,
                   **common)


def _absent(df: pd.DataFrame, claim: Claim, rows: pd.DataFrame) -> bool:
    """Does a side of the claim have no measured row (its implementation, baseline or device
    is not in these runs, or every row of it was skipped)? Asked whatever else is wrong (all
    rows contended, say), so such a claim is folded, not listed."""
    if not len(rows) or not len(select(rows, claim.metric)):
        return True
    if claim.kind in ("exponent", "bound"):
        return False
    return not len(select(subject_rows(df, claim, baseline=True), claim.metric))


def _short(group: dict) -> bool:
    """Did a group have too few points to decide (thin data, one point)?"""
    return bool(group.get("thin")) or head(group.get("reason", "")).startswith(
        ("thin data", "one point", "too few")
    )


def _combined(groups: list[dict], left_out: int) -> dict:
    """The device verdict's fields from its judged groups (see :func:`combine`)."""
    overall, decisive, words = combine(groups)
    timed = [g for g in groups if g.get("judged", True)] or groups
    used = [g for g in timed if not g.get("thin")] or timed  # the groups that decide
    lows = [g["util_low"] for g in used if g.get("util_low") is not None]
    highs = [g["util_high"] for g in used if g.get("util_high") is not None]
    why = decisive["reason"] + words
    waiting = sum(not g.get("judged", True) for g in groups)
    if waiting and waiting < len(groups):
        why += f" ({waiting} of {len(groups)} groups have no time verdict: utilization not level)"
    if left_out:
        why += f" ({left_out} rows measured under contention left out)"
    high = max(highs) if highs else None
    ci, region = decisive.get("utilization_exponent_ci"), decisive.get("plateau_region")
    return {
        "verdict": overall,
        "measured": decisive["measured"],
        "ci_low": decisive["ci_low"],
        "ci_high": decisive["ci_high"],
        "reason": why,
        "n_points": decisive["n_points"],
        "group": decisive["group"],
        "groups": tuple({k: v for k, v in g.items() if k != "judged"} for g in groups),
        "regions": tuple(r for g in used for r in g.get("regions", ())),
        "util_low": min(lows) if lows else None,
        "util_high": high,
        "regime": decisive.get("regime", ""),
        "plateau_region": tuple(region) if region else None,
        "utilization_exponent": decisive.get("utilization_exponent"),
        "utilization_exponent_ci": tuple(ci) if ci is not None else None,
        "calibration_beaten": regime.beaten(high),
        "contended_left_out": left_out,
    }


def evaluate_all(
    claims: list[Claim],
    df: pd.DataFrame,
    envs: dict[str, dict] | None = None,
    *,
    allow_contended: bool = False,
) -> list[Verdict]:
    """One :class:`Verdict` per claim, in the claims' order."""
    df = with_derived(df)  # once for every claim (frames.with_derived)
    normalized = None  # and time in the normalized basis once, for the claims judged in it
    verdicts = []
    for c in claims:
        rows = df
        if c.time_basis == "normalized":
            normalized = rows = normalized_time(df) if normalized is None else normalized
        verdicts.append(evaluate(c, rows, envs, allow_contended=allow_contended))
    return verdicts


def judge_claims(
    claims: list[Claim],
    rows: pd.DataFrame,
    envs: dict[str, dict] | None = None,
    *,
    allow_contended: bool = False,
) -> tuple[list[Verdict], str | None]:
    """Every claim's verdict and one line about contention (None when no row was flagged):
    what ``attnbench claims`` prints and ``attnbench report`` shows."""
    verdicts = evaluate_all(claims, rows, envs, allow_contended=allow_contended)
    flagged = notice(rows) if len(rows) else None
    if flagged is None:
        return verdicts, None
    if allow_contended:
        return verdicts, f"{flagged} (used for time verdicts too, as {ALLOW_CONTENDED} asks)"
    every = bool(contended_mask(rows).all())
    return verdicts, (
        f"{flagged}: left out of time verdicts; memory claims and work verdicts use them "
        f"(contention cannot change an allocation or a count)"
        + (f". Every row is contended: no claim gets a time verdict; re-run on a quiet "
           f"machine, or judge them anyway with {ALLOW_CONTENDED}" if every else "")
    )


def verdict_table(verdicts: list[Verdict]) -> pd.DataFrame:
    """One row per claim: id, verdict, measured, interval, expected, utilization (time claims
    only, and where it was level), group, reason."""
    cols = list(TABLE_COLUMNS)
    records = [
        {**v.as_dict(), "utilization": v.utilization() if v.timed else "",
         "plateau": v.plateau()} for v in verdicts
    ]
    return pd.DataFrame([{c: r[c] for c in cols} for r in records], columns=cols)


def crossovers(rows: pd.DataFrame, claim: Claim) -> list[dict]:
    """Where a crossover ``claim``'s ``impl`` stops being cheaper than its ``baseline`` in its
    ``metric`` as ``over`` grows, per group of matched rows (every row as it is: no evidence
    rule is asked): dicts with ``group``, ``measured`` (the crossover, in units of
    ``relative_to`` when given, e.g. n/d), ``ci_low``, ``ci_high``, ``n_points``, ``reason``
    and ``verdict`` (the crossover against its expected range)."""
    if claim.kind != "crossover":
        raise ValueError(f"{claim.id}: crossovers needs expect_crossover_min or _max")
    sub = select(subject_rows(rows, claim), claim.metric)
    base = select(subject_rows(rows, claim, baseline=True), claim.metric)
    if not len(sub) or not len(base):
        return []
    return [judged(g, claim) for g in crossover_groups(matched(sub, base, claim)[0], claim)]
