"""Verdicts: each claim of :mod:`harness.claims` judged against result rows.

Per fitted group (e.g. causal and non-causal rows of one implementation) the measured interval
is compared with the claim's band: confirmed (inside), refuted (outside), inconclusive (it
straddles an edge or is wider than the band, too few points, missing rows). Across groups:
any refuted -> refuted (one counterexample refutes a general statement); all confirmed ->
confirmed; otherwise inconclusive. The verdict reports the group that decided it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import pandas as pd

from harness import analysis
from harness.claims import VERDICTS, Claim

N_BOOT = 2000
__all__ = ["VERDICTS", "Verdict", "evaluate", "evaluate_all", "judge", "verdict_table"]


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

    def as_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["groups"] = [dict(g) for g in self.groups]
        return {k: _json_float(v) for k, v in out.items()}


def _json_float(v):
    if isinstance(v, float | np.floating):
        return float(v) if np.isfinite(v) else None
    return v


def judge(lo: float, hi: float, band: tuple[float, float]) -> tuple[str, str]:
    """(verdict, reason) of an interval ``[lo, hi]`` against the claim's ``band``."""
    b_lo, b_hi = band
    if np.isnan(lo) or np.isnan(hi):
        return "inconclusive", "no interval (too few points)"
    if b_lo <= lo and hi <= b_hi:
        return "confirmed", "interval inside the claimed band"
    if hi < b_lo or lo > b_hi:
        return "refuted", "interval outside the claimed band"
    if hi - lo > b_hi - b_lo:
        return "inconclusive", "interval wider than the claimed band"
    return "inconclusive", "interval straddles an edge of the claimed band"


def subject_rows(df: pd.DataFrame, claim: Claim, baseline: bool = False) -> pd.DataFrame:
    """Rows the claim (or its baseline) is about, before the status/metric filter."""
    where = dict(claim.where)
    if baseline and claim.baseline_where is not None:
        where = dict(claim.baseline_where)
    impl = claim.baseline if baseline else claim.impl
    if impl is not None:
        where["impl"] = impl
    if claim.scenario is not None:
        where["scenario"] = claim.scenario
    out = analysis.with_derived(df)
    for col, value in where.items():
        if col not in out.columns:
            return out.iloc[0:0]
        out = out[analysis._keys(out[[col]])[col].eq(analysis.MISSING if value is None else value)]
    if claim.range is not None and claim.over in out.columns:
        x = pd.to_numeric(out[claim.over], errors="coerce")
        out = out[(x >= claim.range[0]) & (x <= claim.range[1])]
    return out


def describe(claim: Claim, baseline: bool = False) -> str:
    """The row filter of a claim (or its baseline) in words, e.g. ``impl=full, scenario=decode``."""
    where = claim.baseline_where if baseline and claim.baseline_where is not None else claim.where
    impl = claim.baseline if baseline else claim.impl
    parts = {"impl": impl, "scenario": claim.scenario, **where}
    return ", ".join(f"{k}={v}" for k, v in parts.items() if v is not None) or "any rows"


def missing_reason(rows: pd.DataFrame, claim: Claim, who: str) -> str:
    """Why a claim has nothing to fit: no rows, or rows that did not produce the metric."""
    if not len(rows):
        return f"missing rows: none for {who}"
    if "status" in rows.columns and not rows["status"].eq("ok").any():
        reasons = rows.get("reason", pd.Series(dtype=str)).dropna().astype(str).unique()[:2]
        return (
            f"missing rows: {who} rows are {sorted(rows['status'].unique())}: {'; '.join(reasons)}"
        )
    return f"missing rows: {who} rows have no positive {claim.metric}"


def _label(values: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items() if k != "impl") or "all rows"


def _exponent_groups(df: pd.DataFrame, claim: Claim) -> tuple[list[dict], str]:
    rows = subject_rows(df, claim)
    ok = analysis.select(rows, claim.metric)
    if not len(ok):
        return [], missing_reason(rows, claim, describe(claim))
    fits = analysis.fit_exponents(
        ok,
        claim.over,
        claim.metric,
        hold=claim.hold,
        model=claim.model,
        min_points=claim.min_points or 3,
        n_boot=N_BOOT,
    )
    keys = [c for c in fits.columns if c in analysis.KEY_FIELDS or c == "window"]
    records = fits.to_dict("records")
    swept = [r for r in records if r["n_total"] > 1]  # groups that sweep `over` at all
    groups = []
    for rec in swept or records:
        verdict, reason = judge(rec["ci_low"], rec["ci_high"], claim.band)
        if not np.isfinite(rec["ci_low"]):
            need = (claim.min_points or 3) + (claim.model == "power+const")
            reason = f"too few points ({rec['n_total']} with {claim.metric}, need {need})"
        region = (
            f"; fit over {claim.over} {rec['x_lo']:g}..{rec['x_hi']:g}"
            if rec["n_points"] > 1
            else ""
        )
        slopes = f", local slopes {rec['local_slopes']}" if rec["local_slopes"] else ""
        groups.append(
            {
                "group": _label({k: rec[k] for k in keys}),
                "verdict": verdict,
                "reason": f"{reason}{region}{slopes}",
                "measured": rec["exponent"],
                "ci_low": rec["ci_low"],
                "ci_high": rec["ci_high"],
                "n_points": rec["n_points"],
            }
        )
    return groups, ""


def _matched(df: pd.DataFrame, claim: Claim) -> tuple[list[tuple[dict, pd.DataFrame]], str]:
    """Subject and baseline rows matched point by point (every other point field equal)."""
    sub_rows, base_rows = subject_rows(df, claim), subject_rows(df, claim, baseline=True)
    sub, base = analysis.select(sub_rows, claim.metric), analysis.select(base_rows, claim.metric)
    if not len(sub):
        return [], missing_reason(sub_rows, claim, describe(claim))
    if not len(base):
        return [], missing_reason(base_rows, claim, describe(claim, baseline=True))
    filters = set(claim.where) | set(claim.baseline_where or {})
    skip = filters | {"impl", "mixer", "point_id", claim.over}
    keys = [
        c for c in analysis.KEY_FIELDS if c in sub.columns and c in base.columns and c not in skip
    ]
    merged = analysis.aggregate(sub, claim.over, claim.metric, keys).merge(
        analysis.aggregate(base, claim.over, claim.metric, keys),
        on=[*keys, "x"],
        suffixes=("_s", "_b"),
    )
    if not len(merged):
        return [], f"missing rows: no {claim.baseline} row matches a {claim.impl} point"
    varying = [k for k in keys if merged[k].nunique() > 1 or k in claim.hold]
    out = []
    for values, part in analysis._groups(merged, varying):
        out.append(({**values, "_first": part.iloc[0].to_dict()}, part))
    return out, ""


def _log_ratios(part: pd.DataFrame, claim: Claim) -> tuple[np.ndarray, np.ndarray]:
    """Point estimates (k,) and bootstrap replicates (B, k) of log(subject / baseline)."""

    def side(s: str) -> pd.DataFrame:
        return part[[f"y_{s}", f"samples_{s}"]].set_axis(["y", "samples"], axis=1)

    power = analysis.TIME_METRICS.get(claim.metric)
    boot = analysis.log_ratio_boot(side("s"), side("b"), power, N_BOOT, seed=0)
    est = np.log(part["y_s"].to_numpy(float) / part["y_b"].to_numpy(float))
    return est, boot


def _ratio_groups(df: pd.DataFrame, claim: Claim) -> tuple[list[dict], str]:
    matched, reason = _matched(df, claim)
    sign = -1.0 if claim.ratio == "baseline/impl" else 1.0
    groups = []
    for values, part in matched:
        est, boot = _log_ratios(part, claim)
        est, boot = sign * est, sign * boot
        lo, hi = np.quantile(boot, [0.025, 0.975], axis=0)
        ci_lo, ci_hi = (
            float(np.exp(min(lo.min(), est.min()))),
            float(np.exp(max(hi.max(), est.max()))),
        )
        k = len(part)
        need = claim.min_points or 1
        verdict, why = (
            judge(ci_lo, ci_hi, claim.band)
            if k >= need
            else ("inconclusive", f"too few matched points ({k}, need {need})")
        )
        per_point = " ".join(f"{x:g}:{np.exp(v):.3g}" for x, v in zip(part["x"], est, strict=True))
        values.pop("_first")
        groups.append(
            {
                "group": _label(values),
                "verdict": verdict,
                "n_points": k,
                "reason": f"{why}; {claim.ratio} per {claim.over}: {per_point}"
                + _no_samples(claim),
                "measured": float(np.exp(est.mean())),
                "ci_low": ci_lo,
                "ci_high": ci_hi,
            }
        )
    return groups, reason


def crossing(x: np.ndarray, log_ratio: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bounds (lower, upper) on the x up to which the subject is cheaper (log_ratio < 0), for
    each row of ``log_ratio`` (..., k): at the first sign change, both are the log-interpolated
    crossing; cheaper at every point: (x[-1], inf); never cheaper: (0, x[0])."""
    lr = np.atleast_2d(log_ratio)
    lx = np.log(np.asarray(x, float))
    lower = np.full(lr.shape[0], float(x[-1]))
    upper = np.full(lr.shape[0], np.inf)
    for row in range(lr.shape[0]):
        bad = np.flatnonzero(lr[row] >= 0)
        if not bad.size:
            continue
        i = bad[0]
        if i == 0:
            lower[row], upper[row] = 0.0, float(x[0])
            continue
        a, b = lr[row, i - 1], lr[row, i]
        lower[row] = upper[row] = np.exp(lx[i - 1] + (lx[i] - lx[i - 1]) * (-a) / (b - a))
    return lower, upper


def _crossover_groups(df: pd.DataFrame, claim: Claim) -> tuple[list[dict], str]:
    matched, reason = _matched(df, claim)
    groups = []
    for values, part in matched:
        first = values.pop("_first")
        unit = float(values.get(claim.relative_to, first.get(claim.relative_to, np.nan)))
        x = part["x"].to_numpy(float)
        est, boot = _log_ratios(part, claim)
        (p_lo,), (p_hi,) = crossing(x, est)
        b_lo, b_hi = crossing(x, boot)
        lo = min(np.quantile(b_lo, 0.025, method="inverted_cdf"), p_lo) / unit
        hi = max(np.quantile(b_hi, 0.975, method="inverted_cdf"), p_hi) / unit
        point = (p_hi if p_lo == 0 else p_lo) / unit  # the crossing, or the bound we have
        censor = (
            " (cheaper at every point: a lower bound)"
            if np.isinf(p_hi)
            else " (never cheaper: an upper bound)"
            if p_lo == 0
            else ""
        )
        verdict, why = (
            judge(lo, hi, claim.band)
            if len(part) >= 2
            else ("inconclusive", "too few matched points (need 2)")
        )
        per_point = " ".join(f"{v:g}:{np.exp(r):.3g}" for v, r in zip(x, est, strict=True))
        groups.append(
            {
                "group": _label(values),
                "verdict": verdict,
                "n_points": len(part),
                "reason": f"{why}; crossover at {point * unit:g}{censor}; "
                f"{claim.impl}/{claim.baseline} per {claim.over}: {per_point}" + _no_samples(claim),
                "measured": point,
                "ci_low": float(lo),
                "ci_high": float(hi),
            }
        )
    return groups, reason


def _no_samples(claim: Claim) -> str:
    if claim.metric in analysis.TIME_METRICS:
        return ""
    return f" (no per-call samples of {claim.metric}: the interval has no measurement noise)"


def evaluate(claim: Claim, df: pd.DataFrame) -> Verdict:
    """The verdict of one claim over result rows (see the module docstring)."""
    runner = {"exponent": _exponent_groups, "ratio": _ratio_groups, "crossover": _crossover_groups}[
        claim.kind
    ]
    groups, reason = runner(df, claim) if len(df) else ([], "missing rows: no rows at all")
    common = {
        "claim": claim.id,
        "expected": claim.expected(),
        "kind": claim.kind,
        "metric": claim.metric,
        "over": claim.over,
        "impl": claim.impl,
        "text": claim.text,
        "source": claim.source,
    }
    if not groups:
        return Verdict(
            verdict="inconclusive",
            measured=None,
            ci_low=None,
            ci_high=None,
            reason=reason,
            **common,
        )
    verdicts = [g["verdict"] for g in groups]
    overall = (
        "refuted"
        if "refuted" in verdicts
        else "confirmed"
        if all(v == "confirmed" for v in verdicts)
        else "inconclusive"
    )
    decisive = next(g for g in groups if g["verdict"] == overall)
    return Verdict(
        verdict=overall,
        measured=decisive["measured"],
        ci_low=decisive["ci_low"],
        ci_high=decisive["ci_high"],
        reason=decisive["reason"],
        n_points=decisive["n_points"],
        group=decisive["group"],
        groups=tuple(groups),
        **common,
    )


def evaluate_all(claims: list[Claim], df: pd.DataFrame) -> list[Verdict]:
    return [evaluate(claim, df) for claim in claims]


def verdict_table(verdicts: list[Verdict]) -> pd.DataFrame:
    """One row per claim: id, verdict, measured, interval, expected, group, reason."""
    cols = [
        "claim",
        "verdict",
        "measured",
        "ci_low",
        "ci_high",
        "expected",
        "kind",
        "impl",
        "metric",
        "over",
        "n_points",
        "group",
        "reason",
        "source",
        "text",
    ]
    return pd.DataFrame([{c: v.as_dict()[c] for c in cols} for v in verdicts], columns=cols)
