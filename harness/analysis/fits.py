"""Exponent fits over result rows: how a metric grows with a swept variable, with an interval.

The fit itself (models ``power``, ``power+const``, ``auto``; the region rule that uses each
point's measured uncertainty; the bootstrap interval) is :mod:`harness.analysis.powerfit`.
This module feeds it: :func:`fit_exponent` turns per-point raw samples or stored intervals into
the noise of its bootstrap; :func:`fit_exponents` and :func:`local_slopes` fit every group of
result rows (:mod:`harness.analysis.frames` picks the rows and groups); :func:`log_ratio_boot`
is the same bootstrap for ratios of two implementations at matched points.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterator, Sequence

import numpy as np
import pandas as pd

from harness import fmt
from harness.analysis.frames import (
    TIME_METRICS,
    aggregate,
    group_keys,
    iter_groups,
    select,
    with_derived,
)
from harness.analysis.powerfit import (
    MODELS,
    SIGMA_FLOOR,
    Fit,
    choose_region,
    fit_region,
    fit_rows,
    local_slopes_xy,
    n_params,
    needs_constant,
    sample_medians,
)

__all__ = ["N_BOOT", "fit_exponent", "fit_exponents", "local_slopes", "log_ratio_boot"]
N_BOOT = 2000  # bootstrap replicates behind every verdict interval


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


def _noise(ratios, s2, sample_power: float, start: int, n_boot: int, k: int, rng):
    """Measurement-noise perturbations (n_boot, k) of log y over the fitted region (points
    ``start:``) and the name of their source: resampled medians, normal draws with ``σ``, or
    none (zeros: the residuals alone)."""
    if ratios is not None:
        return sample_power * np.log(ratios[:, start:]), "samples+residuals"
    if s2 is not None:
        return np.sqrt(s2) * rng.standard_normal((n_boot, k)), "sigma+residuals"
    return np.zeros((n_boot, k)), "residuals"


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
    whole: bool = False,
) -> Fit:
    """Fit the exponent of ``y`` in ``x`` (positive values; sorted here); see
    :mod:`harness.analysis.powerfit`.

    ``samples``: per point, raw per-call times whose median ``y`` is proportional to
    ``median**sample_power`` (1 for times, -1 for rates). ``sigma``: per point, the standard
    error of ``log y`` when there are no samples (e.g. from a stored median interval). With
    neither, the residuals alone set the scale. Points below ``min_x`` are left out; with
    ``whole``, no others (a region chosen by another rule, e.g. the plateau of utilization).
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
    picked = None if samples is None else [samples[i] for i in order]
    key = _key(xs, ys, picked, sigma, order,
               (sample_power, model, min_points, n_boot, level, seed, whole, len(xs_all)))
    if key is not None and key in _FITS:
        _FITS.move_to_end(key)
        return _FITS[key]
    fit = _fit(xs, ys, picked, sigma, order, sample_power, model, min_points, n_boot, level,
               seed, whole, len(xs_all))
    if key is not None:
        _FITS[key] = fit
        if len(_FITS) > _FITS_KEPT:
            _FITS.popitem(last=False)
    return fit


# Fits already made, by their inputs: every claim over the same rows and axis (the claims of
# one implementation, ``claims`` and ``report`` over one run, a plateau's candidate regions
# tried again for the next claim) fits the same points with the same seed. A fit is a
# function of its inputs and a frozen value, so the stored one is the one a refit would give.
_FITS: OrderedDict[tuple, Fit] = OrderedDict()
_FITS_KEPT = 4096


def _key(xs, ys, picked, sigma, order, settings: tuple) -> tuple | None:
    """The inputs of a fit as a small hashable value (a digest of the points' bytes, each
    point's samples pass by pass and its sigma; the settings), or None when some are not
    numbers (then the fit is not kept)."""
    try:
        samples = None if picked is None else tuple(_frozen(s) for s in picked)
        sigmas = None if sigma is None else np.asarray(sigma, float)[order].tobytes()
    except (TypeError, ValueError):
        return None
    digest = hashlib.blake2b(repr((samples, sigmas)).encode(), digest_size=20)
    digest.update(xs.tobytes())
    digest.update(b"|")
    digest.update(ys.tobytes())
    return digest.digest(), len(xs), settings


def _frozen(s) -> object:
    """One point's samples (None, a flat list or a list of passes) as bytes per pass."""
    if s is None:
        return None
    if len(s) and isinstance(s[0], list | tuple | np.ndarray):
        return ("passes", *(np.asarray(g, float).tobytes() for g in s))
    return ("flat", np.asarray(s, float).tobytes())


def _fit(xs, ys, picked, sigma, order, sample_power, model, min_points, n_boot, level, seed,
         whole, n_total) -> Fit:
    """:func:`fit_exponent` over the points kept, x-sorted (``order`` indexes ``sigma``)."""
    nan = float("nan")
    rng = np.random.default_rng(seed)
    ratios = None if picked is None else sample_medians(picked, n_boot, rng)
    sigma2 = _sigma2(ratios, sigma, order, len(xs))
    start, chosen = _region(xs, ys, sigma2, model, min_points, whole)
    xr, yr, lx, k = xs[start:], ys[start:], np.log(xs[start:]), len(xs) - start
    s2 = None if sigma2 is None else sigma2[start:]
    # weights 1/(σ_i² + τ²): a precise point must not dominate data that wobble more than
    # their error bars say (drift between timing passes, shape-dependent kernel choices)
    w = np.ones(k) if s2 is None else fit_region(lx, yr, s2, chosen).w
    noise, method = _noise(ratios, s2, sample_power, start, n_boot, k, rng)
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
    return Fit(
        p, lo, hi, float(np.exp(la)), c, chosen, k, n_total, float(xr[0]), float(xr[-1]),
        _r_squared(yr, resid), method,
    )


def _region(xs, ys, sigma2, model: str, min_points: int, whole: bool) -> tuple[int, str]:
    """(first index of the fitted region, resolved model): powerfit's region rule, or every
    point (``whole``; ``auto`` still resolved by the F-test)."""
    if not whole:
        return choose_region(xs, ys, sigma2, model, min_points)
    bent = model == "auto" and needs_constant(np.log(xs), ys, sigma2)
    return 0, "power+const" if bent else model.replace("auto", "power")


def _r_squared(y: np.ndarray, resid: np.ndarray) -> float:
    """R² of a fit on the log scale: 1 - SSE / total sum of squares of log y (1 if y is flat)."""
    ss_tot = ((np.log(y) - np.log(y).mean()) ** 2).sum()
    return float(1 - (resid**2).sum() / ss_tot) if ss_tot > 0 else 1.0


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
    power = TIME_METRICS.get(metric)
    out = []
    for values, part in _groups(df, over, metric, hold, covary, x_range):
        samples = list(part["samples"]) if power is not None else None
        sigma = list(part["sigma"]) if part["sigma"].notna().all() else None
        fit = fit_exponent(
            part["x"], part["y"], samples, sigma=sigma, sample_power=power or 1.0, **fit_kw
        )
        slopes = local_slopes_xy(part["x"], part["y"])
        text = " ".join(fmt.fixed(s, 2) for s in slopes)
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
    out = []
    for values, part in _groups(df, over, metric, hold, covary):
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


def _groups(
    df: pd.DataFrame,
    over: str,
    metric: str,
    hold: Sequence[str],
    covary: Sequence[str] | None,
    x_range: tuple[float, float] | None = None,
) -> Iterator[tuple[dict, pd.DataFrame]]:
    """The ok rows of ``metric`` (derived variables added; ``over`` within ``x_range``)
    aggregated per value of ``over``, group by group of the fields that vary with it."""
    rows = select(with_derived(df), metric)
    if x_range is not None:
        x = pd.to_numeric(rows[over], errors="coerce")
        rows = rows[(x >= x_range[0]) & (x <= x_range[1])]
    if not len(rows):
        return
    keys = group_keys(rows, over, hold, covary)
    yield from iter_groups(aggregate(rows, over, metric, keys), keys)


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
        ratios = sample_medians(list(frame["samples"]), n_boot, rng)
        if ratios is not None:
            boot = boot + sign * power * np.log(ratios)
    return boot
