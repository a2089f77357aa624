"""How fast does ``attnbench --help`` answer? Target: under 1 s on a 2-core machine (the
command line imports no torch, pandas or matplotlib before a subcommand is chosen;
tests/harness/cli/test_cli.py checks the imports, this script the time).

    python benchmarks/cli_help.py [--runs 5]

Times ``python -m harness.cli --help`` in fresh interpreters with the harness's timer
(:func:`harness.measure.timing.measure` on the CPU device: wall clock, median of ``--runs``
samples), prints the median with the load average beside it; exits 1 when it is over the
target.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from harness.measure.device import CpuDevice
from harness.measure.timing import TimingConfig, measure

TARGET_S = 1.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    def help_once() -> None:
        subprocess.run([sys.executable, "-m", "harness.cli", "--help"], check=True,
                       stdout=subprocess.DEVNULL)

    config = TimingConfig(budget_s=0.1, min_samples=args.runs, max_samples=args.runs,
                          warmup_calls=0, min_sample_s=0.0)
    timed = measure(help_once, CpuDevice(), config)
    print(" ".join(f"{t:.3f}" for t in timed.samples)
          + f"  median {timed.median:.3f} s (target < {TARGET_S} s), load {os.getloadavg()[0]:.1f}")
    return 0 if timed.median < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
