"""The way in to the paged split-KV decode (:mod:`.paged_decode`, the kernels): its checks, its
split count and its two launches. The kernels' module imports with Triton alone (the warm
cache's compiles); this one imports the launch helpers, which import the harness.
"""

from __future__ import annotations

import torch
import triton
from torch import Tensor

from implementations._kernels.triton.attention_launches import LOG2E, _on_device, _precision
from implementations._kernels.triton.kernel_launch import launch
from implementations._kernels.triton.paged_decode import (
    LARGEST_BLOCK_N,
    MAX_ROWS,
    paged_combine,
    paged_decode,
)
from implementations._kernels.triton.plan_tables import (
    block_d,
    decode_tiles,
    device_key,
    split_count,
)


def paged_decode_attention(
    q: Tensor,
    k_pages: Tensor,
    v_pages: Tensor,
    block_table: Tensor,
    context_lens: Tensor,
    scale: float | None = None,
) -> Tensor:
    """Attention of a decode step over a paged KV cache, two launches (splits, combine).

    q: (B, H, q_len, D), q_len 1..16, the step's queries; k_pages, v_pages: (num_pages,
    page_size, H_kv, D), one pool ("NHD": FlashInfer's and flash-attn's layout), unit last
    stride; block_table: (B, max_pages) int32, the physical page of each logical page (entries
    past a sequence's last page are never read); context_lens: (B,) int32, the keys of each
    sequence including this step's q_len (at most max_pages·page_size: not checked, that would
    synchronize). Returns (B, H, q_len, D) in q.dtype: query t of sequence b at position
    ``context_lens[b] - q_len + t`` over the keys j <= it; H % H_kv == 0 (query head h reads
    K/V head ``h // (H / H_kv)``); ``scale`` default 1/sqrt(D); a sequence of 0 keys gives zeros.
    Raises ValueError (one line) on shapes, dtypes or devices that do not fit."""
    _check(q, k_pages, v_pages, block_table, context_lens)
    q = q if q.stride(-1) == 1 else q.contiguous()
    block_table = block_table if block_table.stride(-1) == 1 else block_table.contiguous()
    context_lens = context_lens.contiguous()
    b, h, q_len, d = q.shape
    page, h_kv = k_pages.shape[1], k_pages.shape[2]
    max_pages = block_table.shape[1]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if b * h == 0:
        return out
    if max_pages == 0:  # no page to read: every sequence has 0 keys
        return out.zero_()
    scale = d**-0.5 if scale is None else scale
    group = h // h_kv
    rows, block_m = decode_tiles(q_len, group)
    pps, n_split = split_pages(b * h_kv, max_pages, page, q.device)
    part_o = torch.empty((n_split, b * h, q_len, d), dtype=torch.float32, device=q.device)
    part_ml = torch.empty((n_split, b * h, q_len, 2), dtype=torch.float32, device=q.device)
    n_bucket = triton.next_power_of_2(max_pages * page)
    with _on_device(q):
        launch(
            "paged_decode",
            paged_decode,
            (n_split, b * h_kv),
            (
                q,
                k_pages,
                v_pages,
                block_table,
                context_lens,
                part_o,
                part_ml,
                *q.stride()[:3],
                *k_pages.stride()[:3],
                *v_pages.stride()[:3],
                block_table.stride(0),
                h,
                group,
                q_len,
                pps * page,
                scale * LOG2E,
                n_bucket,
            ),
            dict(
                D=d,
                BLOCK_D=block_d(d),
                PAGE=page,
                ROWS=rows,
                BLOCK_M=block_m,
                PRECISION=_precision(q.dtype, q.device),
                enable_fp_fusion=True,
            ),
        )
        launch(
            "paged_combine",
            paged_combine,
            (triton.cdiv(q_len, MAX_ROWS), b * h),
            (part_o, part_ml, context_lens, out, *out.stride()[:3], h, q_len, pps * page),
            dict(D=d, BLOCK_D=block_d(d), BLOCK=MAX_ROWS, enable_fp_fusion=True),
        )
    return out


def split_pages(
    batch_kv_heads: int, max_pages: int, page_size: int, device: torch.device | str
) -> tuple[int, int]:
    """(pages per split, n_split) of a call: the split-KV decode's count
    (:func:`.plan_tables.split_count`: ``DECODE_WAVES`` programs per SM, each split at least
    ``MIN_SPLIT_KEYS`` keys) for ``batch_kv_heads`` (sequence, K/V head) pairs over the
    longest sequence the block table holds (``max_pages`` pages), each split a whole number of
    pages and of the largest key block."""
    n_split = split_count(batch_kv_heads, 1, max_pages * page_size, device_key(device))
    unit = max(1, LARGEST_BLOCK_N // page_size)
    pps = triton.cdiv(triton.cdiv(max_pages, n_split), unit) * unit
    return pps, triton.cdiv(max_pages, pps)


def _check(
    q: Tensor, k_pages: Tensor, v_pages: Tensor, block_table: Tensor, context_lens: Tensor
) -> None:
    """One ValueError line for arguments the kernels cannot take."""
    if q.dim() != 4 or k_pages.dim() != 4:
        raise ValueError(
            f"paged decode: q must be (B, H, q_len, D) and the pages (num_pages, "
            f"page_size, H_kv, D); got {tuple(q.shape)}, {tuple(k_pages.shape)}"
        )
    b, h, q_len, d = q.shape
    if v_pages.shape != k_pages.shape:
        raise ValueError(
            f"paged decode: v_pages {tuple(v_pages.shape)} is not k_pages' shape "
            f"{tuple(k_pages.shape)}"
        )
    _, page, h_kv, d_kv = k_pages.shape
    problems = [
        (not 1 <= q_len <= MAX_ROWS, f"q_len {q_len} outside 1..{MAX_ROWS}"),
        (d_kv != d, f"head dim {d} of q is not the pages' {d_kv}"),
        (page < 1, f"page_size {page} < 1"),
        (h_kv < 1 or h % h_kv != 0, f"{h} query heads are not a multiple of {h_kv} K/V heads"),
        (
            block_table.dim() != 2 or block_table.shape[0] != b,
            f"block_table {tuple(block_table.shape)} is not (B={b}, max_pages)",
        ),
        (
            tuple(context_lens.shape) != (b,),
            f"context_lens {tuple(context_lens.shape)} is not (B={b},)",
        ),
        (
            block_table.dtype != torch.int32 or context_lens.dtype != torch.int32,
            "block_table and context_lens must be int32",
        ),
        (
            q.dtype != k_pages.dtype or q.dtype != v_pages.dtype,
            f"dtypes differ: q {q.dtype}, pages {k_pages.dtype}, {v_pages.dtype}",
        ),
        (
            q.dtype not in (torch.float32, torch.float16, torch.bfloat16),
            f"dtype {q.dtype} is not one of float32, float16, bfloat16",
        ),
        (
            k_pages.stride(-1) != 1 or v_pages.stride(-1) != 1,
            "the pages' last dim must be contiguous",
        ),
        (
            len({t.device for t in (q, k_pages, v_pages, block_table, context_lens)}) != 1,
            "tensors on different devices",
        ),
    ]
    found = [why for bad, why in problems if bad]
    if found:
        raise ValueError(f"paged decode: {found[0]}")
