"""Is attnbench's median right? Compare it with torch.utils.benchmark on the same op and
thread count, interleaving the two so machine drift hits both alike.

    python benchmarks/timing_check.py [--n 2048] [--rounds 3]

Prints both medians and their ratio per implementation; exits 1 if any differs by > 5%.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.utils.benchmark as tub

from harness import registry
from harness.masks import MaskSpec
from harness.measure.device import CpuDevice
from harness.measure.timing import TimingConfig, measure


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--impls", default="sdpa-flash,full,flash-tiled")
    args = parser.parse_args()
    threads = torch.get_num_threads()
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, args.n, 64, generator=gen) for _ in range(3))
    worst = 0.0
    print(f"n={args.n} B=1 H=8 D=64 fp32 causal, threads={threads}")
    for name in args.impls.split(","):
        impl = registry.get(name)
        mask = MaskSpec(causal=True)

        def call(impl=impl, mask=mask):
            with torch.no_grad():
                return impl(q, k, v, mask)

        ours, theirs = [], []
        for _ in range(args.rounds):
            ours.append(measure(call, CpuDevice(), TimingConfig(budget_s=2.0)).median)
            timer = tub.Timer(stmt="call()", globals={"call": call}, num_threads=threads)
            theirs.append(timer.blocked_autorange(min_run_time=2.0).median)
        a, b = sorted(ours)[len(ours) // 2], sorted(theirs)[len(theirs) // 2]
        worst = max(worst, abs(a / b - 1))
        print(
            f"{name:12s} attnbench {a * 1e3:9.3f} ms   torch.utils.benchmark {b * 1e3:9.3f} ms"
            f"   ratio {a / b:.4f}"
        )
    print(f"largest difference: {worst:.2%}")
    return 0 if worst <= 0.05 else 1


if __name__ == "__main__":
    sys.exit(main())
