"""Exponent claims, judged per fitted group: on the device and on the work.

*Device*: the measured metric's exponent over the subject's ok rows. For a timed metric with
known utilization, only rows at >= ``saturation`` of the claim's bound count
(:mod:`harness.analysis.regime`); a group with too few of them gets no time verdict and a
reason that names its regime ("latency-bound regime (x–y% of roofline)" or "kernel efficiency
varies (...)"), never "refuted". *Work*: the cost model's FLOPs or bytes over every swept
point (exact counts, so the interval is the fit's own). A verdict limited by too few points
says "thin data (k points)".
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness import fmt
from harness.analysis import regime
from harness.analysis.claims import TIMED_METRICS, Claim
from harness.analysis.fits import fit_exponent
from harness.analysis.frames import TIME_METRICS, aggregate, group_keys, iter_groups, select
from harness.analysis.judging import N_BOOT, judge, thin, thin_reason
from harness.analysis.powerfit import local_slopes_xy
from harness.analysis.subjects import describe, group_label, missing_reason, subject_rows

# per-point medians merged beside the metric: what the regime words and the gate need
REGIME_COLUMNS = ("utilization", "work_flops", "achieved_flops_per_s", "head_dim_v")


def _with_medians(data: pd.DataFrame, claim: Claim, keys: list[str], cols: tuple[str, ...]):
    """Aggregated points of ``claim.metric`` (frames.aggregate) with the medians of ``cols``
    per point merged in (NaN where a column is missing)."""
    out = aggregate(data, claim.over, claim.metric, keys)
    for col in cols:
        if col not in data.columns or not len(out):
            out[col] = np.nan
            continue
        extra = aggregate(data, claim.over, col, keys)[[*keys, "x", "y"]]
        out = out.merge(extra.rename(columns={"y": col}), on=[*keys, "x"], how="left")
    return out


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
            f"{fmt.number(rate[j], 3)} at {_where(part, j, claim)}; {fmt.percent_range(lo, hi)} of "
            f"{claim.saturation_rule}): {limit}"
        )
    return "latency-bound", (
        f"latency-bound regime ({fmt.percent_range(lo, hi)} of {claim.saturation_rule}): {limit}"
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


def _unfitted(base: dict, part: pd.DataFrame, reason: str, judged: bool) -> dict:
    """An inconclusive group without a fit: too few points, or too few saturated ones."""
    lo, hi = regime.util_range(part["utilization"])
    return {**base, "verdict": "inconclusive", "reason": reason, "measured": np.nan,
            "ci_low": np.nan, "ci_high": np.nan, "util_low": lo, "util_high": hi,
            "judged": judged}


def _fitted(base: dict, part: pd.DataFrame, used: pd.DataFrame, claim: Claim, gate: bool):
    """The group's verdict from the exponent fitted over ``used`` (its saturated points when
    ``gate``, else all of ``part``)."""
    power = TIME_METRICS.get(claim.metric)
    fit = fit_exponent(
        used["x"], used["y"], list(used["samples"]) if power is not None else None,
        sigma=list(used["sigma"]) if used["sigma"].notna().all() else None,
        sample_power=power or 1.0, model=claim.model, min_points=claim.min_points or 3,
        min_x=claim.min_x, n_boot=N_BOOT,
    )
    verdict, reason = judge(fit.ci_low, fit.ci_high, claim.band)
    if verdict == "inconclusive" and thin(fit.n_points, fit.model, claim.min_points or 3):
        reason = thin_reason(fit.n_points)
    region = f"; fit over {claim.over} {fit.x_lo:g}..{fit.x_hi:g}" if fit.n_points > 1 else ""
    if gate and len(used) < len(part):
        region += (f" ({len(part) - len(used)} points below {claim.saturation:.0%} of "
                   f"{claim.saturation_rule} left out)")
    slopes = local_slopes_xy(part["x"], part["y"])
    text = " ".join(fmt.fixed(v, 2) for v in slopes)
    lo, hi = regime.util_range(used["utilization"])
    return {
        **base, "verdict": verdict, "n_points": fit.n_points,
        "reason": f"{reason}{region}" + (f", local slopes {text}" if text else ""),
        "measured": fit.exponent, "ci_low": fit.ci_low, "ci_high": fit.ci_high,
        "util_low": lo, "util_high": hi, "judged": True,
        "regime": "saturated" if gate else ("unknown" if lo is None else "not gated"),
    }


def device_groups(
    df: pd.DataFrame, claim: Claim, envs: dict | None = None
) -> tuple[list[dict], str]:
    """Per fitted group of the subject's ok rows: the exponent verdict of ``claim.metric``
    (time verdicts over saturated rows only), with the utilization range and regime of the
    rows used and ``judged`` (False: below saturation, no time verdict); or ([], why none).
    ``envs``: run_id -> env.json (the calibration behind utilization)."""
    rows = subject_rows(df, claim)
    ok = select(rows, claim.metric)
    if not len(ok):
        return [], missing_reason(rows, claim, describe(claim))
    data = regime.attach(ok, envs, claim.metric, work=claim.work, rule=claim.saturation_rule)
    if "head_dim" in data.columns:
        data["head_dim_v"] = pd.to_numeric(data["head_dim"], errors="coerce")
    gate = _gated(claim, data)
    keys = group_keys(data, claim.over, claim.hold)
    agg = _with_medians(data, claim, keys, REGIME_COLUMNS)
    need = (claim.min_points or 3) + (claim.model == "power+const")
    parts = list(iter_groups(agg, keys))
    swept = [(v, p) for v, p in parts if len(p) > 1] or parts
    groups = []
    for values, part in swept:
        used = part[part["utilization"] >= claim.saturation] if gate else part
        base = {"group": group_label(values), "n_points": len(used), "regime": "unknown"}
        if len(part) < need:  # too few points at all: not a question of the regime
            groups.append(_unfitted(base, part, thin_reason(len(part)), judged=True))
        elif gate and len(used) < need:
            kind, words = _regime_text(part, claim)
            groups.append({**_unfitted(base, part, words, judged=False), "regime": kind})
        else:
            groups.append(_fitted(base, part, used, claim, gate))
    return groups, ""


def work_groups(df: pd.DataFrame, claim: Claim) -> tuple[list[dict], str]:
    """Exponents of the analytic work (cost model) over every swept point, whatever its status:
    exact counts, so the interval is the fit's own (zero width for an exact power law)."""
    rows = subject_rows(df, claim)
    if not len(rows) or claim.over not in rows.columns:
        return [], "no rows"
    data = regime.attach(rows, None, claim.metric, work=claim.work)
    data = data[pd.to_numeric(data["work"], errors="coerce") > 0]
    if not len(data):
        return [], f"no {claim.work} model for {claim.metric} of these rows"
    keys = group_keys(data, claim.over, claim.hold)
    parts = list(iter_groups(aggregate(data, claim.over, "work", keys), keys))
    unit = "bytes" if claim.metric == "peak_mem_bytes" or claim.work == "bytes" else "FLOPs"
    groups = []
    for values, part in [(v, p) for v, p in parts if len(p) > 1] or parts:
        fit = fit_exponent(
            part["x"], part["y"], model="auto", min_points=claim.min_points or 3,
            min_x=claim.min_x, n_boot=200,
        )
        verdict, reason = judge(fit.ci_low, fit.ci_high, claim.band)
        if verdict == "inconclusive" and not fit.ok:
            reason = thin_reason(fit.n_points)
        region = f" over {claim.over} {fit.x_lo:g}..{fit.x_hi:g}" if fit.n_points > 1 else ""
        groups.append({
            "group": group_label(values), "verdict": verdict, "measured": fit.exponent,
            "ci_low": fit.ci_low, "ci_high": fit.ci_high, "n_points": fit.n_points,
            "reason": f"{reason}; analytic {unit} ({fit.model}){region}",
        })
    return groups, ""
