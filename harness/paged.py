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
Pages that lie end to end (consecutive physical pages, as a contiguous cache's do) are read in
place, a view of the pool; only scattered pages are gathered (copied) by the plain paths here:
a contiguous baseline that copied its cache every step would charge it for work no user does.

The queries of a step: q (B, H, q_len, D); query t of sequence b sits at position
``context_lens[b] - q_len + t`` and sees the keys ``j <= that position`` (causal within the
step, bottom-right aligned per sequence, as :mod:`harness.masks` aligns one sequence). H is a
multiple of H_kv (grouped or multi-query K/V: head h reads K/V head ``h // (H / H_kv)``).
Output (B, H, q_len, D) in q's dtype.
"""

from __future__ import annotations

import math
import weakref

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


def consecutive_start(pages: Tensor) -> int | None:
    """The first physical page when ``pages`` (1-d: a sequence's used pages, or a batch's rows
    one after another) are consecutive, p0, p0 + 1, ...: they lie end to end in the pool and
    are read in place, as a contiguous cache is; else None (they must be gathered). One small
    host read."""
    if len(pages) == 0 or (len(pages) > 1 and not bool((pages[1:] - pages[:-1] == 1).all())):
        return None
    start = int(pages[0])
    return start if start >= 0 else None


# id(table) -> (a weak reference to it, (its version, columns), the answer); by identity, as
# a tensor's == is elementwise; an entry leaves with its tensor
_RUNS: dict[int, tuple[weakref.ref, tuple[int, int], int | None]] = {}


def table_run(block_table: Tensor, n_pages: int) -> int | None:
    """:func:`consecutive_start` over the first ``n_pages`` columns of ``block_table`` (B,
    max_pages), rows in order. A host read of the table; on CUDA the answer is remembered per
    table tensor and version (an in-place write changes the version), so the calls a CUDA
    graph captures reuse the warm-up's answer, and a capture with no answer gathers."""
    key, ident = (block_table._version, n_pages), id(block_table)
    known = _RUNS.get(ident)
    if known is not None and known[0]() is block_table and known[1] == key:
        return known[2]
    if block_table.is_cuda and torch.cuda.is_current_stream_capturing():
        return None
    start = consecutive_start(block_table[:, :n_pages].flatten())
    _RUNS[ident] = (weakref.ref(block_table, lambda _: _RUNS.pop(ident, None)), key, start)
    return start


def sequence_pages(block_table: Tensor, length: int, page: int) -> slice | Tensor:
    """Where one sequence's first ``length`` keys lie: its block-table row (max_pages,) ->
    a slice of the pool when its pages are consecutive (:func:`consecutive_start`: a
    contiguous cache, read in place), else the int64 indices of its pages (to gather)."""
    used = block_table[: -(-length // page)]
    start = consecutive_start(used)
    return slice(start, start + len(used)) if start is not None else used.long()


def gather_sequence(pages: Tensor, where: slice | Tensor, length: int) -> Tensor:
    """The first ``length`` keys (or values) of one sequence: pages (P, page, H_kv, D) and
    :func:`sequence_pages`'s answer -> (length, H_kv, D) in key order: a view of the pool
    for a slice, a copy of the gathered pages for indices."""
    taken = pages[where] if isinstance(where, slice) else _take(pages, where)
    return taken.flatten(0, 1)[:length]


def _take(pages: Tensor, index: Tensor) -> Tensor:
    """A copy of the pages ``index`` (int64, (k,)) names: (P, page, H_kv, D) -> (k, page,
    H_kv, D). The pool as rows of page·H_kv·D: index_select copies a 2-d tensor's rows
    whole, 1.6x faster on a CPU than the same selection of the 4-d pool and 4x faster than
    ``pages[index]`` (measured at 512 pages of 16 x 2 x 64)."""
    if not pages.is_contiguous():  # a strided pool's pages are not one block each
        return pages.index_select(0, index)
    return pages.flatten(1).index_select(0, index).view(len(index), *pages.shape[1:])


def gather_padded(pages: Tensor, block_table: Tensor, n_keys: int) -> Tensor:
    """Every sequence's first ``n_keys`` slots, padded: (P, page, H_kv, D), block table
    (B, max_pages) -> (B, H_kv, n_keys, D): a view of the pool when the rows' pages are
    consecutive (:func:`table_run`: a contiguous cache, sequence b in page b), else a copy.
    Slots past a sequence's length hold whatever its pages hold (unused entries read page
    0): a mask must hide them (:func:`key_mask`)."""
    page, batch = pages.shape[1], block_table.shape[0]
    n_pages = -(-n_keys // page)
    start = table_run(block_table, n_pages)
    if start is not None:
        out = pages[start : start + batch * n_pages].unflatten(0, (batch, n_pages))
    else:
        table = block_table[:, :n_pages].long().clamp(min=0).flatten()  # (B·pages,)
        out = _take(pages, table).unflatten(0, (batch, n_pages))  # (B, pages, page, H_kv, D)
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
        where = sequence_pages(block_table[i], length, k_pages.shape[1])
        k = gather_sequence(k_pages, where, length).transpose(0, 1)  # (H_kv, n, D)
        v = gather_sequence(v_pages, where, length).transpose(0, 1)
        qi = q[i].reshape(kv_heads, heads // kv_heads * q_len, d)  # (H_kv, group·q_len, D)
        scores = (qi @ k.transpose(-2, -1) * scale).view(kv_heads, -1, q_len, length)
        keep = key_mask(context_lens[i : i + 1], q_len, length)[0, 0]  # (q_len, n)
        scores = scores.masked_fill(~keep, float("-inf"))
        probs = torch.softmax(scores, dim=-1).view(kv_heads, -1, length)
        out[i] = (probs @ v).view(heads, q_len, d)
    return out
