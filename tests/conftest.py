"""Shared fixtures: fresh seeded random inputs (never zeros) at deliberately odd sizes."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch

# Without a GPU the fused Triton kernels run in Triton's NumPy interpreter. The flag is read
# when a kernel is defined, so it is set here, before any test imports the kernel modules.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# The fused kernels launch their class default config, not autotuned (one compile per kernel and
# mask mode; on a GPU autotuning compiles and times every config); one test autotunes on purpose.
os.environ.setdefault("ATTNBENCH_AUTOTUNE", "off")

# Probe outcomes the tests' runs record go to a scratch cache, not the user's (harness.probecache);
# set in the environment, so the CLI subprocesses that tests start use it too.
os.environ.setdefault("ATTNBENCH_CACHE_DIR", tempfile.mkdtemp(prefix="attnbench-test-cache-"))

# The core implementations: every test over the core set uses this list.
CORE_IMPLEMENTATIONS = [
    "full",
    "sdpa",
    "sdpa-math",
    "sdpa-flash",
    "sdpa-efficient",
    "sdpa-cudnn",
    "flash-tiled",
    "xformers",
    "flash-attn",
]


def make_qkv(
    batch: int,
    heads: int,
    n_q: int,
    n_k: int,
    head_dim: int,
    *,
    kv_heads: int | None = None,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    requires_grad: bool = False,
):
    """q: (B, H, n_q, D), k/v: (B, H_kv, n_k, D), N(0, 1) from a seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    kv = kv_heads or heads
    shapes = [(batch, heads, n_q, head_dim), (batch, kv, n_k, head_dim), (batch, kv, n_k, head_dim)]
    return tuple(
        torch.randn(s, generator=gen, dtype=dtype).requires_grad_(requires_grad) for s in shapes
    )


@pytest.fixture(autouse=True)
def _two_threads():
    """Pin intra-op threads so memory and timing behave the same on every 2-core runner."""
    before = torch.get_num_threads()
    torch.set_num_threads(min(2, before))
    yield
    torch.set_num_threads(before)
