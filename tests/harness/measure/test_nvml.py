"""NVML's decisions on fake readings: a figure that contradicts the allocator or was never
sampled is null with a reason, never "ok" with 0; throttling is told apart from idling; a CUDA
index finds its board by UUID; the harness's own processes and the power cap are not
contention. A fake ``pynvml`` stands in for the driver on CPU machines."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest
import torch

from harness.measure import contention, nvml
from harness.measure.device import CpuDevice
from harness.measure.nvml import (
    MIN_SAMPLES,
    REASON_BITS,
    ClockReading,
    clock_columns,
    decode_reasons,
    nvml_verdict,
    run_until_sampled,
)

MiB, GiB = 2**20, 2**30
BASE = 10 * GiB


def test_nvml_that_did_not_move_while_the_allocator_reserved_4_gib_is_null():
    verdict = nvml_verdict([BASE] * 50, BASE, reserved_peak=4 * GiB)
    assert verdict["nvml_peak_bytes"] is None
    assert verdict["nvml_status"] == (
        "unavailable: NVML used-memory did not move while the allocator reserved 4.0 GiB"
    )


def test_nvml_far_below_the_allocator_is_null():
    verdict = nvml_verdict([BASE + GiB] * 50, BASE, reserved_peak=4 * GiB)
    assert verdict["nvml_peak_bytes"] is None
    assert "below the allocator's reserved peak 4.0 GiB" in verdict["nvml_status"]


def test_nvml_that_agrees_with_the_allocator_is_reported():
    samples = [BASE] * 5 + [BASE + 4 * GiB + 40 * MiB] * 20  # + context/workspace memory
    verdict = nvml_verdict(samples, BASE, reserved_peak=4 * GiB, calls=3)
    assert verdict["nvml_status"] == "ok"
    assert verdict["nvml_peak_bytes"] == 4 * GiB + 40 * MiB
    assert verdict["nvml_samples"] == 25 and verdict["nvml_calls"] == 3


def test_too_few_samples_is_never_ok_with_a_number():
    for samples in ([], [BASE], [BASE + GiB] * (MIN_SAMPLES - 1)):
        verdict = nvml_verdict(samples, BASE, reserved_peak=GiB)
        assert verdict["nvml_peak_bytes"] is None
        assert verdict["nvml_status"].startswith("unavailable: call shorter than the sampling")


def test_short_calls_are_repeated_until_sampled():
    state = {"calls": 0, "samples": 0}

    def call():  # each call spans 3 sampling periods of a fake sampler
        state["calls"] += 1
        state["samples"] += 3

    calls = run_until_sampled(call, lambda: state["samples"], lambda: None)
    assert calls == state["calls"] == -(-MIN_SAMPLES // 3)


def test_a_never_sampled_call_stops_at_the_time_cap():
    calls = run_until_sampled(lambda: None, lambda: 0, lambda: None, max_s=0.01)
    assert calls >= 1


def test_idle_and_app_clocks_are_not_throttling_power_and_heat_are():
    idle = REASON_BITS["gpu_idle"] | REASON_BITS["applications_clocks_setting"]
    calm = clock_columns(ClockReading(1980, idle), ClockReading(1980, 0))
    assert calm["throttled"] is False and calm["clock_status"] == "ok"
    assert calm["sm_clock_start_mhz"] == 1980 and "gpu_idle" in calm["throttle_reasons"]
    hot = clock_columns(ClockReading(1980, 0), ClockReading(1410, REASON_BITS["sw_power_cap"]))
    assert hot["throttled"] is True and hot["throttle_reasons"] == "sw_power_cap"
    assert decode_reasons(REASON_BITS["hw_thermal_slowdown"] | 0x10000) == [
        "hw_thermal_slowdown", "0x10000"
    ]


def test_cpu_rows_say_why_clocks_are_missing():
    device = CpuDevice()
    cols = clock_columns(device.clock(), device.clock())
    assert cols["sm_clock_start_mhz"] is None and cols["throttled"] is None
    assert cols["clock_status"].startswith("unavailable: ")


class FakeNvml(SimpleNamespace):
    """``pynvml`` over two boards in PCI order; each board lists the PIDs NVML would show."""

    NVML_CLOCK_SM = 1

    def __init__(self, boards: list[dict]):
        super().__init__(boards=boards)

    def nvmlInit(self) -> None: ...

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict:
        return self.boards[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> dict:
        return next(b for b in self.boards if b["uuid"] == uuid)

    def nvmlDeviceGetClockInfo(self, board: dict, _kind: int) -> int:
        return board["clock"]

    def nvmlDeviceGetCurrentClocksEventReasons(self, board: dict) -> int:
        return board["reasons"]

    nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons  # old name

    def nvmlDeviceGetComputeRunningProcesses(self, board: dict) -> list:
        return [SimpleNamespace(pid=pid) for pid in board["pids"]]

    def nvmlDeviceGetGraphicsRunningProcesses(self, board: dict) -> list:
        return []


@pytest.fixture
def fake_gpus(monkeypatch):
    """Two boards; CUDA sees only the second (``CUDA_VISIBLE_DEVICES=1``): CUDA index 0 is NVML
    index 1. Returns the boards so a test can set their PIDs."""
    boards = [
        {"uuid": "GPU-aaaa", "clock": 345, "reasons": 0x1, "pids": [4242]},
        {"uuid": "GPU-bbbb", "clock": 1980, "reasons": 0x4, "pids": []},
    ]
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(boards))
    cuda_uuids = ["bbbb"]  # torch prints the UUID without NVML's "GPU-" prefix
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid=cuda_uuids[i])
    )
    for cached in (nvml.unavailable_reason, nvml.handle):
        cached.cache_clear()
    yield boards
    for cached in (nvml.unavailable_reason, nvml.handle):
        cached.cache_clear()


def test_a_cuda_index_reads_its_own_board_found_by_uuid(fake_gpus):
    reading = nvml.read_clock(0)
    assert (reading.sm_clock_mhz, reading.reasons_mask) == (1980, 0x4)
    gpu = contention.gpu_readings(0)  # board 0 (another user's 4242) is not ours to judge
    assert gpu["gpu_other_processes"] == 0 and gpu["gpu_throttle_reasons"] == 0x4


def test_the_power_cap_is_not_contention_thermal_slowdown_is(fake_gpus):
    assert contention.assess(None, 1, contention.gpu_readings(0))[0] is False
    fake_gpus[1]["reasons"] = REASON_BITS["sw_power_cap"] | REASON_BITS["hw_thermal_slowdown"]
    contended, reason = contention.assess(None, 1, contention.gpu_readings(0))
    assert contended and "throttled" in reason
    # the power cap is still recorded as a clock-lowering reason in the clock columns
    hot = clock_columns(ClockReading(1980, 0), ClockReading(1755, REASON_BITS["sw_power_cap"]))
    assert hot["throttled"] is True and hot["throttle_reasons"] == "sw_power_cap"


def test_the_harness_own_processes_are_not_others(fake_gpus):
    """An isolated point's parent (and forkserver) hold no work while it is timed: they are
    not "another process on the GPU"; a stranger is."""
    fake_gpus[1]["pids"] = [os.getpid(), os.getppid()]
    assert contention.gpu_readings(0)["gpu_other_processes"] == 0
    fake_gpus[1]["pids"] = [os.getpid(), 1]  # pid 1 exists here and is no harness process
    assert contention.gpu_readings(0)["gpu_other_processes"] == 1


def test_host_pids_from_a_pid_namespace_do_not_count_this_process_twice(fake_gpus):
    """In a container NVML lists host PIDs: this process appears under a PID that does not
    exist here. One unresolved entry is this process; a second one is someone else."""
    ghost = (1 << 22) + 17  # above pid_max: exists in no namespace here
    fake_gpus[1]["pids"] = [ghost]
    assert contention.gpu_readings(0)["gpu_other_processes"] == 0
    fake_gpus[1]["pids"] = [ghost, ghost + 1]
    assert contention.gpu_readings(0)["gpu_other_processes"] == 1


def test_ancestors_walk_proc_stat():
    stats = {"/proc/30/stat": "30 (py (x)) S 20 1", "/proc/20/stat": "20 (sh) S 10 1",
             "/proc/10/stat": "10 (init) S 1 1"}
    assert contention.ancestors(30, stats.get) == {20, 10}
    assert os.getppid() in contention.ancestors(os.getpid())


@pytest.mark.cuda
@pytest.mark.gpu_alone  # NVML reads the whole device: other processes' memory and load
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_peak_memory_nvml_is_believable_or_null_with_a_reason():
    from harness.measure.device import get_device

    device = get_device("cuda")
    n = 4096
    q, k, v = (torch.randn(1, 16, n, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))

    def eager():  # materializes the (1, 16, n, n) scores: > 512 MiB
        return torch.softmax((q @ k.transpose(-2, -1)).float(), -1).to(q.dtype) @ v

    reading = device.peak_memory(eager)
    x = reading.extra
    assert reading.peak_bytes >= 16 * n * n * 4 and x["peak_reserved_bytes"] >= reading.peak_bytes
    if x["nvml_status"] == "ok":
        assert x["nvml_peak_bytes"] >= 0.5 * x["peak_reserved_bytes"]
        assert x["nvml_samples"] >= MIN_SAMPLES
    else:
        assert x["nvml_peak_bytes"] is None and x["nvml_status"].startswith("unavailable: ")


@pytest.mark.cuda
@pytest.mark.gpu_alone  # NVML reads the whole device: other processes' memory and load
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_clock_columns_come_from_nvml_or_say_why():
    from harness.measure.device import get_device

    device = get_device("cuda")
    cols = clock_columns(device.clock(), device.clock())
    if cols["clock_status"] == "ok":
        assert cols["sm_clock_start_mhz"] > 0 and isinstance(cols["throttled"], bool)
    else:
        assert cols["clock_status"].startswith("unavailable: ") and cols["throttled"] is None
