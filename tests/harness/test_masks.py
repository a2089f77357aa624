"""The executable mask definition, checked against hand-written cases and invariants, and its
closed-form pair counts against the dense mask they must equal."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from harness.masks import (
    MaskError,
    MaskSpec,
    block_layout,
    block_pair_counts,
    dense_mask,
    kept_pairs,
    reduced,
)
from harness.paircount import band_pairs


def brute_force(spec: MaskSpec, n_q: int, n_k: int) -> torch.Tensor:
    """The module docstring's rules written as a double loop (the spec read literally)."""
    if spec.documents is not None:  # rule 5: each document is its own sequence
        out = torch.zeros(n_q, n_k, dtype=torch.bool)
        local, start = MaskSpec(**{**spec.__dict__, "documents": None}), 0
        for length in spec.documents:
            out[start : start + length, start : start + length] = _rules(local, length, length)
            start += length
        return out
    return _rules(spec, n_q, n_k)


def _rules(spec: MaskSpec, n_q: int, n_k: int) -> torch.Tensor:
    out = torch.zeros(n_q, n_k, dtype=torch.bool)
    off = n_k - n_q
    g = spec.global_tokens
    glob = set(range(g)) if isinstance(g, int) else set(g)
    for i in range(n_q):
        p = i + off
        member = max(p, 0)  # a row before the first key counts as position 0
        for j in range(n_k):
            rel = j - p
            d = spec.dilation
            if spec.block_size is not None:
                b = spec.block_size
                keep = p >= 0 and bool(block_layout(spec, n_q, n_k)[p // b, j // b])
            else:
                keep = rel % d == 0
                if spec.left is not None:
                    keep &= rel >= -spec.left * d
                if spec.right is not None:
                    keep &= rel <= spec.right * d
            if member in glob or j in glob:
                keep = True
            if spec.causal:
                keep &= rel <= 0
            if member < spec.prefix_len and j < spec.prefix_len:
                keep = True
            out[i, j] = keep
    return out


HAND_CASES = [
    MaskSpec(),
    MaskSpec(causal=True),
    MaskSpec(window=(2, 1)),
    MaskSpec(causal=True, window=(3, 0)),
    MaskSpec(window=(2, 2), dilation=2),
    MaskSpec(causal=True, window=(2, None), global_tokens=2),
    MaskSpec(window=(0, 0), global_tokens=1),
    MaskSpec(window=(1, 0), global_tokens=(3, 5)),
    MaskSpec(causal=True, prefix_len=3),
    MaskSpec(causal=True, window=(1, 0), prefix_len=4, global_tokens=(6,)),
    MaskSpec(window=(1, 1), block_size=2, global_tokens=(0, 1, 6, 7)),
]


@pytest.mark.parametrize("n_q,n_k", [(7, 7), (3, 11), (11, 3), (1, 9), (8, 8)])
@pytest.mark.parametrize("spec", HAND_CASES, ids=lambda s: s.describe())
def test_dense_mask_matches_the_rules(spec, n_q, n_k):
    try:
        spec.check_lengths(n_q, n_k)
    except MaskError:
        pytest.skip("spec does not fit these lengths")
    assert torch.equal(dense_mask(spec, n_q, n_k), brute_force(spec, n_q, n_k))


@pytest.mark.parametrize(
    "spec",
    [
        MaskSpec(causal=True, documents=(3, 1, 5)),
        MaskSpec(window=(1, 1), documents=(4, 5)),
        MaskSpec(causal=True, window=(2, 0), dilation=2, global_tokens=1, documents=(2, 7)),
        MaskSpec(causal=True, prefix_len=2, global_tokens=(0, 3), documents=(5, 4)),
    ],
    ids=lambda s: s.describe(),
)
def test_documents_are_sequences_of_their_own(spec):
    assert torch.equal(dense_mask(spec, 9, 9), brute_force(spec, 9, 9))


def test_documents_never_reach_across_a_boundary():
    m = dense_mask(MaskSpec(global_tokens=1, prefix_len=2, documents=(3, 4)), 7, 7)
    assert not m[:3, 3:].any() and not m[3:, :3].any()
    assert m[3:, 3].all() and m[3, 3:].all()  # the second document's first token is global


def test_causal_is_bottom_right_aligned():
    # 2 queries over 4 keys: the last query sees every key, the first all but the last
    m = dense_mask(MaskSpec(causal=True), 2, 4)
    assert m.tolist() == [[True, True, True, False], [True, True, True, True]]


def test_rows_before_the_first_key_count_as_position_zero():
    """n_q > n_k: such a row is global exactly when position 0 is, whatever the spelling."""
    as_count = dense_mask(MaskSpec(window=(0, 0), global_tokens=2), 6, 4)
    as_tuple = dense_mask(MaskSpec(window=(0, 0), global_tokens=(0, 1, 3)), 6, 4)
    assert as_count[:2].all() and as_tuple[:2].all()
    without_zero = dense_mask(MaskSpec(window=(0, 0), global_tokens=(3,)), 6, 4)
    assert without_zero[:2].tolist() == [[False, False, False, True]] * 2


def test_prefix_lm_is_attention_gyms():
    """``kv < P or q >= kv`` (attention-gym's prefix_lm) at odd lengths."""
    for n, prefix in ((13, 5), (97, 31), (9, 9)):
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        expected = (j < prefix) | (i >= j)
        assert torch.equal(dense_mask(MaskSpec(causal=True, prefix_len=prefix), n, n), expected)


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


def test_hf_bigbird_first_and_last_blocks_are_global():
    b, n = 4, 30  # the last block is short: it ends with the sequence
    spec = MaskSpec(window=(1, 1), block_size=b, global_tokens=(*range(b), *range(28, 30)))
    m = dense_mask(spec, n, n)
    assert m[:b].all() and m[28:].all() and m[:, :b].all() and m[:, 28:].all()


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
        {"global_tokens": (3, -1)},
        {"global_tokens": True},
        {"random_blocks": 1},
        {"block_size": 4, "global_tokens": 3},
        {"block_size": 4, "global_tokens": (4, 5, 6, 9)},  # a short block before the last
        {"block_size": 4, "global_tokens": (5, 6, 7)},  # a block that starts late
        {"block_size": 4, "dilation": 2},
        {"block_size": 4, "documents": (4, 4)},
        {"documents": ()},
        {"documents": (3, 0, 2)},
        {"prefix_len": -1},
    ],
)
def test_contradictory_specs_are_rejected(kwargs):
    with pytest.raises(MaskError):
        MaskSpec(**kwargs)


@pytest.mark.parametrize(
    "kwargs,n_q,n_k,message",
    [
        ({"documents": (3, 4)}, 8, 8, "sum to 7"),
        ({"documents": (4, 4)}, 4, 8, "n_q == n_k"),
        ({"global_tokens": (2, 9)}, 9, 9, "outside a sequence of 9"),
        ({"global_tokens": (5,), "documents": (4, 4)}, 8, 8, "outside every document"),
        ({"prefix_len": 10}, 9, 9, "prefix_len 10 > sequence length 9"),
        ({"block_size": 4, "global_tokens": (8, 9)}, 12, 12, "whole blocks"),
    ],
)
def test_lengths_that_do_not_fit_are_one_clear_error(kwargs, n_q, n_k, message):
    with pytest.raises(MaskError, match=message):
        dense_mask(MaskSpec(**kwargs), n_q, n_k)
    with pytest.raises(MaskError, match=message):
        kept_pairs(MaskSpec(**kwargs), n_q, n_k)


def test_one_spelling_per_mask():
    assert MaskSpec(global_tokens=(2, 0, 1, 1)) == MaskSpec(global_tokens=3)
    assert MaskSpec(global_tokens=[5, 1]).global_tokens == (1, 5)
    assert MaskSpec(window=(-1, 3)) == MaskSpec(window=(None, 3))


def test_kept_pairs_counts_exactly():
    assert kept_pairs(MaskSpec(causal=True), 4, 4) == 10
    assert kept_pairs(MaskSpec(), 5, 7) == 35
    assert kept_pairs(MaskSpec(causal=True, window=(1, 0)), 4, 4) == 7
    assert kept_pairs(MaskSpec(causal=True, documents=(1, 3)), 4, 4) == 1 + 6
    assert kept_pairs(MaskSpec(causal=True, prefix_len=3), 4, 4) == 9 + 4


def test_kept_pairs_is_closed_form_at_a_million_tokens():
    """Packed causal documents of 1000 and a windowed mask with scattered globals at n = 10^6:
    the counts are the formulas' (a pair-visiting count would take hours)."""
    n = 10**6
    assert kept_pairs(MaskSpec(causal=True, documents=(1000,) * 1000), n, n) == 1000 * 500500
    spec = MaskSpec(causal=True, window=(0, 0), global_tokens=(0, n - 1))
    # each row keeps itself and key 0; row 0 and the last row keep every key up to themselves
    assert kept_pairs(spec, n, n) == (n - 2) * 2 + 1 + n


def test_band_pairs_is_the_diagonal_sum():
    rng = np.random.default_rng(0)
    for _ in range(200):
        a0, b0 = rng.integers(-5, 10, 2)
        a1, b1 = a0 + rng.integers(0, 12), b0 + rng.integers(0, 12)
        lo, hi = sorted(rng.integers(-15, 15, 2))
        d = int(rng.integers(1, 5))
        p, j = np.arange(a0, a1)[:, None], np.arange(b0, b1)[None, :]
        rel = j - p
        want = int(((rel >= lo) & (rel <= hi) & (rel % d == 0)).sum())
        assert int(band_pairs(a0, a1, b0, b1, lo, hi, d)) == want


side = st.one_of(st.none(), st.integers(0, 12))


@st.composite
def specs_and_lengths(draw):
    """Any valid spec with lengths it fits: every feature, combined."""
    n_q, n_k = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    kw = {"causal": draw(st.booleans()), "window": (draw(side), draw(side))}
    if draw(st.booleans()):  # block-sparse, global blocks at any block positions
        b = draw(st.integers(1, 6))
        blocks = draw(st.sets(st.integers(0, (n_k - 1) // b), max_size=2))
        kw |= {"block_size": b, "random_blocks": draw(st.integers(0, 2)),
               "seed": draw(st.integers(0, 5)),
               "global_tokens": tuple(x for c in blocks for x in range(c * b, min(c * b + b, n_k)))}
    else:
        if draw(st.booleans()):
            n_k = n_q
            kw["documents"] = tuple(draw(st.lists(st.integers(1, 12), min_size=1, max_size=6)))
            n_q = n_k = sum(kw["documents"])
        longest = max(kw.get("documents") or (n_k,))
        kw["dilation"] = draw(st.integers(1, 4))
        kw["global_tokens"] = draw(st.one_of(
            st.integers(0, 6), st.lists(st.integers(0, longest - 1), max_size=6).map(tuple)))
    kw["prefix_len"] = draw(st.integers(0, n_k)) if draw(st.booleans()) else 0
    try:
        return MaskSpec(**kw), n_q, n_k
    except MaskError:  # a whole sequence shorter than one global block: spelled as a count
        assume(False)


@settings(max_examples=300, deadline=None)
@given(case=specs_and_lengths())
def test_closed_form_pair_count_equals_the_dense_mask(case):
    spec, n_q, n_k = case
    assert kept_pairs(spec, n_q, n_k) == int(dense_mask(spec, n_q, n_k).sum())


@settings(max_examples=200, deadline=None)
@given(case=specs_and_lengths(), bq=st.integers(1, 9), bk=st.integers(1, 9))
def test_block_pair_counts_equal_the_dense_mask(case, bq, bk):
    """Every block that keeps a pair is listed, with its exact count; no other block is."""
    spec, n_q, n_k = case
    n_qb, n_kb = -(-n_q // bq), -(-n_k // bk)
    padded = torch.zeros(n_qb * bq, n_kb * bk, dtype=torch.long)
    padded[:n_q, :n_k] = dense_mask(spec, n_q, n_k).long()
    want = padded.view(n_qb, bq, n_kb, bk).sum((1, 3))
    qb, kb, counts = block_pair_counts(spec, n_q, n_k, bq, bk)
    got = torch.zeros(n_qb, n_kb, dtype=torch.long)
    got[torch.from_numpy(qb), torch.from_numpy(kb)] = torch.from_numpy(counts)
    assert torch.equal(got, want)
    assert (counts > 0).all()


@settings(max_examples=400, deadline=None)
@given(case=specs_and_lengths(), one_query=st.booleans())
def test_a_reduced_mask_keeps_exactly_the_same_pairs(case, one_query):
    spec, n_q, n_k = case
    if one_query and spec.documents is None:
        n_q = 1
    try:
        spec.check_lengths(n_q, n_k)
    except MaskError:
        assume(False)
    simple = reduced(spec, n_q, n_k)
    assert torch.equal(dense_mask(simple, n_q, n_k), dense_mask(spec, n_q, n_k))
    assert simple.features <= spec.features and simple.seed == spec.seed
    assert reduced(simple, n_q, n_k) == simple  # one step reaches the simplest form


DILATED = MaskSpec(causal=True, window=(2, 0), dilation=4)


@pytest.mark.parametrize(
    "spec,n_q,n_k,want",
    [
        (MaskSpec(causal=True), 1, 4096, MaskSpec()),  # one query row: every key
        (MaskSpec(causal=True, seed=3), 1, 9, MaskSpec(seed=3)),  # random features read it
        (MaskSpec(causal=True, global_tokens=2, prefix_len=3), 1, 9, MaskSpec()),
        (MaskSpec(causal=True, window=(8, 0)), 1, 9, MaskSpec()),  # the window holds every key
        (MaskSpec(causal=True, window=(8, 0)), 4, 9, MaskSpec(causal=True)),
        (MaskSpec(causal=True, window=(4, 0)), 1, 9, MaskSpec(causal=True, window=(4, 0))),
        (MaskSpec(window=(8, 3)), 4, 9, MaskSpec()),  # n_q <= window on the open side
        (MaskSpec(window=(2, 3)), 4, 9, MaskSpec(window=(2, None))),
        (MaskSpec(causal=True, global_tokens=2), 9, 9, MaskSpec(causal=True)),
        (MaskSpec(causal=True, prefix_len=3), 9, 9, MaskSpec(causal=True, prefix_len=3)),
        (MaskSpec(causal=True), 9, 9, MaskSpec(causal=True)),
        (DILATED, 1, 9, DILATED),  # a dilated window keeps its form
        (MaskSpec(window=(1, 1), block_size=2), 1, 8, MaskSpec(window=(1, 1), block_size=2)),
    ],
)
def test_masks_that_reduce_to_simpler_ones(spec, n_q, n_k, want):
    assert reduced(spec, n_q, n_k) == want
