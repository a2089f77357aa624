"""A paged KV cache as serving engines hold it, and the plain attention over it: the one
definition every paged path is checked against.

The layout (FlashInfer's and flash-attn's "NHD" pages, vLLM's block table):

- ``k_pages``, ``v_pages``: (num_pages, page_size, H_kv, D), one pool shared by the batch;
- ``block_table``: (B, max_pages) int32, the physical page of each logical page of sequence b
  (entries past the sequence's last page are unused; -1 by convention);
- ``context_lens``: (B,) int32, the keys of sequence b *including* this step's ``q_len`` tokens.

Key ``j`` of sequence b lives in page ``block_table[b, j // page_size]`` at slot
``j % page_size``. A contiguous cache is the same layout with one page per sequence
(``page_size`` = the capacity, ``block_table[b] = [b]``): the padded form of a ragged batch.

The queries of a step: q (B, H, q_len, D); query t of sequence b sits at position
``context_lens[b] - q_len + t`` and sees the keys ``j <= that position`` (causal within the
step, bottom-right aligned per sequence, as :mod:`harness.masks` aligns one sequence). H is a
multiple of H_kv (grouped or multi-query K/V: head h reads K/V head ``h // (H / H_kv)``).
Output (B, H, q_len, D) in q's dtype.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def check_layout(
    q: Tensor, k_pages: Tensor, v_pages: Tensor, block_table: Tensor, context_lens: Tensor
) -> None:
    """Raise ValueError (one line) when the tensors do not follow the module's layout."""
    if q.dim() != 4 or k_pages.dim() != 4 or k_pages.shape != v_pages.shape:
        raise ValueError("paged attention: q (B, H, q_len, D), k/v pages (P, page, H_kv, D)")
    b, heads, _, d = q.shape
    if k_pages.shape[-1] != d or heads % k_pages.shape[2]:
        raise ValueError(
            f"paged attention: {heads} heads over {k_pages.shape[2]} K/V heads of "
            f"size {k_pages.shape[-1]} (q head size {d})"
        )
    if block_table.shape[0] != b or context_lens.shape != (b,):
        raise ValueError(
            f"paged attention: block table {tuple(block_table.shape)} and context "
            f"lengths {tuple(context_lens.shape)} for a batch of {b}"
        )


def gather_sequence(pages: Tensor, block_table: Tensor, length: int) -> Tensor:
    """The first ``length`` keys (or values) of one sequence: pages (P, page, H_kv, D), its
    block-table row (max_pages,) -> (length, H_kv, D), a copy in key order."""
    page = pages.shape[1]
    used = block_table[: -(-length // page)].long()
    return pages.index_select(0, used).flatten(0, 1)[:length]


def gather_padded(pages: Tensor, block_table: Tensor, n_keys: int) -> Tensor:
    """Every sequence's first ``n_keys`` slots, padded: (P, page, H_kv, D), block table
    (B, max_pages) -> (B, H_kv, n_keys, D). Slots past a sequence's length hold whatever its
    pages hold (unused entries read page 0): a mask must hide them (:func:`key_mask`)."""
    page = pages.shape[1]
    table = block_table[:, : -(-n_keys // page)].long().clamp(min=0)  # (B, pages)
    out = pages[table]  # (B, pages, page, H_kv, D)
    return out.flatten(1, 2)[:, :n_keys].transpose(1, 2)


def key_mask(context_lens: Tensor, q_len: int, n_keys: int) -> Tensor:
    """bool (B, 1, q_len, n_keys): query t of sequence b keeps key j <= context_lens[b] -
    q_len + t (its own position and everything before it; padding past the length never)."""
    pos = (
        context_lens.long().view(-1, 1, 1, 1)
        - q_len
        + torch.arange(q_len, device=context_lens.device).view(1, 1, -1, 1)
    )
    return torch.arange(n_keys, device=context_lens.device).view(1, 1, 1, -1) <= pos


def paged_attention(
    q: Tensor,
    k_pages: Tensor,
    v_pages: Tensor,
    block_table: Tensor,
    context_lens: Tensor,
    scale: float | None = None,
) -> Tensor:
    """The plain path: for each sequence, gather its pages, attend (module docstring).
    Work over the real keys only (Σ lengths, not B·max); in the inputs' dtype, so float64
    inputs make it the reference. q (B, H, q_len, D) -> (B, H, q_len, D)."""
    check_layout(q, k_pages, v_pages, block_table, context_lens)
    _, heads, q_len, d = q.shape
    kv_heads = k_pages.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = torch.empty_like(q)
    for i, length in enumerate(context_lens.tolist()):
        if length < q_len:
            raise ValueError(
                f"paged attention: sequence {i} holds {length} keys, fewer than "
                f"the step's {q_len} queries"
            )
        k = gather_sequence(k_pages, block_table[i], length).transpose(0, 1)  # (H_kv, n, D)
        v = gather_sequence(v_pages, block_table[i], length).transpose(0, 1)
        qi = q[i].reshape(kv_heads, heads // kv_heads * q_len, d)  # (H_kv, group·q_len, D)
        scores = (qi @ k.transpose(-2, -1) * scale).view(kv_heads, -1, q_len, length)
        keep = key_mask(context_lens[i : i + 1], q_len, length)[0, 0]  # (q_len, n)
        scores = scores.masked_fill(~keep, float("-inf"))
        probs = torch.softmax(scores, dim=-1).view(kv_heads, -1, length)
        out[i] = (probs @ v).view(heads, q_len, d)
    return out
