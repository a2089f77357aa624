"""Time ``full`` and ``sdpa-math`` at n = 1024 in many fresh processes, the way a run does, and
show per process and pass what the calls cost: CPU time, user vs system time, minor page faults.

Usage: python scripts/malloc_modes.py [--processes 12] [--passes 3] [--malloc tuned|default]
                                       [--seq-len 1024] [--json OUT.jsonl]

Each process is a fresh interpreter that builds the points from a suite like
``suites/smoke.toml`` (B1 H4 D32 float32, one thread, 0.25 s budget) and runs them as the
runner does: pass 0 is :func:`harness.execute.runner.run_point` (agreement, peak memory, a
timing pass), later passes :func:`harness.execute.runner.time_pass`, each pass in its own
shuffled order; the points are those of the smoke suite at that length (``full`` and
``sdpa-math``, dense and causal). Its CPU device counts ``getrusage(RUSAGE_THREAD)`` around
every timed sample, so the figures are those of the timed calls alone (warm-up, set-up and the
reference kernel are outside them): per pass, the median sample's CPU time per call, user and
system time and minor faults per call over all its samples, and how many samples faulted in
more than 100 pages a call.

``--malloc default`` sets ``ATTNBENCH_MALLOC=default`` in the processes: glibc's allocator as
it comes (what every run did before ``harness.measure.allocator``); ``tuned`` (the default)
lets the harness apply its allocator settings. docs/noise.md ("Two modes of the
memory-heavy points") has the measurement this was written for.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

IMPLS = ("full", "sdpa-math")


def child(seq_len: int, passes: int, seed: int) -> list[dict]:
    """One process's records: per (implementation, pass), the timed samples' CPU time, user and
    system time and minor faults per call (the harness's own runner functions do the work)."""
    import numpy as np
    import torch

    from harness.execute.runner import run_point, time_pass
    from harness.measure import allocator
    from harness.measure.device import CpuDevice
    from harness.measure.passes import pass_orders
    from harness.measure.refkernel import ReferenceKernel
    from harness.sweep.suite import parse_suite

    class CountingCpu(CpuDevice):
        """The CPU device, with the thread's rusage counted around every timed sample."""

        def __init__(self) -> None:
            super().__init__()
            self.reset()

        def reset(self) -> None:
            self.calls, self.user, self.system, self.faults = 0, 0.0, 0.0, 0
            self.faulting = self.samples = 0

        def time_issue(self, fn, calls):
            before = resource.getrusage(resource.RUSAGE_THREAD)
            times = super().time_issue(fn, calls)
            after = resource.getrusage(resource.RUSAGE_THREAD)
            self.calls += calls
            self.user += after.ru_utime - before.ru_utime
            self.system += after.ru_stime - before.ru_stime
            self.faults += after.ru_minflt - before.ru_minflt
            self.samples += 1
            self.faulting += (after.ru_minflt - before.ru_minflt) > 100 * calls
            return times

    torch.set_num_threads(1)
    doc = {
        "name": "malloc-modes",
        "scenario": "attention",
        "implementations": list(IMPLS),
        "device": "cpu",
        "fixed": {"batch": 1, "heads": 4, "head_dim": 32, "dtype": "float32", "seq_len": seq_len},
        "sweep": {"causal": [False, True]},
        "measure": {"budget_s": 0.25, "min_samples": 5, "threads": 1, "passes": passes},
    }
    suite = parse_suite(doc)
    device = CountingCpu()
    ref = ReferenceKernel(CpuDevice())  # its own device: its calls are not counted
    records = []
    for k, order in enumerate(pass_orders(len(suite.points), passes, seed)):
        for index in order:
            point = suite.points[index]
            device.reset()
            if k == 0:
                out = run_point(point, suite.measure, device, None, ref)
            else:
                out = time_pass(point, suite.measure, device, ref)
            n = max(device.calls, 1)
            records.append(
                {
                    "impl": point.impl + (" causal" if point.mask.causal else ""),
                    "pass": k,
                    "status": out.get("status"),
                    "cpu_ms": 1e3 * float(np.median(out.get("cpu_time_samples_s") or [np.nan])),
                    "wall_ms": 1e3 * float(np.median(out.get("time_samples_s") or [np.nan])),
                    "user_ms": 1e3 * device.user / n,
                    "sys_ms": 1e3 * device.system / n,
                    "faults": device.faults / n,
                    "calls": device.calls,
                    "samples": device.samples,
                    "faulting_samples": device.faulting,
                    "peak_mem_bytes": out.get("peak_mem_bytes"),
                    "mem_method": out.get("mem_method"),
                    "malloc_tuning": allocator.state(),
                }
            )
    return records


def run_processes(args: argparse.Namespace) -> list[dict]:
    env = dict(os.environ)
    env.pop("ATTNBENCH_MALLOC", None)
    if args.malloc == "default":
        env["ATTNBENCH_MALLOC"] = "default"
    found = []
    for proc in range(args.processes):
        load = os.getloadavg()[0]
        cmd = [
            sys.executable,
            __file__,
            "--child",
            "--passes",
            str(args.passes),
            "--seq-len",
            str(args.seq_len),
            "--seed",
            str(proc),
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
        if out.returncode != 0:
            sys.exit(f"process {proc} failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
        for record in json.loads(out.stdout):
            found.append({"process": proc, "load_1m": load, **record})
        rows = [r for r in found if r["process"] == proc]
        print(f"process {proc:2d} (load {load:4.1f}):", flush=True)
        for r in sorted(rows, key=lambda r: (r["impl"], r["pass"])):
            print(
                f"  {r['impl']:17s} pass {r['pass']}: {r['cpu_ms']:5.1f} ms CPU (user "
                f"{r['user_ms']:5.1f}, sys {r['sys_ms']:4.1f}), {r['faults']:6.0f} faults/call, "
                f"{r['faulting_samples']}/{r['samples']} samples faulting",
                flush=True,
            )
    return found


def histogram(records: list[dict], impl: str, width: float = 2.0) -> str:
    """Text histogram of the per-pass CPU medians of ``impl`` (bins of ``width`` ms)."""
    values = sorted(r["cpu_ms"] for r in records if r["impl"] == impl)
    if not values:
        return f"{impl}: no passes"
    lines = [f"{impl}: {len(values)} passes, CPU ms per call (median of each pass)"]
    low = int(values[0] // width) * width
    edge = low
    while edge <= values[-1]:
        count = sum(edge <= v < edge + width for v in values)
        faults = [
            r["faults"] for r in records if r["impl"] == impl and edge <= r["cpu_ms"] < edge + width
        ]
        tail = f"  faults/call {min(faults):.0f}-{max(faults):.0f}" if faults else ""
        lines.append(f"  {edge:5.1f}-{edge + width:5.1f} | {'#' * count}{tail}")
        edge += width
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=12)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--malloc", choices=("tuned", "default"), default="tuned")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--json", help="write every record here (JSON Lines)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.processes < 1 or args.passes < 1 or args.seq_len < 1:
        parser.error("--processes, --passes and --seq-len must be positive")
    if args.child:
        print(json.dumps(child(args.seq_len, args.passes, args.seed)))
        return 0
    records = run_processes(args)
    for impl in sorted({r["impl"] for r in records}):
        print(histogram(records, impl))
    states = sorted({r["malloc_tuning"] for r in records})
    print(
        f"malloc_tuning: {', '.join(states)}; load {min(r['load_1m'] for r in records):.1f}"
        f"-{max(r['load_1m'] for r in records):.1f}"
    )
    if args.json:
        Path(args.json).write_text("".join(json.dumps(r) + "\n" for r in records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
