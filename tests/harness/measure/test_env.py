"""env.json records what fp32 numbers depend on (TF32) and, per device, the clock under load."""

from __future__ import annotations

import torch

from harness.execute.session import RunOptions, run_suite
from harness.measure import calibrate, env
from harness.measure.device import CpuDevice
from harness.results import load_env
from harness.sweep.suite import load_suite


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


def test_the_settings_that_change_what_runs_are_recorded(monkeypatch):
    monkeypatch.setenv("ATTNBENCH_AUTOTUNE", "off")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("HOME_OF_SOMETHING_ELSE", "x")
    recorded = env.collect(CpuDevice(), "s", "s.toml", "f", "run")["settings_env"]
    assert recorded["ATTNBENCH_AUTOTUNE"] == "off" and recorded["TRITON_INTERPRET"] == "1"
    assert "HOME_OF_SOMETHING_ELSE" not in recorded
    monkeypatch.delenv("ATTNBENCH_AUTOTUNE")
    assert "ATTNBENCH_AUTOTUNE" not in env.collect(CpuDevice(), "s", "s.toml", "f", "run")[
        "settings_env"]


def test_clock_under_load_says_why_it_is_missing_on_cpu():
    reading = calibrate.clock_under_load(CpuDevice())
    assert reading["sm_clock_under_load_mhz"] is None
    assert reading["clock_under_load_status"].startswith("unavailable: ")


def test_env_is_collected_after_the_new_tf32_api_was_used():
    """Setting ``torch.backends.cuda.matmul.fp32_precision`` makes reading the legacy
    ``allow_tf32`` raise; env.json must still be written and say TF32 is on."""
    matmul = torch.backends.cuda.matmul
    saved = matmul.fp32_precision
    try:
        matmul.fp32_precision = "tf32"
        info = env.collect(CpuDevice(), "s", "s.toml", "f", "run")
        assert info["tf32_cuda_matmul"] is True
        assert info["fp32_precision_cuda_matmul"] == "tf32"
        assert info["float32_matmul_precision"] == "high"
        matmul.fp32_precision = "ieee"
        info = env.collect(CpuDevice(), "s", "s.toml", "f", "run")
        assert info["tf32_cuda_matmul"] is False
    finally:
        matmul.fp32_precision = saved


def test_an_isolated_run_calibrates_in_a_child_not_in_the_parent(tmp_path, monkeypatch):
    """Under --isolate the parent must not run the calibration GEMMs: on a GPU it would keep
    its context and cached memory, and every point's child would see "another process"."""
    suite_file = tmp_path / "s.toml"
    suite_file.write_text(
        'name = "iso"\nscenario = "attention"\nimplementations = ["sdpa"]\n'
        "[fixed]\nheads = 2\nhead_dim = 16\nseq_len = 64\n"
        "[measure]\nbudget_s = 0.05\nmin_samples = 3\nwarmup_calls = 1\nthreads = 1\n"
    )
    suite = load_suite(suite_file)

    def parent_calibrates(*args, **kwargs):
        raise AssertionError("the parent process ran the calibration")

    monkeypatch.setattr(calibrate, "calibrate", parent_calibrates)
    options = RunOptions(out=tmp_path / "run", isolate=True, progress=False)
    result = run_suite(suite, suite.measure, options)
    info = load_env(result.run_dir)
    assert info["calibration"]["process"] == "isolated child"
    assert info["calibration"]["matmul_flops_per_s"] > 0 and info["threads"] == 1
    assert result.counts == {"ok": 1}
