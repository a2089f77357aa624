"""The runner: the only place that touches devices. Each point becomes one row, appended and
fsynced as soon as its last pass finishes; a failing point becomes a row with a status and
reason, and the sweep goes on.

Points run in ``passes`` (``[measure] passes``, default 3), each pass in its own order shuffled
by ``order_seed`` (:mod:`harness.measure.passes`), so a neighbour's burst or slow drift lands on
many points as disagreement between passes instead of on one point as bias.

First pass, per point: support check -> memory-budget check -> build the Case (set-up untimed)
-> first call (compile/allocation, reported as ``first_call_s``) -> agreement check -> peak
memory of one call -> a timing pass -> the scenario's extra columns (``Case.extra``).
Later passes: build the Case again and time it (memory and agreement are measured once).
A timing pass is bracketed by the reference kernel (:mod:`harness.measure.refkernel`) and by the
contention readings of :mod:`harness.measure.contention`.

Every finished pass is appended to ``passes.jsonl`` (:mod:`harness.execute.passlog`) beside
``rows.jsonl`` before the next one starts, so a crash loses no finished pass: ``--resume`` reads
it back and runs only the passes that are missing; ``rows.jsonl`` keeps one final row per point.

A built Case's timed call is launched as ``[measure] cuda_graph`` and the scenario say
(:func:`harness.scenarios.case.launch_case`: eager, or replayed from a CUDA graph); its memory
is measured on the eager call (a replay allocates nothing: its pool was taken at capture).

A device fault: a CUDA error poisons the process's context (a device-side assert, an illegal
address, a launch failure), so every later CUDA call in it fails too. The point that hit it
becomes an ``error`` row with the CUDA message; nothing raised after a point (its cleanup
included) escapes, so the row is written; and :func:`run_points` runs the points left in fresh
child processes from then on (``after_fault``: the session's isolated executor).
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial

import torch

from harness import fmt
from harness.errors import first_line
from harness.execute.calibrate_memory import calibrated
from harness.execute.deadline import Deadline
from harness.execute.passlog import PassLog, final_row, pass_record
from harness.measure import graphs, passes
from harness.measure.contention import Interval
from harness.measure.device import Device, get_device
from harness.measure.nvml import ClockReading, clock_columns
from harness.measure.refkernel import ReferenceKernel, pass_columns
from harness.measure.timing import measure
from harness.results import RowWriter
from harness.scenarios.case import Case, CaseOptions, launch_case
from harness.scenarios.interface import Point, PointCost, scenario_of
from harness.sweep.suite import MeasureConfig


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    return isinstance(exc, RuntimeError) and (
        "can't allocate memory" in str(exc) or "out of memory" in str(exc).lower())


def device_fault(row: dict) -> bool:
    """Whether a row failed on a CUDA error, which may poison the context of the process it
    happened in (``torch.AcceleratorError`` since torch 2.8; a ``RuntimeError`` that says
    ``CUDA error`` before): an ``error`` row, or a ``skipped`` one whose availability probe
    met it. Not every CUDA error is sticky, but telling which are is not worth a run: any of
    them sends the rest of the run into fresh processes."""
    reason = str(row.get("reason") or "")
    return row.get("status") in ("error", "skipped") and (
        "AcceleratorError" in reason or "CUDA error" in reason)


def point_row(point: Point) -> dict:
    """The identity columns of a point's row (no measurement yet)."""
    return {**point.columns(), "family": scenario_of(point).family(point),
            "threads": torch.get_num_threads() if point.device == "cpu" else None}


def run_point(point: Point, config: MeasureConfig, device: Device,
              mem_budget: int | None = None, ref: ReferenceKernel | None = None) -> dict:
    """Measure one point (its first pass); every failure is returned as the row's status,
    never raised. ``ref``: the reference kernel to bracket the timing with (one is made when
    None)."""
    row = point_row(point)
    try:
        row["device_name"] = device.name()
    except Exception as exc:  # a device that cannot even name itself (a poisoned context)
        return {**row, "status": "error", "reason": f"device: {first_line(exc)}"}
    scenario = scenario_of(point)
    try:
        reasons = scenario.support(point)
    except Exception as exc:  # a plug-in's own support check failing is this point's error
        return {**row, "status": "error", "reason": f"support check: {first_line(exc)}"}
    if reasons:
        return {**row, "status": "skipped", "reason": "; ".join(reasons)}
    cost = scenario.cost(point)
    with calibrated(device):  # a declared memory law is calibrated on a short call here
        try:
            predicted = cost.peak_bytes
            row["mem_prediction"] = cost.mem_prediction
        except Exception as exc:  # a model gap must not stop the sweep; the row says so
            predicted, row["prediction_error"] = None, first_line(exc)
    row["predicted_mem_bytes"] = predicted
    if mem_budget is not None and predicted is not None and predicted > mem_budget:
        return {**row, "status": "skipped",
                "reason": f"predicted peak {fmt.size(predicted)} > budget {fmt.size(mem_budget)}"}
    try:
        clock_start = device.clock()  # SM clock and throttle reasons around the point (GPU)
        case = scenario.build_case(point, device, _options(config))
        launched = launch_case(case, config.cuda_graph, device.kind)
        ref = ref or ReferenceKernel(device)
        row.update(_measure_case(case, launched.mode, cost, config, device, ref, clock_start))
    except Exception as exc:
        row.update(status="oom" if _is_oom(exc) else "error", reason=first_line(exc))
    case = launched = None  # the graph and its buffers go before the memory is released
    return _released(row, device)


def _released(record: dict, device: Device) -> dict:
    """``record`` after the point's memory is handed back. Cleanup must not raise: an error
    there (a CUDA error the point left behind surfaces at ``empty_cache``) makes an ``ok`` or
    ``mismatch`` record an ``error`` with it; one that failed already keeps its reason."""
    try:
        gc.collect()
        device.release_memory()
    except Exception as exc:
        if record.get("status") not in ("error", "oom"):
            record.update(status="error", reason=f"after the point: {first_line(exc)}")
    return record


def _options(config: MeasureConfig, check: str | None = None) -> CaseOptions:
    """How the runner wants a Case built: the suite's check (or ``check``) and the scenario's
    own ``[measure]`` options, passed through unread."""
    return CaseOptions(check=check or config.check, options=dict(config.options))


def _measure_case(case: Case, mode: str, cost: PointCost, config: MeasureConfig,
                  device: Device, ref: ReferenceKernel, clock_start: ClockReading) -> dict:
    """The first pass of a launched Case (``mode``: how its call was launched): first call,
    agreement, peak memory of the eager call, a timing pass, the scenario's extras (their own
    timings launched the same way), throughput and the status they add up to."""
    device.synchronize()
    start = time.perf_counter()
    finite = _all_finite(case.run())
    device.synchronize()
    first_call_s = time.perf_counter() - start
    out = dict(case.columns)
    out.update(case.check())
    memory = device.peak_memory(case.eager or case.run)
    out.update(peak_mem_bytes=memory.peak_bytes, mem_method=memory.method, **memory.extra)
    timing, bracket = _timed_pass(case.run, config, device, ref)
    out.update(timing.columns())
    out.update(bracket)
    out["first_call_s"] = first_call_s
    out.update(case.extra(timing, partial(_side_timer, mode=mode, device=device,
                                          config=_side_timing(config))))
    out.update(_throughput(cost, case.tokens, timing.median))
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


def _timed_pass(run: Callable[[], object], config: MeasureConfig, device: Device,
                ref: ReferenceKernel):
    """One timing of ``run`` between two reference-kernel timings, with the contention
    readings of the timed interval; returns (Measurement, columns of the bracket)."""
    before = ref.timed()
    threads = torch.get_num_threads() if device.kind == "cpu" else 1
    interval = Interval(threads, getattr(device, "index", None) if device.kind == "cuda" else None)
    interval.start()
    timing = measure(run, device, config.timing)
    readings = interval.columns()
    after = ref.timed()
    return timing, {**pass_columns(before, after), **readings}


def time_pass(point: Point, config: MeasureConfig, device: Device,
              ref: ReferenceKernel | None = None) -> dict:
    """A later pass of an ``ok`` point: build its Case again and time it (no memory or
    agreement). Returns the pass record; a failure is its ``status``/``reason``, not raised."""
    try:
        ref = ref or ReferenceKernel(device)
        case = scenario_of(point).build_case(point, device, _options(config, "none"))
        launch_case(case, config.cuda_graph, device.kind)
        timing, bracket = _timed_pass(case.run, config, device, ref)
        host = timing.host_columns()
        record = {"status": "ok", "time_samples_s": list(timing.samples),
                  "calls_per_sample": timing.calls_per_sample, **bracket,
                  "host_issue_s": host["host_issue_s"], "gpu_time_s": host["gpu_time_s"],
                  **timing.cpu_columns()}
    except Exception as exc:
        record = {"status": "oom" if _is_oom(exc) else "error", "reason": first_line(exc)}
    case = None
    return _released(record, device)


def _all_finite(result) -> bool:
    """False when a returned float tensor (or one in a returned tuple/list) has NaN or inf."""
    if isinstance(result, torch.Tensor):
        return not result.is_floating_point() or bool(torch.isfinite(result).all())
    if isinstance(result, tuple | list):
        return all(_all_finite(r) for r in result)
    return True


def _side_timing(config: MeasureConfig):
    """Half the budget for a scenario's secondary timings (its ``Case.extra``)."""
    return replace(config.timing, budget_s=config.timing.budget_s / 2)


def _side_timer(fn: Callable[[], object], mode: str, device: Device, config) -> object:
    """A scenario's secondary timing of ``fn`` (the Case's ``timer``), launched as its timed
    call was, so the two times compare like with like (a capture that fails runs eagerly)."""
    return measure(graphs.launch(fn, mode).run, device, config)


def _throughput(cost: PointCost, tokens: int, median_s: float) -> dict:
    useful = cost.useful_flops
    return {
        "tokens_per_s": tokens / median_s,
        "useful_flops": useful,
        "executed_flops": cost.executed_flops,
        "tflops_per_s": useful / median_s / 1e12 if useful else None,
    }


def _devices(points: Iterable[Point], flush_l2: bool) -> dict[str, Device]:
    return {kind: get_device(kind, flush_l2) for kind in sorted({p.device for p in points})}


@dataclass
class _PointState:
    first: dict | None = None
    records: dict[int, dict] = field(default_factory=dict)


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """The objects alive when a sweep starts (torch, pandas, the harness, the suite: ~280k in
    the CLI) out of the cyclic collector's sight while it runs (``gc.freeze``), handed back
    at its end: the collection after every point (:func:`_released`) then walks only what the
    points made (5 µs, not 95 ms a call). A heap someone else froze already (a caller's own
    ``gc.freeze``) is left as it is: unfreezing it here would undo theirs."""
    if gc.get_freeze_count():
        yield
        return
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@frozen_heap()
def run_points(
    points: list[Point],
    writer: RowWriter,
    config: MeasureConfig,
    *,
    run_id: str,
    suite_name: str,
    mem_budget: int | None = None,
    executor: Callable[..., dict] | None = None,
    on_row: Callable[[dict], None] | None = None,
    on_pass: Callable[[Point, int, dict], None] | None = None,
    after_fault: Callable[[Point, dict], Callable[..., dict]] | None = None,
    first_order: list[int] | None = None,
    deadline: Deadline | None = None,
    defer: Callable[[list[dict]], set[str]] | None = None,
    wanted: Callable[[str, set[str]], bool] | None = None,
) -> dict[str, int]:
    """Run ``points`` in ``config.passes`` shuffled passes, writing each point's row when its
    last pass finishes; returns status counts. Passes already in ``passes.jsonl`` (a resumed
    run) are not run again.

    ``executor(point)`` replaces :func:`run_point` and ``executor(point, pass_index=k)``
    :func:`time_pass` (e.g. to run each in a child process). ``on_pass(point, k, record)``
    follows every pass that ran (progress). ``after_fault(point, record)``: the executor the
    rest of an in-process run goes on with once a pass of ``point`` met a device fault
    (:func:`device_fault`), since this process's CUDA context may be poisoned.

    ``first_order``: the indices of ``points`` in the order of the first pass (a time-limited
    run's coarse-to-fine order, :mod:`harness.sweep.order`) instead of its shuffled one; the
    later passes keep theirs. ``deadline``: a pass that does not fit in the time left is not
    started; its point runs no further pass and gets no row (its finished passes stay in
    ``passes.jsonl``; :class:`~harness.execute.deadline.Deadline` keeps the tally).
    ``defer(first-pass rows so far)``: after each ok first pass, the point ids whose first
    passes still to come go to the back of the first pass (the order's stopping rule: their
    group is decided already); the runner only reorders, every pass still runs if time
    allows. ``wanted(point id, ids left out so far)``: with a deadline, whether a first pass
    is still worth its time once some points did not fit (False: it is left out too)."""
    devices = _devices(points, config.flush_l2) if executor is None else {}
    refs: dict[str, ReferenceKernel] = {}
    log = PassLog(writer.path.parent)
    restored = log.read({p.point_id for p in points})
    state = {p.point_id: _PointState(*restored.get(p.point_id, (None, {}))) for p in points}
    counts: dict[str, int] = {}
    total = max(config.passes, 1)

    def finish(point: Point) -> None:
        st = state[point.point_id]
        row = final_row(st.first, st.records)
        row.update(run_id=run_id, suite=suite_name)
        writer.write(row)
        counts[row["status"]] = counts.get(row["status"], 0) + 1
        if on_row is not None:
            on_row(row)

    queue = deque(_tasks(len(points), total, config.order_seed, first_order))
    measured = [st.first for st in state.values() if (st.first or {}).get("status") == "ok"]
    deferred: set[str] = set()
    while queue:
        k, index = queue.popleft()
        point, st = points[index], state[points[index].point_id]
        if k > 0 and (st.first or {}).get("status") != "ok":
            continue  # skipped or failed in its first pass: its row is written already
        if deadline is not None and deadline.dropped(point.point_id):
            continue  # an earlier pass of it did not fit: no later one runs
        pending = st.first is None if k == 0 else k not in st.records
        if (pending and deadline is not None and k == 0 and wanted is not None
                and not wanted(point.point_id, deadline.left_out)):
            deadline.leave(point.point_id, k)  # its groups lost an end: no fit to serve
            continue
        if pending and deadline is not None and not deadline.fits(point, k == 0):
            deadline.leave(point.point_id, k)
            continue
        ran = None
        if k == 0 and st.first is None:
            ran = st.first = _first_pass(point, config, executor, devices, refs, mem_budget)
            st.first["point_id"] = st.first.get("point_id") or point.point_id
            st.records[0] = pass_record(st.first)
            log.write(point.point_id, 0, st.records[0], st.first)
        elif k not in st.records:
            record = _later_pass(point, config, executor, devices, refs, k)
            ran = st.records[k] = {"pass": k, **record}
            log.write(point.point_id, k, st.records[k])
        if ran is not None and deadline is not None:
            deadline.record(point, k == 0, record=ran)
        if ran is not None and on_pass is not None:
            on_pass(point, k, ran)
        if ran is not None and executor is None and after_fault and device_fault(ran):
            executor = after_fault(point, ran)  # this process's context may be poisoned
        if k == total - 1 or st.first.get("status") != "ok":
            finish(point)
        if ran is not None and k == 0 and defer is not None and ran.get("status") == "ok":
            measured.append(ran)
            decided = defer(measured) - deferred
            if decided:
                deferred |= decided
                queue = _to_back(queue, points, deferred)
    return counts




def _tasks(count: int, total: int, seed: int,
           first_order: list[int] | None) -> list[tuple[int, int]]:
    """(pass index, point index) in the order they run: pass by pass, each pass in its
    shuffled order (the first in ``first_order`` when given)."""
    orders = passes.pass_orders(count, total, seed)
    if first_order is not None:
        if sorted(first_order) != list(range(count)):
            raise ValueError("first_order must list every point index once")
        orders[0] = list(first_order)
    return [(k, index) for k, order in enumerate(orders) for index in order]


def _to_back(queue: deque, points: list[Point], deferred: set[str]) -> deque:
    """``queue`` with the first passes of ``deferred`` points after every other first pass
    (in their order), the later passes as they were."""
    first = [t for t in queue if t[0] == 0]
    waiting = [t for t in first if points[t[1]].point_id in deferred]
    return deque([t for t in first if points[t[1]].point_id not in deferred] + waiting
                 + [t for t in queue if t[0] > 0])


def _ref(point: Point, device: Device, refs: dict[str, ReferenceKernel]) -> ReferenceKernel:
    if point.device not in refs:
        refs[point.device] = ReferenceKernel(device)
    return refs[point.device]


def _first_pass(point, config, executor, devices, refs, mem_budget) -> dict:
    if executor is not None:
        return executor(point)
    device = devices[point.device]
    try:
        budget = mem_budget if mem_budget is not None else default_budget(device)
        ref = _ref(point, device, refs)
    except Exception as exc:  # the device itself fails (a poisoned context): this point's row
        return {**point_row(point), "status": "error", "reason": f"device: {first_line(exc)}"}
    return run_point(point, config, device, budget, ref)


def _later_pass(point, config, executor, devices, refs, index: int) -> dict:
    if executor is not None:
        return executor(point, pass_index=index)
    device = devices[point.device]
    try:
        ref = _ref(point, device, refs)
    except Exception as exc:  # as in _first_pass: a failed pass, not a failed run
        return {"status": "error", "reason": f"device: {first_line(exc)}"}
    return time_pass(point, config, device, ref)


def default_budget(device: Device) -> int:
    """A safe fraction of what the device has free: 80% of free memory."""
    return int(device.free_memory_bytes() * 0.8)
