"""Adaptive timing: warm up, then sample until the median's confidence interval is tight enough
or the time budget ends. Raw per-call samples are kept; statistics are computed from them.

Like ``triton.testing.do_bench`` the budget is in time, not counts; like
``torch.utils.benchmark`` a sample times enough back-to-back calls to dwarf timer overhead.
With an L2 flush (CUDA ``flush_l2``), every call is flushed and timed with its own event pair,
as ``do_bench`` does: batching calls would time all but the first with a warm L2. Calls too
short for one event pair each are batched, and the row says L2 was warm (``l2`` column).

Each sample also keeps the host's time to issue its calls where the device has a clock of its
own (:meth:`harness.measure.device.Device.time_issue`): ``host_frac``, issue time over GPU time
of the same calls, says how much of the GPU's time went waiting for Python. At or above
:data:`HOST_BOUND_FRAC` a row is host-bound: its time measures the host, not the kernels.

On a CPU each sample also keeps the CPU time its calls used (``cpu_samples``, per call; the
clock is :func:`harness.measure.device.cpu_clock`). Wall time stays the row's time
(``time_median_s``); CPU time is the figure time-sharing does not move: on a 2-core machine
with more runnable tasks than cores, a one-thread point's wall time grew 2-4x by the wait for
a core while the work it did stayed the same (docs/noise.md), and ``compare`` gates one-thread
rows on CPU time for that reason. It still moves with what time-sharing cannot hide: memory
bandwidth and caches shared with the other tasks, and the host's clock speed.

CPU samples are taken with ``malloc`` in the fixed state of :mod:`harness.measure.allocator`
(the ``malloc_tuning`` column): a timed call's blocks under 32 MiB reuse heap memory the
warm-up calls touched, instead of faulting in fresh pages in some processes and not in others.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # annotations only: tables read HOST_BOUND_FRAC without importing torch
    from harness.measure.device import Device

# Below this a single call is within a few event-timer resolutions (~0.5 us) and launch gaps:
# such calls are batched unflushed instead, and their rows say ``l2 = warm``.
MIN_FLUSHED_CALL_S = 1e-5
L2_FLUSHED = "flushed-per-call"
# host_frac at or above this: the host took at least half the GPU time to issue the calls, so
# the GPU waited on the host for much of it (tables flag such rows, claims give no time verdict)
HOST_BOUND_FRAC = 0.5


def host_bound(host_frac: object) -> bool:
    """Whether a row's ``host_frac`` (a number, or None/NaN where there is none) says the GPU
    waited on the host: at or above :data:`HOST_BOUND_FRAC`."""
    return isinstance(host_frac, int | float) and host_frac >= HOST_BOUND_FRAC


@dataclass(frozen=True)
class TimingConfig:
    """How long and how precisely to time one point."""

    budget_s: float = 2.0  # stop sampling after this much wall time (after warm-up)
    min_samples: int = 5
    max_samples: int = 1000
    target_rel_ci: float = 0.02  # stop when the median's 95% CI half-width / median is below
    warmup_calls: int = 2  # after the first (compile/allocation) call
    min_sample_s: float = 2e-3  # calls per sample are batched up to at least this long

    def __post_init__(self) -> None:
        if self.budget_s <= 0 or self.min_samples < 1 or self.max_samples < self.min_samples:
            raise ValueError("timing needs budget_s > 0 and 1 <= min_samples <= max_samples")


def median_ci(samples: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free CI of the median from binomial order statistics."""
    x = np.sort(np.asarray(samples, dtype=float))
    n = len(x)
    if n < 6:
        return float(x[0]), float(x[-1])
    lo = binomial_half_quantile((1 - confidence) / 2, n)
    hi = n - 1 - lo
    return float(x[max(lo - 1, 0)]), float(x[min(hi + 1, n - 1)])


def binomial_half_quantile(q: float, n: int) -> int:
    """The ``q`` quantile of Binomial(n, 1/2): the least k with P(X <= k) >= q (what
    ``scipy.stats.binom.ppf(q, n, 0.5)`` returns; the same for every n up to 3000 at the
    confidences 0.5-0.99), in exact integer arithmetic. Why not scipy: importing
    ``scipy.stats`` cost every process that times a point (each CLI run, each isolated
    child's forkserver) 1-2 s."""
    target, total, count = Fraction(q) * 2**n, 0, 1  # count = C(n, k)
    for k in range(n + 1):
        total += count
        if total >= target:
            return k
        count = count * (n - k) // (k + 1)
    return n


@dataclass(frozen=True)
class Measurement:
    """Raw per-call times (seconds) of one point, with statistics derived from them."""

    samples: tuple[float, ...]
    calls_per_sample: int
    first_call_s: float
    l2: str = "warm"  # flushed-per-call | warm | n/a (cpu): the cache state the samples saw
    # per-call host issue time of each sample (empty where the device has no separate clock)
    host_samples: tuple[float, ...] = ()
    host_status: str = "ok"  # or "unavailable: <reason>" when host_samples is empty
    # per-call CPU time of each sample (CPU devices; empty where the device gives none)
    cpu_samples: tuple[float, ...] = ()
    # the host allocator's state the samples saw (CPU devices, harness.measure.allocator)
    malloc_tuning: str | None = None

    @property
    def median(self) -> float:
        return float(np.median(self.samples))

    @property
    def iqr(self) -> float:
        q1, q3 = np.percentile(self.samples, [25, 75])
        return float(q3 - q1)

    @property
    def ci(self) -> tuple[float, float]:
        return median_ci(np.array(self.samples))

    @property
    def rel_ci_halfwidth(self) -> float:
        lo, hi = self.ci
        return (hi - lo) / 2 / self.median if self.median > 0 else math.inf

    def columns(self) -> dict:
        lo, hi = self.ci
        return {
            "time_median_s": self.median,
            "time_iqr_s": self.iqr,
            "time_ci_low_s": lo,
            "time_ci_high_s": hi,
            "samples": len(self.samples),
            "calls_per_sample": self.calls_per_sample,
            "time_samples_s": list(self.samples),
            "first_call_s": self.first_call_s,
            "l2": self.l2,
            **self.host_columns(),
            **self.cpu_columns(),
            **({"malloc_tuning": self.malloc_tuning} if self.malloc_tuning else {}),
        }

    def cpu_columns(self) -> dict:
        """``cpu_time_median_s`` (median per-call CPU time) and ``cpu_time_samples_s`` (one per
        wall sample, same order), or nothing where the device gave no CPU time."""
        if not self.cpu_samples or len(self.cpu_samples) != len(self.samples):
            return {}
        return {"cpu_time_median_s": float(np.median(self.cpu_samples)),
                "cpu_time_samples_s": list(self.cpu_samples)}

    def host_columns(self) -> dict:
        """``host_issue_s`` and ``gpu_time_s``: mean per-call host issue time and device time
        of the same samples; ``host_frac`` their ratio (of the totals); ``host_frac_status``
        ``ok`` or why the three are None."""
        if not self.host_samples or len(self.host_samples) != len(self.samples):
            status = self.host_status if self.host_status != "ok" else "unavailable: no samples"
            return {"host_issue_s": None, "gpu_time_s": None, "host_frac": None,
                    "host_frac_status": status}
        host, gpu = float(np.mean(self.host_samples)), float(np.mean(self.samples))
        return {"host_issue_s": host, "gpu_time_s": gpu,
                "host_frac": host / gpu if gpu > 0 else None, "host_frac_status": "ok"}


def measure(
    fn: Callable[[], object], device: Device, config: TimingConfig | None = None
) -> Measurement:
    """Time ``fn`` (a zero-argument callable; set-up already done) on ``device``."""
    config = config or TimingConfig()
    device.synchronize()
    start = time.perf_counter()
    fn()
    device.synchronize()
    first_call_s = time.perf_counter() - start  # compilation, autotuning, first allocations
    warm = [device.time_calls(fn, 1) for _ in range(config.warmup_calls)]
    estimate = min(warm) if warm else first_call_s
    per_call_flush = device.flush_l2 and estimate >= MIN_FLUSHED_CALL_S
    batched = max(1, math.ceil(config.min_sample_s / max(estimate, 1e-9)))
    calls = 1 if per_call_flush else batched
    samples: list[float] = []
    host: list[float] = []
    cpu: list[float] = []
    deadline = time.perf_counter() + config.budget_s
    while len(samples) < config.max_samples:
        if per_call_flush:
            device.flush_cache()  # enqueued before the call's own start event: not timed
        times = device.time_issue(fn, calls)
        samples.append(times.device_s / calls)
        if times.host_s is not None:
            host.append(times.host_s / calls)
        if times.cpu_s is not None:
            cpu.append(times.cpu_s / calls)
        if len(samples) < config.min_samples:
            continue
        if time.perf_counter() > deadline:
            break
        if len(samples) >= 6 and _rel_halfwidth(samples) <= config.target_rel_ci:
            break
    l2 = L2_FLUSHED if per_call_flush else device.warm_l2
    reason = device.host_issue_reason or "unavailable: the device gave no host issue time"
    status = "ok" if len(host) == len(samples) else reason
    return Measurement(tuple(samples), calls, first_call_s, l2,
                       tuple(host) if status == "ok" else (), status,
                       tuple(cpu) if len(cpu) == len(samples) else (),
                       device.malloc_tuning)


def _rel_halfwidth(samples: list[float]) -> float:
    lo, hi = median_ci(np.array(samples))
    med = float(np.median(samples))
    return (hi - lo) / 2 / med if med > 0 else math.inf
