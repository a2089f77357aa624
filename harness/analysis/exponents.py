"""Exponent claims, measured per fitted group: on the device and on the work.

*Device*: the exponent of ``claim.metric`` over the subject's ok rows. For a timed metric, only
over the plateau of utilization along the claim's axis (:func:`harness.analysis.regime.
find_plateau`): leading points where utilization still rises or falls are left out, and the
words say how it moved there; a group with no plateau gets no time verdict ("no time verdict:
utilization changes with seq_len (exponent 0.82 [0.71, 0.93]; 0.6–3% of roofline)"), never
"refuted". Without a calibration the achieved FLOP/s stands in for utilization (the same
exponent when the bound is one number); without a work model every point is fitted and the
words say so. *Work*: the cost model's FLOPs or bytes over every swept point (exact counts, so
the interval is the fit's own).

Each group is a measurement: the value, its interval and the words that go after the verdict's
reason (``detail``), or ``unjudged`` (why there is nothing to judge), with the utilization
range and, for time claims, the plateau. Judging it against the claim's band is
:mod:`harness.analysis.verdicts`.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from harness import fmt
from harness.analysis import regime
from harness.analysis.claims import Claim
from harness.analysis.evidence import subject_rows
from harness.analysis.fits import N_BOOT, fit_exponent
from harness.analysis.frames import (
    TIME_METRICS,
    aggregate,
    column,
    group_keys,
    group_label,
    groupable,
    iter_groups,
)
from harness.analysis.judging import thin_words
from harness.analysis.powerfit import local_slopes_xy

# per-point medians merged beside the metric: what the plateau and its words need, and the
# work the time is judged against (executed, and useful where the rows say it)
REGIME_COLUMNS = ("utilization", "achieved_flops_per_s", "head_dim_v", "work", "useful_flops")
WORK_BOOT = 400  # bootstrap replicates of a work fit's lack-of-fit interval
BIG_O = re.compile(r"O\([^()]*\)")  # "O(n·w)" in a claim's source or text


def points_needed(claim: Claim) -> int:
    """The values of ``claim.over`` a group needs before its exponent is fitted at all (fewer:
    "thin data")."""
    return (claim.min_points or 3) + (claim.model == "power+const")


def coverage(points: pd.DataFrame, claim: Claim) -> int:
    """The most distinct values of ``claim.over`` that one fit group of ``points`` (rows, or
    the planned points of a suite as row columns) holds for ``claim``: compared with
    :func:`points_needed`, whether those points can be fitted."""
    sub = subject_rows(points, claim)
    if not len(sub):
        return 0
    keys = group_keys(sub, claim.over, claim.hold)
    x = pd.to_numeric(column(sub, claim.over), errors="coerce")
    frame = groupable(sub[keys]).assign(_x=x.to_numpy()) if keys else pd.DataFrame({"_x": x})
    if not keys:
        return int(frame["_x"].nunique())
    return int(frame.groupby(keys)["_x"].nunique().max())


def thin(n_points: int, model: str, min_points: int) -> bool:
    """Too few points for an interval that could decide: fewer than 3 residual degrees of
    freedom beyond the model's parameters (3 points for a power law, 4 with a constant)."""
    return n_points < max(min_points, 3) + (model == "power+const") + 2


def _with_medians(data: pd.DataFrame, claim: Claim, keys: list[str], cols: tuple[str, ...]):
    """Aggregated points of ``claim.metric`` (frames.aggregate) with the medians of ``cols``
    per point merged in (NaN where a column is missing)."""
    out = aggregate(data, claim.over, claim.metric, keys)
    present = [c for c in cols if c in data.columns] if len(out) else []
    if present:  # every column's median per point in one grouping (NaN: no value there)
        x = pd.to_numeric(column(data, claim.over), errors="coerce")
        values = {c: pd.to_numeric(column(data, c), errors="coerce") for c in present}
        frame = groupable(data[keys]).assign(x=x, **values)[x > 0]
        medians = frame.groupby([*keys, "x"], sort=True, dropna=False)[present].median()
        out = out.merge(medians.reset_index(), on=[*keys, "x"], how="left")
    return out.assign(**{c: np.nan for c in cols if c not in present})


def _span(part: pd.DataFrame, claim: Claim) -> str:
    """``"38–52% of roofline"`` for the points' utilization, or ``""`` when unknown."""
    lo, hi = regime.util_range(part["utilization"])
    return "" if lo is None else f"{fmt.percent_range(lo, hi)} of {claim.saturation_rule}"


def _interval(lo: float, hi: float) -> str:
    return f"[{fmt.fixed(lo, 2)}, {fmt.fixed(hi, 2)}]" if np.isfinite([lo, hi]).all() else ""


def _where(part: pd.DataFrame, i: int, claim: Claim) -> str:
    row = part.iloc[i]
    text = f"{claim.over} {row['x']:g}"
    if claim.over != "head_dim" and "head_dim_v" in part and part["head_dim_v"].nunique() > 1:
        text = f"head_dim {row['head_dim_v']:g} ({text})"
    return text


def _efficiency(part: pd.DataFrame, claim: Claim) -> str:
    """Where the kernel's speed changes with head_dim along a heads sweep at fixed d_model (the
    multi-head claim):
    ``"; kernel efficiency varies with head_dim (120 TFLOP/s at head_dim 16 ... vs 640 at
    ...)"``; ``""`` otherwise."""
    if claim.over != "heads" or part["head_dim_v"].nunique() < 2:  # head_dim = d_model/heads
        return ""
    rate = part["achieved_flops_per_s"].to_numpy(float) / 1e12
    if not np.isfinite(rate).any():
        return ""
    i, j = int(np.nanargmin(rate)), int(np.nanargmax(rate))
    return (
        f"; kernel efficiency varies with head_dim ({fmt.number(rate[i], 3)} TFLOP/s at "
        f"{_where(part, i, claim)} vs {fmt.number(rate[j], 3)} at {_where(part, j, claim)})"
    )


def _basis(part: pd.DataFrame) -> str | None:
    """The column the plateau is sought in: utilization, else the achieved FLOP/s (no
    calibration), else None (no work model)."""
    for col in ("utilization", "achieved_flops_per_s"):
        v = part[col].to_numpy(float)
        if np.all(np.isfinite(v) & (v > 0)):
            return col
    return None


def _measure(base: dict, part: pd.DataFrame, claim: Claim, detail: str = "") -> tuple[dict, dict]:
    """Fit the exponent of the metric over ``part``: the group's measurement and the fit."""
    power = TIME_METRICS.get(claim.metric)
    fit = fit_exponent(
        part["x"], part["y"], list(part["samples"]) if power is not None else None,
        sigma=list(part["sigma"]) if part["sigma"].notna().all() else None,
        sample_power=power or 1.0, model=claim.model, min_points=claim.min_points or 3,
        n_boot=N_BOOT,
    )
    region = f"; fit over {claim.over} {fit.x_lo:g}..{fit.x_hi:g}" if fit.n_points > 1 else ""
    slopes = " ".join(fmt.fixed(v, 2) for v in local_slopes_xy(part["x"], part["y"]))
    lo, hi = regime.util_range(part["utilization"])
    group = {
        **base, "measured": fit.exponent, "ci_low": fit.ci_low, "ci_high": fit.ci_high,
        "n_points": fit.n_points, "thin": thin(fit.n_points, fit.model, claim.min_points or 3),
        "detail": region + detail + (f"; local slopes {slopes}" if slopes else ""),
        "util_low": lo, "util_high": hi,
    }
    return group, fit.as_dict()


def _no_fit(base: dict, part: pd.DataFrame, reason: str, judged: bool) -> dict:
    """A group without a fit: too few points, or no plateau of utilization."""
    lo, hi = regime.util_range(part["utilization"])
    return {**base, "measured": np.nan, "ci_low": np.nan, "ci_high": np.nan,
            "unjudged": reason, "util_low": lo, "util_high": hi, "judged": judged}


def _evidence(part: pd.DataFrame, basis: str | None, region, fit: dict | None) -> dict:
    """What the report draws under the claim: the points, their utilization, the plateau."""
    return {
        "x": part["x"].tolist(), "y": part["y"].tolist(),
        "utilization": part[basis].tolist() if basis else [],
        "basis": basis or "", "region": region, "fit": fit,
    }


def _timed_group(base: dict, part: pd.DataFrame, claim: Claim) -> dict:
    """A time claim's group: the plateau of utilization, then the fit over it."""
    basis = _basis(part)
    if basis is None:  # no work model: nothing to tell the device from the algorithm
        group, fit = _measure(base, part, claim, "; utilization unknown (no work model for "
                              "these rows): every point fitted")
        return {**group, "regime": "unknown", "_evidence": _evidence(part, None, None, fit)}
    per_call = TIME_METRICS.get(claim.metric) == 1.0  # samples are of this very time
    floor = claim.saturation if basis == "utilization" else 0.0
    plateau = _plateau(part, basis, claim, per_call, floor)
    what = "utilization" if basis == "utilization" else "achieved FLOP/s (no calibration)"
    b = fmt.fixed(plateau.exponent, 2)
    ci = _interval(plateau.ci_low, plateau.ci_high)
    stats = {"utilization_exponent": plateau.exponent,
             "utilization_exponent_ci": [plateau.ci_low, plateau.ci_high]}
    if not plateau.found:
        span = _span(part, claim)
        moved = ("rising" if plateau.exponent > claim.plateau
                 else "falling" if plateau.exponent < -claim.plateau else "varies")
        words = (f"no time verdict: {what} changes with {claim.over} (exponent {b} {ci}"
                 + (f"; {span}" if span else "") + ")")
        if floor > 0:
            words += f", or is below the saturation floor ({floor:.0%} of {claim.saturation_rule})"
        words += _efficiency(part, claim)
        return {**_no_fit(base, part, words, judged=False), **stats, "regime": moved,
                "plateau_region": None, "_evidence": _evidence(part, basis, None, None)}
    used = part.iloc[plateau.start:]
    region = [float(used["x"].iloc[0]), float(used["x"].iloc[-1])]
    span = _span(used, claim)
    # an interval far wider than the band: no trend shown, but not shown level either
    noisy = plateau.ci_high - plateau.ci_low > 4 * claim.plateau
    level = "shows no clear trend" if noisy else "level"
    words = (f"; {what} {level} over {claim.over} {region[0]:g}..{region[1]:g} (exponent {b} "
             f"{ci}" + (", too noisy to tell" if noisy else "") + (f", {span}" if span else "")
             + ")")
    if plateau.start:
        lead = part.iloc[: plateau.start + 1]
        moves = "rises" if (plateau.lead_exponent or 0) > 0 else "falls"
        lead_span = _span(part.iloc[: plateau.start], claim)
        words += (
            f"; {plateau.start} leading point{'s' if plateau.start > 1 else ''} left out: "
            f"{what} {moves} there (exponent {fmt.fixed(plateau.lead_exponent, 2)} over "
            f"{claim.over} {lead['x'].iloc[0]:g}..{lead['x'].iloc[-1]:g}"
            + (f", {lead_span}" if lead_span else "") + ")"
        )
    group, fit = _measure(base, used, claim, words)
    fitted = used[used["x"] >= fit["x_lo"]] if fit["n_points"] > 1 else used
    if len(fitted) < len(used):  # the fit left out leading points: level where it fitted?
        inner = _plateau(fitted, basis, claim, per_call, floor)
        if inner.start != 0:
            words = (f"no time verdict: {what} is not level over {claim.over} "
                     f"{fit['x_lo']:g}..{fit['x_hi']:g}, where the time was fitted (exponent "
                     f"{fmt.fixed(inner.exponent, 2)} {_interval(inner.ci_low, inner.ci_high)}), "
                     f"though level over {region[0]:g}..{region[1]:g}")
            return {**_no_fit(base, part, words, judged=False), **stats, "regime": "varies",
                    "plateau_region": None, "_evidence": _evidence(part, basis, None, None)}
    group.update(_against_work(used, fit, claim))
    return {**group, **stats, "judged": True, "regime": "plateau", "plateau_region": region,
            "_evidence": _evidence(part, basis, region, fit)}


def _plateau(part: pd.DataFrame, basis: str, claim: Claim, per_call: bool, floor: float):
    """:func:`regime.find_plateau` over the points of ``part`` (x sorted)."""
    return regime.find_plateau(
        part["x"], part[basis], list(part["samples"]) if per_call else None,
        sigma=list(part["sigma"]) if per_call and part["sigma"].notna().all() else None,
        band=claim.plateau, floor=floor,
    )


def _work_fit(part: pd.DataFrame, fit: dict, col: str, model: str):
    """The exponent of ``col`` (an analytic count) over the points of the time fit's range
    (``fit``'s ``x_lo..x_hi``), in the claim's model, with the fit's lack-of-fit interval
    (the count is exact; a curve that is not the model's law widens it); None if unknown."""
    if fit["n_points"] < 2:
        return None
    inside = part[(part["x"] >= fit["x_lo"]) & (part["x"] <= fit["x_hi"])]
    x, y = inside["x"].to_numpy(float), inside[col].to_numpy(float)
    if len(x) < 2 or not np.all(np.isfinite(y) & (y > 0)):
        return None
    exact = fit_exponent(x, y, model=model, min_points=2, n_boot=WORK_BOOT, whole=True)
    return exact if np.isfinite(exact.exponent) else None


def _against_work(part: pd.DataFrame, fit: dict, claim: Claim) -> dict:
    """The time judged against the executed work over the fitted range (docs/claims.md):

    - ``untestable``: the work's exponent lies outside the band, but with a constant overhead
      modelled (``power+const``) inside it: a fixed cost (a tile's rows and keys beyond the
      band, a step's weight reads) that fades as the axis grows. A device that follows its
      work can neither confirm nor refute the claim at these sizes.
    - ``unrefutable``: the work's exponent is inside the band but its interval is not (the
      work bends over these points): a time outside the band is no refutation.

    ``{}`` when the work is inside the band, unknown, or outside it even with a constant (the
    implementation's work follows another law: its time is judged as it is)."""
    lo, hi = claim.band
    work = _work_fit(part, fit, "work", claim.model)
    if work is None or (lo <= work.ci_low and work.ci_high <= hi):
        return {}
    what = "executed work" if claim.work == "flops" else "compulsory bytes"
    found = BIG_O.search(f"{claim.source} {claim.text}")
    target = found.group(0) if found else f"exponent {claim.expected()} in {claim.over}"
    grows = (f"{what} grows as {claim.over}^{fmt.fixed(work.exponent, 2)} "
             f"{_interval(work.ci_low, work.ci_high)} here")
    useful = _work_fit(part, fit, "useful_flops", claim.model) if claim.work == "flops" else None
    tiles = useful is not None and lo <= useful.exponent <= hi
    if lo <= work.exponent <= hi:
        why = f"{grows}, not inside the band" + (
            f" (tile overhead: useful work ^{fmt.fixed(useful.exponent, 2)})" if tiles else "")
        return {"unrefutable": f"interval outside the claimed band, but the {why}: sizes too "
                               f"small to test {target} (a refutation needs the work inside "
                               "the band)"}
    overhead = _work_fit(part, fit, "work", "power+const")
    if overhead is None or not lo <= overhead.exponent <= hi:
        return {}
    kind = f"tile overhead: useful work ^{fmt.fixed(useful.exponent, 2)}; " if tiles else ""
    return {"untestable": f"{grows} ({kind}^{fmt.fixed(overhead.exponent, 2)} with a fixed "
                          f"overhead modelled); sizes too small to test {target}"}


def device_groups(ok: pd.DataFrame, claim: Claim, envs: dict | None = None) -> list[dict]:
    """Per fitted group of the subject's ok rows (``ok``: status ok, positive metric): the
    exponent of ``claim.metric`` (time claims over the plateau of utilization only), with the
    utilization range of the rows used and ``judged`` (False: no time verdict there).
    ``envs``: run_id -> env.json (the calibration behind utilization)."""
    data = regime.attach(ok, envs, claim.metric, work=claim.work, rule=claim.saturation_rule)
    data["head_dim_v"] = (
        pd.to_numeric(data["head_dim"], errors="coerce") if "head_dim" in data else np.nan
    )
    keys = group_keys(data, claim.over, claim.hold)
    agg = _with_medians(data, claim, keys, REGIME_COLUMNS)
    if claim.min_x is not None:  # the claim's own lower bound on the axis
        agg = agg[agg["x"] >= claim.min_x]
    need = points_needed(claim)
    parts = list(iter_groups(agg, keys))
    swept = [(v, p) for v, p in parts if len(p) > 1] or parts
    groups = []
    for values, part in swept:
        base = {"group": group_label(values), "n_points": len(part), "judged": True,
                "regime": "not gated"}
        if len(part) < need:  # too few points at all: not a question of the regime
            group = _no_fit(base, part, thin_words(part["x"], claim.over, need, claim.model),
                            judged=True)
            group["regime"] = "thin" if claim.timed else group["regime"]
        elif claim.timed:
            group = _timed_group(base, part, claim)
        else:
            group = _measure(base, part, claim)[0]
        if group.get("util_low") is None and group["regime"] == "not gated":
            group["regime"] = "unknown"
        groups.append(group)
    return groups


def work_groups(rows: pd.DataFrame, claim: Claim) -> tuple[list[dict], str]:
    """Exponents of the analytic work (cost model) over every swept point of the subject's
    rows, whatever their status: exact counts, so the interval is the fit's own (zero width
    for an exact power law); or ([], why there are none)."""
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
        region = f" over {claim.over} {fit.x_lo:g}..{fit.x_hi:g}" if fit.n_points > 1 else ""
        groups.append({
            "group": group_label(values), "measured": fit.exponent, "ci_low": fit.ci_low,
            "ci_high": fit.ci_high, "n_points": fit.n_points, "thin": not fit.ok,
            "detail": f"; analytic {unit} ({fit.model}){region}",
        })
    return groups, ""
