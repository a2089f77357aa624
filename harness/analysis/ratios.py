"""Ratio and crossover claims, measured per group of matched points.

Subject and baseline rows are matched point by point (every other point field equal,
:func:`matched`). A ratio claim's measured value is the geometric mean of the metric ratios
(subject/baseline, or the inverse) at matched points; its interval is the envelope of the
per-point bootstrap intervals, so "2-4x at n = 1k..8k" must hold at every n. A trend claim's
measured value is the exponent of the ratio along ``over`` (a power law fitted to the per-point
ratios, weighted by their bootstrap errors). A crossover
claim measures where the two cost the same along ``over`` (log-interpolated between the
points around the first change of sign), with a bootstrap interval, censored at the ends of
the sweep: in units of ``relative_to`` (e.g. n/d) or, without it, in units of ``over`` itself
(an absolute range of the swept axis, "between n = 512 and 1024"). ``cheaper`` says which side
of the crossover the subject is the cheaper one on.

Each group is a measurement (value, interval, words); judging it against the claim's band is
:mod:`harness.analysis.verdicts`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness import fmt
from harness.analysis.claims import Claim
from harness.analysis.exponents import thin
from harness.analysis.fits import N_BOOT, fit_exponent, log_ratio_boot
from harness.analysis.frames import (
    IMPL_FIELDS,
    KEY_FIELDS,
    TIME_METRICS,
    aggregate,
    covarying,
    group_label,
    iter_groups,
)
from harness.analysis.judging import thin_words

Pairs = list[tuple[dict, pd.DataFrame]]


def match_keys(sub: pd.DataFrame, base: pd.DataFrame, claim: Claim) -> list[str]:
    """The point fields subject and baseline rows are matched on: every key field both have,
    less the claim's filters, the implementation's own fields and the axis."""
    filters = set(claim.where) | set(claim.baseline_where or {})
    skip = filters | {"impl", *IMPL_FIELDS, "point_id", claim.over}
    return [c for c in KEY_FIELDS if c in sub.columns and c in base.columns and c not in skip]


def group_fields(merged: pd.DataFrame, keys: list[str], claim: Claim) -> list[str]:
    """The matched points' group fields, as an exponent fit's: the keys that vary (or that the
    claim holds), not those that move with the axis (``contexts`` along ``padding_factor``):
    those still match the two sides point by point."""
    moving = covarying(claim.over, claim.hold)
    return [k for k in keys
            if k not in moving and (merged[k].nunique() > 1 or k in claim.hold)]


def matched(sub: pd.DataFrame, base: pd.DataFrame, claim: Claim) -> tuple[Pairs, str]:
    """Subject and baseline ok rows matched point by point (every other point field equal):
    per group, (``{key: value}`` plus ``"_first"``: the group's first row as a dict, the
    merged points: keys, ``x``, and ``y_s``/``samples_s`` (subject), ``y_b``/``samples_b``
    (baseline) of :func:`~harness.analysis.frames.aggregate`), or ([], why there are none)."""
    keys = match_keys(sub, base, claim)
    merged = aggregate(sub, claim.over, claim.metric, keys).merge(
        aggregate(base, claim.over, claim.metric, keys),
        on=[*keys, "x"],
        suffixes=("_s", "_b"),
    )
    if not len(merged):
        return [], f"missing rows: no {claim.baseline} row matches a {claim.impl} point"
    out = []
    for values, part in iter_groups(merged, group_fields(merged, keys, claim)):
        out.append(({**values, "_first": part.iloc[0].to_dict()}, part))
    return out, ""


def _log_ratios(part: pd.DataFrame, claim: Claim) -> tuple[np.ndarray, np.ndarray]:
    """Point estimates (k,) and bootstrap replicates (B, k) of log(subject / baseline)."""

    def side(s: str) -> pd.DataFrame:
        return part[[f"y_{s}", f"samples_{s}"]].set_axis(["y", "samples"], axis=1)

    power = TIME_METRICS.get(claim.metric)
    boot = log_ratio_boot(side("s"), side("b"), power, N_BOOT, seed=0)
    est = np.log(part["y_s"].to_numpy(float) / part["y_b"].to_numpy(float))
    return est, boot


def _point_intervals(est: np.ndarray, boot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each point's 95 % interval (k,) of its log ratio from the replicates (B, k), widened to
    hold its estimate."""
    lo, hi = np.quantile(boot, [0.025, 0.975], axis=0)
    return np.minimum(lo, est), np.maximum(hi, est)


def _no_samples(claim: Claim) -> str:
    if claim.metric in TIME_METRICS:
        return ""
    return f" (no per-call samples of {claim.metric}: the interval has no measurement noise)"


def ratio_groups(pairs: Pairs, claim: Claim) -> list[dict]:
    """Per group of matched points: the measured ratio (geometric mean), its interval (the
    envelope of the per-point intervals), the per-point ratios in words, and the verdict along
    the axis (:func:`regions`): the sub-ranges where the ratio is inside, above or below the
    band."""
    sign = -1.0 if claim.ratio == "baseline/impl" else 1.0
    groups = []
    for values, part in pairs:
        est, boot = _log_ratios(part, claim)
        est, boot = sign * est, sign * boot
        if claim.relative_to:  # in units of the axis (claims.py): ratio / over at each point
            unit = np.log(part["x"].to_numpy(float))
            est, boot = est - unit, boot - unit
        lo, hi = _point_intervals(est, boot)
        k, need = len(part), claim.min_points or points_needed(claim)
        per_point = " ".join(f"{x:g}:{np.exp(v):.3g}" for x, v in zip(part["x"], est, strict=True))
        values = {k: v for k, v in values.items() if k != "_first"}
        label = group_label(values)
        spans = regions(part["x"].to_numpy(float), np.exp(est), np.exp(lo), np.exp(hi),
                        claim.band)
        verdict, why = along_axis(spans, claim.over)
        groups.append({
            "group": label,
            "n_points": k,
            "measured": float(np.exp(est.mean())),
            "ci_low": float(np.exp(lo.min())),
            "ci_high": float(np.exp(hi.max())),
            "unjudged": too_few(part, need, claim) if k < need else None,
            "short": k < need,
            "verdict": verdict,
            "why": why,
            "regions": [{"group": label, "over": claim.over,
                         **{k: v for k, v in r.items() if k != "last"}} for r in spans],
            "detail": f"; {claim.ratio}{' / ' + claim.over if claim.relative_to else ''} per "
                      f"{claim.over}: {per_point}" + _no_samples(claim),
            "_ratios": _drawn_points(part["x"].to_numpy(float), est, lo, hi),
        })
    return groups


def _drawn_points(x: np.ndarray, est: np.ndarray, lo: np.ndarray, hi: np.ndarray,
              fit: dict | None = None) -> dict:
    """What the report draws of a ratio or trend group (left out of JSON and CSV, as every
    ``_`` key): the matched points ``x``, the ratio at each (``y``) with its 95 % interval
    (``low``..``high``), and a trend's fitted power law (``fit``: exponent, prefactor, x_lo,
    x_hi; None for a ratio's band)."""
    return {"x": x.tolist(), "y": np.exp(est).tolist(), "low": np.exp(lo).tolist(),
            "high": np.exp(hi).tolist(), "fit": fit}


def trend_groups(pairs: Pairs, claim: Claim) -> list[dict]:
    """Per group of matched points: the exponent of the ratio along ``claim.over`` (a power
    law through the per-point ratios, each weighted by its bootstrap error, the interval from
    those errors and the residuals: :func:`~harness.analysis.fits.fit_exponent`), and the
    per-point ratios in words. Fewer than 3 points: nothing to fit; fewer than 5: thin."""
    sign = -1.0 if claim.ratio == "baseline/impl" else 1.0
    need = claim.min_points or 3
    groups = []
    for values, part in pairs:
        part = part.sort_values("x")
        est, boot = _log_ratios(part, claim)
        est, boot = sign * est, sign * boot
        x = part["x"].to_numpy(float)
        label = group_label({k: v for k, v in values.items() if k != "_first"})
        per_point = " ".join(f"{v:g}:{np.exp(r):.3g}" for v, r in zip(x, est, strict=True))
        detail = f"; {claim.ratio} per {claim.over}: {per_point}" + _no_samples(claim)
        lo, hi = _point_intervals(est, boot)
        if len(part) < need or np.any(x <= 0):
            groups.append({"group": label, "n_points": len(part), "measured": np.nan,
                           "ci_low": np.nan, "ci_high": np.nan, "detail": detail, "short": True,
                           "unjudged": thin_words(x, claim.over, need, "power"),
                           "_ratios": _drawn_points(x, est, lo, hi)})
            continue
        fit = fit_exponent(x, np.exp(est), sigma=boot.std(axis=0, ddof=1), model="power",
                           min_points=need, n_boot=N_BOOT, whole=True)
        groups.append({
            "group": label,
            "n_points": fit.n_points,
            "measured": fit.exponent,
            "ci_low": fit.ci_low,
            "ci_high": fit.ci_high,
            "thin": thin(fit.n_points, "power", need),
            "detail": f"; {claim.ratio} ∝ {claim.over}^{fit.exponent:.3g} over "
                      f"{claim.over} {fit.x_lo:g}..{fit.x_hi:g}{detail}",
            "_ratios": _drawn_points(x, est, lo, hi, fit.as_dict()),
        })
    return groups


def points_needed(claim: Claim) -> int:
    """Matched points a ratio claim needs before it may be judged: 2 when its range spans more
    than one value of the axis (or it states none): one point at the edge of "2-4x at n =
    1k..8k" says nothing about the rest of the range; 1 for a claim about one value."""
    return 1 if claim.range is not None and claim.range[0] == claim.range[1] else 2


def too_few(part: pd.DataFrame, need: int, claim: Claim) -> str:
    """``one point (seq_len 1024; the claim's range 1024..8192 needs 2)``."""
    k = len(part)
    at = ", ".join(f"{x:g}" for x in part["x"])
    span = (f"the claim's range {claim.range[0]:g}..{claim.range[1]:g}" if claim.range
            else "the claim")
    return (f"{'one point' if k == 1 else f'{k} points'} ({claim.over} {at}; {span} needs "
            f"{need})")


def _where(lo: float, hi: float, band: tuple[float, float]) -> str:
    """Where one point's interval lies against the band."""
    if band[0] <= lo and hi <= band[1]:
        return "inside"
    if lo > band[1]:
        return "above"
    return "below" if hi < band[0] else "straddles"


def regions(x: np.ndarray, est: np.ndarray, lo: np.ndarray, hi: np.ndarray,
            band: tuple[float, float]) -> list[dict]:
    """Runs of neighbouring points (x sorted) whose intervals lie alike against the band:
    ``from``/``to`` (the axis range), ``where`` (inside, above, below, or straddles an edge),
    ``low``/``high`` (the measured ratios there) and ``ci_low``/``ci_high`` (their intervals'
    envelope)."""
    out: list[dict] = []
    for i, xi in enumerate(x):
        where = _where(lo[i], hi[i], band)
        if out and out[-1]["where"] == where:
            r = out[-1]
            r.update(to=float(xi), low=min(r["low"], float(est[i])),
                     high=max(r["high"], float(est[i])), ci_low=min(r["ci_low"], float(lo[i])),
                     ci_high=max(r["ci_high"], float(hi[i])))
        else:
            out.append({"from": float(xi), "to": float(xi), "where": where,
                        "low": float(est[i]), "high": float(est[i]),
                        "ci_low": float(lo[i]), "ci_high": float(hi[i])})
    if out:
        out[-1]["last"] = True  # the region runs to the end of the swept range
    return out


_WORDS = {"inside": "holds", "above": "above", "below": "below", "straddles": "on an edge"}


def _region_words(r: dict, over: str, first: bool) -> str:
    """``"above from 3072 (4.17–4.74)"``, ``"holds at seq_len 1024..2048 (3.6–3.64)"``; a
    region on an edge of the band with its interval: ``"on an edge at 6144 (3.94 [3.87,
    4.02])"``."""
    lo, hi = fmt.number(r["low"], 3), fmt.number(r["high"], 3)
    values = lo if lo == hi else f"{lo}–{hi}"
    if r["where"] == "straddles":
        values += f" [{fmt.number(r['ci_low'], 3)}, {fmt.number(r['ci_high'], 3)}]"
    axis = f"{over} " if first else ""
    if r["from"] == r["to"]:
        at = f"at {axis}{r['from']:g}"
    elif r.get("last") and not first:
        at = f"from {axis}{r['from']:g}"
    else:
        at = f"at {axis}{r['from']:g}..{r['to']:g}"
    return f"{_WORDS[r['where']]} {at} ({values})"


def along_axis(spans: list[dict], over: str) -> tuple[str, str]:
    """A ratio claim's verdict from its regions: confirmed (inside the band over the whole
    range), refuted (outside it over the whole range), holds in part (inside over part of
    it), refuted too when it is outside over part of the range and on an edge over the rest
    (a claim over a range holds at every point of it: one counterexample refutes it, as one
    refuted group refutes a claim beside undecided ones), else inconclusive (on an edge
    everywhere); and the regions in words."""
    where = {r["where"] for r in spans}
    words = "; ".join(_region_words(r, over, i == 0) for i, r in enumerate(spans))
    if where == {"inside"}:
        return "confirmed", f"inside the claimed band over the whole range: {words}"
    if where <= {"above", "below"}:
        return "refuted", f"outside the claimed band over the whole range: {words}"
    if "inside" in where:
        return "holds in part", words
    if where & {"above", "below"}:
        return "refuted", (f"outside the claimed band over part of the range, on an edge over "
                           f"the rest (a counterexample refutes it): {words}")
    return "inconclusive", f"interval spans the claim along {over}: {words}"


def plain(value: float) -> str:
    """A value on the axis without an exponent: ``1904``, ``0.5``."""
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


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


def _censored(claim: Claim, p_lo: float, p_hi: float) -> str:
    """Words for a crossover outside the sweep: which bound the measurement is."""
    if np.isinf(p_hi):  # the side cheaper below the crossover was cheaper at every point
        return (f" ({claim.impl} cheaper at every point: a lower bound)" if claim.cheaper == "below"
                else f" ({claim.impl} never cheaper: a lower bound)")
    if p_lo == 0:
        return (f" ({claim.impl} never cheaper: an upper bound)" if claim.cheaper == "below"
                else f" ({claim.impl} cheaper at every point: an upper bound)")
    return ""


def crossover_groups(pairs: Pairs, claim: Claim) -> list[dict]:
    """Per group of matched points: the measured crossover (in units of
    ``claim.relative_to``, or of ``claim.over`` without it), its bootstrap interval and the
    per-point ratios in words."""
    groups = []
    # crossing() finds where the side cheaper at small x stops being cheaper: the subject for
    # cheaper = "below", the baseline (log ratio negated) for "above"
    sign = 1.0 if claim.cheaper == "below" else -1.0
    for values, part in pairs:
        first = values.pop("_first")
        unit = (
            float(values.get(claim.relative_to, first.get(claim.relative_to, np.nan)))
            if claim.relative_to
            else 1.0
        )
        x = part["x"].to_numpy(float)
        est, boot = _log_ratios(part, claim)
        (p_lo,), (p_hi,) = crossing(x, sign * est)
        b_lo, b_hi = crossing(x, sign * boot)
        lo = min(np.quantile(b_lo, 0.025, method="inverted_cdf"), p_lo) / unit
        hi = max(np.quantile(b_hi, 0.975, method="inverted_cdf"), p_hi) / unit
        point = (p_hi if p_lo == 0 else p_lo) / unit  # the crossing, or the bound we have
        per_point = " ".join(f"{v:g}:{np.exp(r):.3g}" for v, r in zip(x, est, strict=True))
        at = f"{claim.over} {plain(point * unit)}" + (
            f" = {point:.3g} x {claim.relative_to}" if claim.relative_to else ""
        )
        groups.append({
            "group": group_label(values),
            "n_points": len(part),
            "measured": point,
            "ci_low": float(lo),
            "ci_high": float(hi),
            "unjudged": "too few matched points (need 2)" if len(part) < 2 else None,
            "detail": f"; crossover at {at}{_censored(claim, p_lo, p_hi)}, {claim.impl} "
            f"cheaper {claim.cheaper}; {claim.impl}/{claim.baseline} per {claim.over}: "
            f"{per_point}" + _no_samples(claim),
        })
    return groups
