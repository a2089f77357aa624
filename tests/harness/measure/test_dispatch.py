"""The ATen op count and the GPU operation count of one call."""

from __future__ import annotations

import torch

from harness.measure.dispatch import OpCount, aten_ops, gpu_ops


def test_every_dispatched_op_is_counted_and_still_runs():
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(5, 7, generator=gen), torch.randn(7, 4, generator=gen)
    with OpCount() as count:
        y = torch.mm(x, w).add_(1.0).relu()
    assert count.ops == 3
    torch.testing.assert_close(y, (x @ w + 1.0).relu())
    assert aten_ops(lambda: x.sum()) == 1
    assert aten_ops(lambda: [x.sum() for _ in range(4)]) == 4  # a loop shows as its length


def test_gpu_operations_are_none_off_cuda():
    assert gpu_ops(lambda: torch.ones(3).sum(), "cpu") is None
