"""Everything device-specific lives here: synchronization, sample timers, L2 flush, peak memory
(CUDA allocator + NVML sampling on GPUs; torch.profiler allocation events on CPU) and device
facts. The rest of the harness talks to a :class:`Device` and never to ``torch.cuda``/NVML.

GPU-only figures degrade to ``None`` plus an ``"unavailable: <reason>"`` string, never to 0.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from harness.errors import DeviceUnavailable


@dataclass(frozen=True)
class MemoryReading:
    """Peak bytes one call added above the pre-call baseline, and how that was measured."""

    peak_bytes: int | None
    method: str
    extra: dict = field(default_factory=dict)  # e.g. reserved bytes, NVML figures or reasons


def _nvml_unavailable_reason() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return None
    except Exception as exc:  # NVMLError_LibraryNotFound on machines without the driver
        return f"unavailable: NVML ({type(exc).__name__}: {exc})"


class Device:
    """Base class: a device the runner times and measures on."""

    kind = "cpu"

    def synchronize(self) -> None: ...

    def time_calls(self, fn: Callable[[], object], calls: int) -> float:
        """Seconds for ``calls`` back-to-back calls of ``fn`` (device work included)."""
        raise NotImplementedError

    def flush_cache(self) -> None: ...

    def peak_memory(self, fn: Callable[[], object]) -> MemoryReading:
        raise NotImplementedError

    def free_memory_bytes(self) -> int:
        raise NotImplementedError

    def name(self) -> str:
        raise NotImplementedError

    def info(self) -> dict:
        raise NotImplementedError


class CpuDevice(Device):
    """Timing with ``perf_counter``; peak memory from the profiler's allocation events."""

    kind = "cpu"

    def time_calls(self, fn: Callable[[], object], calls: int) -> float:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return time.perf_counter() - start

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
            "nvml": _nvml_unavailable_reason() or "available",
            "cuda": "unavailable: torch.cuda.is_available() is False",
        }


def profiler_peak_bytes(fn: Callable[[], object]) -> int:
    """Peak of the running sum of CPU allocator events while ``fn`` runs (exact, byte level).

    Uses ``torch.profiler`` with ``profile_memory=True``; the per-event list is only reachable
    through ``prof.profiler.kineto_results`` (the public ``events()`` reports zeros on CPU).
    """
    from torch.profiler import ProfilerActivity, profile

    with (
        _native_stderr_silenced(),
        profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof,
    ):
        result = fn()
    del result
    events = prof.profiler.kineto_results.events()
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
        self.flush_cache()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def peak_memory(self, fn: Callable[[], object]) -> MemoryReading:
        self.synchronize()
        torch.cuda.reset_peak_memory_stats(self.torch_device)
        base = torch.cuda.memory_allocated(self.torch_device)
        base_reserved = torch.cuda.memory_reserved(self.torch_device)
        sampler = _NvmlSampler(self.index)
        with sampler:
            result = fn()
            self.synchronize()
        peak = torch.cuda.max_memory_allocated(self.torch_device) - base
        extra = {
            "peak_reserved_bytes": torch.cuda.max_memory_reserved(self.torch_device)
            - base_reserved,
            **sampler.reading(),
        }
        del result
        return MemoryReading(peak, "cuda-allocator", extra)

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
        info.update(_nvml_device_info(self.index))
        return info


class _NvmlSampler:
    """Samples NVML's device used-memory every ~1 ms while a call runs (driver-level view)."""

    def __init__(self, index: int, period_s: float = 0.001):
        self.index, self.period_s = index, period_s
        self.samples: list[int] = []
        self.reason = _nvml_unavailable_reason()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> _NvmlSampler:
        if self.reason is None:
            import pynvml

            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            self._base = pynvml.nvmlDeviceGetMemoryInfo(self._handle).used
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        import pynvml

        while not self._stop.is_set():
            self.samples.append(pynvml.nvmlDeviceGetMemoryInfo(self._handle).used)
            time.sleep(self.period_s)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def reading(self) -> dict:
        if self.reason is not None:
            return {"nvml_peak_bytes": None, "nvml_status": self.reason}
        if not self.samples:
            return {
                "nvml_peak_bytes": None,
                "nvml_status": "unavailable: call ended before a sample",
            }
        return {
            "nvml_peak_bytes": max(self.samples) - self._base,
            "nvml_status": "ok",
            "nvml_samples": len(self.samples),
        }


def _nvml_device_info(index: int) -> dict:
    reason = _nvml_unavailable_reason()
    if reason is not None:
        return {"nvml": reason}
    import pynvml

    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    info = {"nvml": "available", "driver": pynvml.nvmlSystemGetDriverVersion()}
    try:
        info["sm_clock_mhz"] = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
        info["max_sm_clock_mhz"] = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)
        info["throttle_reasons"] = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
        info["power_limit_w"] = pynvml.nvmlDeviceGetPowerManagementLimit(handle) / 1e3
    except Exception as exc:  # some fields are not supported on every board
        info["nvml_partial"] = str(exc)
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
