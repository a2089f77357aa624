"""The linear family beside lucidrains' packages, at the same shapes, in one process.

Problem: B=1, H=8, D=64, float32. Peers (the ``peers`` extra): ``performer-pytorch``'s
``FastAttention`` (m = 256), ``linformer``'s ``LinformerSelfAttention`` (k = 256) and
``nystrom-attention``'s ``NystromAttention`` (m = 64, no convolution residual). The last two are
layers: their q/k/v/out projections are replaced by identities (and the fused qkv projection by
a concatenation, one 3·n·H·D copy they pay and we do not), so both sides time the attention
core on inputs already in their own layout. Before timing, each pair is checked to compute the
same function: the peer gets our W / E / F, and the relative difference of the outputs is
printed, at q/k std 0.25 (FAVOR+ then differs by lucidrains' 1e-4 feature epsilon, Nyström by
its batch-wide pseudo-inverse scaling; at unit-variance q and k that epsilon outweighs most key
features, and lucidrains' output drifts towards a plain average of V).

Targets: ``linear`` causal time exponent <= 1.15 over n = 2k..32k, peak-memory exponent
<= 1.1, at least 5x faster than causal ``sdpa`` at n = 16384; ``performer`` and ``linformer``
time exponent <= 1.15 and at least as fast as the peer at n = 8192.

Timing is the harness's adaptive median (:func:`harness.measure.timing.measure`), memory the
harness's CPU peak (profiler allocation events). Run on a quiet machine:
``python benchmarks/peers_linear.py [--threads 2] [--budget 1.0] [--json out.json]``.
On a shared machine ``--threads 1 --cpu-clock`` times by process CPU time instead.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from harness import registry
from harness.masks import MaskSpec
from harness.measure.device import get_device
from harness.measure.timing import TimingConfig, measure
from harness.spec import Problem
from implementations.linformer import projections
from implementations.performer import orthogonal_features

B, H, D = 1, 8, 64
FEATURES, PROJECTED, LANDMARKS = 256, 256, 64
Call = Callable[[], torch.Tensor]


def qkv(n: int, qk_std: float = 1.0) -> tuple[torch.Tensor, ...]:
    """Seeded q, k, v (B, H, n, D); q and k drawn with standard deviation ``qk_std``."""
    gen = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(B, H, n, D, generator=gen) for _ in range(3))
    return q * qk_std, k * qk_std, v


def ours(name: str, n: int, causal: bool, qk_std: float = 1.0, **params) -> Call:
    """The registry implementation, prepared as the runner prepares it (setup untimed)."""
    mask = MaskSpec(causal=causal)
    problem = Problem(B, H, n, n, D, mask=mask, params=tuple(sorted(params.items())))
    impl = registry.get(name)
    reasons = impl.not_supported(problem)
    if reasons:
        raise RuntimeError(f"{name}: {'; '.join(reasons)}")
    fn, (q, k, v) = impl.prepare(problem), qkv(n, qk_std)
    return lambda: fn(q, k, v)


def peer_performer(n: int, causal: bool, qk_std: float = 1.0) -> Call:
    from performer_pytorch import FastAttention

    attn = FastAttention(D, nb_features=FEATURES, causal=causal)
    attn.projection_matrix.copy_(orthogonal_features(FEATURES, D, 0).float())
    q, k, v = qkv(n, qk_std)
    return lambda: attn(q, k, v)


def peer_linformer(n: int) -> Call:
    from linformer import LinformerSelfAttention

    attn = LinformerSelfAttention(H * D, seq_len=n, k=PROJECTED, heads=H)
    attn.to_q = attn.to_k = attn.to_v = attn.to_out = nn.Identity()
    e, f = projections(PROJECTED, n, 0, "cpu", torch.float32)
    attn.proj_k.data, attn.proj_v.data = e.T.contiguous(), f.T.contiguous()
    x = qkv(n)[0].transpose(1, 2).reshape(B, n, H * D)  # q = k = v: self-attention
    return lambda: attn(x)


class _Triple(nn.Module):
    """The fused qkv projection replaced by q = k = v = x (one concatenation)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x, x], dim=-1)


def peer_nystrom(n: int) -> Call:
    from nystrom_attention import NystromAttention

    attn = NystromAttention(H * D, dim_head=D, heads=H, num_landmarks=LANDMARKS, residual=False)
    attn.to_qkv, attn.to_out = _Triple(), nn.Identity()
    x = qkv(n)[0].transpose(1, 2).reshape(B, n, H * D)
    return lambda: attn(x)


def self_attention_ours(name: str, n: int, **params) -> Call:
    """Ours on q = k = v (what the peers' self-attention layers compute here)."""
    impl = registry.get(name)
    problem = Problem(B, H, n, n, D, params=tuple(sorted(params.items())))
    fn, q = impl.prepare(problem), qkv(n)[0]
    return lambda: fn(q, q, q)


def same_function(n: int = 1024) -> dict[str, float]:
    """Relative Frobenius difference of each pair's outputs on the same inputs and W/E/F."""
    with torch.no_grad():
        pairs = {
            "performer": (
                ours("performer", n, False, 0.25, features=FEATURES)(),
                peer_performer(n, False, 0.25)(),
            ),
            "linformer": (
                self_attention_ours("linformer", n, projected_len=PROJECTED)(),
                peer_linformer(n)().view(B, n, H, D).transpose(1, 2),
            ),
            "nystrom": (
                self_attention_ours("nystrom", n, landmarks=LANDMARKS)(),
                peer_nystrom(n)().view(B, n, H, D).transpose(1, 2),
            ),
        }
    return {k: float((a - b).norm() / a.norm()) for k, (a, b) in pairs.items()}


def cpu_time(fn: Call, config: TimingConfig) -> float:
    """Smallest process-CPU time per call (the wall clock counts other jobs on a busy box)."""
    fn()
    samples, deadline = [], time.perf_counter() + config.budget_s
    while len(samples) < config.min_samples or time.perf_counter() < deadline:
        start = time.process_time()
        fn()
        samples.append(time.process_time() - start)
    return min(samples)


def figure(fn: Call, config: TimingConfig, cpu_clock: bool, memory: bool) -> dict:
    device = get_device("cpu")
    with torch.no_grad():
        seconds = cpu_time(fn, config) if cpu_clock else measure(fn, device, config).median
        peak = device.peak_memory(fn).peak_bytes if memory else None
    return {"time_s": seconds, "peak_bytes": peak}


def slope(ns: list[int], ys: list[float]) -> float:
    """Least-squares slope of log(y) against log(n)."""
    return float(np.polyfit(np.log(ns), np.log(ys), 1)[0])


def plan(
    sizes: list[int], linear_sizes: list[int], sdpa_n: int, at: int
) -> list[tuple[str, int, Call]]:
    """(label, n, callable factory) in run order; factories build inputs only when run."""
    jobs: list[tuple[str, int, Call]] = []
    for n in linear_sizes:
        jobs.append(("linear causal", n, lambda n=n: ours("linear", n, True)))
    jobs.append(("sdpa causal", sdpa_n, lambda: ours("sdpa", sdpa_n, True)))
    for n in sizes:
        jobs += [
            ("performer", n, lambda n=n: ours("performer", n, False, features=FEATURES)),
            ("lucidrains performer", n, lambda n=n: peer_performer(n, False)),
        ]
        if n <= at:  # lucidrains' CPU causal path is the slow one (a cumsum of n·m·D states)
            jobs += [
                ("performer causal", n, lambda n=n: ours("performer", n, True, features=FEATURES)),
                ("lucidrains performer causal", n, lambda n=n: peer_performer(n, True)),
            ]
        jobs += [
            (
                "linformer",
                n,
                lambda n=n: self_attention_ours("linformer", n, projected_len=PROJECTED),
            ),
            ("lucidrains linformer", n, lambda n=n: peer_linformer(n)),
            ("nystrom", n, lambda n=n: self_attention_ours("nystrom", n, landmarks=LANDMARKS)),
            ("lucidrains nystrom", n, lambda n=n: peer_nystrom(n)),
        ]
    return jobs


def targets(
    figs: dict[tuple[str, int], dict],
    sizes: list[int],
    linear_sizes: list[int],
    sdpa_n: int,
    at: int,
) -> list[tuple[str, str, bool]]:
    def t(label: str, n: int) -> float:
        return figs[label, n]["time_s"] if (label, n) in figs else math.nan

    def exponent(label: str, ns: list[int], key: str = "time_s") -> float:
        ns = [n for n in ns if (label, n) in figs]
        return slope(ns, [figs[label, n][key] for n in ns]) if len(ns) > 1 else math.nan

    lin_t, lin_m = (
        exponent("linear causal", linear_sizes),
        exponent("linear causal", linear_sizes, "peak_bytes"),
    )
    rows = [
        ("linear causal time exponent <= 1.15", f"{lin_t:.3f}", lin_t <= 1.15),
        ("linear causal peak-memory exponent <= 1.1", f"{lin_m:.3f}", lin_m <= 1.1),
        (
            f"sdpa causal / linear causal at n={sdpa_n} >= 5",
            f"{t('sdpa causal', sdpa_n) / t('linear causal', sdpa_n):.1f}x",
            t("sdpa causal", sdpa_n) / t("linear causal", sdpa_n) >= 5,
        ),
    ]
    for name in ("performer", "linformer"):
        exp = exponent(name, sizes)
        ratio = t(f"lucidrains {name}", at) / t(name, at)
        rows += [
            (f"{name} time exponent <= 1.15", f"{exp:.3f}", exp <= 1.15),
            (f"lucidrains {name} / {name} at n={at} >= 1", f"{ratio:.2f}x", ratio >= 1),
        ]
    ratio = t("lucidrains nystrom", at) / t("nystrom", at)
    rows.append((f"(no target) lucidrains nystrom / nystrom at n={at}", f"{ratio:.2f}x", True))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    parser.add_argument(
        "--linear-sizes", type=int, nargs="+", default=[2048, 4096, 8192, 16384, 32768]
    )
    parser.add_argument("--sdpa-n", type=int, default=16384)
    parser.add_argument("--at", type=int, default=8192, help="n of the peer ratios")
    parser.add_argument("--budget", type=float, default=1.0, help="timing budget per point, s")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--cpu-clock",
        action="store_true",
        help="time by process CPU time (min of samples); use with --threads 1",
    )
    parser.add_argument("--json", help="also write every figure to this JSON file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = TimingConfig(budget_s=args.budget, min_samples=3)
    load_before = os.getloadavg()
    same = same_function()
    print(
        "same function (relative difference at n=1024): "
        + ", ".join(f"{k} {v:.1e}" for k, v in same.items())
    )
    figs: dict[tuple[str, int], dict] = {}
    for label, n, make in plan(args.sizes, args.linear_sizes, args.sdpa_n, args.at):
        memory = label in ("linear causal", "performer", "linformer", "nystrom")
        figs[label, n] = figure(make(), config, args.cpu_clock, memory)
        f = figs[label, n]
        peak = "" if f["peak_bytes"] is None else f"{f['peak_bytes'] / 2**20:9.1f} MiB"
        print(f"{label:<28} n={n:>6} {f['time_s'] * 1e3:10.1f} ms {peak}", flush=True)
    rows = targets(figs, args.sizes, args.linear_sizes, args.sdpa_n, args.at)
    load = (load_before, os.getloadavg())
    clock = "process CPU time (min)" if args.cpu_clock else "wall clock (median)"
    print(
        f"\nthreads {torch.get_num_threads()}, {clock}, torch {torch.__version__}, load "
        f"average before {load[0][0]:.1f} / after {load[1][0]:.1f} on {os.cpu_count()} cores"
    )
    for what, value, ok in rows:
        print(f"  {'PASS' if ok else 'MISS'}  {what:<48} {value}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "args": vars(args),
                    "load": load,
                    "targets": rows,
                    "same_function": same,
                    "figures": [{"label": k[0], "n": k[1], **v} for k, v in figs.items()],
                },
                fh,
                indent=1,
            )


if __name__ == "__main__":
    main()
