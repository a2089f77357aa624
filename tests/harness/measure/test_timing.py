"""The timing loop's statistics and stopping rules (no expected timings anywhere)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from harness.measure.device import CpuDevice, Device
from harness.measure.timing import (
    L2_FLUSHED,
    Measurement,
    TimingConfig,
    binomial_half_quantile,
    measure,
    median_ci,
)


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


class FakeClockDevice(CpuDevice):
    """A CPU device on a fake clock: every call takes exactly ``call_s`` of it."""

    def __init__(self, clock: list[float], call_s: float):
        self.clock, self.call_s = clock, call_s

    def time_calls(self, fn, calls: int) -> float:
        for _ in range(calls):
            fn()
            self.clock[0] += self.call_s
        return calls * self.call_s


def test_budget_bounds_the_sampling_time(monkeypatch):
    """On a fake clock: sampling stops at the first sample past the budget, not before the
    minimum sample count, and never because of how busy the machine is."""
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    call_s = 2.0**-9  # binary fractions: the clock's sums are exact
    # target_rel_ci < 0: equal samples never stop the loop early; only the budget does
    config = TimingConfig(budget_s=0.25, min_samples=3, max_samples=10_000, target_rel_ci=-1.0,
                          min_sample_s=0.0)
    m = measure(lambda: None, FakeClockDevice(clock, call_s), config)
    assert m.calls_per_sample == 1
    assert len(m.samples) == 128 + 1  # 0.25 s of samples, then the one that crossed it
    assert clock[0] == (config.warmup_calls + 129) * call_s

    few = measure(lambda: None, FakeClockDevice(clock, call_s=1.0), config)
    assert len(few.samples) == 3  # min_samples, although the first one was past the budget


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


class FlushCountingDevice(Device):
    """A CUDA-like device on the CPU: perf_counter timing, and a flush that is counted and
    marks the cache cold; each timed call records whether it ran after a flush."""

    kind = "cuda"

    def __init__(self, flush_l2: bool):
        self.flush_l2 = flush_l2
        self.flushes = 0
        self.cold = False
        self.calls_cold: list[bool] = []  # one entry per timed call: was L2 flushed before it?

    def flush_cache(self) -> None:
        if self.flush_l2:
            self.flushes += 1
            self.cold = True

    def time_calls(self, fn, calls: int) -> float:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
            self.calls_cold.append(self.cold)
            self.cold = False
        return time.perf_counter() - start


def _sleep_50us():
    time.sleep(5e-5)  # far above MIN_FLUSHED_CALL_S


def test_l2_flush_is_per_call_with_its_own_timer():
    device = FlushCountingDevice(flush_l2=True)
    m = measure(_sleep_50us, device, TimingConfig(budget_s=0.05, min_samples=5, warmup_calls=1))
    assert m.l2 == L2_FLUSHED and m.calls_per_sample == 1
    timed = device.calls_cold[1:]  # the warm-up call comes first, unflushed
    assert len(timed) == len(m.samples) == device.flushes
    assert all(timed)  # every timed call ran right after its own flush
    assert m.columns()["l2"] == "flushed-per-call"


def test_without_flushing_calls_are_batched_and_the_row_says_warm():
    device = FlushCountingDevice(flush_l2=False)
    # samples of >= 50 ms: batched unless a 50 us sleep's warm-up took 50 ms (a busy machine's
    # scheduler delay once made it take more than the 2 ms default)
    config = TimingConfig(budget_s=0.05, min_samples=3, warmup_calls=1, min_sample_s=0.05)
    m = measure(_sleep_50us, device, config)
    assert m.l2 == "warm" and m.calls_per_sample > 1 and device.flushes == 0


def test_calls_too_short_to_time_one_by_one_are_batched_and_warm():
    device = FlushCountingDevice(flush_l2=True)
    m = measure(lambda: None, device, TimingConfig(budget_s=0.05, min_samples=3, warmup_calls=1))
    assert m.l2 == "warm" and m.calls_per_sample > 1 and device.flushes == 0


def test_cpu_rows_say_l2_does_not_apply():
    m = measure(lambda: None, CpuDevice(), TimingConfig(budget_s=0.02, min_samples=3))
    assert m.columns()["l2"] == "n/a (cpu)"


@pytest.mark.cuda
@pytest.mark.gpu_alone
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_flush_per_call_times_one_call_per_event_pair():
    from harness.measure.device import get_device

    a = torch.randn(2048, 2048, device="cuda")
    config = TimingConfig(budget_s=0.2, min_samples=5)
    flushed = measure(lambda: a @ a, get_device("cuda", flush_l2=True), config)
    warm = measure(lambda: a @ a, get_device("cuda", flush_l2=False), config)
    assert flushed.l2 == L2_FLUSHED and flushed.calls_per_sample == 1
    assert warm.l2 == "warm"


class FakeCuda:
    """Just enough of ``torch.cuda`` on a CPU: a current device, one stream per device,
    events that remember the stream they were recorded on, launches that land on the current
    device (as Triton's do)."""

    def __init__(self):
        self.current = 0
        self.launched_on: list[int] = []
        fake = self

        class Event:
            def __init__(self, enable_timing: bool = False):
                self.stream = None

            def record(self, stream=None):
                self.stream = stream if stream is not None else fake.current_stream()

            def synchronize(self):
                pass

            def elapsed_time(self, other) -> float:
                return 1.0

        self.Event = Event

    def device(self, dev):
        fake = self

        class Guard:
            def __enter__(self):
                self.saved, fake.current = fake.current, torch.device(dev).index

            def __exit__(self, *exc):
                fake.current = self.saved

        return Guard()

    def current_stream(self, device=None) -> str:
        index = self.current if device is None else torch.device(device).index
        return f"stream of cuda:{index}"

    def launch(self) -> None:
        self.launched_on.append(self.current)


def test_cuda_n_times_on_its_own_stream_with_its_device_current(monkeypatch):
    """On cuda:1 the events mark cuda:1's stream and the timed calls run with cuda:1 current;
    a bare ``Event.record()`` would time cuda:0's stream."""
    from harness.measure.device import CudaDevice

    fake = FakeCuda()
    for name in ("Event", "device", "current_stream"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    device = CudaDevice(1)
    events = []
    real_event = fake.Event
    monkeypatch.setattr(torch.cuda, "Event", lambda **kw: events.append(real_event(**kw)) or
                        events[-1])
    assert device.time_calls(fake.launch, 3) == pytest.approx(1e-3)
    assert [e.stream for e in events] == ["stream of cuda:1"] * 2
    assert fake.launched_on == [1, 1, 1] and fake.current == 0


def test_calibration_of_cuda_n_runs_on_cuda_n():
    from harness.measure import calibrate
    from harness.measure.device import CudaDevice

    name, _ = calibrate._device_of(CudaDevice(1))
    assert name == "cuda:1"


# --- host issue time: when the GPU waited on Python -------------------------------------------


class IssueDevice(CpuDevice):
    """A device with a clock of its own, on numbers the test sets: each call costs the host
    ``host_s`` to issue and the device ``device_s`` to run. The device cannot finish before
    the host has issued the last call: a sample's device time is max(issue, run) (a GPU that
    waits on the host idles between kernels)."""

    host_issue_reason = None

    def __init__(self, host_s: float, device_s: float):
        self.host_s, self.device_s = host_s, device_s

    def time_issue(self, fn, calls: int):
        from harness.measure.device import CallTimes

        for _ in range(calls):
            fn()
        host = calls * self.host_s
        return CallTimes(max(host, calls * self.device_s), host)


FAST_CONFIG = TimingConfig(budget_s=0.02, min_samples=3, warmup_calls=0, min_sample_s=0.0)


@pytest.mark.parametrize(
    ("host_s", "device_s", "frac", "bound"),
    [(1e-5, 1e-3, 0.01, False), (4e-4, 1e-3, 0.4, False), (3e-3, 1e-3, 1.0, True)],
    ids=["gpu-bound", "mixed", "host-bound"],
)
def test_host_frac_is_issue_time_over_gpu_time_of_the_same_calls(host_s, device_s, frac, bound):
    from harness.measure.timing import host_bound

    m = measure(lambda: None, IssueDevice(host_s, device_s), FAST_CONFIG)
    cols = m.columns()
    assert cols["host_frac_status"] == "ok"
    assert cols["host_issue_s"] == pytest.approx(host_s)
    assert cols["gpu_time_s"] == pytest.approx(max(host_s, device_s))
    assert cols["host_frac"] == pytest.approx(frac)
    assert host_bound(cols["host_frac"]) is bound


def test_cpu_rows_have_no_host_issue_time_and_say_why():
    cols = measure(lambda: None, CpuDevice(), FAST_CONFIG).columns()
    assert cols["host_issue_s"] is None and cols["gpu_time_s"] is None
    assert cols["host_frac"] is None
    assert cols["host_frac_status"].startswith("unavailable: on a CPU")


def test_a_device_without_a_host_clock_says_so():
    """A device that implements only time_calls (as fakes and future devices may) gets null
    host columns with a reason, never a ratio of one clock to itself."""
    cols = measure(_sleep_50us, FlushCountingDevice(False), FAST_CONFIG).columns()
    assert cols["host_frac"] is None and cols["host_frac_status"].startswith("unavailable")


def test_host_bound_needs_a_number_at_or_above_the_threshold():
    from harness.measure.timing import HOST_BOUND_FRAC, host_bound

    assert host_bound(HOST_BOUND_FRAC) and host_bound(2.0)
    assert not any(host_bound(v) for v in (0.49, None, float("nan"), "0.9"))


def test_cuda_host_issue_time_covers_the_launch_loop_only(monkeypatch):
    """The host clock runs around the launches and stops before the end event is recorded and
    waited for: a GPU-bound call's host time holds no waiting (on a fake clock where each
    launch costs 1 unit, recording an event 10 and waiting for the end event 100)."""
    from harness.measure.device import CudaDevice

    fake = FakeCuda()
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])

    class Event(fake.Event):
        def record(self, stream=None):
            clock[0] += 10.0
            super().record(stream)

        def synchronize(self):
            clock[0] += 100.0

    def launch():
        clock[0] += 1.0

    monkeypatch.setattr(torch.cuda, "Event", Event)
    for name in ("device", "current_stream"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    times = CudaDevice(0).time_issue(launch, 5)
    assert times.host_s == 5.0 and times.device_s == pytest.approx(1e-3)
    assert CudaDevice(0).time_calls(launch, 2) == pytest.approx(1e-3)


def test_the_medians_binomial_quantile_is_scipys():
    """:func:`binomial_half_quantile` (exact integers, no scipy.stats import) is
    ``scipy.stats.binom.ppf(q, n, 0.5)`` at every sample count and confidence used."""
    from scipy import stats

    for q in (0.025, (1 - 0.95) / 2, 0.005, 0.05, 0.25):
        for n in range(1, 400):
            assert binomial_half_quantile(q, n) == int(stats.binom.ppf(q, n, 0.5)), (q, n)
