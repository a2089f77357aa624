"""How fast does ``attnbench --help`` answer? Target: under 1 s on a 2-core machine (the
command line imports no torch, pandas or matplotlib before a subcommand is chosen;
tests/harness/cli/test_cli.py checks the imports, this script the time).

    python benchmarks/cli_help.py [--runs 5]

Runs ``python -m harness.cli --help`` in fresh interpreters, prints each wall time and the
median with the load average beside it; exits 1 when the median is over the target.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

TARGET_S = 1.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "harness.cli", "--help"], check=True,
                       stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    print(" ".join(f"{t:.3f}" for t in times)
          + f"  median {median:.3f} s (target < {TARGET_S} s), load {os.getloadavg()[0]:.1f}")
    return 0 if median < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
