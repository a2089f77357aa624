"""Contention: what the machine had to spare while a point was timed, and whether a row was
measured under contention.

CPU (Linux): ``/proc/stat`` per-CPU counters over the timing interval, restricted to the CPUs
this process may run on, minus this process's own CPU time, give the cores *other* processes
used; the ``steal`` column gives time a hypervisor took away; ``/proc/self/task/*/schedstat``
gives the time this process's own threads spent runnable but waiting for a CPU (the run-queue
wait: what the point *lost*, which others' use alone does not show). The 1-minute load average is
recorded too (it lags by a minute, so it informs but does not decide). GPU: other processes
with a context on the device and clock-throttle reasons, through NVML (the board matched by
UUID); without NVML the row says ``unavailable: <reason>``. The harness's own processes are not
"others": this process, and its ancestors (an isolated point's forkserver and the run's parent,
which wait while it is timed). In a PID namespace NVML may report host PIDs that match nothing
here; one such unresolved entry is this process itself (:func:`other_gpu_processes`).

A row is ``contended`` when other processes used more than the cores the point left idle (plus
a margin), when this process's threads waited for a CPU more than a tenth of the interval, when
steal is above a few percent, or when the GPU is shared or throttled.

The run-queue wait is the signal the first rule missed. On a 2-core machine at load 2-4 a
one-thread point was timed 3x slower in some runs than in others with every row
``contended: false``: other processes used "only" 0.9-1.25 cores, within the one core the
point left idle plus the margin, yet the scheduler still time-shared the point's own core.
Measured here (2026-11-28, load 8.6-8.9, ``full`` n=1024 B1 H4 D32, one thread, quiet ~9 ms):
intervals timed at 24.8, 28.9, 29.0 and 40.1 ms read others at 0.86-1.25 cores and were not
flagged.

The rule is a pure function of the readings (:func:`assess`) so that it can be tested on synthetic
``/proc`` text. :func:`contended_mask`, :func:`usable_rows` and :func:`notice` are what claims,
compare and report call on loaded rows.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from harness.measure import nvml

OTHER_CORES_MARGIN = 0.25  # cores others may use beyond our spare ones before we flag
WAIT_LIMIT = 0.10  # fraction of our threads' time spent runnable but waiting for a CPU
STEAL_LIMIT = 0.05  # fraction of our CPUs' time taken by the hypervisor
# NVML clock-event bits that make a timing untrustworthy: HW slowdown, SW/HW thermal, HW power
# brake. Not the SW power cap (routine under tensor-core load), idle or application clocks.
GPU_CONTENTION_BITS = sum(nvml.REASON_BITS[name] for name in nvml.CONTENTION_REASONS)


@dataclass(frozen=True)
class CpuSnapshot:
    """Cumulative counters at one instant: ticks of our CPUs, our own CPU seconds, wall time."""

    busy_ticks: int
    steal_ticks: int
    total_ticks: int
    own_cpu_s: float
    wall_s: float
    load_avg_1m: float | None
    wait_s: float | None = None  # our threads' cumulative run-queue wait (schedstat)


def parse_stat(text: str, cpus: set[int] | None = None) -> tuple[int, int, int]:
    """(busy, steal, total) ticks of ``cpus`` (all CPUs when None) from ``/proc/stat`` text.

    Columns: user nice system idle iowait irq softirq steal [guest guest_nice]; guest time is
    already inside user, so it is not added twice. Busy = total - idle - iowait.
    """
    busy = steal = total = 0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        if cpus is not None and int(name[3:]) not in cpus:
            continue
        ticks = [int(x) for x in rest.split()[:8]]
        ticks += [0] * (8 - len(ticks))
        total += sum(ticks)
        busy += sum(ticks) - ticks[3] - ticks[4]
        steal += ticks[7]
    return busy, steal, total


def parse_loadavg(text: str) -> float | None:
    try:
        return float(text.split()[0])
    except (IndexError, ValueError):
        return None


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def parse_schedstat(text: str) -> float | None:
    """Seconds a thread waited on a run queue from its ``schedstat`` text (``on-CPU ns,
    waiting ns, timeslices``); None when unreadable."""
    try:
        return int(text.split()[1]) / 1e9
    except (IndexError, ValueError):
        return None


def own_wait_s(
    read: Callable[[str], str | None] | None = None, tasks: list[str] | None = None
) -> float | None:
    """Run-queue wait of every thread of this process so far (seconds); None without
    schedstat (kernels built without CONFIG_SCHEDSTATS, other systems). ``read`` and
    ``tasks`` (thread ids) replace ``/proc`` in tests."""
    read = read or _read
    if tasks is None:
        try:
            tasks = os.listdir("/proc/self/task")
        except OSError:
            return None
    waits = [parse_schedstat(read(f"/proc/self/task/{t}/schedstat") or "") for t in tasks]
    known = [w for w in waits if w is not None]
    return sum(known) if known else None


def our_cpus() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def cpu_snapshot() -> CpuSnapshot | None:
    """The counters now; None where ``/proc/stat`` cannot be read (not Linux)."""
    stat = _read("/proc/stat")
    if stat is None:
        return None
    busy, steal, total = parse_stat(stat, our_cpus())
    load = _read("/proc/loadavg")
    return CpuSnapshot(
        busy, steal, total, time.process_time(), time.monotonic(),
        parse_loadavg(load) if load else None, own_wait_s(),
    )


@dataclass(frozen=True)
class CpuReading:
    """What happened on our CPUs between two snapshots."""

    other_cores: float  # cores' worth of CPU time used by other processes
    steal_frac: float  # of our CPUs' total time
    cpus: int
    load_avg_1m: float | None
    wait_cores: float | None = None  # cores' worth of our threads' run-queue wait


def cpu_between(a: CpuSnapshot, b: CpuSnapshot, cpus: int, hz: int | None = None) -> CpuReading:
    """Other processes' CPU use and steal between snapshots ``a`` and ``b``.

    The kernel counts in ticks (``hz`` per second, usually 100): each CPU's count can be off
    by a tick at either end, so up to ``2 * cpus`` ticks of apparent use are noise. That
    slack is taken off before dividing by the interval, so a short interval reads low
    rather than flagging contention that is only rounding."""
    hz = hz or os.sysconf("SC_CLK_TCK")
    wall = max(b.wall_s - a.wall_s, 1e-9)
    busy_s = (b.busy_ticks - a.busy_ticks) / hz
    own_s = b.own_cpu_s - a.own_cpu_s
    slack_s = 2 * cpus / hz
    other = min(max(busy_s - own_s - slack_s, 0.0) / wall, float(cpus))
    total = max(b.total_ticks - a.total_ticks, 1)
    steal = max(b.steal_ticks - a.steal_ticks - 2 * cpus, 0) / total
    wait = None
    if a.wait_s is not None and b.wait_s is not None:
        wait = max(b.wait_s - a.wait_s, 0.0) / wall
    return CpuReading(other, steal, cpus, b.load_avg_1m, wait)


def assess(cpu: CpuReading | None, threads: int, gpu: dict | None = None) -> tuple[bool, str]:
    """(contended, reason) from the readings; the reason also says what was seen when clean."""
    problems, seen = [], []
    if cpu is not None:
        spare = max(cpu.cpus - threads, 0)
        seen.append(f"others used {cpu.other_cores:.2f} of {cpu.cpus} cores (we use {threads})")
        if cpu.other_cores > spare + OTHER_CORES_MARGIN:
            problems.append(
                f"other processes used {cpu.other_cores:.2f} cores of {cpu.cpus} "
                f"while this point used {threads}"
            )
        if cpu.wait_cores is not None:
            waited = cpu.wait_cores / max(threads, 1)
            seen.append(f"our threads waited {waited:.0%} of the time for a CPU")
            if waited > WAIT_LIMIT:  # others' use named when that rule did not fire
                others = "" if problems else (
                    f" (others used {cpu.other_cores:.2f} of {cpu.cpus} cores)")
                problems.append(
                    f"this point's threads waited {waited:.0%} of the time for a CPU{others}")
        if cpu.steal_frac > STEAL_LIMIT:
            problems.append(f"CPU steal {cpu.steal_frac:.0%}")
        if cpu.load_avg_1m is not None:
            seen.append(f"load {cpu.load_avg_1m:.2f}")
    else:
        seen.append("CPU: unavailable: /proc/stat not readable")
    if gpu:
        others = gpu.get("gpu_other_processes")
        if isinstance(others, int) and others > 0:
            problems.append(f"{others} other process(es) on the GPU")
        throttle = gpu.get("gpu_throttle_reasons")
        if isinstance(throttle, int) and throttle & GPU_CONTENTION_BITS:
            problems.append(f"GPU clocks throttled (NVML reasons {throttle:#x})")
        if isinstance(gpu.get("gpu_contention_status"), str):
            seen.append(f"GPU: {gpu['gpu_contention_status']}")
    if problems:
        return True, "; ".join(problems) + (f" ({load})" if (load := _load_text(cpu)) else "")
    return False, "; ".join(seen)


def _load_text(cpu: CpuReading | None) -> str:
    return "" if cpu is None or cpu.load_avg_1m is None else f"load {cpu.load_avg_1m:.2f}"


def ancestors(pid: int, read: Callable[[str], str | None] | None = None) -> set[int]:
    """PIDs of ``pid``'s parent, its parent's parent, ... (from ``/proc/<pid>/stat``)."""
    read = read or _read
    found: set[int] = set()
    while pid > 1:
        stat = read(f"/proc/{pid}/stat")
        if stat is None:
            break
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        fields = stat.rsplit(")", 1)[-1].split()
        pid = int(fields[1]) if len(fields) > 1 else 0
        if pid in found:  # a loop would be a corrupt read: stop
            break
        if pid > 1:
            found.add(pid)
    return found


def other_gpu_processes(
    listed: set[int], own: int, ours: set[int], visible: Callable[[int], bool]
) -> int:
    """How many of the PIDs NVML ``listed`` on the board belong to someone else.

    ``own``: this process; ``ours``: the harness processes that wait while it times (its
    ancestors); ``visible(pid)``: whether the PID exists in this PID namespace. Inside a
    container NVML may report host PIDs, which match nothing here: then this process's own
    entry is one of those unresolved ones, so one of them is not counted."""
    others = listed - {own} - ours
    unresolved = {pid for pid in others if not visible(pid)}
    mine_unmatched = 0 if own in listed else 1
    return len(others - unresolved) + max(len(unresolved) - mine_unmatched, 0)


def gpu_readings(index: int) -> dict:
    """Other processes with a context on GPU ``index`` and the current clock-event reasons
    (NVML, the board matched by UUID).

    Without NVML: ``gpu_contention_status = "unavailable: <reason>"`` and no numbers."""
    try:
        import pynvml

        pynvml.nvmlInit()
        dev = nvml.handle(index)
        procs = list(pynvml.nvmlDeviceGetComputeRunningProcesses(dev))
        procs += list(pynvml.nvmlDeviceGetGraphicsRunningProcesses(dev))
        reasons = nvml.clock_event_reasons(dev)
    except Exception as exc:  # no driver, no library, or a field this board does not support
        return {"gpu_contention_status": f"unavailable: NVML ({type(exc).__name__}: {exc})"}
    own = os.getpid()
    others = other_gpu_processes(
        {p.pid for p in procs}, own, ancestors(own), lambda pid: os.path.exists(f"/proc/{pid}")
    )
    return {
        "gpu_other_processes": others,
        "gpu_throttle_reasons": int(reasons),
        "gpu_contention_status": "ok",
    }


class Interval:
    """Brackets one timing interval: ``start()`` before, ``columns()`` after."""

    def __init__(self, threads: int, gpu_index: int | None = None):
        self.threads, self.gpu_index = threads, gpu_index
        self._start: CpuSnapshot | None = None

    def start(self) -> None:
        self._start = cpu_snapshot()

    def columns(self) -> dict:
        """``contended``, ``contention`` and the readings behind them."""
        end = cpu_snapshot()
        cpus = len(our_cpus() or ()) or os.cpu_count() or 1
        cpu = cpu_between(self._start, end, cpus) if self._start and end else None
        gpu = gpu_readings(self.gpu_index) if self.gpu_index is not None else None
        contended, reason = assess(cpu, self.threads, gpu)
        out = {"contended": contended, "contention": reason}
        if cpu is not None:
            out.update(
                other_cpu_cores=round(cpu.other_cores, 3),
                cpu_steal_frac=round(cpu.steal_frac, 4),
                load_avg_1m=cpu.load_avg_1m,
            )
        return out | (gpu or {})


# --- rows: what claims, compare and report ask -----------------------------------------------


def contended_mask(rows: pd.DataFrame) -> pd.Series:
    """True for rows flagged ``contended`` (rows without the column count as clean)."""
    if "contended" not in rows.columns:
        return pd.Series(False, index=rows.index)
    return rows["contended"].map(lambda v: v is True or v == 1).astype(bool)


def notice(rows: pd.DataFrame, what: str = "rows") -> str | None:
    """One line saying how many ``rows`` were measured under contention (None when none)."""
    flagged = contended_mask(rows)
    if not flagged.any():
        return None
    reasons = rows.loc[flagged, "contention"].dropna().astype(str) if "contention" in rows else []
    example = f"; e.g. {reasons.iloc[0]}" if len(reasons) else ""
    return f"{int(flagged.sum())} of {len(rows)} {what} were measured under contention{example}"


def usable_rows(rows: pd.DataFrame, allow_contended: bool) -> tuple[pd.DataFrame, str | None]:
    """The rows verdicts may use, and a notice: flagged rows are left out unless allowed."""
    note = notice(rows)
    if note is None or allow_contended:
        return rows, note and f"{note} (used, as --allow-contended asks)"
    return rows[~contended_mask(rows)], (
        f"{note}: left out of the verdicts (--allow-contended uses them)"
    )
