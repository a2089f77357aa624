"""The plain paged path (:mod:`harness.paged`) against a float64 reference written from the mask
definition, sequence by sequence, and its layout helpers."""

from __future__ import annotations

import math

import pytest
import torch

from harness.masks import MaskSpec, dense_mask
from harness.paged import gather_padded, gather_sequence, key_mask, paged_attention, sequence_pages


def _pool(lengths, page, kv_heads, d, seed=0, shuffle=True):
    """Logical K/V (B, max, H_kv, D) float64 and a pool of shuffled pages holding them
    (``shuffle`` False: the pages of each sequence end to end, sequences in order)."""
    gen = torch.Generator().manual_seed(seed)
    b, longest = len(lengths), max(lengths)
    k = torch.randn(b, longest, kv_heads, d, generator=gen, dtype=torch.float64)
    v = torch.randn(b, longest, kv_heads, d, generator=gen, dtype=torch.float64)
    counts = [-(-n // page) for n in lengths]
    order = torch.randperm(sum(counts), generator=gen).tolist() if shuffle else \
        list(range(sum(counts)))
    k_pages = torch.zeros(sum(counts), page, kv_heads, d, dtype=torch.float64)
    v_pages = torch.zeros_like(k_pages)
    table = torch.full((b, max(counts)), -1, dtype=torch.int32)
    taken = 0
    for i, (n, c) in enumerate(zip(lengths, counts, strict=True)):
        for j in range(c):
            phys = order[taken]
            taken += 1
            table[i, j] = phys
            rows = slice(j * page, min(n, (j + 1) * page))
            k_pages[phys, : rows.stop - rows.start] = k[i, rows]
            v_pages[phys, : rows.stop - rows.start] = v[i, rows]
    return k, v, k_pages, v_pages, table, torch.tensor(lengths, dtype=torch.int32)


def _reference(q, k, v, lengths):
    """Sequence by sequence: softmax(q kᵀ/√D + causal mask (bottom-right)) v, float64, K/V
    heads repeated."""
    out = torch.empty_like(q)
    heads, q_len, d = q.shape[1:]
    for i, n in enumerate(lengths):
        ki = k[i, :n].transpose(0, 1).repeat_interleave(heads // k.shape[2], dim=0)
        vi = v[i, :n].transpose(0, 1).repeat_interleave(heads // k.shape[2], dim=0)
        scores = q[i] @ ki.transpose(-2, -1) / math.sqrt(d)
        keep = dense_mask(MaskSpec(causal=True), q_len, n, "cpu")
        out[i] = torch.softmax(scores.masked_fill(~keep, float("-inf")), -1) @ vi
    return out


@pytest.mark.parametrize(
    "lengths, q_len, heads, kv_heads, page",
    [
        ((1, 2, 97, 513), 1, 8, 2, 16),  # GQA 4:1, odd lengths, a sequence of one token
        ((3, 5, 97, 513), 3, 4, 1, 16),  # MQA, three tokens per step (causal within it)
        ((7, 15, 16, 17), 2, 6, 6, 16),  # shorter than a page, exactly one, one past it
        ((97,), 1, 3, 3, 1),  # pages of one token
    ],
)
def test_plain_path_matches_the_mask_definition(lengths, q_len, heads, kv_heads, page):
    k, v, kp, vp, table, lens = _pool(lengths, page, kv_heads, 59)
    q = torch.randn(len(lengths), heads, q_len, 59, dtype=torch.float64)
    out = paged_attention(q, kp, vp, table, lens)
    assert (out - _reference(q, k, v, lengths)).abs().max() < 1e-12


def test_a_wrong_block_table_entry_changes_the_output():
    k, v, kp, vp, table, lens = _pool((40, 513), 16, 2, 59)
    q = torch.randn(2, 4, 1, 59, dtype=torch.float64)
    wrong = table.clone()
    wrong[1, 3] = table[0, 1]  # sequence 1's fourth page: one of sequence 0's
    # (swapping two of its own pages would not do: one query sees every key, in any order)
    ref = _reference(q, k, v, (40, 513))
    assert (paged_attention(q, kp, vp, table, lens) - ref).abs().max() < 1e-12
    assert (paged_attention(q, kp, vp, wrong, lens) - ref)[1].abs().max() > 1e-3


def test_padded_gather_and_key_mask():
    k, _, kp, _, table, lens = _pool((5, 20), 8, 1, 4)
    padded = gather_padded(kp, table, 24)  # (B, H_kv, 24, D)
    assert padded.shape == (2, 1, 24, 4)
    assert torch.equal(padded[1, 0, :20], k[1, :20, 0])
    assert torch.equal(padded[0, 0, :5], k[0, :5, 0])
    keep = key_mask(lens, 2, 24)  # queries at 3, 4 (seq 0) and 18, 19 (seq 1)
    assert keep.shape == (2, 1, 2, 24)
    assert keep[0, 0].sum(-1).tolist() == [4, 5] and keep[1, 0].sum(-1).tolist() == [19, 20]


def test_bad_layouts_are_one_line_errors():
    _, _, kp, vp, table, lens = _pool((5, 20), 8, 2, 4)
    with pytest.raises(ValueError, match="heads over"):
        paged_attention(torch.randn(2, 3, 1, 4, dtype=torch.float64), kp, vp, table, lens)
    with pytest.raises(ValueError, match="for a batch of 3"):
        paged_attention(torch.randn(3, 4, 1, 4, dtype=torch.float64), kp, vp, table, lens)
    with pytest.raises(ValueError, match="fewer than"):
        paged_attention(torch.randn(2, 4, 6, 4, dtype=torch.float64), kp, vp, table, lens)


def _shares_storage(view, pool):
    return view.untyped_storage().data_ptr() == pool.untyped_storage().data_ptr()


@pytest.mark.parametrize("page", [16, 513])  # consecutive pages; one page per sequence
def test_consecutive_pages_are_read_in_place_and_scattered_ones_gathered(page):
    lengths = (97, 513)
    k, v, kp, vp, table, lens = _pool(lengths, page, 2, 59, shuffle=False)
    q = torch.randn(2, 8, 1, 59, dtype=torch.float64)
    assert (paged_attention(q, kp, vp, table, lens) - _reference(q, k, v, lengths)).abs().max() \
        < 1e-12
    where = sequence_pages(table[1], 513, page)
    assert where == slice(int(table[1, 0]), int(table[1, 0]) + -(-513 // page))
    assert _shares_storage(gather_sequence(kp, where, 513), kp)
    _, _, kp, _, table, _ = _pool(lengths, 16, 2, 59)  # shuffled: a copy of the pages
    where = sequence_pages(table[1], 513, 16)
    assert isinstance(where, torch.Tensor)
    assert not _shares_storage(gather_sequence(kp, where, 513), kp)


def test_a_contiguous_cache_is_read_in_place_until_its_table_changes():
    k, _, kp, _, table, _ = _pool((20, 20), 20, 1, 4, shuffle=False)  # sequence b in page b
    padded = gather_padded(kp, table, 20)
    assert _shares_storage(padded, kp) and torch.equal(padded[:, 0], k[:, :, 0])
    table[0, 0], table[1, 0] = 1, 0  # in place: the remembered answer must not be reused
    swapped = gather_padded(kp, table, 20)
    assert not _shares_storage(swapped, kp)
    assert torch.equal(swapped[0, 0], k[1, :, 0]) and torch.equal(swapped[1, 0], k[0, :, 0])
