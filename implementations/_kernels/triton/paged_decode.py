"""Split-KV decode over a paged KV cache: a step's few query rows per sequence of a ragged
batch, K/V read through a block table.

Serving engines (vLLM, SGLang, TensorRT-LLM) hold each sequence's keys in fixed-size pages of
one pool, in any physical order, and batch sequences of very different lengths. Here one
program per (split, sequence, K/V head) holds the GROUP query heads x ``q_len`` rows of its K/V
head as one tile (tile row t: query head ``t // ROWS``, step row ``t % ROWS``, as
:mod:`.decode_split_kv`), so grouped-query heads read each page once. It walks its split's pages
through the sequence's block table row, keeps the online softmax in fp32 with ``exp2``
(:func:`.forward.online`: the scale folded into the exponent, masked scores a finite ``NEG``)
and writes its partial state (unnormalized acc, scaled row max, row sum);
:func:`paged_combine` merges each sequence's splits (:func:`.decode_split_kv.merge_splits`).

No padded work: a split is ``split_keys`` keys, whole pages, one length for the batch (chosen
per call from the block table's width and the SM count, :func:`split_pages`); a sequence's
splits cover its own pages only, a program past its last page exits at once, and the combine
reads only the splits the sequence used. Nothing past a sequence's last key is read: not the
block table's later entries, not a last page's unused slots (whatever they hold, NaN
included). Query t of sequence b sits at position ``context_lens[b] - q_len + t`` and keeps the
keys at or before it (causal within the step, bottom-right aligned per sequence); a row with
no key (a sequence of 0 keys) outputs zeros. A call does no host synchronization (the split
count needs no context length: CUDA-graph capturable).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from implementations._kernels.triton.autotune import SHAPES, configs, prune
from implementations._kernels.triton.decode_split_kv import merge_splits
from implementations._kernels.triton.forward import online
from implementations._kernels.triton.launch_modes import launch
from implementations._kernels.triton.primitives import NEG, load_rows, mma

LOG2E = 1.4426950408889634
MAX_ROWS = 16  # q_len per sequence, at most (plan_tables.DECODE_MAX_ROWS)
PAGED_KEY = ["n_bucket", "BLOCK_M", "BLOCK_D", "PAGE"]  # the autotuner's key, plus the dtypes
# a split's keys are a whole number of the largest key block listed, so that no block straddles
# two splits (a straddling block would still be right: its keys past the split are masked)
LARGEST_BLOCK_N = max(shape[1] for shape in SHAPES["paged_decode"])


# the kernels keep their arguments several to a line, as the folder's kernels do
# fmt: off
@triton.autotune(configs=configs("paged_decode"), key=PAGED_KEY,
                 prune_configs_by={"early_config_prune": prune("paged_decode")})
@triton.jit(do_not_specialize=["sbt", "q_len", "split_keys", "n_bucket"])
def paged_decode(Q, K, V, BT, LENS, PART_O, PART_ML,
                 sqb, sqh, sqn, skp, skt, skh, svp, svt, svh, sbt,
                 H, GROUP, q_len, split_keys, sc2, n_bucket,
                 D: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr, ROWS: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Grid (n_split, B·H_kv). Q: (B, H, q_len, D); K, V: (pages, PAGE, H_kv, D) with unit last
    stride; BT: (B, max pages) int32; LENS: (B,) int32 keys of each sequence. PART_O:
    (n_split, B·H, q_len, D) fp32 unnormalized; PART_ML: (n_split, B·H, q_len, 2) fp32
    (m·scale·log2e, l), written for the splits a sequence uses. ``split_keys``: the keys of a
    split, whole pages."""
    split, bhk = tl.program_id(0), tl.program_id(1)
    h_kv = H // GROUP
    b, hk = bhk // h_kv, bhk % h_kv
    n_keys = tl.load(LENS + b)
    first = split * split_keys
    if first < n_keys:  # a program past the sequence's last page exits at once
        last = tl.minimum(first + split_keys, n_keys)  # keys [first, last)
        t = tl.arange(0, BLOCK_M)
        head, r = t // ROWS, t % ROWS
        ok = (r < q_len) & (head < GROUP)
        h = hk * GROUP + head
        p = n_keys - q_len + r  # each row's position: it keeps the keys j <= p
        dd = tl.arange(0, BLOCK_D)
        ld = ok[:, None] & (dd[None, :] < D)
        q_rows = b.to(tl.int64) * sqb + h.to(tl.int64) * sqh + r * sqn
        q = tl.load(Q + q_rows[:, None] + dd[None, :], mask=ld, other=0.0)
        pages = BT + b.to(tl.int64) * sbt
        k_head = K + hk.to(tl.int64) * skh
        v_head = V + hk.to(tl.int64) * svh
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + NEG
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        # the blocks every row keeps whole (keys up to the first row's position), then the
        # rest masked: the step's own keys and the split's last, partial block
        n_full = tl.maximum(tl.minimum(last, n_keys - q_len + 1) - first, 0) // BLOCK_N
        for i in range(0, n_full):
            acc, l_i, m_i = page_block(acc, l_i, m_i, q, p, pages, k_head, v_head, skp, skt,
                                       svp, svt, first + i * BLOCK_N, last, sc2, PAGE, BLOCK_N,
                                       BLOCK_D, D, False, PRECISION)
        for k0 in range(first + n_full * BLOCK_N, last, BLOCK_N):
            acc, l_i, m_i = page_block(acc, l_i, m_i, q, p, pages, k_head, v_head, skp, skt,
                                       svp, svt, k0, last, sc2, PAGE, BLOCK_N, BLOCK_D, D, True,
                                       PRECISION)
        bh_all = tl.num_programs(1) * GROUP  # B·H
        part = ((split * bh_all + b * H + h) * q_len + r).to(tl.int64)
        tl.store(PART_O + part[:, None] * D + dd[None, :], acc, mask=ld)
        tl.store(PART_ML + part * 2, m_i * sc2, mask=ok)
        tl.store(PART_ML + part * 2 + 1, l_i, mask=ok)


@triton.jit
def page_block(acc, l_i, m_i, q, p, pages, k_head, v_head, skp, skt, svp, svt, k0, last, sc2,
               PAGE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
               D: tl.constexpr, MASKED: tl.constexpr, PRECISION: tl.constexpr):
    """Fold keys k0 .. k0 + BLOCK_N of a sequence into (acc, l, m), each key read from the
    physical page its block table row ``pages`` names. MASKED: keys at or past ``last`` are
    not loaded (zeros) and every key past a row's position ``p`` scores ``NEG``."""
    n = tl.arange(0, BLOCK_N)
    j = k0 + n
    inside = j < last
    if PAGE % BLOCK_N == 0:  # the block lies in one page (splits start on a page)
        page = tl.load(pages + k0 // PAGE).to(tl.int64)
        slot = k0 % PAGE + n
    else:  # each key's own page (BLOCK_N a multiple of PAGE: BLOCK_N / PAGE pages)
        if MASKED:
            page = tl.load(pages + j // PAGE, mask=inside, other=0).to(tl.int64)
        else:
            page = tl.load(pages + j // PAGE).to(tl.int64)
        slot = j % PAGE
    dd = tl.arange(0, BLOCK_D)
    k_ptrs = k_head + (page * skp + slot * skt)[:, None] + dd[None, :]
    k = load_rows(k_ptrs, inside, D, BLOCK_D, MASKED)
    s = mma(q, tl.trans(k), None, PRECISION)
    if MASKED:
        s = tl.where(j[None, :] <= tl.minimum(p, last - 1)[:, None], s, NEG)
    v_ptrs = v_head + (page * svp + slot * svt)[:, None] + dd[None, :]
    v = load_rows(v_ptrs, inside, D, BLOCK_D, MASKED)
    return online(acc, l_i, m_i, s, v, sc2, MASKED, PRECISION)


@triton.jit(do_not_specialize=["q_len", "split_keys"])
def paged_combine(PART_O, PART_ML, LENS, Out, sob, soh, son, H, q_len, split_keys,
                  D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK: tl.constexpr):
    """Merge each row's partial states over the splits its sequence used (a sequence of 0 keys
    used none: zeros). Grid (row blocks, B·H); Out: (B, H, q_len, D). Splits are whole pages,
    so a sequence of n keys used ``cdiv(n, split_keys)``: one kernel for every page size."""
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < q_len
    used = tl.cdiv(tl.load(LENS + b), split_keys)
    out, _ = merge_splits(PART_O, PART_ML, bh, i, ok, q_len, used, D, BLOCK_D, BLOCK)
    dd = tl.arange(0, BLOCK_D)
    o_ptrs = Out + b.to(tl.int64) * sob + h.to(tl.int64) * soh + i[:, None] * son + dd[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=ok[:, None] & (dd[None, :] < D))

# fmt: on


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
    # the host's helpers import the harness (and numpy): here, not at the top, so that the
    # kernels import where only Triton is (the warm cache's compiles: benchmarks/triton_cache.py)
    from implementations._kernels.triton.launches import _on_device, _precision
    from implementations._kernels.triton.plan_tables import block_d, decode_tiles

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
    from implementations._kernels.triton.plan_tables import device_key, split_count

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
