"""The sparse families' targets on this CPU (O(n·w) time and memory), measured in one run.

Problem: B=1, H=8, D=64, float32, causal sliding window of 256 keys = (255, 0), n = 2k..16k.
Targets: ``local`` time and peak-memory exponents in n <= 1.15; ``local`` at the largest n at
least 8x faster than dense causal ``sdpa-flash`` and at least as fast as ``flex-local``;
``local`` useful FLOP/s >= 35 % of this machine's fp32 matmul peak (measured in the same run);
``dilated`` (d=2) within 2x of ``local``; ``longformer`` (16 globals) within 1.5x; the fitted
exponent of ``masked-dense`` ~2.

Timing is the harness's adaptive median (:func:`harness.measure.timing.measure`), memory the
harness's
CPU peak (torch.profiler allocator events, :meth:`harness.measure.device.CpuDevice.peak_memory`).
Run: ``python benchmarks/sparse_targets.py [--sizes 2048 4096 8192 16384] [--budget 1.0]``.
On a machine shared with other jobs the wall clock is not this process's: ``--threads 1
--cpu-clock`` times by process CPU time instead (ratios and exponents, not 2-thread speed).
"""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import dataclass

import numpy as np
import torch

from harness import registry
from harness.masks import MaskSpec, kept_pairs
from harness.measure.calibrate import measure_matmul_peak
from harness.measure.device import get_device
from harness.measure.timing import TimingConfig, measure
from harness.spec import Problem

B, H, D = 1, 8, 64
WINDOW = (255, 0)
CASES = {  # label -> (implementation, mask)
    "local": ("local", MaskSpec(causal=True, window=WINDOW)),
    "dilated d=2": ("dilated", MaskSpec(causal=True, window=WINDOW, dilation=2)),
    "longformer g=16": ("longformer", MaskSpec(causal=True, window=WINDOW, global_tokens=16)),
    "flex-local": ("flex-local", MaskSpec(causal=True, window=WINDOW)),
    "masked-dense": ("masked-dense", MaskSpec(causal=True, window=WINDOW)),
    "sdpa-flash causal": ("sdpa-flash", MaskSpec(causal=True)),
}


@dataclass(frozen=True)
class Figure:
    label: str
    n: int
    median_s: float
    iqr_s: float
    first_call_s: float
    peak_bytes: int
    useful_flops: float


def cpu_time_measure(fn, config: TimingConfig) -> tuple[float, float, float]:
    """(min, IQR, first call) of this process's CPU time per call: on a shared machine the
    wall clock counts other processes' work, CPU time does not (meaningful with 1 thread)."""
    start = time.process_time()
    fn()
    first = time.process_time() - start
    samples: list[float] = []
    deadline = time.perf_counter() + config.budget_s
    while len(samples) < config.min_samples or time.perf_counter() < deadline:
        start = time.process_time()
        fn()
        samples.append(time.process_time() - start)
    q1, q3 = np.percentile(samples, [25, 75])
    return min(samples), float(q3 - q1), first


def run_case(label: str, n: int, config: TimingConfig, cpu_clock: bool = False) -> Figure:
    """Prepare (untimed), time and take the peak memory of one (implementation, n)."""
    name, mask = CASES[label]
    impl = registry.get(name)
    problem = Problem(B, H, n, n, D, mask=mask)
    reasons = impl.not_supported(problem)
    if reasons:
        raise RuntimeError(f"{label}: {'; '.join(reasons)}")
    gen = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(B, H, n, D, generator=gen) for _ in range(3))
    device = get_device("cpu")
    with torch.no_grad():
        fn = impl.prepare(problem)
        if cpu_clock:
            median, iqr, first = cpu_time_measure(lambda: fn(q, k, v), config)
        else:
            m = measure(lambda: fn(q, k, v), device, config)
            median, iqr, first = m.median, m.iqr, m.first_call_s
        peak = device.peak_memory(lambda: fn(q, k, v)).peak_bytes
    useful = 4.0 * B * H * D * kept_pairs(mask, n, n)
    return Figure(label, n, median, iqr, first, peak, useful)


def slope(ns: list[int], ys: list[float]) -> float:
    """Least-squares slope of log(y) against log(n)."""
    return float(np.polyfit(np.log(ns), np.log(ys), 1)[0])


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def report(figs: dict[tuple[str, int], Figure], sizes: list[int], peak: float) -> None:
    print(
        f"\n{'case':<18} {'n':>6} {'time ms':>10} {'iqr ms':>8} {'first s':>8} "
        f"{'peak MiB':>9} {'useful GF/s':>11} {'% peak':>7}"
    )
    for (label, n), f in figs.items():
        gfs = f.useful_flops / f.median_s / 1e9
        print(
            f"{label:<18} {n:>6} {f.median_s * 1e3:>10.1f} {f.iqr_s * 1e3:>8.1f} "
            f"{f.first_call_s:>8.2f} {f.peak_bytes / 2**20:>9.1f} {gfs:>11.1f} "
            f"{100 * gfs * 1e9 / peak:>6.1f}%"
        )
    print(f"\n{'case':<18} {'time exp':>9} {'mem exp':>8}   local slopes (time)")
    for label in CASES:
        ns = [n for n in sizes if (label, n) in figs]
        if len(ns) < 2:
            continue
        t = [figs[label, n].median_s for n in ns]
        mem = [figs[label, n].peak_bytes for n in ns]
        steps = " ".join(f"{slope(ns[i : i + 2], t[i : i + 2]):.2f}" for i in range(len(ns) - 1))
        print(f"{label:<18} {slope(ns, t):>9.2f} {slope(ns, mem):>8.2f}   {steps}")
    targets(figs, sizes, peak)


def targets(figs: dict[tuple[str, int], Figure], sizes: list[int], peak: float) -> None:
    top = max(sizes)

    def t(label: str) -> float:
        return figs[label, top].median_s if (label, top) in figs else math.nan

    ns = [n for n in sizes if ("local", n) in figs]
    local_t = slope(ns, [figs["local", n].median_s for n in ns])
    local_m = slope(ns, [figs["local", n].peak_bytes for n in ns])
    md = [n for n in sizes if ("masked-dense", n) in figs]
    md_exp = slope(md, [figs["masked-dense", n].median_s for n in md]) if len(md) > 1 else math.nan
    local_pct = figs["local", top].useful_flops / t("local") / peak
    rows = [
        ("local time exponent <= 1.15", f"{local_t:.2f}", local_t <= 1.15),
        ("local memory exponent <= 1.15", f"{local_m:.2f}", local_m <= 1.15),
        (
            f"sdpa-flash / local at n={top} >= 8",
            f"{t('sdpa-flash causal') / t('local'):.1f}x",
            t("sdpa-flash causal") / t("local") >= 8,
        ),
        (
            f"flex-local / local at n={top} >= 1",
            f"{t('flex-local') / t('local'):.2f}x",
            t("flex-local") / t("local") >= 1,
        ),
        ("local useful FLOP/s >= 35% of peak", f"{100 * local_pct:.1f}%", local_pct >= 0.35),
        (
            "dilated / local <= 2",
            f"{t('dilated d=2') / t('local'):.2f}x",
            t("dilated d=2") / t("local") <= 2,
        ),
        (
            "longformer / local <= 1.5",
            f"{t('longformer g=16') / t('local'):.2f}x",
            t("longformer g=16") / t("local") <= 1.5,
        ),
        ("masked-dense time exponent ~2", f"{md_exp:.2f}", abs(md_exp - 2) <= 0.3),
    ]
    print(
        f"\nmatmul peak (fp32, 2048^3, median): {peak / 1e9:.1f} GFLOP/s; "
        f"threads {torch.get_num_threads()}; load average {os.getloadavg()[0]:.1f}"
    )
    for what, figure, ok in rows:
        print(f"  {verdict(ok)}  {what:<40} {figure}")


def matmul_peak(cpu_clock: bool) -> float:
    """fp32 GEMM FLOP/s: the harness's median wall-clock figure, or the best CPU-time one."""
    if not cpu_clock:
        return measure_matmul_peak("cpu", budget_s=1.5)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    best, _, _ = cpu_time_measure(lambda: a @ b, TimingConfig(budget_s=1.5, min_samples=5))
    return 2 * 2048**3 / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    parser.add_argument("--budget", type=float, default=1.0, help="timing budget per point, s")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument(
        "--cpu-clock",
        action="store_true",
        help="time by process CPU time (min of samples), peak included: a proxy for a busy "
        "machine; use with --threads 1",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = TimingConfig(budget_s=args.budget, min_samples=5)
    peak_before = matmul_peak(args.cpu_clock)
    figs = {}
    for label in args.cases:
        for n in args.sizes:
            figs[label, n] = run_case(label, n, config, args.cpu_clock)
            f = figs[label, n]
            print(
                f"{label:<18} n={n:>6} {f.median_s * 1e3:9.1f} ms  peak "
                f"{f.peak_bytes / 2**20:8.1f} MiB  first call {f.first_call_s:6.2f} s",
                flush=True,
            )
    peak = max(peak_before, matmul_peak(args.cpu_clock))
    report(figs, args.sizes, peak)


if __name__ == "__main__":
    main()
