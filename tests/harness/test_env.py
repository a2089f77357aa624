"""env.json records what fp32 numbers depend on (TF32) and, per device, the clock under load."""

from __future__ import annotations

import torch

from harness.measure import calibrate, env
from harness.measure.device import CpuDevice


def test_tf32_flags_are_recorded_as_set():
    saved = torch.get_float32_matmul_precision()
    try:
        for precision in ("high", "highest"):
            torch.set_float32_matmul_precision(precision)
            info = env.collect(CpuDevice(), "s", "s.toml", "f", "run")
            assert info["float32_matmul_precision"] == precision
            assert info["tf32_cuda_matmul"] is torch.backends.cuda.matmul.allow_tf32
            assert info["tf32_cudnn"] is torch.backends.cudnn.allow_tf32
    finally:
        torch.set_float32_matmul_precision(saved)


def test_clock_under_load_says_why_it_is_missing_on_cpu():
    reading = calibrate.clock_under_load(CpuDevice())
    assert reading["sm_clock_under_load_mhz"] is None
    assert reading["clock_under_load_status"].startswith("unavailable: ")
