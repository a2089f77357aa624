"""Measurement soundness on a CUDA GPU: NVML figures, clocks/TF32, per-call L2 flush timing,
probed availability, direct-call capability checks and the agreement gate.

    python benchmarks/gpu_soundness.py [--n 8192]

On a CPU-only machine it prints why it cannot run and exits 2. On CUDA it prints:
- NVML rows for an eager (`full`) and a flash (`sdpa-flash`) call: the allocator peak, the
  reserved peak, and NVML's peak, or null with the reason NVML was not believed;
- the env fields fp32 numbers depend on (TF32 flags) and the SM clock idle / under load /
  now, with throttle reasons;
- one SDPA call timed by attnbench with a per-call L2 flush, without, and by
  ``triton.testing.do_bench`` (which flushes per call): the flushed median should be within
  ~10% of do_bench's;
- each optional backend's probed availability;
- that a direct call with an unsupported mask raises, and that the agreement gate passes
  `sdpa-flash` and fails the same output x 0.5 at n = 16384 bf16 (sampled rows).
Exit status 1 when the flushed median and do_bench differ by more than 10% or a check fails.
"""

from __future__ import annotations

import argparse
import sys

import torch

from harness import registry
from harness.masks import MaskSpec
from harness.measure import calibrate, env
from harness.measure.device import get_device
from harness.measure.timing import TimingConfig, measure
from harness.registry import NotSupportedError
from harness.scenarios.attention.attention_case import make_inputs
from harness.scenarios.attention.checking import check_attention
from harness.scenarios.interface import Point, check_choice


def _qkv(n: int, dtype=torch.bfloat16, heads: int = 16, d: int = 64):
    gen = torch.Generator(device="cuda").manual_seed(0)
    return [torch.randn(1, heads, n, d, generator=gen, device="cuda", dtype=dtype)
            for _ in range(3)]


def nvml_rows(device, n: int) -> None:
    q, k, v = _qkv(n)
    for name in ("full", "sdpa-flash"):
        impl = registry.get(name)

        def call(impl=impl):
            with torch.no_grad():
                return impl(q, k, v, MaskSpec(causal=True))

        call()
        reading = device.peak_memory(call)
        x = reading.extra
        print(f"  {name:11s} n={n} bf16 H16 D64: allocator {reading.peak_bytes / 2**20:.0f} MiB, "
              f"reserved {x['peak_reserved_bytes'] / 2**20:.0f} MiB, nvml_peak_bytes="
              f"{x.get('nvml_peak_bytes')}, samples={x.get('nvml_samples')}, "
              f"calls={x.get('nvml_calls')}, nvml_status={x['nvml_status']!r}")


def clocks_and_tf32(device) -> None:
    info = env.collect(device, "gpu-soundness", "-", "-", "check")
    for key in ("tf32_cuda_matmul", "tf32_cudnn", "float32_matmul_precision",
                "fp32_precision_cuda_matmul", "nvml_uuid", "sm_clock_idle_mhz",
                "throttle_reasons_idle", "max_sm_clock_mhz", "nvml"):
        print(f"  {key} = {info.get(key)!r}")
    print(f"  under load: {calibrate.clock_under_load(device)}")
    now = device.clock()
    print(f"  now: sm_clock_mhz={now.sm_clock_mhz} reasons_mask={now.reasons_mask} {now.status}")


def flush_timing(n: int) -> float:
    import triton.testing

    q, k, v = _qkv(n)
    impl = registry.get("sdpa")

    def call():
        with torch.no_grad():
            return impl(q, k, v, MaskSpec(causal=True))

    config = TimingConfig(budget_s=1.0, min_samples=20)
    flushed = measure(call, get_device("cuda", flush_l2=True), config)
    warm = measure(call, get_device("cuda", flush_l2=False), config)
    bench_ms = triton.testing.do_bench(call, warmup=25, rep=300, return_mode="median")
    ratio = flushed.median * 1e3 / bench_ms
    print(f"  sdpa causal n={n} bf16: attnbench flushed {flushed.median * 1e3:.4f} ms "
          f"(l2={flushed.l2}, {len(flushed.samples)} samples), warm {warm.median * 1e3:.4f} ms "
          f"(l2={warm.l2}, {warm.calls_per_sample} calls/sample), do_bench {bench_ms:.4f} ms, "
          f"flushed/do_bench = {ratio:.3f}")
    return ratio


def availability_and_direct_calls() -> bool:
    for name in ("xformers", "flash-attn", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn"):
        print(f"  {name:15s} {registry.get(name).unavailable_reason() or 'available'}")
    q, k, v = _qkv(128)
    try:
        registry.get("sdpa")(q, k, v, MaskSpec(causal=True, window=(15, 0)))
        print("  FAIL: sdpa with a window did not raise")
        return False
    except NotSupportedError as exc:
        print(f"  direct call refused: {exc}")
        return True


def agreement_gate() -> bool:
    point = Point.of(impl="sdpa-flash", device="cuda", dtype="bfloat16", seq_len=16384, heads=1,
                  head_dim=32, seed=3)
    q, k, v = make_inputs(point, "cuda")
    attn = registry.get("sdpa-flash").prepare(point.problem())
    plan = check_choice(point)
    good = check_attention(attn, q, k, v, None, point, plan)
    bad = check_attention(lambda *a: attn(*a) * 0.5, q, k, v, None, point, plan)
    for label, r in (("sdpa-flash", good), ("sdpa-flash x0.5", bad)):
        print(f"  {label:16s} agree={r['agree']} max_abs={r['max_abs_err']:.3g} "
              f"(bound {r['tolerance']:.3g}) rel={r['rel_err']:.3g} "
              f"(bound {r['rel_tolerance']:.3g}) naive={r['naive_err']:.3g}")
    return good["agree"] is True and bad["agree"] is False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8192)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"gpu_soundness: needs a CUDA GPU; torch.cuda.is_available() is False "
              f"(torch {torch.__version__}). Nothing was measured.")
        return 2
    device = get_device("cuda")
    print(f"device: {device.name()}, torch {torch.__version__}")
    print("NVML vs allocator:")
    nvml_rows(device, args.n)
    print("TF32 and clocks:")
    clocks_and_tf32(device)
    print("L2 flush per call vs triton.testing.do_bench:")
    ratio = flush_timing(args.n)
    print("availability (probes) and direct calls:")
    refused = availability_and_direct_calls()
    print("agreement gate at n=16384 bf16 (sampled rows):")
    gate = agreement_gate()
    ok = abs(ratio - 1) <= 0.10 and refused and gate
    print("OK" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
