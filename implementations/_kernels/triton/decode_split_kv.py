"""Split-KV decode (flash-decoding) for a few query rows (``n_q <= 16``) over a long cache.

The prefill kernel would give a decode step one row block per (batch, head): B·H programs on a
GPU with over a hundred SMs, each streaming the whole cache. Here the keys a slot's rows see
are split into ``n_split`` chunks (whole key blocks), one program per (chunk, K/V head, slot);
a program holds the slot's rows of all GROUP query heads of its K/V head as one tile (tile row
t: query head ``t // ROWS``, slot row ``t % ROWS``), so grouped-query heads read each K/V block
once. Each program writes its partial softmax state (unnormalized acc, scaled row max m, row
sum l); :func:`split_combine` merges the chunks of each row:
``out = Σ 2^(m_s − M) acc_s / Σ 2^(m_s − M) l_s``, ``lse = M + log2 Σ 2^(m_s − M) l_s``
(:func:`merge_splits`, which the paged decode's combine shares: :mod:`.paged_decode`).
Masks, slots and the band walk are the prefill kernels' (:mod:`.forward`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from implementations._kernels.triton.autotune import TUNE_KEY, configs, prune
from implementations._kernels.triton.forward import fwd_band, fwd_spans, stored_rows
from implementations._kernels.triton.primitives import (
    NEG,
    own_bounds,
    own_positions,
    own_start,
    walk,
)


@triton.jit
def decode_rows(SP, GPOS, GROUP, ROWS: tl.constexpr, BLOCK_M: tl.constexpr):
    """The tile's rows: query-head offset, validity, own coordinate x and position p of each
    row, and the slot's first and last own (x0, p0, x1, p1)."""
    r, step, x_start, n_own = tl.load(SP), tl.load(SP + 1), tl.load(SP + 2), tl.load(SP + 3)
    flags = tl.load(SP + 8)
    t = tl.arange(0, BLOCK_M)
    head, a = t // ROWS, x_start + t % ROWS
    ok = (t % ROWS < n_own) & (head < GROUP)
    x, p, x0, p0, x1, p1 = own_positions(GPOS, a, ok, x_start, x_start + n_own - 1, r, step,
                                         flags)
    return head, ok, x, p, x0, p0, x1, p1, r, step, flags


@triton.autotune(configs=configs("band_fwd_split"), key=TUNE_KEY,
                 prune_configs_by={"early_config_prune": prune("band_fwd_split")})
@triton.jit
def band_fwd_split(Q, K, V, PART_O, PART_ML, SLOTS, GPOS, GIDX, DS, DE,
                   sqb, sqh, sqn, skb, skh, skn, svb, svh, svn,
                   H, GROUP, n_q, n_k, off, hg, P, GB, sc2, n_split, n_bucket, q_bucket, MASK_KEY,
                   D: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
                   GLOBAL: tl.constexpr, DILATED: tl.constexpr, DOCS: tl.constexpr,
                   PREFIX: tl.constexpr, APART: tl.constexpr = False,
                   PRED: tl.constexpr = None):
    """Grid (n_split, B·H_kv, slots). PART_O: (n_split, B·H, n_q, D) fp32 unnormalized;
    PART_ML: (n_split, B·H, n_q, 2) fp32 (m·scale·log2e, l). ``PRED``: as ``band_fwd``'s."""
    split, bhk = tl.program_id(0), tl.program_id(1)
    SP = SLOTS + tl.program_id(2) * 9
    GIDX -= GB  # GIDX[x] counts the global positions below x >= GB (negative: rows)
    if tl.load(SP + 3) > 0:
        hkv = H // GROUP
        b, hk = bhk // hkv, bhk % hkv
        head, ok, x, p, x0, p0, x1, p1, r, step, flags = decode_rows(SP, GPOS, GROUP, ROWS,
                                                                     BLOCK_M)
        h = hk * GROUP + head
        i = p - off
        dd = tl.arange(0, BLOCK_D)
        ld = ok[:, None] & (dd[None, :] < D)
        rows = b.to(tl.int64) * sqb + h.to(tl.int64) * sqh + i * sqn
        q = tl.load(Q + rows[:, None] + dd[None, :], mask=ld, other=0.0)
        k_base = K + b.to(tl.int64) * skb + hk.to(tl.int64) * skh
        v_base = V + b.to(tl.int64) * svb + hk.to(tl.int64) * svh
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + NEG
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        lo, hi = own_bounds(x, p, ok, SP, P, DS, DE, PREFIX, DOCS, DILATED)
        ds = own_start(p, ok, DS, DOCS, PRED)
        # the global keys and a dilated prefix's: the first chunk's
        acc, l_i, m_i = fwd_spans(acc, l_i, m_i, q, lo, hi, p, ok, p0, p1, r, step, flags,
                                     split == 0, GPOS, GIDX, DS, DE, k_base, v_base, skn, svn,
                                     n_k, hg, P, sc2, ds, BLOCK_N, BLOCK_D, D, GLOBAL, DILATED,
                                     DOCS, PREFIX, PRECISION, PRED)
        lo0, hi0 = own_bounds(x0, p0, p0 >= 0, SP, P, DS, DE, PREFIX, DOCS, DILATED)
        lo1, hi1 = own_bounds(x1, p1, p1 >= 0, SP, P, DS, DE, PREFIX, DOCS, DILATED)
        start, mid, post, end = split_walk(lo0, hi0, lo1, hi1, split, n_split, BLOCK_N)
        acc, l_i, m_i = fwd_band(acc, l_i, m_i, q, lo, hi, k_base, v_base, skn, svn, r, step,
                                 tl.load(SP + 5), start, mid, post, end, sc2, p, ds, BLOCK_N,
                                 BLOCK_D, D, DILATED, PRECISION, PRED)
        keep = stored_rows(ok, p, flags, GIDX, GLOBAL, APART)
        bh_all = tl.num_programs(1) * GROUP  # B·H
        part = ((split * bh_all + b * H + h) * n_q + i).to(tl.int64)
        tl.store(PART_O + part[:, None] * D + dd[None, :], acc, mask=ld & keep[:, None])
        tl.store(PART_ML + part * 2, m_i * sc2, mask=keep)
        tl.store(PART_ML + part * 2 + 1, l_i, mask=keep)


@triton.jit
def split_walk(lo0, hi0, lo1, hi1, split, n_split, BLOCK_N: tl.constexpr):
    """:func:`walk`'s bounds cut to chunk ``split`` of ``n_split`` (whole key blocks)."""
    lo, mid, post, end = walk(lo0, hi0, lo1, hi1, BLOCK_N)
    chunk = tl.cdiv(tl.cdiv(end - lo, n_split), BLOCK_N) * BLOCK_N
    start = tl.minimum(lo + split * chunk, end)
    stop = tl.minimum(start + chunk, end)
    mid = tl.minimum(tl.maximum(mid, start), stop)
    post = tl.minimum(tl.maximum(post, mid), stop)
    return start, mid, post, stop


@triton.jit
def split_combine(PART_O, PART_ML, Out, LSE, sob, soh, son, H, n_q, n_split,
                  D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK: tl.constexpr):
    """Merge the chunks' partial states of each row. Grid (row blocks, B·H)."""
    bh = tl.program_id(1)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n_q
    dd = tl.arange(0, BLOCK_D)
    out, lse = merge_splits(PART_O, PART_ML, bh, i, ok, n_q, n_split, D, BLOCK_D, BLOCK)
    b, h = bh // H, bh % H
    o_ptrs = Out + b.to(tl.int64) * sob + h.to(tl.int64) * soh + i[:, None] * son + dd[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=ok[:, None] & (dd[None, :] < D))
    tl.store(LSE + bh.to(tl.int64) * n_q + i, lse, mask=ok)


@triton.jit
def merge_splits(PART_O, PART_ML, bh, i, ok, n_q, n_split, D: tl.constexpr,
                 BLOCK_D: tl.constexpr, BLOCK: tl.constexpr):
    """(out (BLOCK, BLOCK_D) fp32, lse (BLOCK,)) of rows ``i`` (valid ``ok``) of head ``bh``
    (of ``tl.num_programs(1)``) from the first ``n_split`` chunks' partial states (layout of
    :func:`band_fwd_split`'s PART_O, PART_ML); a row no chunk kept a key for gets zeros and
    lse = +inf."""
    dd = tl.arange(0, BLOCK_D)
    ld = ok[:, None] & (dd[None, :] < D)
    m_all = tl.zeros([BLOCK], dtype=tl.float32) + NEG
    for s in range(0, n_split):
        part = ((s * tl.num_programs(1) + bh) * n_q + i).to(tl.int64)
        m_all = tl.maximum(m_all, tl.load(PART_ML + part * 2, mask=ok, other=NEG))
    l_all = tl.zeros([BLOCK], dtype=tl.float32)
    acc = tl.zeros([BLOCK, BLOCK_D], dtype=tl.float32)
    for s in range(0, n_split):
        part = ((s * tl.num_programs(1) + bh) * n_q + i).to(tl.int64)
        w = tl.math.exp2(tl.load(PART_ML + part * 2, mask=ok, other=NEG) - m_all)
        l_all += w * tl.load(PART_ML + part * 2 + 1, mask=ok, other=0.0)
        o = tl.load(PART_O + part[:, None] * D + dd[None, :], mask=ld, other=0.0)
        acc += w[:, None] * o
    has = l_all > 0.0
    l_safe = tl.where(has, l_all, 1.0)
    return acc / l_safe[:, None], tl.where(has, m_all + tl.math.log2(l_safe), float("inf"))
