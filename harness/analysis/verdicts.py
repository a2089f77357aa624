"""Verdicts: each claim of :mod:`harness.analysis.claims` judged against result rows. This is
the one judging path: ``attnbench claims`` and ``attnbench report`` both call
:func:`judge_claims`, so they show the same verdicts.

**Which rows.** The claim's subject (and baseline) rows (:func:`subject_rows`). Rows measured
under contention (the ``contended`` column) are left out of *time* evidence unless allowed:
memory claims and work verdicts are allocations and analytic counts that another process does
not change, so they keep every row. When contention leaves a time claim with no row, the
verdict says so and how to judge anyway (``--allow-contended``).

**What is measured.** A complexity claim (an exponent of a timed metric) is measured twice
(docs/claims.md): on the *work*, the cost model's FLOPs or bytes over every swept point, and
on the *device*, the time exponent over the region where utilization is level along the axis
(:mod:`harness.analysis.exponents`, :mod:`harness.analysis.regime`). Outside any plateau there
is no time verdict and never "refuted". Ratio and crossover claims are measured at matched
points (:mod:`harness.analysis.ratios`).

**How it is judged.** Per group (e.g. causal and non-causal rows of one implementation):
confirmed when the interval lies inside the claim's band, refuted when it lies outside,
inconclusive when it straddles an edge, is wider than the band or does not exist (thin data).
Across groups: any refuted -> refuted (one counterexample refutes a general statement); all
confirmed -> confirmed; otherwise inconclusive. Groups with no time verdict count only when no
group has one. The verdict reports the group that decided it, and every verdict carries the
utilization range of the rows it used.
"""

# size: one module on purpose: the rows a claim is about, how an interval is judged, the
# Verdict and the one path both CLI verbs call are read together (merged from three).

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import pandas as pd

from harness import fmt
from harness.analysis import regime
from harness.analysis.claims import Claim
from harness.analysis.exponents import device_groups, work_groups
from harness.analysis.frames import column, matches, select, with_derived
from harness.analysis.ratios import crossover_groups, matched, ratio_groups
from harness.measure.contention import contended_mask, notice
from harness.results import json_safe

__all__ = [
    "Verdict",
    "combine",
    "crossovers",
    "evaluate",
    "evaluate_all",
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
ALLOW_CONTENDED = "--allow-contended"


# --- judging an interval ---------------------------------------------------------------------


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


def _judged(group: dict, claim: Claim) -> dict:
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
            why = f"thin data ({k} point{'' if k == 1 else 's'})"
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


def _value(group: dict) -> str:
    """``1.98 [1.95, 2.01]``: a group's measurement in words."""
    return f"{fmt.number(group['measured'], 3)} [{fmt.number(group['ci_low'], 3)}, " \
        f"{fmt.number(group['ci_high'], 3)}]"


# --- the rows a claim is about ---------------------------------------------------------------


def subject_rows(df: pd.DataFrame, claim: Claim, baseline: bool = False) -> pd.DataFrame:
    """Rows the claim (or its baseline) is about, any status: the filters hold (columns the
    rows lack read as their schema default) and the row has a value on the claim's axis (a
    run without packed documents is not about a claim over ``document_len``)."""
    where = dict(claim.where)
    if baseline and claim.baseline_where is not None:
        where = dict(claim.baseline_where)
    impl = claim.baseline if baseline else claim.impl
    if impl is not None:
        where["impl"] = impl
    if claim.scenario is not None:
        where["scenario"] = claim.scenario
    out = with_derived(df)
    for col, value in where.items():
        out = out[matches(out, col, value)]
    x = pd.to_numeric(column(out, claim.over), errors="coerce")
    keep = x.notna()
    if claim.range is not None:
        keep &= (x >= claim.range[0]) & (x <= claim.range[1])
    return out[keep]


def describe(claim: Claim, baseline: bool = False) -> str:
    """The row filter of a claim (or its baseline) in words, e.g. ``impl=full, scenario=decode``."""
    where = claim.baseline_where if baseline and claim.baseline_where is not None else claim.where
    impl = claim.baseline if baseline else claim.impl
    parts = {"impl": impl, "scenario": claim.scenario, **where}
    return ", ".join(f"{k}={v}" for k, v in parts.items() if v is not None) or "any rows"


def missing_reason(rows: pd.DataFrame, claim: Claim, who: str) -> str:
    """Why a claim has nothing to measure: no rows, or rows that did not produce the metric."""
    if not len(rows):
        return f"missing rows: none for {who}"
    if "status" in rows.columns and not rows["status"].eq("ok").any():
        reasons = rows.get("reason", pd.Series(dtype=str)).dropna().astype(str).unique()[:2]
        return (
            f"missing rows: {who} rows are {sorted(rows['status'].unique())}: {'; '.join(reasons)}"
        )
    return f"missing rows: {who} rows have no positive {claim.metric}"


HOST_BOUND = 0.5  # host_frac at or above this: the GPU waited on the host (no time verdict)
HOST_WORDS = "host-bound: the GPU waits on the host"


def host_bound(rows: pd.DataFrame) -> pd.Series:
    """Rows whose timed calls kept the GPU waiting on the host: ``host_frac`` (host issue time
    over GPU event time) >= :data:`HOST_BOUND`; absent or null = not host-bound."""
    frac = pd.to_numeric(column(rows, "host_frac"), errors="coerce")
    return frac.ge(HOST_BOUND).fillna(False).astype(bool)


class _Evidence:
    """The ok rows of one side of a claim; rows measured under contention, and host-bound rows,
    left out of time evidence."""

    def __init__(self, rows: pd.DataFrame, claim: Claim, allow: bool, who: str):
        ok = select(rows, claim.metric)
        flagged = (
            contended_mask(ok) if claim.timed and not allow else pd.Series(False, index=ok.index)
        )
        host = host_bound(ok) & ~flagged if claim.timed else pd.Series(False, index=ok.index)
        self.rows, self.left_out = ok[~flagged & ~host], int(flagged.sum())
        self.host_bound = int(host.sum())
        self.host_note = _host_note(ok[host], claim) if self.host_bound else ""
        if not len(ok):
            self.why = missing_reason(rows, claim, who)
        elif not len(self.rows) and self.host_bound:
            self.why = f"no time verdict: {HOST_WORDS} (every {who} row: {self.host_note})"
        elif not len(self.rows):
            example = ok.get("contention", pd.Series(dtype=object)).dropna().astype(str)
            self.why = (
                f"no time verdict: every {who} row ({len(ok)}) was measured under contention"
                + (f" (e.g. {example.iloc[0]})" if len(example) else "")
                + f"; re-run on a quiet machine, or judge them anyway with {ALLOW_CONTENDED}"
            )
        else:
            self.why = ""


def _host_note(rows: pd.DataFrame, claim: Claim) -> str:
    """``host_frac 0.6–0.9 at seq_len 1024..4096``: the host-bound rows in words."""
    frac = pd.to_numeric(rows["host_frac"], errors="coerce")
    x = pd.to_numeric(column(rows, claim.over), errors="coerce")
    lo, hi = fmt.number(frac.min(), 2), fmt.number(frac.max(), 2)
    span = lo if lo == hi else f"{lo}–{hi}"
    where = f"{x.min():g}" if x.min() == x.max() else f"{x.min():g}..{x.max():g}"
    return f"host_frac {span} at {claim.over} {where}"


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
    host_bound_left_out: int = 0  # rows left out of time evidence (host_frac >= HOST_BOUND)
    regions: tuple[dict, ...] = ()  # a ratio claim along its axis: where it is inside/above/below

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
    groups = [_judged(g, claim) for g in groups]
    overall, decisive, words = combine(groups)
    return {"verdict": overall, "measured": decisive["measured"],
            "reason": decisive["reason"] + words, "group": decisive["group"],
            "ci_low": decisive["ci_low"], "ci_high": decisive["ci_high"],
            "n_points": decisive["n_points"], "groups": groups}


def _left_out(*sides: _Evidence) -> dict:
    """Rows left out of time evidence on the sides of a claim: contended, host-bound."""
    notes = [e.host_note for e in sides if e.host_note]
    return {"contended_left_out": sum(e.left_out for e in sides),
            "host_bound_left_out": sum(e.host_bound for e in sides),
            "host_note": "; ".join(notes)}


def _device(claim: Claim, df: pd.DataFrame, rows: pd.DataFrame, envs, allow: bool):
    """(measured groups, why there are none, rows left out: :func:`_left_out`) of the device
    side."""
    subject = _Evidence(rows, claim, allow, describe(claim))
    if subject.why:
        return [], subject.why, _left_out(subject)
    if claim.kind == "exponent":
        return device_groups(subject.rows, claim, envs), "", _left_out(subject)
    base = _Evidence(subject_rows(df, claim, baseline=True), claim, allow,
                     describe(claim, baseline=True))
    if base.why:
        return [], base.why, _left_out(subject, base)
    pairs, why = matched(subject.rows, base.rows, claim)
    groups = (ratio_groups if claim.kind == "ratio" else crossover_groups)(pairs, claim)
    if groups:  # utilization of the subject rows the ratios used
        data = regime.attach(subject.rows, envs, claim.metric, rule=claim.saturation_rule)
        lo, hi = regime.util_range(data["utilization"])
        for g in groups:
            g.update(util_low=lo, util_high=hi, regime="not gated" if lo is not None else "unknown")
    return groups, why, _left_out(subject, base)


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
        reason = _missing(df, claim)
        groups, left = [], _left_out()
    else:
        groups, reason, left = _device(claim, df, rows, envs, allow_contended)
    note = left.pop("host_note")
    if not groups:
        return Verdict(verdict="inconclusive", measured=None, ci_low=None, ci_high=None,
                       reason=reason, regime="unknown", **left, **beside, **common)
    fields = _combined([_judged(g, claim) for g in groups], left["contended_left_out"])
    if left["host_bound_left_out"]:
        fields["reason"] += (f" ({left['host_bound_left_out']} rows left out: {HOST_WORDS}, "
                             f"{note})")
    return Verdict(**fields, host_bound_left_out=left["host_bound_left_out"], **beside,
                   **common)


def _missing(df: pd.DataFrame, claim: Claim) -> str:
    """Why a claim has no rows: none at all, none that pass its filters, or rows that pass them
    but have no value on its axis (a run without packed documents, for ``document_len``)."""
    if not len(df):
        return "missing rows: no rows at all"
    who = describe(claim)
    bare = subject_rows(df, Claim(**{**_fields(claim), "over": "seq_len", "range": None}))
    if len(bare) and claim.over != "seq_len":
        return f"missing rows: the {len(bare)} {who} rows have no {claim.over}"
    return missing_reason(bare.iloc[0:0], claim, who)


def _fields(claim: Claim) -> dict:
    return {f.name: getattr(claim, f.name) for f in fields(claim)}


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
    return [evaluate(c, df, envs, allow_contended=allow_contended) for c in claims]


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
    """One row per claim: id, verdict, measured, interval, expected, utilization (and where
    it was level), group, reason."""
    cols = list(TABLE_COLUMNS)
    records = [
        {**v.as_dict(), "utilization": v.utilization(), "plateau": v.plateau()} for v in verdicts
    ]
    return pd.DataFrame([{c: r[c] for c in cols} for r in records], columns=cols)


def crossovers(
    rows: pd.DataFrame,
    impl: str,
    baseline: str,
    *,
    metric: str,
    over: str,
    relative_to: str | None = None,
    expect_min: float | None = None,
    expect_max: float | None = None,
) -> list[dict]:
    """Where ``impl`` stops being cheaper than ``baseline`` in ``metric`` as ``over`` grows, per
    group of matched rows: dicts with ``group``, ``measured`` (the crossover, in units of
    ``relative_to`` when given, e.g. n/d), ``ci_low``, ``ci_high``, ``n_points``, ``reason``
    and ``verdict`` (the crossover against ``[expect_min, expect_max]``; give at least one)."""
    if expect_min is None and expect_max is None:
        raise ValueError("crossovers needs expect_min or expect_max")
    claim = Claim(
        id=f"{impl}-vs-{baseline}", metric=metric, over=over, impl=impl, baseline=baseline,
        relative_to=relative_to, expect_crossover_min=expect_min, expect_crossover_max=expect_max,
    )
    sub = select(subject_rows(rows, claim), metric)
    base = select(subject_rows(rows, claim, baseline=True), metric)
    if not len(sub) or not len(base):
        return []
    return [_judged(g, claim) for g in crossover_groups(matched(sub, base, claim)[0], claim)]
