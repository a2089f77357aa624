"""Power-law fits with their own uncertainty: the exponent ``p`` of ``y = c + a·x^p``.

The fit lives on a log-log scale: ``log y`` against ``log x``. Three models:

- ``power``: ``y = a·x^p`` (a straight line in log-log).
- ``power+const``: ``y = c + a·x^p`` with ``c >= 0``: a fixed overhead (thread buffers, per-call
  dispatch, weight reads in a decode step) is modelled instead of dropped. ``c`` is profiled on
  a grid of fractions of ``min(y)``; it needs one point more than ``power``.
- ``auto``: ``power``, unless an F-test on the residuals says the constant is needed
  (p < :data:`ALPHA_CONST`); then ``power+const``. When it keeps ``power``, the reported
  interval is the hull of both models' intervals: choosing the model from the same data must
  not make the interval too narrow (a small overhead that the test misses would bias a narrow
  power-law interval; on synthetic data with 10 % overheads coverage fell to ~70 %).
  ``power`` is right where physics rules an overhead out (time over the plateau of utilization).

Each point carries its measured uncertainty ``σ_i`` (the standard error of ``log y``): from the
bootstrap of its raw per-call samples, or from its stored median interval, or none (exact
counts such as memory; then the residuals alone set the scale). Points are weighted by
``1/(σ_i² + τ²)``, where ``τ²`` is the scatter beyond the measured noise (kernel choices that
change with the shape, a shared machine): so a noisy point counts less, but a precise one
does not dominate data that wobble more than their error bars say.

The fitted region: every point (at or above a stated ``min_x``), less the leading points the
data themselves reject. From the smallest x up, a point is dropped while (a) for ``power``, the
F-test still finds an overhead-shaped bend in the region (the constant is significant), or
(b) the point lies outside the prediction interval (two-sided, :data:`ALPHA_DROP`) of the fit
over the points above it, using the measured ``σ`` of that point and the scatter of the others
(Student-t when that scatter had to be estimated). A clean power law keeps every point however
dense the grid; an overhead that bends the small sizes is dropped (``power``) or modelled
(``power+const``/``auto``). Fewer points than the model needs are never fitted.

Interval: a percentile bootstrap (``level``, default 95 %) with the region and model fixed.
Each replicate adds two perturbations to the fitted log values and refits: (1) measurement
noise: each point's raw samples resampled with replacement, median recomputed (else a normal
draw with the point's ``σ``); (2) lack of fit: the residual variance beyond what (1) explains,
``s² = max(SSE/(k-q) - noise variance, 0)`` for ``q`` parameters, drawn as
``N(0, s²·(k-q)/χ²(k-q))`` per replicate, so with few points the interval has Student-t
tails. The region choice itself is not resampled. Seeded: the same data give the same interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import special  # not scipy.stats: its import alone took 1-2 s of each command

from harness.measure.passes import hierarchical_bootstrap, point_estimate

MODELS = ("power", "power+const", "auto")
ALPHA_DROP = 0.01  # a leading point is dropped when it is this unlikely under the fit above it
ALPHA_CONST = 0.05  # ``auto`` adds the constant when the F-test's p-value is below this
SIGMA_FLOOR = 1e-3  # relative: even an exact count has rounding and a stored median jitters
_FRACTIONS = np.concatenate([[0.0], 1.0 - np.geomspace(1.0, 1e-3, 160)[1:]])


@dataclass(frozen=True)
class Fit:
    """A fitted exponent ``y = offset + prefactor·x^exponent`` over ``x_lo..x_hi``."""

    exponent: float
    ci_low: float
    ci_high: float
    prefactor: float
    offset: float
    model: str  # the model fitted ("power" or "power+const"; ``auto`` resolves to one)
    n_points: int  # points in the fitted region
    n_total: int  # points available
    x_lo: float
    x_hi: float
    r2: float
    bootstrap: str  # what was resampled: "samples+residuals", "sigma+residuals", ...

    @property
    def ok(self) -> bool:
        """True when the interval exists (enough points were there)."""
        return bool(np.isfinite(self.ci_low) and np.isfinite(self.ci_high))

    def as_dict(self) -> dict:
        return asdict(self)


def n_params(model: str) -> int:
    return 3 if model == "power+const" else 2


def local_slopes_xy(x: Sequence[float], y: Sequence[float]) -> np.ndarray:
    """Slopes ``Δlog y / Δlog x`` between neighbours of x-sorted positive data (length k-1)."""
    lx, ly = np.log(np.asarray(x, float)), np.log(np.asarray(y, float))
    return np.diff(ly) / np.diff(lx)


def _wls(lx: np.ndarray, ly: np.ndarray, w: np.ndarray):
    """Weighted lines through rows of ``ly`` (..., k) against ``lx`` (k,), weights w (k,):
    slope, intercept (each (...,))."""
    mx = (w * lx).sum() / w.sum()
    my = (ly * w).sum(-1) / w.sum()
    xc = lx - mx
    centred = ly - my[..., None]  # one (..., k) buffer for the slope's products
    centred *= w * xc
    slope = centred.sum(-1) / (w * xc**2).sum()
    return slope, my - slope * mx


def _profile(lx: np.ndarray, y: np.ndarray, frac: np.ndarray, w: np.ndarray):
    """Best ``c = frac·min(y)`` per row of y (B, k) over candidate fractions frac (B, G)."""
    c = frac[..., None] * y.min(-1)[:, None, None]  # (B, G, 1)
    slope, icpt = _wls(lx, np.log(y[:, None, :] - c), w)  # (B, G)
    # log y minus the log of the model c + a·x^p, squared, in one (B, G, k) buffer
    err = slope[..., None] * lx
    err += icpt[..., None]
    np.exp(err, out=err)
    err += c
    np.log(err, out=err)
    np.subtract(np.log(y)[:, None, :], err, out=err)
    err *= err
    err *= w
    best = np.argmin(err.sum(-1), axis=1)
    rows = np.arange(y.shape[0])
    return best, slope[rows, best], icpt[rows, best], c[rows, best, 0]


def _power_const(lx: np.ndarray, y: np.ndarray, w: np.ndarray):
    """Profile fit of ``y = c + a·x^p``, c >= 0, for rows of y (B, k): p, log a, c (each (B,)).

    A coarse grid of c/min(y), then two finer grids between the best point's neighbours."""
    frac = np.broadcast_to(_FRACTIONS, (y.shape[0], _FRACTIONS.size))
    for _ in range(3):
        best, slope, icpt, c = _profile(lx, y, frac, w)
        rows = np.arange(y.shape[0])
        lo = frac[rows, np.maximum(best - 1, 0)]
        hi = frac[rows, np.minimum(best + 1, frac.shape[1] - 1)]
        frac = lo[:, None] + (hi - lo)[:, None] * np.linspace(0.0, 1.0, 21)
    return slope, icpt, c


def fit_rows(lx: np.ndarray, y: np.ndarray, model: str, w: np.ndarray | None = None):
    """Fit each row of y (B, k) with weights w (k,); returns (p, log a, c) arrays (B,)."""
    w = np.ones(lx.size) if w is None else w
    with np.errstate(all="ignore"):
        if model == "power":
            slope, icpt = _wls(lx, np.log(y), w)
            return slope, icpt, np.zeros_like(slope)
        return _power_const(lx, y, w)


@dataclass
class _RegionFit:
    p: float
    la: float
    c: float
    resid: np.ndarray  # log y - log ŷ
    tau2: float  # scatter beyond the measured noise (or the whole scatter when σ is unknown)
    w: np.ndarray
    dof: int


def fit_region(lx, y, sigma2, model) -> _RegionFit:
    """Weighted fit of one region; the weights' extra scatter τ² re-estimated once."""
    k, q = lx.size, n_params(model)
    w = np.ones(k) if sigma2 is None else 1.0 / sigma2
    tau2 = 0.0
    for _ in range(2):
        p, la, c = (float(v[0]) for v in fit_rows(lx, y[None, :], model, w))
        with np.errstate(all="ignore"):
            resid = np.log(y) - np.log(c + np.exp(la + p * lx))
        if k <= q:
            break
        mean_sq = float((resid**2).sum()) / (k - q)
        tau2 = mean_sq if sigma2 is None else max(mean_sq - float(sigma2.mean()), 0.0)
        if sigma2 is None:
            break
        w = 1.0 / (sigma2 + tau2)
    return _RegionFit(p, la, c, resid, tau2, w, k - q)


def needs_constant(lx, y, sigma2) -> bool:
    """Does ``c + a·x^p`` fit better than ``a·x^p`` (:func:`constant_p_value` < ALPHA_CONST)?"""
    return constant_p_value(lx, y, sigma2) < ALPHA_CONST


def constant_p_value(lx, y, sigma2) -> float:
    """F-test on one region: the p-value of "no constant" (1.0 when the best constant is 0 or
    there is no residual degree of freedom to test with)."""
    k = lx.size
    if k < 4:
        return 1.0
    plain = fit_region(lx, y, sigma2, "power")
    const = fit_region(lx, y, sigma2, "power+const")
    if const.c <= 0:
        return 1.0
    # weights of the measured noise only: the extra scatter τ² of the plain fit would absorb
    # the very bend under test; the denominator is the full model's own mean square
    w = np.ones(k) if sigma2 is None else 1.0 / sigma2
    sse_p, sse_c = float((w * plain.resid**2).sum()), float((w * const.resid**2).sum())
    denom = max(sse_c / (k - 3), 1.0 if sigma2 is not None else 1e-12)
    f = max(sse_p - sse_c, 0.0) / denom
    return float(special.fdtrc(1, k - 3, f))  # the F(1, k-3) survival function


def _leading_point_off(lx, y, sigma2, model, start) -> bool:
    """Is point ``start`` outside the prediction interval of the fit over the points above it?"""
    rest = slice(start + 1, None)
    fit = fit_region(lx[rest], y[rest], None if sigma2 is None else sigma2[rest], model)
    if fit.dof < 1:
        return False
    with np.errstate(all="ignore"):
        predicted = np.log(fit.c + np.exp(fit.la + fit.p * lx[start]))
    r = float(np.log(y[start]) - predicted)
    xr = lx[rest]
    leverage = 1 / xr.size + (lx[start] - xr.mean()) ** 2 / ((xr - xr.mean()) ** 2).sum()
    if sigma2 is None:
        var, quant = fit.tau2 * (1 + leverage), special.stdtrit(fit.dof, 1 - ALPHA_DROP / 2)
    else:
        rest_var = float(sigma2[rest].mean()) + fit.tau2
        var = sigma2[start] + fit.tau2 + rest_var * leverage
        # Student's t quantile (normal without extra scatter): scipy.stats' t.ppf, norm.ppf
        p = 1 - ALPHA_DROP / 2
        quant = special.stdtrit(fit.dof, p) if fit.tau2 > 0 else special.ndtri(p)
    return not abs(r) <= quant * np.sqrt(max(var, 1e-30))


def choose_region(
    x: np.ndarray, y: np.ndarray, sigma2: np.ndarray | None, model: str, min_points: int = 3
) -> tuple[int, str]:
    """(start index into x-sorted data, resolved model); see the module docstring."""
    lx = np.log(np.asarray(x, float))
    y = np.asarray(y, float)

    def resolve(start: int) -> str:
        if model != "auto":
            return model
        s2 = None if sigma2 is None else sigma2[start:]
        return "power+const" if needs_constant(lx[start:], y[start:], s2) else "power"

    def bent(start: int) -> bool:  # only a plain power law drops points for an overhead
        s2 = None if sigma2 is None else sigma2[start:]
        return model == "power" and needs_constant(lx[start:], y[start:], s2)

    chosen, start = resolve(0), 0
    need = min_points + (chosen == "power+const")
    while lx.size - start - 1 >= need and (
        bent(start) or _leading_point_off(lx, y, sigma2, chosen, start)
    ):
        start += 1
    if start and model == "auto":
        chosen = resolve(start)
    return start, chosen


def asymptotic_start(
    x: Sequence[float],
    y: Sequence[float],
    min_points: int = 3,
    model: str = "power",
    sigma: Sequence[float] | None = None,
) -> int:
    """Index (into x-sorted data) where the fitted region starts; see the module docstring."""
    sigma2 = None if sigma is None else np.maximum(np.asarray(sigma, float), SIGMA_FLOOR) ** 2
    return choose_region(np.asarray(x, float), np.asarray(y, float), sigma2, model, min_points)[0]


def sample_medians(samples: Sequence, n_boot: int, rng: np.random.Generator) -> np.ndarray | None:
    """(B, k) bootstrap replicates of each point's time estimate, relative to the estimate, or
    None if any point lacks two finite samples.

    A point's samples are either one flat list of per-call times (bootstrap of their median),
    or a list of timing passes, each a list of per-call times (hierarchical bootstrap of the
    median of pass medians: passes drawn with replacement, then calls within each pass). The
    pass structure matters: calls within a pass share that pass's machine state, so pooling
    them claims a precision that the drift between passes does not allow."""
    cols = []
    for s in samples:
        groups = _as_passes(s)
        if groups is None:
            return None
        if len(groups) == 1:
            arr = groups[0]
            idx = rng.integers(0, arr.size, size=(n_boot, arr.size))
            cols.append(np.median(arr[idx], axis=1) / np.median(arr))
        else:
            seed = int(rng.integers(0, 2**31))
            reps = hierarchical_bootstrap(groups, "median", resamples=n_boot, seed=seed)
            cols.append(reps / point_estimate(groups, "median"))
    return np.stack(cols, axis=1)


def _as_passes(s) -> list[np.ndarray] | None:
    """A point's samples as a list of finite per-pass arrays (None: fewer than 2 samples)."""
    nested = s is not None and len(s) > 0 and isinstance(s[0], list | tuple | np.ndarray)
    raw = s if nested else [s if s is not None else []]
    groups = [a[np.isfinite(a)] for a in (np.asarray(g, float) for g in raw)]
    groups = [g for g in groups if g.size]
    return groups if sum(g.size for g in groups) >= 2 else None
