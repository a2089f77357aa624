"""Exponent fits over result rows: how a metric grows with a swept variable, with an interval.

The fit itself (models ``power``, ``power+const``, ``auto``; the region rule that uses each
point's measured uncertainty; the bootstrap interval) is :mod:`harness.analysis.powerfit`. This
module
adds the DataFrame side: which rows, which groups, which samples and uncertainties go in.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from harness.analysis.powerfit import (
    MODELS,
    SIGMA_FLOOR,
    Fit,
    asymptotic_start,
    choose_region,
    fit_region,
    fit_rows,
    local_slopes_xy,
    n_params,
    sample_medians,
)
from harness.measure.passes import split_samples
from harness.sweep.point import POINT_FIELDS

__all__ = ["MODELS", "Fit", "asymptotic_start", "fit_exponent", "fit_exponents", "local_slopes"]
SHAPE_FIELDS = ("heads", "head_dim", "d_model")
SHAPE_PARTNER = {"heads": "d_model", "head_dim": "d_model", "d_model": "head_dim"}
KEY_FIELDS: tuple[str, ...] = (*POINT_FIELDS, "d_model")
# metric -> power of time it scales with; their bootstrap resamples time_samples_s
TIME_METRICS = {"time_median_s": 1.0, "tokens_per_s": -1.0, "tflops_per_s": -1.0}
MISSING = "-"  # group-key stand-in for None/NaN (pandas cannot group or merge on them reliably)
_sample_medians = sample_medians  # the ratio/crossover bootstrap shares it


def _sigma2(ratios: np.ndarray | None, sigma, order: np.ndarray, k: int) -> np.ndarray | None:
    """Per-point variance of log y: from the sample bootstrap, else from ``sigma``, else None."""
    if ratios is not None:
        s2 = np.log(ratios).var(axis=0)
    elif sigma is not None:
        s = np.asarray(sigma, float)[order]
        if not np.all(np.isfinite(s)):
            return None
        s2 = s**2
    else:
        return None
    return np.maximum(s2, SIGMA_FLOOR**2)


def fit_exponent(
    x: Sequence[float],
    y: Sequence[float],
    samples: Sequence | None = None,
    *,
    sigma: Sequence[float] | None = None,
    sample_power: float = 1.0,
    model: str = "power",
    min_points: int = 3,
    min_x: float | None = None,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> Fit:
    """Fit the exponent of ``y`` in ``x`` (positive values; sorted here); see
    :mod:`harness.analysis.powerfit`.

    ``samples``: per point, raw per-call times whose median ``y`` is proportional to
    ``median**sample_power`` (1 for times, -1 for rates). ``sigma``: per point, the standard
    error of ``log y`` when there are no samples (e.g. from a stored median interval). With
    neither, the residuals alone set the scale. Points below ``min_x`` are left out.
    """
    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    xs_all, ys_all = np.asarray(x, float), np.asarray(y, float)
    if np.any(xs_all <= 0) or np.any(ys_all <= 0) or len(np.unique(xs_all)) != len(xs_all):
        raise ValueError("fit_exponent needs distinct positive x and positive y")
    keep = np.flatnonzero(xs_all >= (min_x if min_x is not None else -np.inf))
    order = keep[np.argsort(xs_all[keep])]
    xs, ys = xs_all[order], ys_all[order]
    nan = float("nan")
    if len(xs) < 2:
        return Fit(nan, nan, nan, nan, nan, model, len(xs), len(xs_all), nan, nan, nan, "none")
    rng = np.random.default_rng(seed)
    picked = None if samples is None else [samples[i] for i in order]
    ratios = None if picked is None else sample_medians(picked, n_boot, rng)
    sigma2 = _sigma2(ratios, sigma, order, len(xs))
    start, chosen = choose_region(xs, ys, sigma2, model, min_points)
    xr, yr, lx = xs[start:], ys[start:], np.log(xs[start:])
    k = len(xr)
    s2 = None if sigma2 is None else sigma2[start:]
    # weights 1/(σ_i² + τ²): a precise point must not dominate data that wobble more than
    # their error bars say (drift between timing passes, shape-dependent kernel choices)
    w = np.ones(k) if s2 is None else fit_region(lx, yr, s2, chosen).w
    noise, method = np.zeros((n_boot, k)), "residuals"
    if ratios is not None:
        noise, method = sample_power * np.log(ratios[:, start:]), "samples+residuals"
    elif s2 is not None:
        noise, method = np.sqrt(s2) * rng.standard_normal((n_boot, k)), "sigma+residuals"
    p, la, c, resid, lo, hi = _fit_with_interval(lx, yr, chosen, w, noise, level, rng)
    if k < min_points + (chosen == "power+const"):
        lo = hi = nan
        method = "none"
    elif model == "auto" and chosen == "power" and k > min_points:
        # the F-test kept the plain law: the interval covers both models, so choosing the
        # model from the same data does not make it too narrow
        alt = _fit_with_interval(lx, yr, "power+const", w, noise, level, rng)
        lo, hi = min(lo, alt[4]), max(hi, alt[5])
        method += ", both models"
    ss_tot = ((np.log(yr) - np.log(yr).mean()) ** 2).sum()
    r2 = float(1 - (resid**2).sum() / ss_tot) if ss_tot > 0 else 1.0
    return Fit(
        p, lo, hi, float(np.exp(la)), c, chosen, k, len(xs_all), float(xr[0]), float(xr[-1]),
        r2, method,
    )


def _fit_with_interval(lx, y, model, w, noise, level, rng):
    """Point fit of one model and its percentile bootstrap interval (see powerfit's docstring):
    (p, log a, c, residuals, low, high); low/high NaN without residual degrees of freedom."""
    p, la, c = (float(v[0]) for v in fit_rows(lx, y[None, :], model, w))
    fitted = np.log(c + np.exp(la) * np.exp(lx) ** p)
    resid = np.log(y) - fitted
    k, n_boot = lx.size, noise.shape[0]
    dof = k - n_params(model)
    if dof < 0:
        return p, la, c, resid, float("nan"), float("nan")
    lack = max((resid**2).sum() / dof - noise.var(axis=0).mean(), 0.0) if dof > 0 else 0.0
    spread = np.sqrt(lack * dof / rng.chisquare(max(dof, 1), size=(n_boot, 1)))
    deviation = np.clip(noise + spread * rng.standard_normal((n_boot, k)), -30.0, 30.0)
    boot = fit_rows(lx, np.exp(fitted + deviation), model, w)[0]
    alpha = (1 - level) / 2
    lo, hi = (float(v) for v in np.nanquantile(boot, [alpha, 1 - alpha]))
    return p, la, c, resid, min(lo, p), max(hi, p)


# --- over DataFrames of result rows --------------------------------------------------------


def with_derived(df: pd.DataFrame) -> pd.DataFrame:
    """Add derived variables one may fit against: ``window`` = keys per query (left+right+1)."""
    out = df.copy()
    if "window_left" in out.columns and "window_right" in out.columns:
        left = pd.to_numeric(out["window_left"], errors="coerce")
        right = pd.to_numeric(out["window_right"], errors="coerce")
        out["window"] = (left.fillna(0) + right.fillna(0) + 1).where(left.notna() | right.notna())
    if "d_model" not in out.columns and {"heads", "head_dim"} <= set(out.columns):
        out["d_model"] = out["heads"] * out["head_dim"]
    return out


def covarying(over: str, hold: Sequence[str] = ()) -> set[str]:
    """Fields that change with ``over`` by construction (d_model = heads·head_dim) or derivation."""
    out = {"point_id", "q_len"} if over == "seq_len" else {"point_id"}
    if over == "window":
        out |= {"window_left", "window_right"}
    if over in {"window_left", "window_right"}:
        out.add("window")
    if over in SHAPE_FIELDS:  # d_model = heads·head_dim: the shape field not held co-varies
        free = [f for f in SHAPE_FIELDS if f != over and f not in hold]
        out |= {SHAPE_PARTNER[over]} if len(free) == 2 else set(free)
    return out


def group_keys(
    df: pd.DataFrame, over: str, hold: Sequence[str] = (), covary: Sequence[str] | None = None
) -> list[str]:
    """Point fields that tell fits apart: those that vary in ``df`` (plus ``hold``), minus ``over``
    and the fields that co-vary with it; ``impl`` is always kept (it labels the fit)."""
    skip = covarying(over, hold) if covary is None else set(covary)
    keys = []
    for c in (*KEY_FIELDS, "window"):
        if c not in df.columns or c == over or c in skip or c in keys:
            continue
        if c == "impl" or c in hold or _keys(df[[c]])[c].nunique() > 1:
            keys.append(c)
    return keys


def _keys(df: pd.DataFrame) -> pd.DataFrame:
    """Key columns with None/NaN replaced by :data:`MISSING` so groupby/merge see them."""
    return df.astype(object).where(df.notna(), MISSING)


def select(df: pd.DataFrame, metric: str, where: dict | None = None) -> pd.DataFrame:
    """Rows with status ok, a positive finite ``metric`` and ``column == value`` for ``where``."""
    if metric not in df.columns:
        return df.iloc[0:0]
    keep = pd.to_numeric(df[metric], errors="coerce").gt(0)
    if "status" in df.columns:
        keep &= df["status"].eq("ok")
    for col, value in (where or {}).items():
        if col not in df.columns:
            return df.iloc[0:0]
        keep &= _keys(df[[col]])[col].eq(MISSING if value is None else value)
    return df[keep]


def _ci_sigma(df: pd.DataFrame) -> pd.Series:
    """Standard error of log(time) from each row's stored 95 % median interval (NaN if none)."""
    if not {"time_ci_low_s", "time_ci_high_s"} <= set(df.columns):
        return pd.Series(np.nan, index=df.index)
    lo = pd.to_numeric(df["time_ci_low_s"], errors="coerce")
    hi = pd.to_numeric(df["time_ci_high_s"], errors="coerce")
    with np.errstate(all="ignore"):
        return (np.log(hi) - np.log(lo)) / (2 * 1.96)


def _pass_samples(df: pd.DataFrame) -> pd.Series | None:
    """Each row's ``time_samples_s`` cut into its timing passes (``pass_samples``): a list of
    per-pass lists, one pass when the row has no pass counts; None without samples."""
    if "time_samples_s" not in df.columns:
        return None
    counts = df["pass_samples"] if "pass_samples" in df.columns else pd.Series(None, df.index)

    def split(samples, count) -> list | None:
        if not isinstance(samples, list):
            return None
        count = count if isinstance(count, list) else None
        return [g.tolist() for g in split_samples(samples, count)]

    pairs = zip(df["time_samples_s"], counts, strict=True)
    return pd.Series([split(s, c) for s, c in pairs], df.index)


def aggregate(df: pd.DataFrame, over: str, metric: str, keys: Sequence[str]) -> pd.DataFrame:
    """One row per (keys, over): median metric, pooled ``samples`` (duplicate runs merge)."""
    frame = (
        _keys(df[list(keys)])
        .assign(
            x=pd.to_numeric(df[over], errors="coerce"),
            y=pd.to_numeric(df[metric], errors="coerce"),
            samples=_pass_samples(df),
            sigma=_ci_sigma(df) if metric in TIME_METRICS else np.nan,
        )
        .dropna(subset=["x", "y"])
    )
    frame = frame[frame["x"] > 0]

    def pool(series: pd.Series) -> list | None:  # duplicate runs: their passes side by side
        lists = [s for s in series if isinstance(s, list)]
        return [p for s in lists for p in s] if len(lists) == len(series) else None

    grouped = frame.groupby([*keys, "x"], sort=True, dropna=False)
    out = grouped.agg(
        y=("y", "median"), samples=("samples", pool), sigma=("sigma", "median"), rows=("y", "size")
    )
    return out.reset_index()


def _groups(agg: pd.DataFrame, keys: Sequence[str]):
    if not keys:
        yield {}, agg.sort_values("x")
        return
    for values, part in agg.groupby(list(keys), sort=True, dropna=False):
        values = values if isinstance(values, tuple) else (values,)
        yield dict(zip(keys, values, strict=True)), part.sort_values("x")


def fit_exponents(
    df: pd.DataFrame,
    over: str,
    metric: str,
    *,
    hold: Sequence[str] = (),
    covary: Sequence[str] | None = None,
    x_range: tuple[float, float] | None = None,
    **fit_kw,
) -> pd.DataFrame:
    """One fit per group of ok rows: group keys, ``metric``, ``over``, :class:`Fit` fields and
    the local slopes (text). ``fit_kw`` goes to :func:`fit_exponent`."""
    df = with_derived(df)
    rows = select(df, metric)
    if x_range is not None:
        x = pd.to_numeric(rows[over], errors="coerce")
        rows = rows[(x >= x_range[0]) & (x <= x_range[1])]
    keys = group_keys(rows, over, hold, covary) if len(rows) else []
    out = []
    if len(rows):
        agg = aggregate(rows, over, metric, keys)
        power = TIME_METRICS.get(metric)
        for values, part in _groups(agg, keys):
            samples = list(part["samples"]) if power is not None else None
            sigma = list(part["sigma"]) if part["sigma"].notna().all() else None
            fit = fit_exponent(
                part["x"], part["y"], samples, sigma=sigma, sample_power=power or 1.0, **fit_kw
            )
            slopes = local_slopes_xy(part["x"], part["y"])
            text = " ".join(f"{s:.2f}" for s in slopes)
            out.append(
                {**values, "metric": metric, "over": over, **fit.as_dict(), "local_slopes": text}
            )
    return pd.DataFrame(out)


def local_slopes(
    df: pd.DataFrame,
    over: str,
    metric: str,
    *,
    hold: Sequence[str] = (),
    covary: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Tidy local slopes: group keys, ``x_lo``, ``x_hi``, ``slope`` between neighbouring points."""
    df = with_derived(df)
    rows = select(df, metric)
    if not len(rows):
        return pd.DataFrame()
    keys = group_keys(rows, over, hold, covary)
    out = []
    for values, part in _groups(aggregate(rows, over, metric, keys), keys):
        xs = list(part["x"])
        for lo, hi, s in zip(xs[:-1], xs[1:], local_slopes_xy(part["x"], part["y"]), strict=True):
            out.append(
                {
                    **values,
                    "metric": metric,
                    "over": over,
                    "x_lo": lo,
                    "x_hi": hi,
                    "slope": float(s),
                }
            )
    return pd.DataFrame(out)


def log_ratio_boot(
    subject: pd.DataFrame, base: pd.DataFrame, power: float | None, n_boot: int, seed: int
) -> np.ndarray:
    """(B, k) bootstrap log ratios subject/baseline over matched points (same row order); the
    point estimate is column-constant when samples are missing."""
    est = np.log(subject["y"].to_numpy(float) / base["y"].to_numpy(float))
    boot = np.tile(est, (n_boot, 1))
    if power is None:
        return boot
    rng = np.random.default_rng(seed)
    for frame, sign in ((subject, 1.0), (base, -1.0)):
        ratios = _sample_medians(list(frame["samples"]), n_boot, rng)
        if ratios is not None:
            boot = boot + sign * power * np.log(ratios)
    return boot
