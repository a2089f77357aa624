"""Interleaved repetitions: the order points run in on each pass, and one point's statistics
from its passes. Pure functions over plain numbers; the runner does the measuring.

Why passes: samples taken back to back inside one point share whatever the machine was doing
at that moment, so their spread cannot show a neighbour's burst or slow drift. Running the
suite several times in a shuffled order spreads such disturbances over many points, where
they show up as disagreement between a point's passes (variance) instead of one point being
uniformly, confidently wrong (bias).

The statistic: ``time_median_s`` is the median of the per-pass medians (one disturbed pass
out of three cannot move it), and its interval comes from a hierarchical bootstrap -- resample
passes with replacement, then samples within each chosen pass, and take the same median of
medians. With few passes this interval spans roughly the range of the pass medians: a point
whose passes disagree gets an honest wide interval, where a t-interval over three pass medians
would need a normal model that burst noise does not follow.

CPU rows carry the same structure in CPU time (``cpu_time_samples_s``, one per wall sample):
``cpu_time_median_s`` is their median of pass medians, and ``ref_kernel_cpu_s`` the reference
kernel's, so ``compare`` can bootstrap CPU time per reference CPU time pass by pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from harness.measure.timing import median_ci

STATS = {"median": np.median, "mean": np.mean, "min": np.min}


def pass_orders(count: int, passes: int, seed: int) -> list[list[int]]:
    """Index orders of ``count`` points for each of ``passes`` passes, shuffled per pass by a
    generator seeded with ``(seed, pass)`` (so a pass's order does not depend on how many
    passes there are)."""
    return [
        np.random.default_rng([seed, k]).permutation(count).tolist() for k in range(passes)
    ]


def split_samples(samples: Sequence[float], counts: Sequence[int] | None) -> list[np.ndarray]:
    """``time_samples_s`` cut back into passes by ``pass_samples`` (one group when absent or
    inconsistent)."""
    x = np.asarray([s for s in samples if s is not None], dtype=float)
    if not counts or sum(counts) != x.size or min(counts) < 1:
        return [x] if x.size else []
    return np.split(x, np.cumsum(counts)[:-1])


def point_estimate(groups: Sequence[np.ndarray], stat: str = "median") -> float:
    """``stat`` within each pass, then the median over passes (``min``: the minimum)."""
    per_pass = np.array([STATS[stat](g) for g in groups])
    return float(per_pass.min() if stat == "min" else np.median(per_pass))


def hierarchical_bootstrap(
    groups: Sequence[np.ndarray],
    stat: str = "median",
    resamples: int = 1000,
    seed: int = 0,
) -> np.ndarray:
    """``resamples`` bootstrap replicates of :func:`point_estimate`: passes drawn with
    replacement, then samples drawn with replacement within each drawn pass."""
    rng = np.random.default_rng(seed)
    groups = [np.asarray(g, dtype=float) for g in groups if len(g)]
    p = len(groups)
    # replicate[b, slot, pass]: the statistic of a fresh resample of that pass, so a pass drawn
    # twice in one replicate gets two independent within-pass resamples
    per_pass = np.empty((resamples, p, p))
    for j, g in enumerate(groups):
        draws = rng.integers(0, g.size, size=(resamples, p, g.size))
        per_pass[:, :, j] = STATS[stat](g[draws], axis=2)
    chosen = rng.integers(0, p, size=(resamples, p))
    values = np.take_along_axis(per_pass, chosen[:, :, None], axis=2)[:, :, 0]
    return values.min(axis=1) if stat == "min" else np.median(values, axis=1)


def pass_interval(
    groups: Sequence[np.ndarray], confidence: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """CI of the median of pass medians; one pass: the distribution-free CI of its median."""
    if len(groups) == 1:
        return median_ci(groups[0], confidence)
    reps = hierarchical_bootstrap(groups, "median", seed=seed)
    alpha = 1.0 - confidence
    low, high = np.quantile(reps, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


def combine(records: Sequence[dict], seed: int = 0) -> dict:
    """Row time columns from per-pass records (``time_samples_s``, ``calls_per_sample``,
    ``ref_kernel_s`` and contention fields each); records of failed passes are skipped."""
    done = [r for r in records if r.get("time_samples_s")]
    if not done:
        return {}
    groups = [np.asarray(r["time_samples_s"], dtype=float) for r in done]
    pooled = np.concatenate(groups)
    low, high = pass_interval(groups, seed=seed)
    q1, q3 = np.percentile(pooled, [25, 75])
    refs = [r.get("ref_kernel_s") for r in done]
    out = {
        "time_median_s": point_estimate(groups),
        "time_iqr_s": float(q3 - q1),
        "time_ci_low_s": low,
        "time_ci_high_s": high,
        "samples": int(pooled.size),
        "time_samples_s": pooled.tolist(),
        "passes": len(done),
        "pass_samples": [int(g.size) for g in groups],
        "pass_medians_s": [float(np.median(g)) for g in groups],
        "pass_calls_per_sample": [r.get("calls_per_sample") for r in done],
        "pass_ref_kernel_s": refs,
        "ref_kernel_s": float(np.median(refs)) if None not in refs else None,
    }
    out.update(cpu_columns(done))
    failed = [r for r in records if not r.get("time_samples_s")]
    if failed:
        out["pass_errors"] = [f"pass {r.get('pass')}: {r.get('reason')}" for r in failed]
    return out


CPU_COLUMNS = ("cpu_time_median_s", "cpu_time_samples_s", "pass_cpu_medians_s",
               "pass_ref_kernel_cpu_s", "ref_kernel_cpu_s")


def cpu_columns(done: Sequence[dict]) -> dict:
    """The row's CPU-time columns from timed pass records: nothing when no pass has CPU time
    (a GPU row), all of them ``None`` when only some passes do (a run resumed from an older
    ``passes.jsonl``: a CPU time that covers some passes is not the row's), else
    ``cpu_time_median_s`` (median of pass medians), the pooled ``cpu_time_samples_s``,
    ``pass_cpu_medians_s``, ``pass_ref_kernel_cpu_s`` and ``ref_kernel_cpu_s`` (their median;
    ``None`` when a pass lacks one)."""
    cpu = [r.get("cpu_time_samples_s") for r in done]
    if not any(cpu):
        return {}
    complete = all(c and len(c) == len(r["time_samples_s"]) for c, r in zip(cpu, done, strict=True))
    if not complete:
        return dict.fromkeys(CPU_COLUMNS)
    groups = [np.asarray(c, dtype=float) for c in cpu]
    refs = [r.get("ref_kernel_cpu_s") for r in done]
    return {
        "cpu_time_median_s": point_estimate(groups),
        "cpu_time_samples_s": np.concatenate(groups).tolist(),
        "pass_cpu_medians_s": [float(np.median(g)) for g in groups],
        "pass_ref_kernel_cpu_s": refs,
        "ref_kernel_cpu_s": float(np.median(refs)) if None not in refs else None,
    }
