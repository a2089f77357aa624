"""The fused Triton kernels compiled ahead of time for sm_90 (H100) and sm_80 (A100), no GPU.

Every kernel the launch code uses, through the real launch code (meta tensors), bf16, for each
of its autotune configs, head dims and targets: registers, spilled bytes, shared memory (and
the target's limit), the tensor-core instruction kind, SASS size and the instructions of each
loop that holds an MMA (masked/unmasked ratio of the band kernels). Prints a markdown table.

    python benchmarks/aot_kernels.py [--ci] [--candidates] [--json OUT.json] [--workers N]

``--ci``: the CPU test suite's subset (the default config of each kernel, one mask per family,
``aot_check.CI_EXTRA``: four prefix-with-dilation defaults, and on sm_90 the forward's first
config of each Hopper path, a listed one before the candidates: at D 64 the listed TMA config).
``--candidates``: every candidate too
(``autotune.CANDIDATES``: the TMA and warp-specialized forward); columns ``tma`` (SASS
bulk tensor copies), ``bulk_tensor`` (PTX ``cp.async.bulk.tensor``) and ``setmaxnreg`` (SASS
``USETMAXREG``: a warp-specialized kernel's register hand-over).
Each autotuned kernel compiles the configs of the target's class (``autotune.SHAPES``;
``GATHERED_SHAPES`` for a kernel with both a prefix and dilation, which the
``*-dilated-prefix`` workloads compile); exit 1 when any of them spills, so the lists stay
spill-free. ``--workloads band-dilated-prefix decode-dilated-prefix`` checks those lists alone;
``--workloads feature-linear feature-performer`` the fused feature-map attention's three
kernels (pinned block sizes, ``feature_attention.tiles``); ``feature-linear-causal`` the causal
chunk kernel's three (``feature_attention.chunk_tiles``).
Needs Triton with its NVIDIA backend; run without ``TRITON_INTERPRET`` (exit 2 otherwise).
Exit 1 when a compile fails, a kernel exceeds its target's shared memory, a config spills, a
default's masked loop is over 1.5x the unmasked one, or the forward's default on sm_90 is over
its register target (``aot_check.verdicts``). A default a GPU measurement chose
(``autotune.MEASURED``) has its masked-loop ratio reported, not gated: the ratio is a
proxy of speed, and its speed was measured; spills and compile failures still fail it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import pandas as pd

if os.environ.get("TRITON_INTERPRET") == "1":
    print("aot_kernels: unset TRITON_INTERPRET (interpreted kernels do not compile)",
          file=sys.stderr)
    sys.exit(2)
try:
    from implementations.triton_kernels import aot_check
except Exception as exc:  # no Triton, or no NVIDIA backend in it
    print(f"aot_kernels: needs Triton's NVIDIA backend ({type(exc).__name__}: {exc})",
          file=sys.stderr)
    sys.exit(2)

from harness.render.page import markdown_table

COLUMNS = ["kernel", "workload", "config", "default", "candidate", "measured", "head_dim",
           "target", "regs", "spill_bytes", "smem_bytes", "mma", "tma", "bulk_tensor", "setmaxnreg",
           "sass", "loops", "masked_ratio", "cross_ratio", "error"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ci", action="store_true", help="the test suite's subset")
    parser.add_argument("--workloads", nargs="+", choices=list(aot_check.ALL_WORKLOADS))
    parser.add_argument("--candidates", action="store_true",
                        help="compile the candidates too (with every config)")
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--targets", nargs="+", default=list(aot_check.TARGETS),
                        choices=list(aot_check.TARGETS))
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    dims, targets = tuple(args.head_dims), tuple(args.targets)
    start = time.monotonic()
    if args.ci and not args.workloads:
        todo = aot_check.ci_jobs(dims, targets)
    else:
        workloads = tuple(args.workloads or aot_check.ALL_WORKLOADS)
        todo = aot_check.jobs(workloads, dims, targets, not args.ci, args.candidates)
    print(f"aot_kernels: {len(todo)} compiles on {args.workers} workers", file=sys.stderr)
    rows = aot_check.run_jobs(todo, args.workers)
    seconds = time.monotonic() - start
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"seconds": seconds, "rows": rows}, fh, indent=1)
    table = pd.DataFrame(rows).reindex(columns=COLUMNS)
    table["loops"] = table["loops"].map(lambda x: "/".join(map(str, x)) if isinstance(x, list |
                                        tuple) else "")
    table["measured"] = table["measured"].map(lambda x: "yes" if isinstance(x, str) else "")
    for ratio in ("masked_ratio", "cross_ratio"):
        table[ratio] = table[ratio].map(lambda x: f"{x:.2f}" if x == x and x else "")
    print(markdown_table(table.astype(object).fillna("")))
    print(f"\n{len(rows)} compiles in {seconds:.0f} s", file=sys.stderr)
    failures, notes = aot_check.verdicts(rows)
    for line in notes + failures:
        print(f"aot_kernels: {line}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
