"""FlexAttention over a paged KV cache with PyTorch's own paged block mask
(``torch.nn.attention.experimental._paged_attention.PagedAttention``): the paged form of
``flex-local`` (:data:`harness.spec.PagedFn`).

The pool of :mod:`harness.paged` ((P, page, H_kv, D), "NHD") is read where it lies: viewed as
PagedAttention's cache, (1, H_kv, P·page, D), without a copy. PagedAttention's page table and
its physical-to-logical map are filled from the block table; the logical mask (query t of
sequence b keeps keys ``j <= context_lens[b] - q_len + t``) is made a block mask over key blocks
of one page and converted to physical pages by ``convert_logical_block_mask``.

That set-up is what a serving engine does once per step for all layers, so it is built on the
first call for a given block table and lengths (their storage and version counters) and
reused by the calls after it: the timed call is the compiled flex_attention alone. Every
distinct shape compiles its own kernel (``implementations.flex`` lifts dynamo's recompile
limit and makes reaching it an error, never a silent eager fallback).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from harness.paged import check_layout

_PREPARED: dict[tuple, tuple] = {}  # (block table, lengths, shapes) -> (block mask, pager)
_KEEP = 8  # prepared steps kept (one per timed point is enough; a few for interleaved ones)


def _key(q: Tensor, k_pages: Tensor, block_table: Tensor, context_lens: Tensor) -> tuple:
    return (block_table.data_ptr(), block_table._version, context_lens.data_ptr(),
            context_lens._version, tuple(q.shape), tuple(k_pages.shape),
            tuple(block_table.shape), str(q.device))  # fmt: skip


def _pager(k_pages: Tensor, block_table: Tensor):
    """PagedAttention's tables filled from the block table (B, max_pages), -1 past the end."""
    # imported here: it imports flex_attention, which pulls in torch._dynamo
    from torch.nn.attention.experimental._paged_attention import PagedAttention

    pages, page = k_pages.shape[:2]
    batch, width = block_table.shape
    pager = PagedAttention(pages, page, batch, device=str(k_pages.device))
    table = block_table.long()
    pager.page_table[:, :width] = table
    live = table >= 0
    rows = torch.arange(batch, device=table.device).unsqueeze(1).expand_as(table)
    logical = torch.arange(width, device=table.device).expand_as(table)
    pager.physical_to_logical[rows[live], table[live]] = logical[live]
    return pager


def _block_mask(q: Tensor, k_pages: Tensor, block_table: Tensor, context_lens: Tensor) -> tuple:
    from torch.nn.attention.flex_attention import create_block_mask  # pulls in torch._dynamo

    batch, _, q_len, _ = q.shape
    page = k_pages.shape[1]
    lens = context_lens.long()

    def causal_in_step(b, h, q_idx, kv_idx):
        return kv_idx <= lens[b] - q_len + q_idx

    logical = create_block_mask(
        causal_in_step, batch, None, q_len, block_table.shape[1] * page,
        device=str(q.device), BLOCK_SIZE=(128, page),
    )  # fmt: skip
    pager = _pager(k_pages, block_table)
    return pager.convert_logical_block_mask(logical, kv_len=lens), pager


def flex_paged(q: Tensor, k_pages: Tensor, v_pages: Tensor, block_table: Tensor,
               context_lens: Tensor, scale: float | None = None, *,
               flex: Callable) -> Tensor:  # fmt: skip
    """Compiled FlexAttention over the pool with PagedAttention's converted block mask:
    q (B, H, q_len, D) -> (B, H, q_len, D). ``flex``: the compiled flex_attention."""
    check_layout(q, k_pages, v_pages, block_table, context_lens)
    key = _key(q, k_pages, block_table, context_lens)
    if key not in _PREPARED:
        if len(_PREPARED) >= _KEEP:
            _PREPARED.pop(next(iter(_PREPARED)))
        _PREPARED[key] = _block_mask(q, k_pages, block_table, context_lens)
    block_mask, _ = _PREPARED[key]
    pages, page, kv_heads, d = k_pages.shape
    k = k_pages.view(1, pages * page, kv_heads, d).transpose(1, 2)  # (1, H_kv, P·page, D)
    v = v_pages.view(1, pages * page, kv_heads, d).transpose(1, 2)
    gqa = kv_heads != q.shape[1]
    return flex(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa)
