"""Exponent fits: how a metric grows with a swept variable, with a bootstrap interval.

A fit is the slope ``p`` of ``log(metric)`` against ``log(x)``. Two models:

- ``power`` (default): ``y = a·x^p``.
- ``power+const``: ``y = c + a·x^p`` with ``c >= 0``: a fixed overhead (thread buffers,
  per-call dispatch, weight reads in a decode step) is modelled instead of dropped. ``c`` is
  profiled on a grid of fractions of ``min(y)``; it needs one point more than ``power``.

Both fit over the *asymptotic region*, chosen by one rule: start with the largest-x points the
model needs for one residual degree of freedom (3 for ``power``, 4 for ``power+const``); walk
downwards and add the next smaller point while the region's fit predicts it within ``tol`` in
slope, ``|log y - log ŷ| <= tol·log(x_above / x)``; stop at the first point that is not. So
leading points where overheads still bend the curve, or where a kernel switches its blocking,
are dropped objectively and visibly (``x_lo`` says where the region starts; the local slopes
between neighbours, :func:`local_slopes`, show why).

Interval: a percentile bootstrap (``level``, default 95 %) with the region fixed. Each replicate
adds two perturbations to the fitted log values and refits: (1) measurement noise: each point's
raw per-call samples (``time_samples_s``) resampled with replacement, median recomputed (for
time-derived metrics: ``time_median_s``, ``tokens_per_s``, ``tflops_per_s``); (2) lack of fit:
the residual variance *beyond* what (1) explains, ``s² = max(SSE/(k-q) - noise variance, 0)``
for ``q`` fitted parameters, drawn as ``N(0, s²·(k-q)/χ²(k-q))`` per replicate, so with few
points the interval has Student-t tails (for ``power`` without samples it is the classic OLS t
interval). A fit with fewer than ``min_points`` (+1 for ``power+const``) points has ``nan``
bounds. Seeded: the same rows give the same interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from harness.point import POINT_FIELDS

MODELS = ("power", "power+const")
SHAPE_FIELDS = ("heads", "head_dim", "d_model")
SHAPE_PARTNER = {"heads": "d_model", "head_dim": "d_model", "d_model": "head_dim"}
KEY_FIELDS: tuple[str, ...] = (*POINT_FIELDS, "d_model")
# metric -> power of time it scales with; their bootstrap resamples time_samples_s
TIME_METRICS = {"time_median_s": 1.0, "tokens_per_s": -1.0, "tflops_per_s": -1.0}
MISSING = "-"  # group-key stand-in for None/NaN (pandas cannot group or merge on them reliably)


@dataclass(frozen=True)
class Fit:
    """A fitted exponent ``y = offset + prefactor·x^exponent`` over ``x_lo..x_hi``."""

    exponent: float
    ci_low: float
    ci_high: float
    prefactor: float
    offset: float
    model: str
    n_points: int  # points in the fitted region
    n_total: int  # points available
    x_lo: float
    x_hi: float
    r2: float
    bootstrap: str  # what was resampled: "samples+residuals", "residuals" or "none"

    @property
    def ok(self) -> bool:
        """True when the interval exists (enough points were there)."""
        return bool(np.isfinite(self.ci_low) and np.isfinite(self.ci_high))

    def as_dict(self) -> dict:
        return asdict(self)


def local_slopes_xy(x: Sequence[float], y: Sequence[float]) -> np.ndarray:
    """Slopes ``Δlog y / Δlog x`` between neighbours of x-sorted positive data (length k-1)."""
    lx, ly = np.log(np.asarray(x, float)), np.log(np.asarray(y, float))
    return np.diff(ly) / np.diff(lx)


def _ols(lx: np.ndarray, ly: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Least-squares lines through rows of ``ly`` (..., k) against ``lx`` (k,): slope, icpt, SSE."""
    xc = lx - lx.mean()
    slope = (ly * xc).sum(-1) / (xc**2).sum()
    icpt = ly.mean(-1) - slope * lx.mean()
    sse = ((ly - icpt[..., None] - slope[..., None] * lx) ** 2).sum(-1)
    return slope, icpt, sse


def asymptotic_start(
    x: np.ndarray, y: np.ndarray, min_points: int = 3, tol: float = 0.15, model: str = "power"
) -> int:
    """Index (into x-sorted data) where the asymptotic region starts; see the module docstring."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    lx, ly = np.log(x), np.log(y)
    start = max(len(x) - min_points - (model == "power+const"), 0)
    while start > 0:
        with np.errstate(all="ignore"):
            p, la, c = (float(v[0]) for v in _fit_rows(lx[start:], y[None, start:], model))
            predicted = np.log(c + np.exp(la) * x[start - 1] ** p)
        if not abs(ly[start - 1] - predicted) <= tol * (lx[start] - lx[start - 1]):
            break
        start -= 1
    return start


_FRACTIONS = np.concatenate([[0.0], 1.0 - np.geomspace(1.0, 1e-3, 160)[1:]])


def _profile(lx: np.ndarray, y: np.ndarray, frac: np.ndarray):
    """Best ``c = frac·min(y)`` per row of y (B, k) over candidate fractions frac (B, G)."""
    c = frac[..., None] * y.min(-1)[:, None, None]  # (B, G, 1)
    slope, icpt, _ = _ols(lx, np.log(y[:, None, :] - c))  # (B, G)
    model = np.log(c + np.exp(icpt[..., None] + slope[..., None] * lx))
    best = np.argmin(((np.log(y)[:, None, :] - model) ** 2).sum(-1), axis=1)
    rows = np.arange(y.shape[0])
    return best, slope[rows, best], icpt[rows, best], c[rows, best, 0]


def _power_const(lx: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Profile fit of ``y = c + a·x^p``, c >= 0, for rows of y (B, k): p, log a, c (each (B,)).

    A coarse grid of c/min(y), then two finer grids between the best point's neighbours."""
    frac = np.broadcast_to(_FRACTIONS, (y.shape[0], _FRACTIONS.size))
    for _ in range(3):
        best, slope, icpt, c = _profile(lx, y, frac)
        rows = np.arange(y.shape[0])
        lo = frac[rows, np.maximum(best - 1, 0)]
        hi = frac[rows, np.minimum(best + 1, frac.shape[1] - 1)]
        frac = lo[:, None] + (hi - lo)[:, None] * np.linspace(0.0, 1.0, 21)
    return slope, icpt, c


def _fit_rows(lx: np.ndarray, y: np.ndarray, model: str):
    """Fit each row of y (B, k); returns (p, log a, c) arrays."""
    if model == "power":
        slope, icpt, _ = _ols(lx, np.log(y))
        return slope, icpt, np.zeros_like(slope)
    return _power_const(lx, y)


def _sample_medians(samples: Sequence, n_boot: int, rng: np.random.Generator) -> np.ndarray | None:
    """(B, k) bootstrap medians of each point's raw samples, or None if any point lacks them."""
    cols = []
    for s in samples:
        arr = np.asarray(s if s is not None else [], float)
        arr = arr[np.isfinite(arr)]
        if arr.size < 2:
            return None
        idx = rng.integers(0, arr.size, size=(n_boot, arr.size))
        cols.append(np.median(arr[idx], axis=1) / np.median(arr))
    return np.stack(cols, axis=1)


def fit_exponent(
    x: Sequence[float],
    y: Sequence[float],
    samples: Sequence | None = None,
    *,
    sample_power: float = 1.0,
    model: str = "power",
    min_points: int = 3,
    tol: float = 0.15,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> Fit:
    """Fit the exponent of ``y`` in ``x`` (positive values; sorted here). See the module docstring.

    ``samples``: per point, raw per-call times whose median ``y`` is proportional to
    ``median**sample_power`` (1 for times, -1 for rates); ``None`` = residual bootstrap only.
    """
    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    order = np.argsort(np.asarray(x, float))
    xs, ys = np.asarray(x, float)[order], np.asarray(y, float)[order]
    if np.any(xs <= 0) or np.any(ys <= 0) or len(np.unique(xs)) != len(xs):
        raise ValueError("fit_exponent needs distinct positive x and positive y")
    need = min_points + (model == "power+const")
    start = asymptotic_start(xs, ys, min_points, tol, model)
    xr, yr = xs[start:], ys[start:]
    k, lx = len(xr), np.log(xr)
    if k < 2:
        nan = float("nan")
        return Fit(nan, nan, nan, nan, nan, model, k, len(xs), nan, nan, nan, "none")
    p, la, c = (float(v[0]) for v in _fit_rows(lx, yr[None, :], model))
    fitted = np.log(c + np.exp(la) * xr**p)
    resid = np.log(yr) - fitted
    ss_tot = ((np.log(yr) - np.log(yr).mean()) ** 2).sum()
    r2 = float(1 - (resid**2).sum() / ss_tot) if ss_tot > 0 else 1.0
    lo = hi = float("nan")
    method = "none"
    if k >= need:
        rng = np.random.default_rng(seed)
        n_par = 2 if model == "power" else 3
        picked = None if samples is None else [samples[i] for i in order[start:]]
        ratios = None if picked is None else _sample_medians(picked, n_boot, rng)
        noise = np.zeros((n_boot, k))
        method = "residuals"
        if ratios is not None:
            noise, method = sample_power * np.log(ratios), "samples+residuals"
        dof = k - n_par
        lack = max((resid**2).sum() / dof - noise.var(axis=0).mean(), 0.0) if dof > 0 else 0.0
        sigma = np.sqrt(lack * dof / rng.chisquare(max(dof, 1), size=(n_boot, 1)))
        deviation = np.clip(noise + sigma * rng.standard_normal((n_boot, k)), -30.0, 30.0)
        log_y = fitted + deviation
        with np.errstate(all="ignore"):
            boot = _fit_rows(lx, np.exp(log_y), model)[0]
        alpha = (1 - level) / 2
        lo, hi = (float(v) for v in np.nanquantile(boot, [alpha, 1 - alpha]))
        lo, hi = min(lo, p), max(hi, p)
    return Fit(
        p, lo, hi, float(np.exp(la)), c, model, k, len(xs), float(xr[0]), float(xr[-1]), r2, method
    )


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


def aggregate(df: pd.DataFrame, over: str, metric: str, keys: Sequence[str]) -> pd.DataFrame:
    """One row per (keys, over): median metric, pooled ``samples`` (duplicate runs merge)."""
    frame = (
        _keys(df[list(keys)])
        .assign(
            x=pd.to_numeric(df[over], errors="coerce"),
            y=pd.to_numeric(df[metric], errors="coerce"),
            samples=df["time_samples_s"] if "time_samples_s" in df.columns else None,
        )
        .dropna(subset=["x", "y"])
    )
    frame = frame[frame["x"] > 0]

    def pool(series: pd.Series) -> list | None:
        lists = [s for s in series if isinstance(s, list)]
        return [v for s in lists for v in s] if len(lists) == len(series) else None

    grouped = frame.groupby([*keys, "x"], sort=True, dropna=False)
    out = grouped.agg(y=("y", "median"), samples=("samples", pool), rows=("y", "size"))
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
            fit = fit_exponent(part["x"], part["y"], samples, sample_power=power or 1.0, **fit_kw)
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
