"""The GPU targets of the linear-complexity attentions, measured directly (no harness run).

B1 H16 D64 bfloat16 on one CUDA GPU, n = 65536 and 16384, each implementation called through
the registry as a user calls it (``impl(q, k, v, mask)``):

| target (at n = 65536) | |
|---|---|
| ``linear`` not causal | <= 1 ms |
| ``linear`` not causal (issue 38) | <= 0.38 ms: 2x its byte floor |
| ``linear`` causal | <= 2x ``fla-linear`` in this process (skipped, with the reason, without fla) |
| ``linear`` causal, the chunk kernel (``fused = 1``, issue 38) | <= ``fla-linear`` |
| ``performer`` (m = 256), not causal | <= 4x ``linear`` not causal |
| a direct ``linformer`` call | <= 1 ms |
| ``host_frac`` of the four, at every n >= 16k | < 0.2 |

``linear`` and ``performer`` not causal run the fused Triton kernels by default on CUDA
(``fused = -1``); ``linear-causal-chunk`` forces the causal chunk kernel (``fused = 1``, a
candidate beside ``linear-causal``'s PyTorch path and fla-linear), ``*-2launch`` the
two-launch non-causal candidate (``fused = 2``), ``performer-causal-chunk`` FAVOR+ in the chunk
kernel beside ``performer-causal``'s PyTorch path, ``nystrom-fused`` the four-launch Nyström
beside ``nystrom``'s PyTorch path (candidates all); the rows ``linear-torch``
and ``performer-torch`` force the PyTorch path (``fused = 0``) in the same process, and each
row's ``path`` says which ran (``triton``: the fused kernels' launches were seen; ``torch``
otherwise).
``sdpa-flash`` and ``nystrom`` are measured for context. Per row: the median time of one call
(CUDA events around each of back-to-back calls), the kernels one call launches (torch.profiler)
and the ATen ops it dispatches, the host's time to issue a batch of calls against the GPU's
time for that batch (``host_frac`` = host / GPU: near 1 when the GPU waits on Python), the
peak memory above the inputs beside the registered memory model's prediction.

Usage::

    python benchmarks/linear_targets.py OUT.json            # on a CUDA machine, < 60 s on an H100
    python benchmarks/linear_targets.py OUT.json --dry-run  # the same code on the CPU, tiny sizes

OUT.json is rewritten after every row, so a run cut short keeps what it measured; fla-linear
runs last (its first call autotunes for a minute or more). Exit status:
0 when every target is met (always for ``--dry-run``), 1 when one is missed, 2 without a CUDA
device (one line) or on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import registry  # noqa: E402
from harness.masks import MaskSpec  # noqa: E402
from harness.measure import dispatch  # noqa: E402
from harness.measure.dispatch import OpCount  # noqa: E402
from harness.spec import Problem  # noqa: E402

try:  # which path ran: the fused kernels' launches are watched (no Triton: none can run)
    from implementations.triton_kernels import launch_modes
except Exception:
    launch_modes = None

# (row name, implementation, causal, method parameters): ours first, context next, fla-linear
# last at every length (its first call autotunes fla's kernels: 44 s on the first H100 lease,
# past a 75 s cap on the second, where it kept every row after it from running)
ROWS = [
    ("linear", "linear", False, {}),
    ("linear-torch", "linear", False, {"fused": 0}),
    ("linear-causal", "linear", True, {}),
    ("linear-causal-chunk", "linear", True, {"fused": 1}),
    ("linear-2launch", "linear", False, {"fused": 2}),
    ("performer", "performer", False, {"features": 256}),
    ("performer-torch", "performer", False, {"features": 256, "fused": 0}),
    ("performer-2launch", "performer", False, {"features": 256, "fused": 2}),
    ("performer-causal", "performer", True, {"features": 256}),
    ("performer-causal-chunk", "performer", True, {"features": 256, "fused": 1}),
    ("linformer", "linformer", False, {"projected_len": 256}),
    ("sdpa-flash", "sdpa-flash", False, {}),
    ("nystrom", "nystrom", False, {}),
    ("nystrom-fused", "nystrom", False, {"fused": 1}),
]
LAST_ROWS = [("fla-linear", "fla-linear", True, {})]
TARGETED = ("linear", "linear-causal", "performer", "linformer")
LINEAR_MS, LINFORMER_MS, FLA_RATIO, PERFORMER_RATIO, HOST_FRAC = 1.0, 1.0, 2.0, 4.0, 0.2
# issue 38: non-causal ``linear`` within 2x its byte floor (q, k, v, o in bf16 at the measured
# 2.83 TB/s: 0.19 ms at n = 64k), the causal chunk kernel (a candidate: ``fused`` = 1) at or
# under fla-linear
FLOOR_MS, CHUNK_FLA_RATIO = 0.38, 1.0
Call = Callable[[], torch.Tensor]


class Clock:
    """Times on the device: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def per_call(self, fn: Call, reps: int) -> list[float]:
        """Seconds of each of ``reps`` back-to-back calls."""
        if not self.cuda:
            out = []
            for _ in range(reps):
                start = time.perf_counter()
                fn()
                out.append(time.perf_counter() - start)
            return out
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(reps)]
        self.sync()
        for start, end in events:
            start.record()
            fn()
            end.record()
        self.sync()
        return [start.elapsed_time(end) / 1e3 for start, end in events]

    def host_and_device(self, fn: Call, reps: int) -> tuple[float, float]:
        """(host seconds to issue ``reps`` calls, device seconds for them), per call."""
        self.sync()
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        host = time.perf_counter() - t0
        if not self.cuda:
            return host / reps, host / reps
        end.record()
        self.sync()
        return host / reps, start.elapsed_time(end) / 1e3 / reps


def inputs(n: int, args, device: torch.device) -> tuple[torch.Tensor, ...]:
    """q, k, v (B, H, n, D) drawn on the device from a seeded generator."""
    gen = torch.Generator(device=device).manual_seed(n)
    shape = (args.batch, args.heads, n, args.head_dim)
    return tuple(
        torch.randn(shape, generator=gen, device=device, dtype=args.torch_dtype) for _ in range(3)
    )


def measure_row(name: str, impl_name: str, causal: bool, params: dict, qkv: tuple, args,
                device: torch.device) -> dict:
    """One row: times, launches, host_frac and memory of one implementation on q, k, v."""
    q, k, v = qkv
    n = q.shape[-2]
    row = {"row": name, "impl": impl_name, "n": n, "causal": causal, **params}
    impl = registry.get(impl_name)
    problem = Problem(args.batch, args.heads, n, n, args.head_dim, dtype=args.torch_dtype,
                      device=device.type, mask=MaskSpec(causal=causal),
                      params=tuple(sorted(params.items())))
    reasons = impl.not_supported(problem)
    if device.type == "cpu" and params.get("fused", 0) >= 1:  # TRITON_INTERPRET=1: it would run
        reasons = reasons or [f"fused = {params['fused']} on the CPU runs Triton's interpreter: "
                              "not timed"]
    if reasons:
        row["skipped"] = "; ".join(reasons)
        return row
    mask = MaskSpec(causal=causal)

    def call() -> torch.Tensor:
        return impl(q, k, v, mask, **params)

    clock = Clock(device)
    with torch.no_grad():
        for _ in range(args.warmup):
            call()  # compilation, autotuning, caches (Linformer's projections, Performer's W)
        clock.sync()
        first = clock.per_call(call, 1)[0]
        reps = max(3, min(args.max_reps, int(args.budget_s / max(first, 1e-6))))
        times = clock.per_call(call, reps)
        host, dev = clock.host_and_device(call, reps)
        with OpCount() as ops:
            call()
        row["path"] = path_of(call)
        gpu_ops = dispatch.gpu_ops(call, device)
        base = torch.cuda.memory_allocated() if device.type == "cuda" else 0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        call()
        clock.sync()
        peak = torch.cuda.max_memory_allocated() - base if device.type == "cuda" else None
        if row["path"] == "triton":  # the fused path against the PyTorch path, same inputs
            got = call().float()
            ref = impl(q, k, v, mask, **{**params, "fused": 0}).float()
            row["rel_err_vs_torch"] = ((got - ref).abs().max() / ref.abs().max()).item()
    out_bytes = q.numel() * q.element_size()
    model = impl.cost.memory_model(problem) if impl.cost.memory_model else None
    row.update(
        ms=statistics.median(times) * 1e3,
        ms_min=min(times) * 1e3,
        reps=reps,
        host_ms=host * 1e3,
        device_ms=dev * 1e3,
        host_frac=host / dev if dev > 0 else None,
        aten_ops=ops.ops,
        gpu_ops=gpu_ops,
        peak_bytes=None if peak is None else peak - out_bytes,
        model_bytes=model,
    )
    return row


def path_of(call: Call) -> str:
    """``triton`` when one call launches the fused kernels (feature maps, Nyström), else
    ``torch``."""
    if launch_modes is None:
        return "torch"
    seen: list = []
    with launch_modes.watching(seen.append):
        call()
    return "triton" if any(x.name.startswith(("feature_", "nys_")) for x in seen) else "torch"


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def judge(rows: list[dict], n_top: int) -> list[tuple[str, bool | None, str]]:
    """(target, met (None: not measurable here), figures) for every target."""
    at = {r["row"]: r for r in rows if r["n"] == n_top and "ms" in r}
    out = []

    def ms(name: str) -> float | None:
        return at[name]["ms"] if name in at else None

    lin, lin_c, fla, perf, lf = (ms(x) for x in ("linear", "linear-causal", "fla-linear",
                                                 "performer", "linformer"))
    out.append((f"linear not causal <= {LINEAR_MS} ms at n = {n_top}",
                None if lin is None else lin <= LINEAR_MS, f"{fmt(lin)} ms"))
    fla_row = next((r for r in rows if r["row"] == "fla-linear"), {})
    if fla is None:
        why = fla_row.get("skipped") or fla_row.get("error") or "not measured"
        out.append((f"linear causal <= {FLA_RATIO}x fla-linear", None, f"fla-linear absent: {why}"))
    else:
        ratio = lin_c / fla if lin_c else None
        out.append((f"linear causal <= {FLA_RATIO}x fla-linear", None if ratio is None
                    else ratio <= FLA_RATIO, f"{fmt(lin_c)} / {fmt(fla)} ms = {fmt(ratio)}"))
    chunk = ms("linear-causal-chunk")
    ratio = chunk / fla if chunk and fla else None
    out.append((f"linear causal chunk kernel (fused = 1) <= {CHUNK_FLA_RATIO}x fla-linear",
                None if ratio is None else ratio <= CHUNK_FLA_RATIO,
                f"{fmt(chunk)} / {fmt(fla)} ms = {fmt(ratio)}"))
    out.append((f"linear not causal <= {FLOOR_MS} ms (2x the byte floor) at n = {n_top}",
                None if lin is None else lin <= FLOOR_MS, f"{fmt(lin)} ms"))
    ratio = perf / lin if perf and lin else None
    out.append((f"performer <= {PERFORMER_RATIO}x linear", None if ratio is None
                else ratio <= PERFORMER_RATIO, f"{fmt(perf)} / {fmt(lin)} ms = {fmt(ratio)}"))
    out.append((f"direct linformer call <= {LINFORMER_MS} ms", None if lf is None
                else lf <= LINFORMER_MS, f"{fmt(lf)} ms"))
    fracs = [(r["row"], r["n"], r["host_frac"]) for r in rows
             if r["row"] in TARGETED and r["n"] >= 16384 and r.get("host_frac") is not None]
    worst = max(fracs, key=lambda x: x[2], default=None)
    out.append((f"host_frac < {HOST_FRAC} for the four at n >= 16k",
                None if worst is None else worst[2] < HOST_FRAC,
                "; ".join(f"{a} n={b}: {c:.3f}" for a, b, c in fracs) or "not measured"))
    return out


def table(rows: list[dict]) -> str:
    lines = ["| row | n | ms (median) | GPU ops | ATen ops | host ms | device ms "
             "| host_frac | peak MiB | model MiB | path |", "|---" * 11 + "|"]
    for r in rows:
        if "ms" not in r:
            why = r.get("skipped") or r.get("error", "")
            lines.append(f"| {r['row']} | {r['n']} | {why[:60]} | | | | | | | | |")
            continue

        def mib(x: int | None) -> str:
            return "" if x is None else f"{x / 2**20:.1f}"

        lines.append(
            f"| {r['row']} | {r['n']} | {r['ms']:.3f} "
            f"| {r['gpu_ops'] or ''} | {r['aten_ops']} "
            f"| {r['host_ms']:.3f} | {r['device_ms']:.3f} | {r['host_frac']:.3f} "
            f"| {mib(r['peak_bytes'])} | {mib(r['model_bytes'])} | {r.get('path', '')} |"
        )
    return "\n".join(lines)


def write(path: Path, payload: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=str))
    os.replace(tmp, path)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="JSON file, rewritten after every row")
    parser.add_argument("--dry-run", action="store_true",
                        help="the same code on the CPU at tiny sizes (n = 512, 1024; B1 H2 D16)")
    parser.add_argument("--lengths", type=int, nargs="+", help="default 65536 16384")
    parser.add_argument("--skip", nargs="*", default=[], help="rows to leave out")
    parser.add_argument("--deadline-s", type=float, default=50.0,
                        help="start no row after this many seconds")
    args = parser.parse_args(argv)
    args.batch, args.heads, args.head_dim = 1, 16, 64
    args.torch_dtype, args.warmup, args.budget_s, args.max_reps = torch.bfloat16, 2, 0.25, 50
    if args.dry_run:
        args.heads, args.head_dim, args.warmup, args.budget_s, args.max_reps = 2, 16, 1, 0.02, 5
        args.lengths = args.lengths or [1024, 512]
    args.lengths = sorted(args.lengths or [65536, 16384], reverse=True)
    return args


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("linear_targets: no CUDA device here; --dry-run runs the same code on the CPU",
              file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.dry_run else "cuda")
    machine = (torch.cuda.get_device_name() if device.type == "cuda" else
               platform.processor() or platform.machine())
    payload = {"machine": machine, "torch": torch.__version__, "dtype": "bfloat16",
               "shape": f"B{args.batch} H{args.heads} D{args.head_dim}", "rows": []}
    rows = payload["rows"]
    plan = [(n, row) for n in args.lengths for row in ROWS]
    plan += [(n, row) for n in args.lengths for row in LAST_ROWS]
    qkv: tuple = ()
    for n, (name, impl_name, causal, params) in plan:
        if name in args.skip:
            continue
        if time.perf_counter() - started > args.deadline_s:
            rows.append({"row": name, "impl": impl_name, "n": n, "skipped": "time limit"})
            continue
        if not qkv or qkv[0].shape[-2] != n:
            qkv = ()  # free the last length's inputs first
            qkv = inputs(n, args, device)
        try:
            rows.append(measure_row(name, impl_name, causal, params, qkv, args, device))
        except Exception as exc:  # an OOM or a broken backend: the row says which
            rows.append({"row": name, "impl": impl_name, "n": n,
                         "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"})
        if device.type == "cuda":
            torch.cuda.empty_cache()
        payload["elapsed_s"] = time.perf_counter() - started
        write(args.out, payload)
        last = rows[-1]
        said = f"{last['ms']:.3f} ms" if "ms" in last else last.get("skipped") or last["error"]
        print(f"  {name} n={n}: {said}", file=sys.stderr, flush=True)
    targets = judge(rows, args.lengths[0])
    if args.dry_run:  # tiny sizes on a CPU: the code path, not the targets
        targets = [(t, None, f) for t, _, f in targets]
    payload["targets"] = [{"target": t, "met": m, "figures": f} for t, m, f in targets]
    payload["elapsed_s"] = time.perf_counter() - started
    write(args.out, payload)
    print(f"{machine}, {payload['shape']} bfloat16, {payload['elapsed_s']:.0f} s\n")
    print(table(rows))
    print()
    for target, met, figures in targets:
        mark = "dry " if args.dry_run else "n/a " if met is None else "met " if met else "MISS"
        print(f"{mark} {target}: {figures}")
    missed = any(m is False for _, m, _ in targets)
    return 0 if args.dry_run or not missed else 1


if __name__ == "__main__":
    sys.exit(main())
