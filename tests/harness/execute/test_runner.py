"""One point -> one row: statuses, agreement, columns, scenarios."""

from __future__ import annotations

import gc

import pytest
import torch

from harness import registry
from harness.execute.runner import run_point
from harness.measure import passes
from harness.measure.device import CpuDevice
from harness.measure.timing import TimingConfig
from harness.registry import register
from harness.scenarios.interface import Point
from harness.spec import Capabilities, Cost
from harness.sweep.suite import MeasureConfig

FAST = MeasureConfig(timing=TimingConfig(budget_s=0.05, min_samples=3, warmup_calls=1))
REQUIRED = (
    "run_id",
    "impl",
    "scenario",
    "device",
    "dtype",
    "batch",
    "seq_len",
    "heads",
    "head_dim",
    "d_model",
    "causal",
    "status",
    "reason",
    "time_median_s",
    "time_iqr_s",
    "samples",
    "tokens_per_s",
    "useful_flops",
    "tflops_per_s",
    "peak_mem_bytes",
    "mem_method",
    "max_abs_err",
    "rel_err",
    "agree",
)


@pytest.fixture
def scratch_impls():
    """Register test-only implementations and remove them afterwards."""
    added: list[str] = []

    def add(name, fn, **caps):
        register(name, family="test", caps=Capabilities(**caps), cost=Cost(2, 2))(fn)
        added.append(name)

    yield add
    for name in added:
        registry._REGISTRY.pop(name, None)


def run(point: Point) -> dict:
    return run_point(point, FAST, CpuDevice()) | {"run_id": "test"}


def test_ok_row_has_every_documented_column():
    row = run(Point.of(impl="sdpa", seq_len=97, heads=3, head_dim=59, batch=2, causal=True))
    assert row["status"] == "ok" and row["agree"] is True
    missing = [c for c in REQUIRED if c not in row]
    assert not missing
    assert row["useful_flops"] == 4 * 2 * 3 * 59 * (97 * 98 // 2)
    assert row["time_median_s"] > 0 and row["samples"] >= 3
    assert len(row["time_samples_s"]) == row["samples"]
    assert row["peak_mem_bytes"] > 0 and row["mem_method"] == "torch-profiler"


def test_unsupported_point_is_skipped_with_the_reason():
    row = run(Point(impl="sdpa-efficient", seq_len=64, heads=2, head_dim=16))
    assert row["status"] == "skipped" and "cuda" in row["reason"]
    point = Point.of(impl="sdpa", seq_len=64, heads=2, head_dim=16, window_left=3, window_right=0)
    row = run(point)
    assert row["status"] == "skipped" and "window" in row["reason"]


def test_wrong_output_is_a_mismatch_not_ok(scratch_impls):
    scratch_impls("test-wrong", lambda q, k, v, mask, scale=None: v[..., : q.shape[-2], :] * 1.01)
    row = run(Point(impl="test-wrong", seq_len=33, heads=2, head_dim=8))
    assert row["status"] == "mismatch" and row["agree"] is False
    assert "beyond tolerance" in row["reason"]


def test_nan_output_is_a_mismatch_with_a_reason(scratch_impls):
    scratch_impls("test-nan", lambda q, k, v, mask, scale=None: q * float("nan"))
    row = run(Point(impl="test-nan", seq_len=16, heads=1, head_dim=8))
    assert row["status"] == "mismatch" and "non-finite" in row["reason"]


def test_a_crashing_point_becomes_an_error_row(scratch_impls):
    def boom(q, k, v, mask, scale=None):
        raise RuntimeError("kernel exploded\nsecond line")

    scratch_impls("test-boom", boom)
    row = run(Point(impl="test-boom", seq_len=16, heads=1, head_dim=8))
    assert row["status"] == "error" and row["reason"] == "RuntimeError: kernel exploded"


def test_allocation_failure_is_an_oom_row(scratch_impls):
    def hog(q, k, v, mask, scale=None):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried 1 TB")

    scratch_impls("test-hog", hog)
    assert run(Point(impl="test-hog", seq_len=16, heads=1, head_dim=8))["status"] == "oom"


def test_over_budget_point_is_skipped_with_the_prediction():
    point = Point(impl="full", seq_len=4096, heads=8, head_dim=64)
    row = run_point(point, FAST, CpuDevice(), mem_budget=64 * 2**20)
    assert row["status"] == "skipped" and "predicted peak" in row["reason"]
    assert row["predicted_mem_bytes"] > 64 * 2**20


def test_backward_scenario_checks_gradients():
    row = run(
        Point.of(
            impl="flash-tiled",
            scenario="attention+backward",
            seq_len=97,
            heads=3,
            head_dim=59,
            causal=True,
        )
    )
    assert row["status"] == "ok" and row["check"] == "full+grads"
    assert row["grad_rel_err"] < 1e-4
    assert row["useful_flops"] == pytest.approx(3.5 * 4 * 3 * 59 * (97 * 98 // 2))


def test_large_points_check_sampled_rows():
    row = run_point(
        Point.of(impl="sdpa-flash", seq_len=4100, heads=1, head_dim=16, causal=True),
        FAST,
        CpuDevice(),
    )
    assert row["status"] == "ok" and row["check"] == "rows"


@pytest.mark.parametrize(
    "norm,ffn,pos",
    [("pre", "gelu", "rope"), ("post", "swiglu", "sinusoidal"), ("pre", "relu", "learned")],
)
def test_block_rows_report_the_attention_share(norm, ffn, pos):
    row = run(
        Point.of(
            impl="sdpa",
            scenario="block",
            seq_len=65,
            heads=2,
            head_dim=24,
            causal=True,
            norm=norm,
            ffn=ffn,
            pos=pos,
        )
    )
    assert row["status"] == "ok" and row["agree"] is True, row.get("reason")
    # a share, not a hard-coded timing: the core timed alone over the block's median
    assert row["attn_share"] == pytest.approx(row["mixer_time_s"] / row["time_median_s"])
    assert row["attn_share"] > 0


@pytest.mark.parametrize("mixer", ["lstm", "conv"])
def test_block_mixer_baselines(mixer):
    row = run(
        Point.of(
            impl=mixer, mixer=mixer, scenario="block", seq_len=40, heads=2, head_dim=16, causal=True
        )
    )
    assert row["status"] == "ok" and row["agree"] is True, row.get("reason")
    assert row["family"] in ("recurrent", "convolution") and "attn_share" not in row


def test_block_backward_checks_input_gradient():
    row = run(
        Point.of(
            impl="full", scenario="block+backward", seq_len=33, heads=2, head_dim=8, causal=True
        )
    )
    assert row["status"] == "ok" and row["grad_rel_err"] < 1e-4


def test_threads_are_recorded_on_cpu():
    assert (
        run(Point(impl="sdpa", seq_len=16, heads=1, head_dim=8))["threads"]
        == torch.get_num_threads()
    )


class _TwoClockCpu(CpuDevice):
    """A CPU device that pretends to have a clock of its own on which every sample takes
    ``slowdown`` times what the host spent issuing it (host_frac = 1 / slowdown)."""

    host_issue_reason = None

    def __init__(self, slowdown: float):
        self.slowdown = slowdown

    def time_issue(self, fn, calls: int):
        from harness.measure.device import CallTimes

        host = self.time_calls(fn, calls)
        return CallTimes(host * self.slowdown, host)


def test_rows_and_later_passes_carry_host_issue_time_combined_over_passes():
    from harness.execute.passlog import final_row, pass_record
    from harness.execute.runner import time_pass

    point = Point(impl="sdpa", seq_len=40, heads=2, head_dim=8)
    first = run_point(point, FAST, _TwoClockCpu(4.0))
    assert first["status"] == "ok" and first["host_frac_status"] == "ok"
    assert first["host_frac"] == pytest.approx(0.25)
    assert first["gpu_time_s"] == pytest.approx(4 * first["host_issue_s"])
    later = time_pass(point, FAST, _TwoClockCpu(1.25))
    assert later["host_issue_s"] > 0 and later["gpu_time_s"] > 0
    row = final_row(first, {0: pass_record(first), 1: {"pass": 1, **later}})
    w0 = len(first["time_samples_s"]) * first["calls_per_sample"]
    w1 = len(later["time_samples_s"]) * later["calls_per_sample"]
    host = (w0 * first["host_issue_s"] + w1 * later["host_issue_s"]) / (w0 + w1)
    gpu = (w0 * first["gpu_time_s"] + w1 * later["gpu_time_s"]) / (w0 + w1)
    assert row["host_issue_s"] == pytest.approx(host) and row["gpu_time_s"] == pytest.approx(gpu)
    assert row["host_frac"] == pytest.approx(host / gpu)
    assert 0.25 < row["host_frac"] < 0.8


def test_cpu_rows_say_host_issue_time_is_unavailable():
    row = run(Point(impl="sdpa", seq_len=40, heads=2, head_dim=8))
    assert row["host_frac"] is None and row["host_issue_s"] is None
    assert row["host_frac_status"].startswith("unavailable: on a CPU")
    assert row["cuda_graph"] == "none" and row["cuda_graph_reason"] is None


@pytest.mark.parametrize("scenario", ["attention", "attention+backward", "block"])
def test_cuda_graph_on_a_cpu_runs_eagerly_and_says_why(scenario):
    config = MeasureConfig(timing=FAST.timing, cuda_graph=True)
    row = run_point(Point.of("sdpa", scenario, seq_len=40, heads=2, head_dim=8), config,
                    CpuDevice())
    assert row["status"] == "ok" and row["cuda_graph"] == "none"
    assert row["cuda_graph_reason"] == "unavailable: CUDA graphs need a CUDA device"


class _PoisonedCleanup(CpuDevice):
    """A device whose cleanup after a point raises what a poisoned CUDA context raises at
    ``torch.cuda.empty_cache()`` (the 2026-11-26 decode crash surfaced there)."""

    def release_memory(self) -> None:
        raise torch.AcceleratorError("CUDA error: device-side assert triggered\nmore")


def test_an_error_in_the_cleanup_after_a_point_is_the_point_s_row_not_a_crash(scratch_impls):
    from harness.execute.runner import device_fault, time_pass

    point = Point(impl="sdpa", seq_len=24, heads=2, head_dim=8)
    row = run_point(point, FAST, _PoisonedCleanup())
    assert row["status"] == "error" and row["impl"] == "sdpa"
    assert row["reason"] == "after the point: AcceleratorError: CUDA error: device-side assert " \
        "triggered"
    assert device_fault(row)
    assert time_pass(point, FAST, _PoisonedCleanup())["status"] == "error"

    def boom(q, k, v, mask, scale=None):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    scratch_impls("test-illegal", boom)
    failed = run_point(Point(impl="test-illegal", seq_len=24, heads=2, head_dim=8), FAST,
                       _PoisonedCleanup())
    assert failed["reason"] == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert device_fault(failed)
    assert not device_fault({"status": "error", "reason": "ValueError: bad shape"})
    assert not device_fault({"status": "oom", "reason": "CUDA error: out of memory"})
    assert device_fault({"status": "skipped", "reason": "unavailable: probe on cuda: "
                         "AcceleratorError: CUDA error: an illegal memory access"})
    assert not device_fault({"status": "skipped", "reason": "needs a CUDA GPU"})


class _PoisonedAfterOnePoint(CpuDevice):
    """A device whose free-memory reading raises a CUDA error after the first point (a fault
    that surfaced outside any point: the runner's own budget check meets it)."""

    def __init__(self):
        self.reads = 0

    def free_memory_bytes(self) -> int:
        self.reads += 1
        if self.reads > 1:
            raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")
        return super().free_memory_bytes()


@pytest.mark.parametrize(
    ("device", "first_faults", "reason"),
    [(_PoisonedCleanup, True, "after the point: AcceleratorError: CUDA error"),
     (_PoisonedAfterOnePoint, False, "device: AcceleratorError: CUDA error")],
    ids=["in-the-cleanup", "in-the-budget-check"],
)
def test_after_a_device_fault_the_rest_of_the_run_goes_to_the_fault_executor(
        tmp_path, monkeypatch, device, first_faults, reason):
    """A CUDA error in a point's cleanup, or in the runner's own device call before a point:
    that point's row is an error, the fault executor is asked for once, and every later pass
    runs through it; the run never raises."""
    from harness.execute import runner
    from harness.results import RowWriter, iter_rows

    one = device()
    monkeypatch.setattr(runner, "get_device", lambda kind, flush_l2=False: one)
    points = [Point(impl="sdpa", seq_len=n, heads=2, head_dim=8) for n in (16, 24, 32)]
    elsewhere: list[tuple[str, int]] = []
    faults: list[str] = []

    def isolated(point, pass_index=0):
        elsewhere.append((point.point_id, pass_index))
        return {**runner.point_row(point), "status": "ok", "time_samples_s": [1e-3],
                "calls_per_sample": 1, "time_median_s": 1e-3}

    def after_fault(point, record):
        faults.append(point.point_id)
        return isolated

    config = MeasureConfig(timing=FAST.timing, passes=2)
    counts = runner.run_points(points, RowWriter(tmp_path), config, run_id="r", suite_name="s",
                               after_fault=after_fault)
    assert counts == {"error": 1, "ok": 2} and len(faults) == 1
    rows = {r["point_id"]: r for r in iter_rows(tmp_path / "rows.jsonl")}
    assert rows[faults[0]]["reason"].startswith(reason)
    first = passes.pass_orders(3, 2, 0)[0][0]  # the point the run starts with
    assert (faults[0] == points[first].point_id) is first_faults
    in_process = {faults[0]} | ({points[first].point_id} if not first_faults else set())
    expected = [(p.point_id, k) for p in points if p.point_id not in in_process for k in (0, 1)]
    if not first_faults:  # its first pass ran here, before the fault; its second there
        expected.append((points[first].point_id, 1))
    assert sorted(elsewhere) == sorted(expected)


def test_a_sweep_runs_with_the_heap_it_found_frozen_and_hands_it_back(tmp_path):
    """The collection after every point must not walk the imports' objects (95 ms a call in
    the CLI): they are frozen while the points run, and unfrozen when the sweep ends."""
    from harness.execute import runner
    from harness.results import RowWriter

    frozen: list[int] = []

    def executor(point, pass_index=0):
        frozen.append(gc.get_freeze_count())
        return {**runner.point_row(point), "status": "ok", "time_samples_s": [1e-3],
                "calls_per_sample": 1, "time_median_s": 1e-3}

    gc.unfreeze()
    points = [Point(impl="sdpa", seq_len=n, heads=2, head_dim=8) for n in (16, 24)]
    config = MeasureConfig(timing=FAST.timing, passes=2)
    counts = runner.run_points(points, RowWriter(tmp_path), config, run_id="r", suite_name="s",
                               executor=executor)
    assert counts == {"ok": 2} and len(frozen) == 4
    assert min(frozen) > 10_000  # torch and the harness, at least
    assert gc.get_freeze_count() == 0
