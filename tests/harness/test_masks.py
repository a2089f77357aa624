"""The executable mask definition, checked against hand-written cases and invariants."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.masks import MaskError, MaskSpec, block_layout, dense_mask, kept_pairs


def brute_force(spec: MaskSpec, n_q: int, n_k: int) -> torch.Tensor:
    """DESIGN.md's rules written as a double loop (the spec read literally)."""
    out = torch.zeros(n_q, n_k, dtype=torch.bool)
    off = n_k - n_q
    for i in range(n_q):
        p = i + off
        for j in range(n_k):
            rel = j - p
            d = spec.dilation
            local = True
            if spec.left is not None:
                local &= rel >= -spec.left * d
            if spec.right is not None:
                local &= rel <= spec.right * d
            local &= rel % d == 0
            if spec.global_tokens and (p < spec.global_tokens or j < spec.global_tokens):
                local = True
            if spec.causal:
                local &= rel <= 0
            out[i, j] = local
    return out


@pytest.mark.parametrize("n_q,n_k", [(7, 7), (3, 11), (11, 3), (1, 9)])
@pytest.mark.parametrize(
    "spec",
    [
        MaskSpec(),
        MaskSpec(causal=True),
        MaskSpec(window=(2, 1)),
        MaskSpec(causal=True, window=(3, 0)),
        MaskSpec(window=(2, 2), dilation=2),
        MaskSpec(causal=True, window=(2, None), global_tokens=2),
        MaskSpec(window=(0, 0), global_tokens=1),
    ],
    ids=lambda s: s.describe(),
)
def test_dense_mask_matches_the_rules(spec, n_q, n_k):
    assert torch.equal(dense_mask(spec, n_q, n_k), brute_force(spec, n_q, n_k))


def test_causal_is_bottom_right_aligned():
    # 2 queries over 4 keys: the last query sees every key, the first all but the last
    m = dense_mask(MaskSpec(causal=True), 2, 4)
    assert m.tolist() == [[True, True, True, False], [True, True, True, True]]


def test_kept_pairs_counts_exactly():
    assert kept_pairs(MaskSpec(causal=True), 4, 4) == 10
    assert kept_pairs(MaskSpec(), 5, 7) == 35
    assert kept_pairs(MaskSpec(causal=True, window=(1, 0)), 4, 4) == 7
    spec = MaskSpec(causal=True, window=(63, 0), global_tokens=3)
    assert kept_pairs(spec, 301, 301, chunk=17) == int(dense_mask(spec, 301, 301).sum())


def test_dilation_keeps_the_key_count_over_a_wider_span():
    plain = dense_mask(MaskSpec(window=(4, 4)), 64, 64)[32]
    dilated = dense_mask(MaskSpec(window=(4, 4), dilation=3), 64, 64)[32]
    assert int(plain.sum()) == int(dilated.sum()) == 9
    span = dilated.nonzero().flatten()
    assert int(span.max() - span.min()) == 3 * 8


def test_empty_rows_exist_when_n_q_exceeds_n_k():
    m = dense_mask(MaskSpec(causal=True), 5, 2)
    assert m.sum(-1).tolist() == [0, 0, 0, 1, 2]


def test_block_layout_sliding_global_random():
    spec = MaskSpec(window=(1, 1), block_size=4, global_tokens=4, random_blocks=1, seed=3)
    layout = block_layout(spec, 32, 32)
    assert layout.shape == (8, 8)
    for row in range(8):
        sliding = {c for c in (row - 1, row, row + 1) if 0 <= c < 8}
        extra = set(layout[row].nonzero().flatten().tolist()) - sliding - {0}
        assert len(extra) <= 1  # one random block, never a sliding or global one
    m = dense_mask(spec, 32, 32)
    assert m[:4].all() and m[:, :4].all()  # global block rows and columns
    assert torch.equal(m[8:12, 8:12], torch.ones(4, 4, dtype=torch.bool))


def test_block_layout_is_seeded():
    a = MaskSpec(window=(0, 0), block_size=2, random_blocks=2, seed=1)
    b = MaskSpec(window=(0, 0), block_size=2, random_blocks=2, seed=2)
    assert torch.equal(block_layout(a, 40, 40), block_layout(a, 40, 40))
    assert not torch.equal(block_layout(a, 40, 40), block_layout(b, 40, 40))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"window": (-2, 0)},
        {"dilation": 0},
        {"global_tokens": -1},
        {"random_blocks": 1},
        {"block_size": 4, "global_tokens": 3},
        {"block_size": 4, "dilation": 2},
    ],
)
def test_contradictory_specs_are_rejected(kwargs):
    with pytest.raises(MaskError):
        MaskSpec(**kwargs)


def test_minus_one_means_unbounded():
    assert MaskSpec(window=(-1, 3)) == MaskSpec(window=(None, 3))


side = st.one_of(st.none(), st.integers(0, 12))


@settings(max_examples=150, deadline=None)
@given(
    causal=st.booleans(),
    left=side,
    right=side,
    dilation=st.integers(1, 4),
    global_tokens=st.integers(0, 6),
    n_q=st.integers(1, 40),
    n_k=st.integers(1, 40),
)
def test_closed_form_pair_count_equals_the_dense_mask(
    causal, left, right, dilation, global_tokens, n_q, n_k
):
    spec = MaskSpec(
        causal=causal, window=(left, right), dilation=dilation, global_tokens=global_tokens
    )
    assert kept_pairs(spec, n_q, n_k) == int(dense_mask(spec, n_q, n_k).sum())


@settings(max_examples=40, deadline=None)
@given(
    window=st.integers(0, 3),
    random_blocks=st.integers(0, 2),
    block=st.integers(1, 5),
    causal=st.booleans(),
    n=st.integers(1, 40),
    seed=st.integers(0, 5),
)
def test_block_sparse_pair_count_equals_the_dense_mask(
    window, random_blocks, block, causal, n, seed
):
    spec = MaskSpec(
        causal=causal,
        window=(window, window),
        block_size=block,
        random_blocks=random_blocks,
        seed=seed,
    )
    assert kept_pairs(spec, n, n, chunk=7) == int(dense_mask(spec, n, n).sum())
