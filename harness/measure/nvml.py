"""NVML behind the device interface: used-memory sampling, SM clocks and throttle reasons.

The devices of :mod:`harness.measure.device` read NVML through this module; calibration decodes
throttle reasons and the runner records clock columns with it. A CUDA device index is matched
to its NVML handle by UUID (:func:`handle`): NVML numbers boards in PCI order, CUDA in its own
order and after ``CUDA_VISIBLE_DEVICES``, so the same index can name two different boards.
The decisions (is an NVML figure believable, is a GPU throttling) are pure functions over plain
readings, tested on CPU with fake readings; the thin ``pynvml`` wrappers around them degrade
to ``"unavailable: <reason>"``, never to 0.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from harness import fmt

MiB = 2**20

# NVML clock-event ("throttle") reason bits, nvmlClocksEventReason* in nvml.h (stable values).
REASON_BITS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
# Reasons that mean the clock was pulled down by power or heat. Idle, application clocks,
# sync boost and display settings are not throttling.
THROTTLING = frozenset(
    {"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
     "hw_power_brake_slowdown"}
)
# Reasons that make a timing untrustworthy (contention). The software power cap is not one: an
# H100 or A100 reaches it routinely under sustained tensor-core load, so it is how the board
# runs, not a disturbance; it stays in ``throttle_reasons`` and ``throttled``.
CONTENTION_REASONS = THROTTLING - {"sw_power_cap"}


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> str | None:
    """None when NVML initializes here, else ``"unavailable: NVML (<error>)"`` (once per
    process: the runner asks twice per point)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return None
    except Exception as exc:  # NVMLError_LibraryNotFound on machines without the driver
        return f"unavailable: NVML ({type(exc).__name__}: {exc})"


def nvml_uuid(cuda_uuid: str) -> str:
    """NVML's spelling of a CUDA device UUID: torch prints ``8f0e...`` where NVML wants
    ``GPU-8f0e...`` (MIG instances already carry ``MIG-``)."""
    text = str(cuda_uuid)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


@functools.lru_cache(maxsize=16)
def handle(index: int):
    """The NVML handle of CUDA device ``index`` (as torch numbers it), found by its UUID."""
    import pynvml

    uuid = nvml_uuid(torch.cuda.get_device_properties(index).uuid)
    return pynvml.nvmlDeviceGetHandleByUUID(uuid)


def clock_event_reasons(dev_handle) -> int:
    """The current clock-event ("throttle") reason bits of an NVML device handle."""
    import pynvml

    getter = (  # renamed in newer NVML; the old name stays in older bindings
        getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    return int(getter(dev_handle))


def decode_reasons(mask: int) -> list[str]:
    """Names of the reason bits set in ``mask`` (unknown bits as hex)."""
    names = [name for name, bit in REASON_BITS.items() if mask & bit]
    rest = mask & ~sum(REASON_BITS.values())
    return names + ([f"0x{rest:x}"] if rest else [])


@dataclass(frozen=True)
class ClockReading:
    """One NVML reading of the SM clock and its clock-event reasons (None + status if not)."""

    sm_clock_mhz: int | None
    reasons_mask: int | None
    status: str = "ok"


def read_clock(index: int) -> ClockReading:
    """SM clock (MHz) and clock-event reasons of GPU ``index`` now."""
    reason = unavailable_reason()
    if reason is not None:
        return ClockReading(None, None, reason)
    import pynvml

    try:
        dev = handle(index)
        clock = pynvml.nvmlDeviceGetClockInfo(dev, pynvml.NVML_CLOCK_SM)
        return ClockReading(int(clock), clock_event_reasons(dev))
    except Exception as exc:  # not every board exposes every field
        return ClockReading(None, None, f"unavailable: NVML clocks ({type(exc).__name__}: {exc})")


def clock_columns(start: ClockReading, end: ClockReading) -> dict:
    """Row columns from the readings at the start and end of a point (pure)."""
    if start.reasons_mask is None or end.reasons_mask is None:
        status = start.status if start.status != "ok" else end.status
        return {"sm_clock_start_mhz": start.sm_clock_mhz, "sm_clock_end_mhz": end.sm_clock_mhz,
                "throttle_reasons": None, "throttled": None, "clock_status": status}
    reasons = sorted(set(decode_reasons(start.reasons_mask) + decode_reasons(end.reasons_mask)))
    return {
        "sm_clock_start_mhz": start.sm_clock_mhz,
        "sm_clock_end_mhz": end.sm_clock_mhz,
        "throttle_reasons": ",".join(reasons),
        "throttled": bool(THROTTLING & set(reasons)),
        "clock_status": "ok",
    }


# --- used-memory sampling -------------------------------------------------------------------

MIN_SAMPLES = 10  # a peak needs a call that spans this many sampling periods
CONTRADICTION_MIN_BYTES = 16 * MiB  # below this the allocator's figure is too small to test
NVML_BELOW_FRACTION = 0.5  # NVML under half the allocator's reserved peak contradicts it


def nvml_verdict(samples: Sequence[int], base: int, reserved_peak: int, calls: int = 1) -> dict:
    """The NVML columns of one measured call, cross-checked against the allocator (pure).

    ``samples``: NVML device used bytes while the call ran; ``base``: used bytes before it
    (after ``empty_cache``); ``reserved_peak``: the allocator's reserved bytes above its own
    baseline. NVML is trusted only when it was sampled often enough and does not contradict
    the allocator; otherwise the figure is None and the status says why.
    """
    out: dict = {"nvml_samples": len(samples), "nvml_calls": calls}
    if len(samples) < MIN_SAMPLES:
        return {**out, "nvml_peak_bytes": None,
                "nvml_status": f"unavailable: call shorter than the sampling period "
                               f"({len(samples)} samples over {calls} calls, need {MIN_SAMPLES})"}
    peak = max(max(samples) - base, 0)
    if reserved_peak >= CONTRADICTION_MIN_BYTES:
        if peak < MiB:
            return {**out, "nvml_peak_bytes": None,
                    "nvml_status": f"unavailable: NVML used-memory did not move while the "
                                   f"allocator reserved {fmt.size(reserved_peak)}"}
        if peak < NVML_BELOW_FRACTION * reserved_peak:
            return {**out, "nvml_peak_bytes": None,
                    "nvml_status": f"unavailable: NVML peak {fmt.size(peak)} is below the "
                                   f"allocator's reserved peak {fmt.size(reserved_peak)}"}
    return {**out, "nvml_peak_bytes": peak, "nvml_status": "ok"}


def run_until_sampled(
    fn: Callable[[], object],
    sample_count: Callable[[], int],
    sync: Callable[[], None],
    min_samples: int = MIN_SAMPLES,
    max_s: float = 2.0,
) -> int:
    """Call ``fn`` (synchronized) until ``sample_count()`` reaches ``min_samples`` or ``max_s``
    passed; at least once. Returns the number of calls. Repeated calls reuse the allocator's
    cached blocks, so device memory stays at the first call's peak while samples accumulate."""
    calls, start = 0, time.perf_counter()
    while True:
        result = fn()
        sync()
        del result
        calls += 1
        if sample_count() >= min_samples or time.perf_counter() - start > max_s:
            return calls


class UsedMemorySampler:
    """Samples NVML's device used-memory every ``period_s`` in a thread while active."""

    def __init__(self, index: int, period_s: float = 0.001):
        self.index, self.period_s = index, period_s
        self.samples: list[int] = []
        self.base: int | None = None
        self.reason = unavailable_reason()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> UsedMemorySampler:
        if self.reason is None:
            import pynvml

            self._handle = handle(self.index)
            self.base = pynvml.nvmlDeviceGetMemoryInfo(self._handle).used
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

    def count(self) -> int:
        return len(self.samples)


def device_info(index: int) -> dict:
    """env.json's NVML fields: driver, clocks at rest, power limit (or the reason they lack)."""
    reason = unavailable_reason()
    if reason is not None:
        return {"nvml": reason}
    import pynvml

    info = {"nvml": "available", "driver": pynvml.nvmlSystemGetDriverVersion()}
    try:
        dev = handle(index)
        info["nvml_uuid"] = pynvml.nvmlDeviceGetUUID(dev)
        idle = read_clock(index)
        info["sm_clock_idle_mhz"] = idle.sm_clock_mhz
        info["throttle_reasons_idle"] = (
            None if idle.reasons_mask is None else ",".join(decode_reasons(idle.reasons_mask))
        )
        info["max_sm_clock_mhz"] = pynvml.nvmlDeviceGetMaxClockInfo(dev, pynvml.NVML_CLOCK_SM)
        info["power_limit_w"] = pynvml.nvmlDeviceGetPowerManagementLimit(dev) / 1e3
    except Exception as exc:  # some fields are not supported on every board
        info["nvml_partial"] = str(exc)
    return info
