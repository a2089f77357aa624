"""The timing loop's statistics and stopping rules (no expected timings anywhere)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from harness.device import CpuDevice
from harness.timing import Measurement, TimingConfig, measure, median_ci


def test_median_ci_covers_the_true_median_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(400):
        sample = rng.lognormal(mean=0.0, sigma=0.3, size=25)  # true median = 1
        lo, hi = median_ci(sample)
        hits += lo <= 1.0 <= hi
    assert 0.90 <= hits / 400 <= 0.995


def test_median_ci_brackets_the_sample_median():
    sample = np.array([5.0, 1.0, 3.0, 2.0, 4.0, 6.0, 7.0, 9.0, 8.0])
    lo, hi = median_ci(sample)
    assert lo <= np.median(sample) <= hi and lo >= sample.min() and hi <= sample.max()


def test_measurement_statistics_come_from_the_raw_samples():
    m = Measurement(samples=(1.0, 2.0, 3.0, 4.0, 100.0), calls_per_sample=1, first_call_s=9.0)
    assert m.median == 3.0 and m.iqr == 2.0
    cols = m.columns()
    assert cols["time_samples_s"] == [1.0, 2.0, 3.0, 4.0, 100.0] and cols["samples"] == 5


def test_fast_calls_are_batched_per_sample():
    counter = {"calls": 0}

    def tiny():
        counter["calls"] += 1

    m = measure(tiny, CpuDevice(), TimingConfig(budget_s=0.05, min_samples=3, min_sample_s=1e-3))
    assert m.calls_per_sample > 10
    assert counter["calls"] >= m.calls_per_sample * len(m.samples)


def test_budget_bounds_the_sampling_time():
    config = TimingConfig(budget_s=0.2, min_samples=3, max_samples=10_000, target_rel_ci=0.0)
    start = time.perf_counter()
    m = measure(lambda: time.sleep(0.002), CpuDevice(), config)
    elapsed = time.perf_counter() - start
    assert len(m.samples) >= 3 and elapsed < 1.5


def test_first_call_is_kept_out_of_the_samples():
    state = {"first": True}

    def slow_first():
        if state["first"]:
            state["first"] = False
            time.sleep(0.05)

    m = measure(slow_first, CpuDevice(), TimingConfig(budget_s=0.05, min_samples=3))
    assert m.first_call_s >= 0.05 and max(m.samples) < 0.05


@pytest.mark.parametrize(
    "kwargs", [{"budget_s": 0}, {"min_samples": 0}, {"min_samples": 5, "max_samples": 4}]
)
def test_bad_configs_are_rejected(kwargs):
    with pytest.raises(ValueError):
        TimingConfig(**kwargs)
