"""Launches per call and CPU time of the linear-complexity attentions, this tree against the old.

Two measurements, B1 H8 D64 float32 on the CPU:

1. **Launches per call**: the ATen ops one call dispatches (a ``TorchDispatchMode`` count; on a
   GPU each is at most one kernel launch), at n = 1k, 4k, 16k, 64k, for ``linear`` and
   ``performer`` (not causal and causal), ``linformer`` and ``nystrom``: this tree with one
   segment (a GPU's default), this tree with the CPU's segments, and the old code.
   Beside them, the fused Triton path (``fused = 1``: kernel launches and host ATen ops, the
   launches recorded, not run, so a CPU counts them at any n under ``TRITON_INTERPRET=1``),
   or the reason a member has no fused path.
2. **CPU time** at n = 16k, one thread and two threads: the old code against this tree (the
   CPU policy, and one segment, the choice a CPU does not make), interleaved in one process
   (every round calls each variant once, in a rotated order), median over the rounds.

The old code is the tree at ``--old-ref`` (default: main before the chunkwise-parallel form,
``OLD_REF``), its modules read with ``git show REF:path`` into a temporary package whose imports
point at each other, and imported with the registry's ``register`` made a no-op (they would
register the same names again); their functions are then called directly, as this tree's are.

Usage::

    python benchmarks/linear_launches.py                 # both parts, printed as markdown
    python benchmarks/linear_launches.py --json out.json --rounds 7
    python benchmarks/linear_launches.py --lengths 256 512 --time-n 512 --rounds 1 --old-ref ""

``--old-ref ""`` skips the old code (no git needed). The figures are printed with the machine's
load average before and after: timings on a shared machine are contended.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import harness.registry  # noqa: E402
from harness.masks import MaskSpec  # noqa: E402
from harness.measure.dispatch import OpCount  # noqa: E402

# the old code's files under their names at OLD_REF: the feature-map machinery was
# implementations/_kernelized.py (+ _kernelized_spec.py) there, _feature_maps.py here
OLD_MODULES = ["_kernelized", "_kernelized_spec", "linear_attention", "performer", "linformer",
               "nystrom"]
# (name, causal, module, function)
CALLS = [
    ("linear", False, "linear_attention", "linear_attention"),
    ("linear", True, "linear_attention", "linear_attention"),
    ("performer", False, "performer", "performer_attention"),
    ("performer", True, "performer", "performer_attention"),
    ("linformer", False, "linformer", "linformer_attention"),
    ("nystrom", False, "nystrom", "nystrom_attention"),
]
ONE_SEGMENT = 2**40
OLD_REF = "6d01d76"  # main before the chunkwise-parallel form (8 MiB segments, chunk loop)
Fn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def load_old(ref: str, into: Path) -> dict[str, object] | None:
    """The old modules as a package ``linear_main`` under ``into`` (None: git cannot show
    them)."""
    package = into / "linear_main"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in OLD_MODULES:
        shown = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{ref}:implementations/{name}.py"],
            capture_output=True,
            text=True,
        )
        if shown.returncode:
            return None
        source = shown.stdout.replace("from implementations.", "from linear_main.")
        (package / f"{name}.py").write_text(source)
    sys.path.insert(0, str(into))
    real = harness.registry.register
    harness.registry.register = lambda *a, **k: (lambda fn: fn)  # no second registration
    try:
        return {n: importlib.import_module(f"linear_main.{n}") for n in OLD_MODULES}
    finally:
        harness.registry.register = real


def variants(old: dict | None) -> dict[str, Callable[[str, bool, str, str], Fn]]:
    """Variant name -> (impl, causal, module, function) -> a call (q, k, v) -> out."""
    harness.registry.get("linear")  # load this tree's implementations

    def new(segment_bytes: int) -> Callable[[str, bool, str, str], Fn]:
        def make(name: str, causal: bool, module: str, function: str) -> Fn:
            fn = getattr(importlib.import_module(f"implementations.{module}"), function)
            extra = {"segment_bytes": segment_bytes} if name in ("linear", "performer") else {}
            return lambda q, k, v: fn(q, k, v, MaskSpec(causal=causal), **extra)

        return make

    out = {"new, one segment": new(ONE_SEGMENT), "new, CPU policy": new(0)}
    if old is not None:

        def old_call(name: str, causal: bool, module: str, function: str) -> Fn:
            fn = getattr(old[module], function)
            return lambda q, k, v: fn(q, k, v, MaskSpec(causal=causal))

        out["old"] = old_call
    return out


def inputs(n: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(n)
    return tuple(torch.randn(1, 8, n, 64, generator=gen) for _ in range(3))


def count_ops(fn: Fn, n: int) -> int:
    q, k, v = inputs(n)
    with torch.no_grad():
        fn(q, k, v)  # caches (W, projections) filled outside the count
        with OpCount() as count:
            fn(q, k, v)
    return count.ops


def launches(makers: dict, lengths: list[int]) -> list[dict]:
    rows = []
    for name, causal, module, function in CALLS:
        for variant, make in makers.items():
            fn = make(name, causal, module, function)
            ops = {n: count_ops(fn, n) for n in lengths}
            rows.append({"impl": name, "causal": causal, "variant": variant, "ops": ops})
            print(f"  ops {name:9s} {'causal' if causal else 'full':6s} {variant:17s} {ops}",
                  file=sys.stderr, flush=True)
    return rows


def fused_launches(lengths: list[int]) -> list[dict]:
    """Per member of ``CALLS`` with ``fused = 1``: the Triton launches and host ATen ops of one
    call at each n (recorded, not run), or the registry's reason it has no fused path."""
    from harness.registry import problem_of
    from implementations.triton_kernels import launch_modes

    rows = []
    for name, causal, _, _ in CALLS:
        impl, mask = harness.registry.get(name), MaskSpec(causal=causal)
        if "fused" not in impl.params:
            rows.append({"impl": name, "causal": causal, "why": "no fused path (PyTorch only)"})
            continue
        counts: dict[int, tuple[int, int]] = {}
        why = None
        for n in lengths:
            q, k, v = inputs(n)
            reasons = impl.not_supported(problem_of(q, k, v, mask, (("fused", 1),)))
            if reasons:
                why = "; ".join(reasons)
                break
            seen: list = []
            with torch.no_grad():
                with launch_modes.watching(seen.append, execute=False):
                    impl(q, k, v, mask, fused=1)  # caches (FAVOR+'s W) outside the count
                seen.clear()
                with launch_modes.watching(seen.append, execute=False), OpCount() as ops:
                    impl(q, k, v, mask, fused=1)
            counts[n] = (len(seen), ops.ops)
        rows.append({"impl": name, "causal": causal, "why": why, "launches": counts})
        print(f"  fused {name:9s} {'causal' if causal else 'full':6s} {why or counts}",
              file=sys.stderr, flush=True)
    return rows


def cpu_times(makers: dict, n: int, rounds: int, threads: list[int]) -> list[dict]:
    """Seconds per call of every (impl, variant), interleaved round by round: wall clock, and
    the calling thread's CPU time (with one thread the whole work, and not inflated by waiting
    for a busy core)."""
    q, k, v = inputs(n)
    rows = []
    for t in threads:
        torch.set_num_threads(t)
        for name, causal, module, function in CALLS:
            fns = {var: make(name, causal, module, function) for var, make in makers.items()}
            wall: dict[str, list[float]] = {var: [] for var in fns}
            cpu: dict[str, list[float]] = {var: [] for var in fns}
            with torch.no_grad():
                for fn in fns.values():
                    fn(q, k, v)  # warm-up
                order = list(fns)
                for r in range(rounds):
                    for var in order[r % len(order) :] + order[: r % len(order)]:
                        start, start_cpu = time.perf_counter(), time.thread_time()
                        fns[var](q, k, v)
                        cpu[var].append(time.thread_time() - start_cpu)
                        wall[var].append(time.perf_counter() - start)
            for var in fns:
                rows.append(
                    {"impl": name, "causal": causal, "variant": var, "threads": t, "n": n,
                     "wall_median_s": statistics.median(wall[var]), "wall_min_s": min(wall[var]),
                     "cpu_median_s": statistics.median(cpu[var]), "wall_s": wall[var],
                     "cpu_s": cpu[var]}
                )
            line = ", ".join(f"{v} {statistics.median(x) * 1e3:.1f} ms" for v, x in wall.items())
            kind = "causal" if causal else "full"
            print(f"  time {name:9s} {kind:6s} {t} thread(s): {line}", file=sys.stderr, flush=True)
    return rows


def markdown(count_rows: list[dict], time_rows: list[dict], lengths: list[int],
             fused_rows: list[dict] | None = None) -> str:
    def label(impl: str, causal: bool) -> str:
        return f"`{impl}`{' causal' if causal else ''}"

    head = "| implementation | variant | " + " | ".join(f"n = {n}" for n in lengths) + " |"
    lines = ["Launches per call (ATen ops of one call, B1 H8 D64 float32):", "", head,
             "|---|---|" + "---|" * len(lengths)]
    for r in count_rows:
        ops = " | ".join(str(r["ops"][n]) for n in lengths)
        lines.append(f"| {label(r['impl'], r['causal'])} | {r['variant']} | {ops} |")
    if fused_rows:
        lines += ["", "The fused path (`fused = 1`): Triton launches + host ATen ops per call, "
                  "or why a member has none:", "",
                  "| implementation | " + " | ".join(f"n = {n}" for n in lengths) + " |",
                  "|---|" + "---|" * len(lengths)]
        for r in fused_rows:
            cells = ([r["why"]] + [""] * (len(lengths) - 1) if r["why"] else
                     [f"{r['launches'][n][0]} + {r['launches'][n][1]}" for n in lengths])
            lines.append(f"| {label(r['impl'], r['causal'])} | " + " | ".join(cells) + " |")
    if not time_rows:
        return "\n".join(lines)
    names = list(dict.fromkeys(r["variant"] for r in time_rows))
    by = {(r["impl"], r["causal"], r["threads"], r["variant"]): r for r in time_rows}
    lines += ["", f"CPU time per call at n = {time_rows[0]['n']}, ms: wall-clock median (minimum) "
              "over interleaved rounds; with one thread also the thread's CPU time (median):", "",
              "| implementation | threads | " + " | ".join(names) + " |",
              "|---|---|" + "---|" * len(names)]
    for impl, causal in dict.fromkeys((r["impl"], r["causal"]) for r in time_rows):
        for t in sorted({r["threads"] for r in time_rows}):
            cells = []
            for v in names:
                r = by[(impl, causal, t, v)]
                cell = f"{r['wall_median_s'] * 1e3:.3g} ({r['wall_min_s'] * 1e3:.3g})"
                if t == 1:
                    cell += f"; CPU {r['cpu_median_s'] * 1e3:.3g}"
                cells.append(cell)
            lines.append(f"| {label(impl, causal)} | {t} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384, 65536])
    parser.add_argument("--time-n", type=int, default=16384, help="n of the CPU timings")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--old-ref", default=OLD_REF, help='git ref of the old code ("": none)')
    parser.add_argument("--no-time", action="store_true", help="launch counts only")
    parser.add_argument("--no-fused", action="store_true", help="leave the fused path out")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(sys.stderr):
        old = load_old(args.old_ref, Path(tmp)) if args.old_ref else None
        if args.old_ref and old is None:
            print(f"linear_launches: git cannot show {args.old_ref}; old code left out",
                  file=sys.stderr)
        makers = variants(old)
        count_rows = launches(makers, args.lengths)
        if not args.no_fused and not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"  # CPU tensors: launches recorded, not run
        fused_rows = [] if args.no_fused else fused_launches(args.lengths)
        time_rows = [] if args.no_time else cpu_times(makers, args.time_n, args.rounds,
                                                      args.threads)
    load_after = os.getloadavg()
    head = (f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
            f"{os.cpu_count()} CPUs; load average (1/5/15 min) before "
            f"{'/'.join(f'{x:.2f}' for x in load_before)}, after "
            f"{'/'.join(f'{x:.2f}' for x in load_after)}")
    print(head + "\n\n" + markdown(count_rows, time_rows, args.lengths, fused_rows))
    if args.json:
        args.json.write_text(json.dumps({"machine": head, "launches": count_rows,
                                         "fused": fused_rows, "times": time_rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
