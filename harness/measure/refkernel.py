"""The reference kernel: a fixed-size matmul timed next to every point's timing pass.

Its time (``ref_kernel_s``) measures how fast the machine was *at that moment*: a runner that
is uniformly slower today (another tenant, a lower clock) slows it as much as the points, so
``time_median_s / ref_kernel_s`` compares across such runs where absolute time does not.
It runs with the same thread count as the points, before and after each pass's timing, so it
shares the interval's contention. On a CPU its CPU time is kept too (``ref_kernel_cpu_s``), so
a point's CPU time can be normalized the same way (``compare``'s ``cpu`` time basis).
"""

from __future__ import annotations

import numpy as np
import torch

from harness.measure.device import CallTimes, Device

CPU_SIZE = 512  # 512x512 fp32: ~0.27 GFLOP, 1-2 ms on two cores of a current CPU
CUDA_SIZE = 4096  # 4096x4096 fp32: ~137 GFLOP, a few ms on a current GPU
SAMPLES = 3  # per side of the pass (before and after)


class ReferenceKernel:
    """``c = a @ b`` on fixed, seeded inputs (set up once, outside the timings)."""

    def __init__(self, device: Device):
        self.device = device
        size = CUDA_SIZE if device.kind == "cuda" else CPU_SIZE
        gen = torch.Generator().manual_seed(0)
        a, b = (torch.randn(size, size, generator=gen) for _ in range(2))
        self.a, self.b = a.to(device.torch_device), b.to(device.torch_device)
        self.size = size
        self._calls = None

    def _run(self) -> torch.Tensor:
        return torch.mm(self.a, self.b)

    def timed(self, count: int = SAMPLES) -> list[CallTimes]:
        """``count`` per-call times (wall, and CPU time where the device gives it); the first
        use calibrates calls per sample to >= 2 ms."""
        if self._calls is None:
            self.device.time_calls(self._run, 1)  # warm-up: thread pool, first allocation
            one = self.device.time_calls(self._run, 1)
            self._calls = max(1, int(np.ceil(2e-3 / max(one, 1e-9))))
        out = []
        for _ in range(count):
            t = self.device.time_issue(self._run, self._calls)
            cpu = None if t.cpu_s is None else t.cpu_s / self._calls
            out.append(CallTimes(t.device_s / self._calls, None, cpu))
        return out

    def samples(self, count: int = SAMPLES) -> list[float]:
        """``count`` per-call wall times (:meth:`timed`)."""
        return [t.device_s for t in self.timed(count)]


def summarize(before: list[float], after: list[float]) -> float:
    """One figure for a pass: the median of the samples taken before and after it."""
    return float(np.median(before + after))


def pass_columns(before: list[CallTimes], after: list[CallTimes]) -> dict:
    """A pass's reference columns: ``ref_kernel_s`` (wall, :func:`summarize`) and, where every
    sample has a CPU time, ``ref_kernel_cpu_s`` (the median CPU time, likewise)."""
    both = before + after
    out = {"ref_kernel_s": summarize([t.device_s for t in before], [t.device_s for t in after])}
    cpu = [t.cpu_s for t in both]
    if both and None not in cpu:
        out["ref_kernel_cpu_s"] = float(np.median(cpu))
    return out
