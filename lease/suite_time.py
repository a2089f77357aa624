"""Each GPU claims suite's time on one H100, derived from the rows the H100 leases measured.

    python lease/suite_time.py [SUITE.toml ...]   # default: every GPU claims suite

The figure each suite's header states (what a lease's ``attnbench verdicts --minutes`` should
allow). Per point: ``OVERHEAD_S`` (what a point cost beyond its timing on the lease: its first
call, float64 check, memory and NVML readings, ~0.7 s) + ``passes`` x max(``budget_s``,
``min_samples`` x t) + ``CALLS_OUTSIDE`` x t (first call, warm-up, check, memory), where t, the
call's time, is the point's executed FLOPs at the rate its implementation reached on the lease
(graph-timed: ``GRAPH_CALLS`` more calls, to capture and compare the replay):

- the highest rate (executed FLOPs over the median) of that implementation's rows in
  ``tests/harness/analysis/data/h100/`` (copies of the first lease's rows, eager) and in the
  third lease's ``linear-targets.json`` (the linear family's device times at B1, eager, by the
  script the claims of the linear family replaced);
- else ``DEFAULT_RATE`` (300 TFLOP/s, as scripts/suite_time.py assumes), and the line says how
  many points that is.

A decode or block point also builds a model (``MODEL_S`` more), a run starts with the
calibration (``START_S``), and fla-linear's first call autotunes fla's kernels
(``FIRST_CALL_S``). The highest rate is the lease's saturated one: a suite at larger batches
fills the GPU at least as well, and a graph replay takes the host out of the call.
An estimate from measured rates, not a measurement: the proof's ``steps.tsv`` gives the real
figure.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.measure.graphs import WARMUP_CALLS  # noqa: E402
from harness.results import load_rows  # noqa: E402
from harness.scenarios.interface import Point, cost_of  # noqa: E402
from harness.sweep.suite import load_suite  # noqa: E402

LEASE_ROWS = ROOT / "tests/harness/analysis/data/h100"
LINEAR_TARGETS = ROOT / "docs/results/h100/2026-11-26-third-lease/linear-targets.json"
# the first lease's claims-gpu: 61 points (43 ok) in 51 s at budget 0.2 s x 2 passes, 5 s of
# calibration: (51 - 5 - 43 x 2 x 0.2) / 43 = 0.67 s a point beyond its timing
OVERHEAD_S = 0.7
CALLS_OUTSIDE = 4
# a graph-timed point also warms up before capture, replays once and calls once eagerly to
# compare (harness/measure/graphs.py)
GRAPH_CALLS = WARMUP_CALLS + 2
START_S = 5.0
MODEL_S = 0.8  # a decode or block point builds its model and prefills (not yet measured)
# once a process: fla's own autotuning at its first call (43.7 s on the first lease)
FIRST_CALL_S = {"fla-linear": 44.0}
DEFAULT_RATE = 300e12


@dataclass(frozen=True)
class SuiteTime:
    name: str
    points: int
    seconds: float
    defaulted: int  # points timed at DEFAULT_RATE (no lease row of their implementation)
    longest_call_s: float


def lease_rates() -> dict[str, float]:
    """impl -> the highest executed FLOP/s of its lease rows (attention scenario, ok)."""
    rates: dict[str, float] = {}
    for folder in sorted(LEASE_ROWS.iterdir()):
        rows = load_rows(folder)
        ok = rows[(rows["status"] == "ok") & (rows["scenario"] == "attention")]
        for impl, part in ok.groupby("impl"):
            rate = float((part["executed_flops"] / part["time_median_s"]).max())
            rates[impl] = max(rates.get(impl, 0.0), rate)
    for row in json.loads(LINEAR_TARGETS.read_text())["rows"]:
        if not row.get("device_ms") or row["row"] != row["impl"]:  # "linear-torch": not run
            continue
        point = Point.of(row["impl"], "attention", device="cuda", dtype="bfloat16", batch=1,
                         seq_len=row["n"], heads=16, head_dim=64, causal=bool(row["causal"]))
        rate = cost_of(point).executed_flops / (row["device_ms"] / 1e3)
        rates[row["impl"]] = max(rates.get(row["impl"], 0.0), rate)
    return rates


def estimate(path: Path, rates: dict[str, float]) -> SuiteTime:
    """The suite's time on one H100 (see the module docstring)."""
    suite = load_suite(path)
    timing, passes = suite.measure.timing, max(suite.measure.passes, 1)
    seconds, defaulted, longest = START_S, 0, 0.0
    seconds += sum(FIRST_CALL_S.get(impl, 0.0) for impl in {p.impl for p in suite.points})
    for point in suite.points:
        cost = cost_of(point)
        rate = rates.get(point.impl) if point.scenario == "attention" else None
        defaulted += rate is None
        t = cost.executed_flops / (rate or DEFAULT_RATE)
        longest = max(longest, t)
        seconds += OVERHEAD_S + passes * max(timing.budget_s, timing.min_samples * t)
        seconds += (CALLS_OUTSIDE + GRAPH_CALLS * bool(suite.measure.cuda_graph)) * t
        if point.scenario.split("+")[0] in ("decode", "block"):
            seconds += MODEL_S
    return SuiteTime(suite.name, len(suite.points), seconds, defaulted, longest)


def gpu_suites() -> list[Path]:
    """Every claims suite for a CUDA device."""
    return [p for p in sorted((ROOT / "suites").glob("claims-*.toml"))
            if load_suite(p).points[0].device == "cuda"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suites", nargs="*", type=Path)
    args = parser.parse_args()
    rates = lease_rates()
    for path in args.suites or gpu_suites():
        t = estimate(path, rates)
        print(f"{t.name}: {t.points} points, ~{t.seconds:.0f} s on one H100 (longest call "
              f"{t.longest_call_s * 1e3:.1f} ms; {t.defaulted} points at "
              f"{DEFAULT_RATE / 1e12:.0f} TFLOP/s, the rest at their lease rate)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
