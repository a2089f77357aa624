"""Time every registered implementation through pytest-benchmark's ``benchmark`` fixture.

One benchmark per implementation, sequence length and mask, for the masks each implementation
declares it supports (dense, causal, sliding window, dilated, Longformer, BigBird). Small CPU
sizes by default; ``ATTNBENCH_BENCH_DEVICE=cuda`` runs them on a GPU (the timed call
then synchronizes). Set-up (inputs, ``Implementation.prepare``) stays outside the timing, and
each output is checked against the float64 reference (an approximation's: its own definition)
once before it is timed, so a benchmark never reports the speed of a wrong answer.
"""

from __future__ import annotations

import os

import pytest
import torch

from harness import registry
from harness.oracle.agreement import tolerance
from harness.oracle.reference import reference_attention
from harness.scenarios.interface import Point

DEVICE = os.environ.get("ATTNBENCH_BENCH_DEVICE", "cpu")
SEQ_LENS = (256, 1024)
SHAPE = {"batch": 1, "heads": 4, "head_dim": 64, "dtype": "float32"}
# Masks as Point fields; each implementation gets those its declared mask features cover.
MASKS: dict[str, dict] = {
    "dense": {},
    "causal": {"causal": True},
    "sliding128": {"causal": True, "window_left": 127, "window_right": 0},
    "dilated2": {"causal": True, "window_left": 63, "window_right": 0, "dilation": 2},
    "longformer": {"window_left": 64, "window_right": 64, "global_tokens": 16},
    "bigbird": {
        "block_size": 64,
        "window_left": 64,
        "window_right": 64,
        "global_tokens": 64,
        "random_blocks": 1,
    },
}


def _cases() -> list:
    cases = []
    for impl in registry.all_implementations():
        for mask_name, fields in MASKS.items():
            if not Point.of(impl=impl.name, **fields).mask.features <= impl.caps.mask_features:
                continue
            for n in SEQ_LENS:
                cases.append(
                    pytest.param(impl.name, n, mask_name, id=f"{impl.name}-n{n}-{mask_name}")
                )
    return cases


@pytest.mark.parametrize(("name", "seq_len", "mask_name"), _cases())
def test_attention_forward(benchmark, name: str, seq_len: int, mask_name: str) -> None:
    point = Point.of(impl=name, device=DEVICE, seq_len=seq_len, **SHAPE, **MASKS[mask_name])
    impl, problem = registry.get(name), point.problem()
    reasons = impl.not_supported(problem)
    if reasons:
        pytest.skip("; ".join(reasons))
    gen = torch.Generator().manual_seed(0)
    q, k, v = (  # (B, H, N, D)
        torch.randn(point.batch, point.heads, seq_len, point.head_dim, generator=gen).to(
            device=DEVICE, dtype=point.torch_dtype
        )
        for _ in range(3)
    )
    fn = impl.prepare(problem)
    tol = tolerance(point.torch_dtype)
    if impl.approximate:  # held to its own float64 definition, not to softmax attention
        ref = impl.define(q.double(), k.double(), v.double(), point.mask)
    else:
        ref = reference_attention(q, k, v, point.mask)
    torch.testing.assert_close(fn(q, k, v).double(), ref, atol=tol.atol, rtol=tol.rtol)

    def call() -> torch.Tensor:
        out = fn(q, k, v)
        if DEVICE.startswith("cuda"):
            torch.cuda.synchronize()
        return out

    benchmark.group = f"n={seq_len} {mask_name}"
    benchmark.extra_info.update(
        point.columns(), threads=torch.get_num_threads(), torch=torch.__version__
    )
    out = benchmark(call)
    assert out.shape == q.shape
