"""FlexAttention variants against the float64 reference, and their block masks against
``dense_mask``. Each new (n_q, n_k, D) compiles (seconds), so the shapes here are few and
shared: specs that differ only in numbers reuse one compiled kernel."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import registry
from harness.masks import MaskSpec, dense_mask, kept_pairs
from harness.reference import reference_attention
from harness.spec import Problem
from implementations.flex import BLOCK, block_counts
from tests.conftest import make_qkv

AVAILABLE = registry.get("flex-local").unavailable_reason() is None
needs_flex = pytest.mark.skipif(not AVAILABLE, reason="FlexAttention/torch.compile unavailable")

SHAPES = [(1, 2, 97, 97, 32), (1, 2, 161, 33, 32)]  # one compile each for the window family
CASES = [
    ("flex-local", MaskSpec(causal=True, window=(5, 0))),
    ("flex-local", MaskSpec(window=(3, 9))),
    ("flex-local", MaskSpec(window=(300, 200), global_tokens=4)),
    ("flex-dilated", MaskSpec(causal=True, window=(4, 2), dilation=3)),
    ("flex-dilated", MaskSpec(window=(2, 5), dilation=2, global_tokens=5)),
]
BLOCK_CASES = [
    MaskSpec(causal=True, window=(1, 0), block_size=8, random_blocks=2, global_tokens=16),
    MaskSpec(window=(1, 1), block_size=8, random_blocks=1, seed=4),
]


@needs_flex
@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_window_family_matches_reference(shape):
    q, k, v = make_qkv(*shape, seed=1)
    for name, mask in CASES:
        out = registry.get(name)(q, k, v, mask)
        assert torch.isfinite(out).all(), (name, mask)
        torch.testing.assert_close(
            out.double(),
            reference_attention(q, k, v, mask),
            atol=2e-5,
            rtol=1e-4,
            msg=f"{name} {mask.describe()}",
        )


@needs_flex
@pytest.mark.slow
def test_blocksparse_matches_reference_and_prepare():
    shape = SHAPES[0]
    q, k, v = make_qkv(*shape, seed=2)
    for mask in BLOCK_CASES:
        fn = registry.get("flex-blocksparse").prepare(Problem(*shape, mask=mask))
        torch.testing.assert_close(
            fn(q, k, v).double(),
            reference_attention(q, k, v, mask),
            atol=2e-5,
            rtol=1e-4,
            msg=mask.describe(),
        )


def test_backward_on_cpu_is_declared_unsupported():
    reasons = registry.get("flex-local").not_supported(
        Problem(1, 1, 64, 64, 16, mask=MaskSpec(causal=True, window=(3, 0)), backward=True)
    )
    assert reasons


side = st.one_of(st.none(), st.integers(0, 300))


@settings(max_examples=25, deadline=None)
@given(
    causal=st.booleans(),
    left=side,
    right=side,
    d=st.integers(1, 3),
    g=st.integers(0, 40),
    n_q=st.integers(1, 400),
    n_k=st.integers(1, 400),
)
def test_block_counts_match_dense_mask(causal, left, right, d, g, n_q, n_k):
    """``any`` blocks hold every kept pair, ``full`` blocks only kept pairs."""
    mask = MaskSpec(causal=causal, window=(left, right), dilation=d, global_tokens=g)
    any_, full, executed = block_counts(mask, n_q, n_k)
    dense = dense_mask(mask, n_q, n_k)
    n_qb, n_kb = any_.shape
    padded = torch.zeros(n_qb * BLOCK, n_kb * BLOCK, dtype=torch.bool)
    padded[:n_q, :n_k] = dense
    blocks = padded.view(n_qb, BLOCK, n_kb, BLOCK)
    assert torch.equal(any_, blocks.any(3).any(1))
    assert not (full & ~blocks.all(3).all(1)).any()
    assert kept_pairs(mask, n_q, n_k) <= executed <= n_q * n_k
