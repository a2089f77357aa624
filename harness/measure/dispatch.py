"""What one call puts on the device: the ATen ops it dispatches and, on CUDA, its GPU operations.

A method whose launches grow with n (a Python loop over chunks or segments) keeps a GPU waiting
on the host (``host_frac`` near 1) however fast its kernels are. The ATen op count shows that
on any device, the CPU included, so a CPU test can hold "the same launches at n = 1k and 64k"
without a GPU (``tests/implementations/test_linear_launches.py``); on CUDA torch.profiler
counts what actually reached the GPU (kernels, copies, memsets).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode


class OpCount(TorchDispatchMode):
    """Counts the ATen ops dispatched while active (``with OpCount() as count: ...;
    count.ops``); every op still runs."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def aten_ops(call: Callable[[], Any]) -> int:
    """The ATen ops one ``call()`` dispatches (fill caches with a call before counting)."""
    with OpCount() as count:
        call()
    return count.ops


def gpu_ops(call: Callable[[], Any], device: torch.device | str) -> int | None:
    """The operations one ``call()`` puts on the GPU (kernels, copies, memsets; torch.profiler);
    None off CUDA."""
    if torch.device(device).type != "cuda":
        return None
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
