"""The runner: the only place that touches devices. Each point becomes one row, appended and
fsynced as soon as it finishes; a failing point becomes a row with a status and reason, and the
sweep goes on.

Per point: support check -> memory-budget check -> build the Case (set-up untimed) -> first
call (compile/allocation, reported as ``first_call_s``) -> agreement check -> peak memory of one
call -> adaptive timing -> scenario extras (e.g. attention share of block time).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

from harness import costmodel, registry
from harness.device import Device, clock_columns, get_device
from harness.point import Point
from harness.results import RowWriter, write_env
from harness.scenarios import build_case
from harness.suite import MeasureConfig, Suite
from harness.timing import measure

MIXER_FAMILIES = {"lstm": "recurrent", "conv": "convolution"}


@dataclass
class RunSummary:
    run_dir: Path
    counts: dict[str, int] = field(default_factory=dict)
    skipped_existing: int = 0

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:500]


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    return isinstance(exc, RuntimeError) and (
        "can't allocate memory" in str(exc) or "out of memory" in str(exc).lower())


def point_row(point: Point) -> dict:
    """The identity columns of a point's row (no measurement yet)."""
    impl_family = MIXER_FAMILIES.get(point.impl)
    if impl_family is None:
        try:
            impl_family = registry.get(point.impl).family
        except KeyError:
            impl_family = None
    return {**point.columns(), "family": impl_family,
            "threads": torch.get_num_threads() if point.device == "cpu" else None}


def support_reasons(point: Point, impl) -> list[str]:
    """Why ``impl`` cannot run ``point`` here (empty = it can); decode adds its own rules."""
    if point.scenario == "decode":
        from harness.scenarios import decode

        return decode.not_supported(point, impl)
    return impl.not_supported(point.problem())


def run_point(point: Point, config: MeasureConfig, device: Device,
              mem_budget: int | None = None) -> dict:
    """Measure one point; every failure is returned as the row's status, never raised."""
    row = point_row(point)
    row["device_name"] = device.name()
    impl = None if point.mixer != "attention" else registry.get(point.impl)
    if impl is not None:
        try:
            reasons = support_reasons(point, impl)
        except Exception as exc:  # a plug-in's own support check failing is this point's error
            return {**row, "status": "error", "reason": f"support check: {_first_line(exc)}"}
        if reasons:
            return {**row, "status": "skipped", "reason": "; ".join(reasons)}
    try:
        predicted = costmodel.predict_peak_bytes(point)
    except Exception as exc:  # a model gap must not stop the sweep; the row says so
        predicted, row["prediction_error"] = None, _first_line(exc)
    row["predicted_mem_bytes"] = predicted
    if mem_budget is not None and predicted is not None and predicted > mem_budget:
        return {**row, "status": "skipped",
                "reason": f"predicted peak {predicted / 2**20:.0f} MiB > budget "
                          f"{mem_budget / 2**20:.0f} MiB"}
    try:
        row.update(_measure_point(point, impl, config, device))
    except Exception as exc:
        row.update(status="oom" if _is_oom(exc) else "error", reason=_first_line(exc))
    finally:
        gc.collect()
        if device.kind == "cuda":
            torch.cuda.empty_cache()
    return row


def _measure_point(point: Point, impl, config: MeasureConfig, device: Device) -> dict:
    clock_start = device.clock()  # SM clock and throttle reasons around the point (GPU)
    case = build_case(point, impl, device, config.check)
    device.synchronize()
    start = time.perf_counter()
    finite = _all_finite(case.run())
    device.synchronize()
    first_call_s = time.perf_counter() - start
    out = dict(case.columns)
    out.update(case.check())
    memory = device.peak_memory(case.run)
    out.update(peak_mem_bytes=memory.peak_bytes, mem_method=memory.method, **memory.extra)
    timing = measure(case.run, device, config.timing)
    out.update(timing.columns())
    out["first_call_s"] = first_call_s
    out.update(case.extra(timing, partial(measure, device=device, config=_side_timing(config))))
    out.update(_throughput(point, case.tokens, timing.median))
    out.update(clock_columns(clock_start, device.clock()))
    nonfinite = out.pop("nonfinite", False) or not finite  # NaN/inf even with check = none
    out.pop("grad_agree", None)
    mismatch = out.pop("mismatch_reason", None)  # which bound the agreement rule broke
    if nonfinite:
        out["status"], out["reason"] = "mismatch", "non-finite values (NaN/inf) in the output"
    elif out.get("agree") is False:
        out["status"] = "mismatch"
        out["reason"] = mismatch or (f"max_abs_err {out.get('max_abs_err')} beyond tolerance "
                                     f"{out.get('tolerance')}")
    else:
        out["status"], out["reason"] = "ok", None
    return out


def _all_finite(result) -> bool:
    """False when a returned float tensor (or one in a returned tuple/list) has NaN or inf."""
    if isinstance(result, torch.Tensor):
        return not result.is_floating_point() or bool(torch.isfinite(result).all())
    if isinstance(result, tuple | list):
        return all(_all_finite(r) for r in result)
    return True


def _side_timing(config: MeasureConfig):
    """Half the budget for secondary timings (the mixer alone inside a block)."""
    from dataclasses import replace

    return replace(config.timing, budget_s=config.timing.budget_s / 2)


def _throughput(point: Point, tokens: int, median_s: float) -> dict:
    useful = costmodel.useful_flops(point)
    return {
        "tokens_per_s": tokens / median_s,
        "useful_flops": useful,
        "executed_flops": costmodel.executed_flops(point),
        "tflops_per_s": useful / median_s / 1e12 if useful else None,
    }


def _devices(points: Iterable[Point], flush_l2: bool) -> dict[str, Device]:
    return {kind: get_device(kind, flush_l2) for kind in sorted({p.device for p in points})}


def run_points(
    points: list[Point],
    writer: RowWriter,
    config: MeasureConfig,
    *,
    run_id: str,
    suite_name: str,
    mem_budget: int | None = None,
    executor: Callable[[Point], dict] | None = None,
    on_row: Callable[[dict], None] | None = None,
) -> dict[str, int]:
    """Run ``points`` in order, writing each row as it finishes; returns status counts."""
    devices = _devices(points, config.flush_l2) if executor is None else {}
    counts: dict[str, int] = {}
    for point in points:
        if executor is not None:
            row = executor(point)
        else:
            device = devices[point.device]
            budget = mem_budget if mem_budget is not None else default_budget(device)
            row = run_point(point, config, device, budget)
        row.update(run_id=run_id, suite=suite_name)
        writer.write(row)
        counts[row["status"]] = counts.get(row["status"], 0) + 1
        if on_row is not None:
            on_row(row)
    return counts


def default_budget(device: Device) -> int:
    """A safe fraction of what the device has free: 80% of free memory."""
    return int(device.free_memory_bytes() * 0.8)


def prepare_run(suite: Suite, run_dir: Path, run_id: str) -> dict:
    """Write env.json (with the device calibration) for a new run; returns it."""
    from harness import calibrate, env

    if suite.measure.threads:
        torch.set_num_threads(suite.measure.threads)
    kinds = sorted({p.device for p in suite.points}) or ["cpu"]
    device = get_device(kinds[0], suite.measure.flush_l2)
    info = env.collect(device, suite.name, suite.path, suite.fingerprint, run_id)
    info["calibration"] = calibrate.calibrate(device)
    write_env(run_dir, info)
    return info
