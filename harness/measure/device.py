"""Everything device-specific lives here: synchronization, sample timers, L2 flush, peak memory
(CUDA allocator + NVML sampling on GPUs; torch.profiler allocation events on CPU), clocks and
device facts. The rest of the harness talks to a :class:`Device` and never to ``torch.cuda`` or
NVML (whose wrappers and pure decision rules are in :mod:`harness.measure.nvml`).

GPU-only figures degrade to ``None`` plus an ``"unavailable: <reason>"`` string, never to 0.

Host issue time (:meth:`Device.time_issue`): on CUDA the host enqueues work and returns, so the
time the host spends issuing the timed calls is a figure of its own beside their GPU time; when
it reaches the GPU time the GPU sat waiting for Python. On a CPU the host runs the calls itself
and there is no second clock.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch.autograd.profiler import profile

from harness.errors import DeviceUnavailable
from harness.measure import allocator, nvml


@dataclass(frozen=True)
class CallTimes:
    """Seconds of ``calls`` back-to-back calls: ``device_s`` on the device's clock (CUDA events:
    GPU time, idle gaps between kernels included), ``host_s`` what the host spent issuing them
    (None where the device has no clock apart from the host's), ``cpu_s`` the CPU time the
    calls used (CPU devices, :func:`cpu_clock`; None elsewhere)."""

    device_s: float
    host_s: float | None = None
    cpu_s: float | None = None


@dataclass(frozen=True)
class MemoryReading:
    """Peak bytes one call added above the pre-call baseline, and how that was measured."""

    peak_bytes: int | None
    method: str
    extra: dict = field(default_factory=dict)  # e.g. reserved bytes, NVML figures or reasons


class Device:
    """Base class: a device the runner times and measures on."""

    kind = "cpu"
    torch_device = torch.device("cpu")  # where its tensors live (a CUDA device: its index)
    flush_l2 = False  # whether flush_cache() really evicts a cache between timed calls
    warm_l2 = "warm"  # the ``l2`` column when calls are timed without a flush before each
    # the ``malloc_tuning`` column: the host allocator's state the samples saw (CPU devices)
    malloc_tuning: str | None = None
    # why a row has no host issue time (``host_frac_status``); None where time_issue gives one
    host_issue_reason: str | None = (
        "unavailable: this device does not time the host's issue apart from the calls"
    )

    def synchronize(self) -> None: ...

    def time_calls(self, fn: Callable[[], object], calls: int) -> float:
        """Seconds for ``calls`` back-to-back calls of ``fn`` (device work included)."""
        raise NotImplementedError

    def time_issue(self, fn: Callable[[], object], calls: int) -> CallTimes:
        """:meth:`time_calls` with the host's issue time beside it, where the device has one."""
        return CallTimes(self.time_calls(fn, calls))

    def flush_cache(self) -> None: ...

    def release_memory(self) -> None:
        """Hand cached memory back after a point (CUDA: the allocator's cache); raises what the
        device raises (a poisoned CUDA context raises its error here too)."""

    def clock(self) -> nvml.ClockReading:
        """SM clock and throttle reasons now (None + reason where the device has none)."""
        return nvml.ClockReading(None, None, f"unavailable: no GPU clock on a {self.kind} device")

    def peak_memory(self, fn: Callable[[], object]) -> MemoryReading:
        raise NotImplementedError

    def free_memory_bytes(self) -> int:
        raise NotImplementedError

    def name(self) -> str:
        raise NotImplementedError

    def info(self) -> dict:
        raise NotImplementedError


def cpu_clock() -> Callable[[], int]:
    """The CPU-time clock (nanoseconds) for calls made now, on this thread.

    With one torch thread every op runs on the calling thread (``at::parallel_for``, MKL and
    oneDNN run inline), so that thread's own CPU time (``CLOCK_THREAD_CPUTIME_ID``) is exactly
    the calls' CPU time: time the scheduler gave another task while this one waited for a core
    is not in it, and neither is this process's other threads' work (a progress refresh, a
    sampler). With more threads the work runs on pool threads the caller cannot name, so the
    process clock (``CLOCK_PROCESS_CPUTIME_ID``) is used: it counts every thread, including
    OpenMP workers spin-waiting at a barrier, so it is no per-call cost (``compare`` gates on
    it only for one-thread rows). The machine this was built on has no SMT (one thread per
    core), so a thread's CPU time is a core's time, not half of one."""
    return time.thread_time_ns if torch.get_num_threads() == 1 else time.process_time_ns


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off inside the block (restored as it was after)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class CpuDevice(Device):
    """Timing with ``perf_counter``, and the CPU time of the same calls (:func:`cpu_clock`);
    peak memory from the profiler's allocation events.

    Making one puts this process's ``malloc`` into one fixed state
    (:mod:`harness.measure.allocator`): otherwise whether a timed call's buffers of up to
    32 MiB reuse heap memory or fault in fresh pages depends on the process's history, and
    memory-heavy points time in two modes."""

    kind = "cpu"
    warm_l2 = "n/a (cpu)"  # no cache flush on CPU: caches stay as the previous call left them
    host_issue_reason = "unavailable: on a CPU the host runs the calls itself (no device clock)"

    def __init__(self) -> None:
        self.malloc_tuning = allocator.tune()

    def release_memory(self) -> None:
        """Between points: give the heap's free pages back once more than 512 MiB is free (the
        tuned allocator keeps them; :func:`harness.measure.allocator.release`)."""
        allocator.release()

    def time_calls(self, fn: Callable[[], object], calls: int) -> float:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return time.perf_counter() - start

    def time_issue(self, fn: Callable[[], object], calls: int) -> CallTimes:
        """Wall seconds of ``calls`` calls (``device_s``, as :meth:`time_calls`) and the CPU
        seconds they used (``cpu_s``): on a time-shared core the wall time grows by the wait
        for a CPU, the CPU time does not.

        The CPU clock is read inside the wall window (the loop is :meth:`time_calls`'s), so
        with one thread ``cpu_s <= device_s`` however short the calls. Python's cyclic garbage
        collector is paused for the sample (as ``timeit`` does): a full collection of a large
        heap takes tenths of a second, which is not the calls'."""
        clock = cpu_clock()
        with gc_paused():
            start = time.perf_counter()
            cpu0 = clock()
            self.time_calls(fn, calls)
            cpu = clock() - cpu0
            wall = time.perf_counter() - start
        return CallTimes(wall, None, cpu / 1e9)

    def peak_memory(self, fn: Callable[[], object]) -> MemoryReading:
        try:
            return MemoryReading(profiler_peak_bytes(fn), "torch-profiler")
        except Exception as exc:  # the events API is private; fall back to the RSS high-water mark
            reading = rss_hwm_peak_bytes(fn)
            return MemoryReading(reading, "rss-hwm", {"profiler_error": str(exc)})

    def free_memory_bytes(self) -> int:
        with open("/proc/meminfo") as fh:
            info = dict(line.split(":", 1) for line in fh)
        return int(info["MemAvailable"].split()[0]) * 1024

    def name(self) -> str:
        try:
            with open("/proc/cpuinfo") as fh:
                for line in fh:
                    if line.startswith("model name"):
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return platform.processor() or platform.machine()

    def info(self) -> dict:
        return {
            "device": "cpu",
            "device_name": self.name(),
            "threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "nvml": nvml.unavailable_reason() or "available",
            "cuda": "unavailable: torch.cuda.is_available() is False",
            "malloc_tuning": self.malloc_tuning,
        }


def profiler_peak_bytes(fn: Callable[[], object]) -> int:
    """Peak of the running sum of CPU allocator events while ``fn`` runs (exact, byte level).

    Uses torch's Kineto profiler with ``profile_memory=True``; the per-event list is only
    reachable through ``kineto_results`` (the public ``events()`` reports zeros on CPU). It is
    the ``torch.autograd.profiler.profile`` that ``torch.profiler.profile`` wraps, with the
    arguments that one passes (CPU only, Kineto): the wrapper's first start asks for
    ``torch._inductor`` (importing torch._dynamo: 2.6 s, in every isolated point's child),
    and the events are the same.
    """
    with (
        _native_stderr_silenced(),
        profile(use_cpu=True, use_device=None, profile_memory=True, use_kineto=True) as prof,
    ):
        result = fn()
    del result
    events = prof.kineto_results.events()
    deltas = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    running = peak = 0
    for _, nbytes in deltas:
        running += nbytes
        peak = max(peak, running)
    return peak


@contextlib.contextmanager
def _native_stderr_silenced():
    """Kineto prints start/stop lines straight to fd 2 on every profile; hide them."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def rss_hwm_peak_bytes(fn: Callable[[], object]) -> int | None:
    """Process RSS high-water mark above the current RSS (Linux; ~1 MiB accuracy).

    ``malloc_trim`` first returns freed heap pages to the OS, so re-used resident pages do not
    hide the call's allocations; writing 5 to clear_refs resets VmHWM to the current RSS.
    """
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        return None
    base = _proc_status_bytes("VmRSS")
    result = fn()
    peak = _proc_status_bytes("VmHWM")
    del result
    return max(peak - base, 0)


def _proc_status_bytes(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"{key} not in /proc/self/status")


class CudaDevice(Device):
    """CUDA events for timing, allocator peak stats, NVML used-memory sampling in a thread."""

    kind = "cuda"
    host_issue_reason = None

    def __init__(self, index: int = 0, flush_l2: bool = False):
        self.index = index
        self.torch_device = torch.device("cuda", index)
        self.flush_l2 = flush_l2
        self._flush_buffer: torch.Tensor | None = None

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.torch_device)

    def flush_cache(self) -> None:
        if not self.flush_l2:
            return
        if self._flush_buffer is None:  # larger than any current L2 (H100: 50 MB)
            self._flush_buffer = torch.empty(
                256 * 2**20, dtype=torch.uint8, device=self.torch_device
            )
        self._flush_buffer.zero_()

    def time_calls(self, fn: Callable[[], object], calls: int) -> float:
        """GPU seconds of ``calls`` calls (:meth:`time_issue`)."""
        return self.time_issue(fn, calls).device_s

    def time_issue(self, fn: Callable[[], object], calls: int) -> CallTimes:
        """One CUDA event pair around ``calls`` calls, and the host's ``perf_counter`` around
        the same launch loop; the caller decides about flushing (a flush enqueued just before
        is not timed: the start event is recorded after it).

        The host clock stops when the last call returns, before the end event is recorded and
        long before it is waited for, so it holds only issuing: Python, dispatch, launches.
        Reading it adds two ``perf_counter`` calls on the host and nothing on the GPU's stream.
        If the GPU is the bottleneck the host runs ahead and ``host_s`` is a fraction of the
        GPU time; if the host is, the GPU idles between kernels and the two come out equal.
        (A call that enqueues more launches than the driver's queue holds, about a thousand,
        also makes the host wait, on the queue: such a call reads as host-bound too.)

        The events go on this device's current stream, and the calls run with this device
        current: on ``cuda:N`` a bare ``Event.record()`` would mark the stream of whatever
        device is current (``cuda:0``), and Triton launches on the current device."""
        with torch.cuda.device(self.torch_device):
            stream = torch.cuda.current_stream(self.torch_device)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            issue = time.perf_counter()
            for _ in range(calls):
                fn()
            host_s = time.perf_counter() - issue
            end.record(stream)
        end.synchronize()
        return CallTimes(start.elapsed_time(end) / 1e3, host_s)

    def clock(self) -> nvml.ClockReading:
        return nvml.read_clock(self.index)

    def peak_memory(self, fn: Callable[[], object]) -> MemoryReading:
        """Allocator peak of one call; NVML's peak over that call repeated until sampled.

        ``empty_cache`` first, so the call's memory must come from the driver (NVML cannot see
        blocks the allocator already holds); NVML is then cross-checked against the
        allocator's reserved peak (:func:`harness.measure.nvml.nvml_verdict`).
        """
        self.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.torch_device)
        base = torch.cuda.memory_allocated(self.torch_device)
        base_reserved = torch.cuda.memory_reserved(self.torch_device)
        sampler = nvml.UsedMemorySampler(self.index)
        wanted = nvml.MIN_SAMPLES if sampler.reason is None else 0  # no NVML: one call
        with sampler, torch.cuda.device(self.torch_device):
            calls = nvml.run_until_sampled(fn, sampler.count, self.synchronize, wanted)
        peak = torch.cuda.max_memory_allocated(self.torch_device) - base
        reserved = torch.cuda.max_memory_reserved(self.torch_device) - base_reserved
        if sampler.reason is not None:
            found = {"nvml_peak_bytes": None, "nvml_status": sampler.reason}
        else:
            found = nvml.nvml_verdict(sampler.samples, sampler.base or 0, reserved, calls)
        return MemoryReading(peak, "cuda-allocator", {"peak_reserved_bytes": reserved, **found})

    def release_memory(self) -> None:
        torch.cuda.empty_cache()

    def free_memory_bytes(self) -> int:
        free, _total = torch.cuda.mem_get_info(self.torch_device)
        return (
            free
            + torch.cuda.memory_reserved(self.torch_device)
            - torch.cuda.memory_allocated(self.torch_device)
        )

    def name(self) -> str:
        return torch.cuda.get_device_name(self.torch_device)

    def info(self) -> dict:
        props = torch.cuda.get_device_properties(self.torch_device)
        info = {
            "device": "cuda",
            "device_name": props.name,
            "cuda": torch.version.cuda,
            "capability": f"{props.major}.{props.minor}",
            "total_memory_bytes": props.total_memory,
            "sm_count": props.multi_processor_count,
            "threads": torch.get_num_threads(),
        }
        info.update(nvml.device_info(self.index))
        return info


def resolve_device_name(requested: str) -> str:
    """``auto`` -> ``cuda`` when a GPU is visible, else ``cpu``; others unchanged."""
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


def get_device(kind: str, flush_l2: bool = False) -> Device:
    """The Device for ``cpu`` / ``cuda`` / ``cuda:N``; DeviceUnavailable if unusable here."""
    if kind == "cpu":
        return CpuDevice()
    if kind.startswith("cuda"):
        if not torch.cuda.is_available():
            raise DeviceUnavailable(
                f"device {kind!r} unavailable: torch.cuda.is_available() is "
                f'False (torch {torch.__version__}); use a CPU suite or device = "auto"'
            )
        index = int(kind.split(":", 1)[1]) if ":" in kind else 0
        return CudaDevice(index, flush_l2=flush_l2)
    raise DeviceUnavailable(f"unknown device {kind!r} (cpu, cuda, cuda:N, auto)")
