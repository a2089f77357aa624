"""Wall-clock checks of the packed-document and prediction targets (tests never time).

1. Packing is real block skipping: ``local`` over n = 16384 packed as 64 documents of 256
   (B1 H8 D64 float32, CPU) against the same 64 documents run as a batch of 64 sequences of
   256, side by side in one process, alternating, median of repeats. Target ratio <= 1.3.
   ``flash-tiled`` (equal and unequal documents) and the dense-mask baseline beside it.
2. Predictions are closed form: memory and executed-pair predictions of the tile families at
   n = 10^6 and beyond; ``maxlen local --no-verify`` in process (imports apart).
3. FlexAttention's block lists with documents against Σ ceil(l/128)² + 2·documents.

Usage: ``PYTHONPATH=. python benchmarks/masks_targets.py [--repeats 7]``. Prints the load.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import random
import statistics
import time

import torch

from harness import registry
from harness.cli import main as cli_main
from harness.masks import MaskSpec, kept_pairs
from harness.spec import Problem
from implementations.flex import BLOCK, block_counts

B, H, D, N, DOC = 1, 8, 64, 16384, 256


def _median_s(fn, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def packing(repeats: int) -> None:
    """Packed 64 x 256 vs a batch of 64 x 256, and unequal documents, per implementation."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, generator=gen) for _ in range(3))
    batch = [x.view(B, H, N // DOC, DOC, D).transpose(1, 2).reshape(N // DOC, H, DOC, D)
             for x in (q, k, v)]  # (64, H, 256, D): each document its own sequence
    docs = (DOC,) * (N // DOC)
    rng = random.Random(0)
    lognormal = _lognormal_documents(rng, N, DOC)
    print(f"packing: n={N} B{B} H{H} D{D} float32, {len(docs)} documents of {DOC}; "
          f"unequal: {len(lognormal)} lognormal documents (mean {DOC})")
    for name, base in (("local", MaskSpec(causal=True)),
                       ("local", MaskSpec(causal=True, window=(127, 0))),
                       ("flash-tiled", MaskSpec(causal=True))):
        impl = registry.get(name)
        packed = impl.prepare(Problem(B, H, N, N, D, mask=_with(base, docs)))
        unequal = impl.prepare(Problem(B, H, N, N, D, mask=_with(base, lognormal)))
        alone = impl.prepare(Problem(N // DOC, H, DOC, DOC, D, mask=base))
        for fn, args in ((packed, (q, k, v)), (alone, batch), (unequal, (q, k, v))):
            fn(*args)  # warm: plans built, pools started
        runs = ((packed, (q, k, v)), (alone, batch), (unequal, (q, k, v)))
        samples: list[list[float]] = [[], [], []]
        for _ in range(repeats):  # alternate so load drifts hit all three alike
            for times, (fn, args) in zip(samples, runs, strict=True):
                t = time.perf_counter()
                fn(*args)
                times.append(time.perf_counter() - t)
        tp, tb, tu = (statistics.median(t) for t in samples)
        useful = kept_pairs(_with(base, lognormal), N, N) / kept_pairs(_with(base, docs), N, N)
        print(f"  {name:12s} {base.describe():22s} packed {tp * 1e3:7.1f} ms  batch "
              f"{tb * 1e3:7.1f} ms  ratio {tp / tb:.2f}   lognormal {tu * 1e3:7.1f} ms "
              f"({useful:.2f}x the kept pairs)")
    dense = registry.get("masked-dense").prepare(Problem(B, H, N, N, D, mask=_with(
        MaskSpec(causal=True), docs)))
    dense(q, k, v)
    print(f"  masked-dense (the n² baseline, same packed mask): "
          f"{_median_s(lambda: dense(q, k, v), max(repeats // 2, 1)) * 1e3:.1f} ms")


def _with(spec: MaskSpec, documents: tuple[int, ...]) -> MaskSpec:
    return MaskSpec(causal=spec.causal, window=spec.window, documents=documents)


def _lognormal_documents(rng: random.Random, n: int, mean: int) -> tuple[int, ...]:
    """Seeded lengths with a lognormal spread (sigma 1) around ``mean``, summing to n."""
    out, left = [], n
    mu = math.log(mean) - 0.5
    while left:
        length = min(left, max(1, round(rng.lognormvariate(mu, 1.0))))
        out.append(length)
        left -= length
    return tuple(out)


def predictions() -> None:
    """Memory and executed-pair predictions at long n, and maxlen's search."""
    print("predictions (memory model + executed pairs, one call each):")
    for name, mask in (("local", MaskSpec(causal=True)),
                       ("local", MaskSpec(causal=True, window=(255, 0))),
                       ("dilated", MaskSpec(window=(255, 255), dilation=4)),
                       ("longformer", MaskSpec(causal=True, window=(255, 0), global_tokens=16)),
                       ("flash-tiled", MaskSpec(causal=True))):
        impl = registry.get(name)
        for n in (65536, 10**6, 2**24):
            problem = Problem(1, 8, n, n, 64, mask=mask)
            t = time.perf_counter()
            impl.cost.memory_model(problem)
            impl.cost.executed_pairs(problem)
            print(f"  {name:11s} {mask.describe():28s} n={n:>9}: {time.perf_counter() - t:.3f} s")
    t = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):
        cli_main(["maxlen", "local", "--no-verify"])
    print(f"  maxlen local --no-verify (in process, imports done): "
          f"{time.perf_counter() - t:.2f} s -> {out.getvalue().strip().splitlines()[-1].strip()}")


def flex_blocks() -> None:
    """Listed (partial + full) blocks against Σ ceil(l/128)² + 2·documents."""
    print(f"flex block lists with documents (block {BLOCK}):")
    rng = random.Random(1)
    for causal in (True, False):
        for mean in (64, 256, 1000):
            docs = _lognormal_documents(rng, N, mean)
            any_, _, _ = block_counts(MaskSpec(causal=causal, documents=docs), N, N)
            bound = sum(math.ceil(x / BLOCK) ** 2 for x in docs) + 2 * len(docs)
            loose = sum((math.ceil(x / BLOCK) + 1) ** 2 for x in docs)
            print(f"  causal={causal!s:5s} {len(docs):4d} docs (mean {mean:4d}): "
                  f"{int(any_.sum()):6d} blocks; target bound {bound}, "
                  f"(ceil+1)² bound {loose}; dense grid {(N // BLOCK) ** 2}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()}, torch threads {torch.get_num_threads()}")
    packing(args.repeats)
    predictions()
    flex_blocks()
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
