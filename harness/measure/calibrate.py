"""What the device can do, measured once per run: matmul peak (FLOP/s) and memory bandwidth.

Rows' FLOP/s and bytes/s are reported as fractions of these (a roofline): a kernel at 80 % of
the measured GEMM peak is near what this machine can do, whatever the datasheet says. Each
measurement takes well under 2 s on a 2-core CPU; CUDA work is synchronized before timing ends.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from harness.measure.nvml import decode_reasons

# Square GEMM sizes: big enough to reach the plateau, small enough to finish fast.
MATMUL_N = {"cpu": 2048, "cuda": 8192}
COPY_BYTES = {"cpu": 256 * 2**20, "cuda": 1024 * 2**20}  # well beyond the last-level cache
REPEATS = 7
_THIS_RUN: dict[str, dict] = {}  # device kind -> the calibration this process made for its run


def _device_of(device) -> tuple[str, Callable[[], None]]:
    """(torch device string, synchronize) for a device name or a harness Device object."""
    if isinstance(device, str | torch.device):
        name = str(device)
        cuda = torch.device(name).type == "cuda"
        sync = (lambda: torch.cuda.synchronize(name)) if cuda else (lambda: None)
        return name, sync
    if device.kind == "cuda":  # the Device's own index: plain "cuda" means the current one
        return str(device.torch_device), device.synchronize
    return "cpu", device.synchronize


def _times(fn: Callable[[], object], sync: Callable[[], None], budget_s: float) -> list[float]:
    """Seconds per call of ``fn`` over up to REPEATS calls (at least 3) within ``budget_s``."""
    fn()  # warm-up: allocation, kernel selection
    sync()
    times: list[float] = []
    spent = 0.0
    while len(times) < 3 or (len(times) < REPEATS and spent < budget_s):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
        spent += times[-1]
    return times


def matmul_rates(
    device="cpu",
    dtype: torch.dtype | str = torch.float32,
    n: int | None = None,
    budget_s: float = 0.6,
) -> list[float]:
    """FLOP/s of each timed square (n, n) @ (n, n) GEMM in ``dtype`` (2·n³ FLOPs per call)."""
    name, sync = _device_of(device)
    kind = torch.device(name).type
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    n = n or MATMUL_N.get(kind, 4096)
    gen = torch.Generator(device=name).manual_seed(0)
    a = torch.randn(n, n, generator=gen, device=name).to(dtype)
    b = torch.randn(n, n, generator=gen, device=name).to(dtype)
    out = torch.empty(n, n, device=name, dtype=dtype)
    return [2.0 * n**3 / t for t in _times(lambda: torch.matmul(a, b, out=out), sync, budget_s)]


def copy_rates(device="cpu", nbytes: int | None = None, budget_s: float = 0.5) -> list[float]:
    """Bytes/s of each timed large tensor copy, counting read + write (2·nbytes per call)."""
    name, sync = _device_of(device)
    nbytes = nbytes or COPY_BYTES.get(torch.device(name).type, 256 * 2**20)
    src = torch.ones(nbytes // 4, device=name, dtype=torch.float32)
    dst = torch.empty_like(src)
    return [2.0 * src.numel() * 4 / t for t in _times(lambda: dst.copy_(src), sync, budget_s)]


def measure_matmul_peak(
    device="cpu",
    dtype: torch.dtype | str = torch.float32,
    n: int | None = None,
    budget_s: float = 0.6,
) -> float:
    """FLOP/s of square GEMMs in ``dtype``: the median over repeats."""
    return statistics.median(matmul_rates(device, dtype, n, budget_s))


def measure_bandwidth(device="cpu", nbytes: int | None = None, budget_s: float = 0.5) -> float:
    """Bytes/s (read + write) of a large tensor copy: the median over repeats."""
    return statistics.median(copy_rates(device, nbytes, budget_s))


def clock_under_load(device, calls: int = 10) -> dict:
    """The SM clock read while GEMMs are in flight (an idle GPU reports its idle clock, e.g.
    345 MHz on an H100): ``calls`` square GEMMs are enqueued, then the clock is read, then the
    device is synchronized. Devices without a clock say why."""
    if isinstance(device, str | torch.device) or device.kind != "cuda":
        kind = torch.device(device).type if isinstance(device, str | torch.device) else device.kind
        return {"sm_clock_under_load_mhz": None,
                "clock_under_load_status": f"unavailable: no GPU clock on a {kind} device"}
    n = MATMUL_N["cuda"]
    a = torch.randn(n, n, device=device.torch_device, dtype=torch.bfloat16)
    out = torch.empty_like(a)
    device.synchronize()
    with torch.cuda.device(device.torch_device):
        for _ in range(calls):
            torch.matmul(a, a, out=out)
    reading = device.clock()  # the GEMMs are still running: this is the clock under load
    device.synchronize()
    return {
        "sm_clock_under_load_mhz": reading.sm_clock_mhz,
        "throttle_reasons_under_load": None if reading.reasons_mask is None
        else ",".join(decode_reasons(reading.reasons_mask)),
        "clock_under_load_status": reading.status,
    }


def calibrate(device="cpu", dtypes: tuple[str, ...] | None = None) -> dict:
    """The ``calibration`` entry of env.json: fp32 matmul peak and copy bandwidth (medians, and
    the best repeat: a large gap between the two means the machine was busy), plus on CUDA the
    half-precision peaks that fp16/bf16 rows are compared against."""
    name, _ = _device_of(device)
    kind = torch.device(name).type
    dtypes = dtypes or (("float32", "bfloat16", "float16") if kind == "cuda" else ("float32",))
    start = time.perf_counter()
    rates = {dt: matmul_rates(device, dt) for dt in dtypes}
    peaks = {dt: statistics.median(r) for dt, r in rates.items()}
    copies = copy_rates(device)
    main = "float32" if "float32" in peaks else next(iter(peaks))
    result = {
        "matmul_flops_per_s": peaks[main],
        "matmul_flops_per_s_best": max(rates[main]),
        "matmul_flops_per_s_by_dtype": peaks,
        "mem_bandwidth_bytes_per_s": statistics.median(copies),
        "mem_bandwidth_bytes_per_s_best": max(copies),
        "dtype": main,
        "matmul_n": MATMUL_N.get(kind, 4096),
        "copy_bytes": COPY_BYTES.get(kind, 256 * 2**20),
        "threads": torch.get_num_threads() if kind == "cpu" else None,
        **clock_under_load(device),
        "seconds": round(time.perf_counter() - start, 3),
    }
    _THIS_RUN[kind] = result
    return result


def use_bandwidth(kind: str, bytes_per_s: float) -> None:
    """Rows of ``kind`` in this process compare their bytes against ``bytes_per_s``, the copy
    bandwidth of the run's calibration (env.json): an isolated child of a run that has one."""
    _THIS_RUN[kind] = {"mem_bandwidth_bytes_per_s": bytes_per_s}


def bandwidth_for(device) -> tuple[float, str]:
    """(bytes/s, source) that rows compare their bytes moved against: the run's calibration
    (``mem_bandwidth_bytes_per_s`` of env.json) when this process made it, otherwise measured
    once here (an isolated child or a resumed run) the same way."""
    name, _ = _device_of(device)
    kind = torch.device(name).type
    if kind not in _THIS_RUN:
        copies = copy_rates(device)
        _THIS_RUN[kind] = {"mem_bandwidth_bytes_per_s": statistics.median(copies), "own": True}
    cal = _THIS_RUN[kind]
    source = "measured in this process" if cal.get("own") else "env.json calibration"
    return cal["mem_bandwidth_bytes_per_s"], source


def peak_for(calibration: dict | None, dtype: str = "float32") -> float | None:
    """The measured matmul peak a row of ``dtype`` is compared against (None if not measured):
    the best fp32 repeat where recorded (a peak is what the device *can* do; the median sags
    when other work shares the machine), else the dtype's median."""
    if not calibration:
        return None
    by_dtype = calibration.get("matmul_flops_per_s_by_dtype") or {}
    if dtype == calibration.get("dtype", "float32") and calibration.get("matmul_flops_per_s_best"):
        return calibration["matmul_flops_per_s_best"]
    return by_dtype.get(dtype) or calibration.get("matmul_flops_per_s")
