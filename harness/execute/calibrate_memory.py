"""The measured short call that calibrates a declared memory law
(:mod:`harness.cost.memory_law`): one forward call of the core on the short problem, on fresh
seeded inputs, its peak read by the device's own method (CPU allocator events, the CUDA
allocator), after a first call that leaves compilation and caches out of the reading. Measured
once per (implementation, problem, thread count) in a process: the same question gets the same
bytes, so a prediction does not change with what ran before it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from harness import registry
from harness.cost import memory_law
from harness.errors import DeviceUnavailable
from harness.measure.device import Device, get_device
from harness.spec import Problem

_MEASURED: dict[tuple, int] = {}


def call_peak(device: Device) -> memory_law.Measure:
    """A :data:`~harness.cost.memory_law.Measure` that runs its calls on ``device``."""

    def measure(impl: str, problem: Problem) -> int:
        core = registry.get(impl)
        key = (impl, core.fn, problem, torch.get_num_threads(), device.kind)
        if key not in _MEASURED:
            _MEASURED[key] = _measure(core, problem, device)
        return _MEASURED[key]

    return measure


def _measure(core: registry.Implementation, problem: Problem, device: Device) -> int:
    """Peak bytes of one forward call of ``core`` on ``problem`` above its live inputs: q (B, H,
    n_q, D), k/v (B, H_kv, n_k, D), N(0, 1) from a fixed seed."""
    p = problem
    gen = torch.Generator(device=p.device).manual_seed(0)
    shapes = [(p.batch, p.heads, p.n_q, p.head_dim)] + 2 * [(p.batch, p.n_kv_heads, p.n_k,
                                                             p.head_dim)]  # fmt: skip
    q, k, v = (torch.randn(s, generator=gen, device=p.device, dtype=p.dtype) for s in shapes)
    attn = core.prepare(p)
    with torch.no_grad():
        attn(q, k, v)
        device.synchronize()
        return device.peak_memory(lambda: attn(q, k, v)).peak_bytes


@contextlib.contextmanager
def calibrated(device: Device | str) -> Iterator[None]:
    """Predictions inside the block calibrate declared memory laws by calls on ``device`` (a
    Device or its name; a name this machine cannot run predicts without calibration)."""
    if isinstance(device, str):
        try:
            device = get_device(device)
        except DeviceUnavailable:
            yield
            return
    with memory_law.calibrating(call_peak(device)):
        yield
