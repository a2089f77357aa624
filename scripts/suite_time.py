"""Estimate a suite's run time from its FLOP counts, before running it on a device.

Usage: python scripts/suite_time.py SUITE.toml [SUITE.toml ...] [--tflops 300]
Per point: t = useful (executed) FLOPs / rate; the point takes about
passes·max(budget_s, min_samples·t) + 3·t (warm-up, agreement check, first call), doubled for block
points (the mixer is timed again on half the budget). Points the device cannot run (an
unavailable implementation) cost nothing. Calibration adds ~5 s per run. An estimate, not a
measurement: kernels below the assumed rate take longer.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.scenarios.interface import cost_of
from harness.sweep.suite import load_suite


def estimate(path: str, rate: float) -> tuple[int, float, float, float]:
    """(points, total FLOPs of one call per point, largest call in seconds, estimated seconds)."""
    suite = load_suite(path)
    m, passes = suite.measure.timing, max(suite.measure.passes, 1)
    total_flops, longest, seconds = 0.0, 0.0, 5.0
    for point in suite.points:
        try:
            flops = cost_of(point).executed_flops
        except Exception:  # an implementation that is not registered here: no model
            flops = cost_of(point).useful_flops
        t = flops / rate
        per_point = passes * max(m.budget_s, m.min_samples * t) + 3 * t
        if point.scenario.startswith("block"):
            per_point *= 2
        total_flops += flops
        longest = max(longest, t)
        seconds += per_point
    return len(suite.points), total_flops, longest, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suites", nargs="+")
    parser.add_argument("--tflops", type=float, default=300.0, help="assumed dense rate")
    args = parser.parse_args()
    for path in args.suites:
        n, flops, longest, seconds = estimate(path, args.tflops * 1e12)
        print(
            f"{path}: {n} points, {flops / 1e12:.1f} TFLOP over one call each, longest call "
            f"{longest * 1e3:.1f} ms, ~{seconds / 60:.1f} min at {args.tflops:g} TFLOP/s"
        )


if __name__ == "__main__":
    main()
