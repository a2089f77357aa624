"""Run points in child processes, so a segfault, an abort or the OOM killer takes only that point.

Children are forked from a *forkserver* that imported torch, the harness and the built-in
implementations once: a point's child starts in milliseconds instead of the seconds a fresh
interpreter spends importing torch, and it never inherits the parent's threads, CUDA context or
half-finished state (the server itself runs nothing). Plug-ins from entry points load in each
child through the registry, as in the parent.

What crosses the process boundary is built by this process: the point's fields and the measure
settings go down; the row comes back as JSON text. Nothing read from a suite or results file is
pickled or unpickled. A child that sends no result within ``timeout_s`` is killed (status
``timeout``); one that dies first becomes an ``error`` row naming the signal or exit code.

:func:`capped_run_task` is the child side of ``attnbench maxlen``: one run of a point with the
child's memory capped at a budget (CPU: ``RLIMIT_DATA``; CUDA: the allocator's memory fraction).
:func:`run_environment` collects ``env.json`` and the device calibration in a child, so that a
parent that runs its points isolated never creates a GPU context nor keeps the calibration's
cached memory: each point's child is then alone on the GPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import gc
import importlib
import json
import multiprocessing
import multiprocessing.connection
import pkgutil
import resource
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from harness import registry, scenarios
from harness.errors import CliError
from harness.execute.runner import default_budget, point_row, run_point, time_pass
from harness.measure import allocator, calibrate, env
from harness.measure.device import get_device
from harness.scenarios.case import CaseOptions
from harness.scenarios.interface import Point, point_from_row, scenario_of
from harness.sweep.suite import MeasureConfig

# Imported once in the forkserver; every child starts with them loaded.
_PRELOAD = ("torch", "harness.execute.runner", *scenarios.modules(), "harness.execute.isolate")
_EXIT_GRACE_S = 10.0  # a child that sent its result but does not exit is killed after this


@dataclass(frozen=True)
class ChildOutcome:
    """What became of one child: its JSON result, or why there is none."""

    result: dict | None
    status: str  # ok (a result arrived) | timeout | error
    reason: str | None
    seconds: float


def isolated_executor(
    config: MeasureConfig, mem_budget: int | None, timeout_s: float | None,
    bandwidth: dict[str, float] | None = None,
) -> Callable[[Point], dict]:
    """An executor for :func:`harness.execute.runner.run_points`: each point runs in its own child.

    ``mem_budget`` None means the child's default (a fraction of the memory free when the point
    starts). ``timeout_s`` None means no limit. ``bandwidth``: device kind -> the copy bandwidth
    of the run's calibration (env.json), which a child's ``bw_fraction`` is then measured
    against, as in-process rows are; a child of a device kind without one measures its own
    (a 256 MiB copy, repeated: about a second of each point's child on a 2-core CPU).
    """

    def execute(point: Point, pass_index: int = 0) -> dict:
        payload = {"point": point.fields(), "config": config, "mem_budget": mem_budget,
                   "pass_index": pass_index, "bandwidth": bandwidth or {}}
        outcome = run_isolated(point_task, payload, timeout_s)
        row = point_row(point) if pass_index == 0 else {}
        if outcome.result is not None:
            return {**row, **outcome.result}
        return {**row, "status": outcome.status, "reason": outcome.reason}

    return execute


def point_task(payload: dict) -> dict:
    """Child side of :func:`isolated_executor`: one :func:`harness.execute.runner.run_point` call
    (first pass) or :func:`harness.execute.runner.time_pass` call (a later pass)."""
    point = point_from_row(payload["point"])
    config: MeasureConfig = payload["config"]
    if config.threads:
        torch.set_num_threads(config.threads)
    device = get_device(point.device, config.flush_l2)
    given = payload.get("bandwidth", {}).get(device.kind)
    if given:  # the run's calibration, as :func:`calibrate.calibrate` leaves it in the parent
        calibrate.use_bandwidth(device.kind, given)
    if payload.get("pass_index", 0) > 0:
        return time_pass(point, config, device)
    budget = payload["mem_budget"]
    return run_point(point, config, device, default_budget(device) if budget is None else budget)


def environment_task(payload: dict) -> dict:
    """Child side of :func:`run_environment`: env.json's fields and the calibration."""
    if payload.get("threads"):
        torch.set_num_threads(payload["threads"])
    device = get_device(payload["device"], payload["flush_l2"])
    info = env.collect(device, *payload["run"])
    info["calibration"] = {**calibrate.calibrate(device), "process": "isolated child"}
    return info


def run_environment(
    device: str, flush_l2: bool, threads: int | None, run: tuple[str, str, str, str]
) -> dict:
    """``env.json`` (with the calibration) of a run whose points run isolated, collected in a
    child process. ``run``: (suite name, suite path, suite fingerprint, run id)."""
    payload = {"device": device, "flush_l2": flush_l2, "threads": threads, "run": list(run)}
    outcome = run_isolated(environment_task, payload)
    if outcome.result is None or outcome.result.get("status") == "error":
        reason = outcome.reason or (outcome.result or {}).get("reason")
        raise CliError(f"device calibration failed in its child process: {reason}")
    return outcome.result


def capped_run_task(payload: dict) -> dict:
    """Child side of a memory-capped run (``attnbench maxlen``): warm up at ``warmup_len``
    (uncapped: library buffers, compilation and autotuning of the target's length bucket),
    cap further allocation at ``budget`` bytes, then build and run the point once."""
    point = point_from_row(payload["point"])
    if payload.get("threads"):
        torch.set_num_threads(payload["threads"])
    device = get_device(point.device)

    def call(p: Point) -> None:
        case = scenario_of(p).build_case(p, device, CaseOptions(check="none"))
        device.synchronize()
        case.run()
        device.synchronize()

    warmup = dataclasses.replace(point, seq_len=payload["warmup_len"])
    device.peak_memory(lambda: call(warmup))  # library buffers, thread pools, profiler: uncapped
    gc.collect()
    allocator.release(keep=0)  # the tuned CPU heap keeps freed blocks: give them back first
    limit = limit_memory(device, payload["budget"])
    start = time.perf_counter()
    try:
        reading = device.peak_memory(lambda: call(point))
    except Exception as exc:  # out of memory under the cap, or the kernel failing
        text = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"[:300]
        oom = isinstance(exc, MemoryError | torch.OutOfMemoryError) or "allocate" in text
        return {"status": "oom" if oom else "error", "reason": text, **limit}
    return {
        "status": "ok",
        "seconds": round(time.perf_counter() - start, 3),
        "peak_bytes": reading.peak_bytes,
        "mem_method": reading.method,
        **limit,
    }


def limit_memory(device, budget: int) -> dict:
    """Cap what this process may still allocate at ``budget`` bytes (above what it holds now)."""
    if device.kind == "cuda":
        torch.cuda.empty_cache()
        held = torch.cuda.memory_allocated(device.torch_device)
        total = torch.cuda.get_device_properties(device.torch_device).total_memory
        torch.cuda.set_per_process_memory_fraction(
            min(1.0, (held + budget) / total), device.torch_device
        )
        return {"limit": "cuda-memory-fraction", "baseline_bytes": held}
    with open("/proc/self/status") as fh:
        data = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmData:"))
    resource.setrlimit(resource.RLIMIT_DATA, (data + budget, data + budget))
    return {"limit": "RLIMIT_DATA", "baseline_bytes": data}


def run_isolated(
    fn: Callable[[dict], dict], payload: dict, timeout_s: float | None = None
) -> ChildOutcome:
    """Run ``fn(payload)`` in a child process; ``fn`` must be a module-level function of ours.

    Never raises for what happens in the child: a crash, a signal or a timeout is the outcome.
    """
    ctx = _context()
    receiver, sender = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child_main, args=(sender, fn, payload), daemon=True)
    start = time.perf_counter()
    child.start()
    sender.close()  # the child holds the only writer: EOF here means it died
    try:
        ready = multiprocessing.connection.wait([receiver, child.sentinel], timeout_s)
        seconds = time.perf_counter() - start
        if not ready:
            return ChildOutcome(
                None, "timeout", f"no result within {timeout_s:g} s; child process killed", seconds
            )
        text = _receive(receiver)
        child.join(_EXIT_GRACE_S)  # it sent its result or closed its pipe: it is ending
        if text is not None:
            return ChildOutcome(json.loads(text), "ok", None, seconds)
        if child.is_alive():
            return ChildOutcome(
                None, "error", "child process closed its pipe without a result", seconds
            )
        return ChildOutcome(None, "error", describe_exit(child.exitcode), seconds)
    finally:
        if child.is_alive():
            child.kill()
            child.join()
        receiver.close()


def describe_exit(code: int | None) -> str:
    """A readable reason for a child that ended without a result (negative code = signal)."""
    if code is None:
        return "child process did not exit"
    if code < 0:
        try:
            sig = signal.Signals(-code)
        except ValueError:
            return f"child process killed by signal {-code}"
        if sig == signal.SIGKILL:
            return "child process killed by SIGKILL (out of memory?)"
        return f"child process killed by {sig.name} ({signal.strsignal(sig)})"
    return f"child process exited with code {code} before sending a result"


def _receive(receiver) -> str | None:
    """The child's JSON text if it sent one (poll: a dead child's pipe reads as EOF)."""
    if not receiver.poll():
        return None
    try:
        return receiver.recv_bytes().decode("utf-8")
    except (EOFError, OSError):
        return None


def _child_main(sender, fn: Callable[[dict], dict], payload: dict) -> None:
    """Child entry point: run, send the result as JSON, exit. What the child inherited (the
    imports: ~280k objects) is frozen out of the cyclic collector's sight for its short life,
    so the collection after its point walks only what the point made."""
    _die_with_parent()
    gc.freeze()
    try:
        result = fn(payload)
        text = json.dumps(result, default=_json_default)
    except BaseException as exc:  # the parent must get a row whatever happened here
        detail = (str(exc).strip().splitlines() or [""])[0]
        text = json.dumps({"status": "error", "reason": f"{type(exc).__name__}: {detail}"[:500]})
    sender.send_bytes(text.encode("utf-8"))
    sender.close()


def _json_default(value):
    if hasattr(value, "item"):  # numpy / torch scalars
        return value.item()
    return str(value)


def _die_with_parent() -> None:
    """Linux: SIGKILL this child when the forkserver (and so the run) goes away; and no core
    dumps from crashing points (a sweep of crashes must not fill the disk)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    with contextlib.suppress(OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


@functools.cache
def _context() -> multiprocessing.context.BaseContext:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(_PRELOAD) + _builtin_implementations())
    return ctx


def _builtin_implementations() -> list[str]:
    """Module names of the built-in implementation package (the registry's own list)."""
    try:
        package = importlib.import_module(registry.BUILTIN_PACKAGE)
    except ImportError:
        return []
    return [
        f"{registry.BUILTIN_PACKAGE}.{m.name}"
        for m in pkgutil.iter_modules(package.__path__)
        if not m.name.startswith("_")
    ]
