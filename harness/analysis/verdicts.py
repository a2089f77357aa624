"""Verdicts: each claim of :mod:`harness.analysis.claims` judged against result rows.

A complexity claim (an exponent of a timed metric) is judged twice (docs/claims.md): on the
*work*, the cost model's FLOPs or bytes over every swept point (exact counts), and on the
*device*, over only the rows that saturate it (utilization >= ``saturation`` of the roofline or
peak, :mod:`harness.analysis.regime`). Below saturation there is no time verdict and never
"refuted":
the reason says "latency-bound regime (x–y% of roofline)" or "kernel efficiency varies (...)".
Every verdict carries the utilization range of the rows it used. A verdict limited by too few
points says "thin data (k points)", not that the interval spans the claim.

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

from harness.analysis import fits as analysis
from harness.analysis import regime
from harness.analysis.claims import TIMED_METRICS, VERDICTS, Claim
from harness.results import json_safe

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
        span = regime.pct_range(self.util_low, self.util_high)
        return f"util {span}" + (f" of {self.util_basis}" if span != "n/a" else "")


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


def _agg(data: pd.DataFrame, claim: Claim, keys: list[str], cols: tuple[str, ...]):
    """Aggregated points of ``claim.metric`` (analysis.aggregate) with the medians of ``cols``
    per point merged in (NaN where a column is missing)."""
    out = analysis.aggregate(data, claim.over, claim.metric, keys)
    for col in cols:
        if col not in data.columns or not len(out):
            out[col] = np.nan
            continue
        extra = analysis.aggregate(data, claim.over, col, keys)[[*keys, "x", "y"]]
        out = out.merge(extra.rename(columns={"y": col}), on=[*keys, "x"], how="left")
    return out


def _thin(k: int) -> str:
    return f"thin data ({k} point{'' if k == 1 else 's'})"


def _regime_text(part: pd.DataFrame, claim: Claim) -> tuple[str, str]:
    """(regime, words with the numbers) for a group with too few saturated points."""
    util = part["utilization"].to_numpy(float)
    lo, hi = regime.util_range(part["utilization"])
    if lo is None:
        return "unknown", "utilization unknown (no calibration in env.json)"
    limit = f"no time verdict below {claim.saturation:.0%} of {claim.saturation_rule}"
    work = part["work_flops"].to_numpy(float)
    finite = np.isfinite(util) & np.isfinite(work)
    spread = work[finite].max() / work[finite].min() if finite.sum() >= 2 else 1.0
    rises = spread >= 1.5 and finite.sum() >= 3 and pd.Series(util[finite]).corr(
        pd.Series(work[finite]), method="spearman"
    ) > 0.5
    if finite.sum() >= 2 and (spread < 1.5 or not rises) and hi / max(lo, 1e-12) > 1.5:
        rate = part["achieved_flops_per_s"].to_numpy(float) / 1e12
        i, j = int(np.nanargmin(util)), int(np.nanargmax(util))
        return "efficiency varies", (
            f"kernel efficiency varies ({rate[i]:.3g} TFLOP/s at {_where(part, i, claim)} vs "
            f"{rate[j]:.3g} at {_where(part, j, claim)}; {regime.pct_range(lo, hi)} of "
            f"{claim.saturation_rule}): {limit}"
        )
    return "latency-bound", (
        f"latency-bound regime ({regime.pct_range(lo, hi)} of {claim.saturation_rule}): {limit}"
    )


def _where(part: pd.DataFrame, i: int, claim: Claim) -> str:
    row = part.iloc[i]
    text = f"{claim.over} {row['x']:g}"
    if claim.over != "head_dim" and "head_dim_v" in part and part["head_dim_v"].nunique() > 1:
        text = f"head_dim {row['head_dim_v']:g} ({text})"
    return text


def _gated(claim: Claim, data: pd.DataFrame) -> bool:
    """Time verdicts only over saturated rows: a timed metric, a fraction, known utilization."""
    return (
        claim.saturation > 0
        and claim.metric in TIMED_METRICS
        and bool(data["utilization"].notna().any())
    )


def _exponent_groups(
    df: pd.DataFrame, claim: Claim, envs: dict | None = None
) -> tuple[list[dict], str]:
    rows = subject_rows(df, claim)
    ok = analysis.select(rows, claim.metric)
    if not len(ok):
        return [], missing_reason(rows, claim, describe(claim))
    data = regime.attach(ok, envs, claim.metric, work=claim.work, rule=claim.saturation_rule)
    if "head_dim" in data.columns:
        data["head_dim_v"] = pd.to_numeric(data["head_dim"], errors="coerce")
    gate = _gated(claim, data)
    keys = analysis.group_keys(data, claim.over, claim.hold)
    cols = ("utilization", "work_flops", "achieved_flops_per_s", "head_dim_v")
    agg = _agg(data, claim, keys, cols)
    power = analysis.TIME_METRICS.get(claim.metric)
    need = (claim.min_points or 3) + (claim.model == "power+const")
    parts = list(analysis._groups(agg, keys))
    swept = [(v, p) for v, p in parts if len(p) > 1] or parts
    groups = []
    for values, part in swept:
        used = part[part["utilization"] >= claim.saturation] if gate else part
        base = {"group": _label(values), "n_points": len(used), "regime": "unknown"}
        if len(part) < need:  # too few points at all: not a question of the regime
            lo, hi = regime.util_range(part["utilization"])
            groups.append({**base, "verdict": "inconclusive", "reason": _thin(len(part)),
                           "measured": np.nan, "ci_low": np.nan, "ci_high": np.nan,
                           "util_low": lo, "util_high": hi, "judged": True})
            continue
        if gate and len(used) < need:
            kind, words = _regime_text(part, claim)
            lo, hi = regime.util_range(part["utilization"])
            groups.append({**base, "verdict": "inconclusive", "reason": words, "regime": kind,
                           "measured": np.nan, "ci_low": np.nan, "ci_high": np.nan,
                           "util_low": lo, "util_high": hi, "judged": False})
            continue
        fit = analysis.fit_exponent(
            used["x"], used["y"], list(used["samples"]) if power is not None else None,
            sigma=list(used["sigma"]) if used["sigma"].notna().all() else None,
            sample_power=power or 1.0, model=claim.model, min_points=claim.min_points or 3,
            min_x=claim.min_x, n_boot=N_BOOT,
        )
        verdict, reason = judge(fit.ci_low, fit.ci_high, claim.band)
        if verdict == "inconclusive" and thin(fit.n_points, fit.model, claim.min_points or 3):
            reason = _thin(fit.n_points)
        region = f"; fit over {claim.over} {fit.x_lo:g}..{fit.x_hi:g}" if fit.n_points > 1 else ""
        if gate and len(used) < len(part):
            region += (f" ({len(part) - len(used)} points below {claim.saturation:.0%} of "
                       f"{claim.saturation_rule} left out)")
        slopes = analysis.local_slopes_xy(part["x"], part["y"])
        text = " ".join(f"{v:.2f}" for v in slopes)
        lo, hi = regime.util_range(used["utilization"])
        groups.append({
            **base, "verdict": verdict, "n_points": fit.n_points,
            "reason": f"{reason}{region}" + (f", local slopes {text}" if text else ""),
            "measured": fit.exponent, "ci_low": fit.ci_low, "ci_high": fit.ci_high,
            "util_low": lo, "util_high": hi, "judged": True,
            "regime": "saturated" if gate else ("unknown" if lo is None else "not gated"),
        })
    return groups, ""


def _work_groups(df: pd.DataFrame, claim: Claim) -> tuple[list[dict], str]:
    """Exponents of the analytic work (cost model) over every swept point, whatever its status:
    exact counts, so the interval is the fit's own (zero width for an exact power law)."""
    rows = analysis.with_derived(subject_rows(df, claim))
    if not len(rows) or claim.over not in rows.columns:
        return [], "no rows"
    data = regime.attach(rows, None, claim.metric, work=claim.work)
    data = data[pd.to_numeric(data["work"], errors="coerce") > 0]
    if not len(data):
        return [], f"no {claim.work} model for {claim.metric} of these rows"
    keys = analysis.group_keys(data, claim.over, claim.hold)
    agg = analysis.aggregate(data, claim.over, "work", keys)
    parts = list(analysis._groups(agg, keys))
    unit = "bytes" if claim.metric == "peak_mem_bytes" or claim.work == "bytes" else "FLOPs"
    groups = []
    for values, part in [(v, p) for v, p in parts if len(p) > 1] or parts:
        fit = analysis.fit_exponent(
            part["x"], part["y"], model="auto", min_points=claim.min_points or 3,
            min_x=claim.min_x, n_boot=200,
        )
        verdict, reason = judge(fit.ci_low, fit.ci_high, claim.band)
        if verdict == "inconclusive" and not fit.ok:
            reason = _thin(fit.n_points)
        region = f" over {claim.over} {fit.x_lo:g}..{fit.x_hi:g}" if fit.n_points > 1 else ""
        groups.append({
            "group": _label(values), "verdict": verdict, "measured": fit.exponent,
            "ci_low": fit.ci_low, "ci_high": fit.ci_high, "n_points": fit.n_points,
            "reason": f"{reason}; analytic {unit} ({fit.model}){region}",
        })
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


def _combine(groups: list[dict]) -> tuple[str, dict]:
    """Across groups: any refuted -> refuted; all confirmed -> confirmed; else inconclusive.
    Groups without a time verdict (below saturation) count only when no group has one."""
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


def _device_groups(claim: Claim, df: pd.DataFrame, envs: dict | None):
    if claim.kind == "exponent":
        return _exponent_groups(df, claim, envs)
    groups, reason = (_ratio_groups if claim.kind == "ratio" else _crossover_groups)(df, claim)
    if groups:  # utilization of the subject rows the ratios used
        ok = analysis.select(subject_rows(df, claim), claim.metric)
        data = regime.attach(ok, envs, claim.metric, rule=claim.saturation_rule)
        lo, hi = regime.util_range(data["utilization"])
        for g in groups:
            g.update(util_low=lo, util_high=hi, regime="not gated" if lo is not None else "unknown")
    return groups, reason


def evaluate(claim: Claim, df: pd.DataFrame, envs: dict[str, dict] | None = None) -> Verdict:
    """The verdict of one claim over result rows (see the module docstring); ``envs`` (run_id ->
    env.json) give the calibration that utilization and saturation need."""
    empty = ([], "missing rows: no rows at all")
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
    work: dict = {}
    if "work" in claim.aspects:
        w_groups, w_reason = _work_groups(df, claim) if len(df) else empty
        if w_groups:
            overall, decisive = _combine(w_groups)
            work = {"verdict": overall, "measured": decisive["measured"],
                    "reason": decisive["reason"], "group": decisive["group"],
                    "ci_low": decisive["ci_low"], "ci_high": decisive["ci_high"],
                    "n_points": decisive["n_points"], "groups": w_groups}
        else:
            work = {"verdict": "inconclusive", "measured": None, "reason": w_reason,
                    "group": "", "ci_low": None, "ci_high": None, "n_points": 0, "groups": []}
    if "device" not in claim.aspects:
        return Verdict(
            verdict=work["verdict"], measured=work["measured"], ci_low=work["ci_low"],
            ci_high=work["ci_high"], reason=work["reason"], n_points=work["n_points"],
            group=work["group"], groups=tuple(work["groups"]), aspect="work", **common,
        )
    beside = {"work_verdict": work.get("verdict"), "work_measured": work.get("measured"),
              "work_reason": work.get("reason", "")}
    groups, reason = _device_groups(claim, df, envs) if len(df) else empty
    if not groups:
        return Verdict(verdict="inconclusive", measured=None, ci_low=None, ci_high=None,
                       reason=reason, regime="unknown", **beside, **common)
    overall, decisive = _combine(groups)
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
    return [evaluate(claim, df, envs) for claim in claims]


def verdict_table(verdicts: list[Verdict]) -> pd.DataFrame:
    """One row per claim: id, verdict, measured, interval, expected, group, reason."""
    cols = [
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
    ]
    records = [{**v.as_dict(), "utilization": v.utilization()} for v in verdicts]
    return pd.DataFrame([{c: r[c] for c in cols} for r in records], columns=cols)
