"""The change of one point's time between two runs, with a confidence interval from the raw
timing samples.

The time rule (see :mod:`harness.compare.rules`) fails a point only when the *lower* end of a
bootstrap confidence interval on the change of a statistic (by default the ratio of medians,
``median(current) / median(baseline) - 1``) is above the threshold. So the slowdown must exceed
the threshold even at the optimistic end of what the measured noise allows: a real 1.5x
slowdown with a few percent of noise is caught, a 12% jump in a run whose samples spread
over ±20% is not.

Rows measured in several passes (``pass_samples`` cuts ``time_samples_s`` into passes) are
compared with a hierarchical bootstrap (:mod:`harness.measure.passes`): passes, then samples,
are resampled, so disagreement between a point's passes widens the interval as it should.
The time basis: ``absolute`` (seconds) or ``normalized`` (each pass's samples divided by the
reference kernel's time in that pass, ``ref_kernel_s``), which cancels a machine that is
uniformly slower today.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from harness.compare.thresholds import Threshold
from harness.measure import passes as pass_stats


@dataclass(frozen=True)
class TimeChange:
    """A time comparison: statistics, the change (point estimate) and its confidence interval,
    in the check's units (fraction when relative, seconds or reference times when absolute)."""

    base: float
    cur: float
    change: float
    low: float
    high: float
    method: str  # passes | bootstrap | run-ci | none (no samples: point estimate only)


def _stat(values: np.ndarray, stat: str, axis: int | None = None) -> np.ndarray:
    return {"median": np.median, "mean": np.mean, "min": np.min}[stat](values, axis=axis)


def bootstrap_interval(
    base: np.ndarray,
    cur: np.ndarray,
    check: Threshold,
    confidence: float = 0.99,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap CI of ``check.change(stat(base), stat(cur))``; each run's samples
    (1-D, seconds) are resampled independently. Seeded, so a comparison is reproducible."""
    rng = np.random.default_rng(seed)
    b = _stat(rng.choice(base, size=(resamples, base.size)), check.stat, axis=1)
    c = _stat(rng.choice(cur, size=(resamples, cur.size)), check.stat, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        changes = c / b - 1.0 if check.relative else c - b
    alpha = 1.0 - confidence
    low, high = np.nanquantile(changes, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


def time_change(
    check: Threshold,
    base_samples: Sequence[float] | None,
    cur_samples: Sequence[float] | None,
    base_stat: float | None = None,
    cur_stat: float | None = None,
    base_ci: tuple[float, float] | None = None,
    cur_ci: tuple[float, float] | None = None,
    scale: float = 1.0,
    confidence: float = 0.99,
    seed: int = 0,
) -> TimeChange | None:
    """Compare two runs' times; ``scale`` multiplies current times (peak normalisation).

    Uses the raw samples when both runs have at least two; else each run's own CI of the
    median (``time_ci_low_s``/``time_ci_high_s``), combined conservatively; else only the
    point estimate (low = high = change). None when a run has no time at all.
    """
    b = np.asarray([x for x in base_samples or [] if x is not None and x > 0], dtype=float)
    c = np.asarray([x for x in cur_samples or [] if x is not None and x > 0], dtype=float) * scale
    if b.size >= 2 and c.size >= 2:
        bs, cs = float(_stat(b, check.stat)), float(_stat(c, check.stat))
        low, high = bootstrap_interval(b, c, check, confidence, seed=seed)
        return TimeChange(bs, cs, check.change(bs, cs), low, high, "bootstrap")
    bs = float(_stat(b, check.stat)) if b.size else base_stat
    cs = float(_stat(c, check.stat)) if c.size else (None if cur_stat is None else cur_stat * scale)
    if bs is None or cs is None or bs <= 0:
        return None
    change = check.change(bs, cs)
    if base_ci and cur_ci and None not in (*base_ci, *cur_ci):
        low = check.change(base_ci[1], cur_ci[0] * scale)
        high = check.change(base_ci[0], cur_ci[1] * scale)
        return TimeChange(bs, cs, change, min(low, change), max(high, change), "run-ci")
    return TimeChange(bs, cs, change, change, change, "none")


def has_reference(row: dict) -> bool:
    """Whether ``row`` can be compared in normalized time."""
    ref = row.get("ref_kernel_s")
    return isinstance(ref, int | float) and ref > 0


def row_groups(row: dict, basis: str = "absolute") -> list[np.ndarray]:
    """A row's per-call samples (seconds) cut into passes; ``normalized`` divides each pass by
    its reference-kernel time (the row's ``ref_kernel_s`` when passes carry none)."""
    raw = [x for x in row.get("time_samples_s") or [] if x is not None and x > 0]
    groups = pass_stats.split_samples(raw, row.get("pass_samples"))
    if basis != "normalized":
        return groups
    refs = row.get("pass_ref_kernel_s") or []
    if len(refs) != len(groups) or not all(isinstance(r, int | float) and r > 0 for r in refs):
        refs = [row["ref_kernel_s"]] * len(groups)
    return [g / r for g, r in zip(groups, refs, strict=True)]


def row_time(row: dict, stat: str = "median", basis: str = "absolute") -> float | None:
    """A row's time statistic: from its raw samples (median over passes of the per-pass
    statistic) when present, else ``time_median_s``; ``normalized``: per reference time."""
    groups = row_groups(row, basis)
    if groups:
        return pass_stats.point_estimate(groups, stat)
    value = row.get("time_median_s")
    if basis == "normalized" and value is not None:
        return value / row["ref_kernel_s"]
    return value


def pass_time_change(
    check: Threshold,
    base: list[np.ndarray],
    cur: list[np.ndarray],
    confidence: float = 0.99,
    seed: int = 0,
    resamples: int = 1000,
) -> TimeChange:
    """The change between two runs' pass-structured samples, with a hierarchical bootstrap
    interval (each run resampled independently: passes, then samples within them)."""
    bs, cs = pass_stats.point_estimate(base, check.stat), pass_stats.point_estimate(cur, check.stat)
    b = pass_stats.hierarchical_bootstrap(base, check.stat, resamples, seed)
    c = pass_stats.hierarchical_bootstrap(cur, check.stat, resamples, seed + 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        changes = c / b - 1.0 if check.relative else c - b
    alpha = 1.0 - confidence
    low, high = np.nanquantile(changes, [alpha / 2, 1 - alpha / 2])
    return TimeChange(bs, cs, check.change(bs, cs), float(low), float(high), "passes")


def row_time_change(
    check: Threshold, base: dict, cur: dict, basis: str, scale: float, confidence: float, seed: int
) -> TimeChange | None:
    """Two rows' time change: pass-structured rows by :func:`pass_time_change`, others by
    :func:`time_change`; ``basis`` is ``absolute`` or ``normalized``."""
    b_groups, c_groups = row_groups(base, basis), row_groups(cur, basis)
    structured = len(b_groups) > 1 or len(c_groups) > 1
    if structured and all(g.size >= 1 for g in b_groups + c_groups) and b_groups and c_groups:
        c_groups = [g * scale for g in c_groups]
        return pass_time_change(check, b_groups, c_groups, confidence, seed)
    if basis == "normalized":
        b_ref, c_ref = base["ref_kernel_s"], cur["ref_kernel_s"]
        return time_change(
            check,
            [x / b_ref for x in base.get("time_samples_s") or [] if x],
            [x / c_ref for x in cur.get("time_samples_s") or [] if x],
            _div(base.get("time_median_s"), b_ref),
            _div(cur.get("time_median_s"), c_ref),
            confidence=confidence,
            seed=seed,
        )
    return time_change(
        check,
        base.get("time_samples_s"),
        cur.get("time_samples_s"),
        base.get("time_median_s"),
        cur.get("time_median_s"),
        (base.get("time_ci_low_s"), base.get("time_ci_high_s")),
        (cur.get("time_ci_low_s"), cur.get("time_ci_high_s")),
        scale=scale,
        confidence=confidence,
        seed=seed,
    )


def _div(value: float | None, by: float) -> float | None:
    return None if value is None else value / by
