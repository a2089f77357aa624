"""Fused FlashAttention-2 forward kernels in Triton: a band kernel and a block-list kernel.

Online softmax in base 2 (scores prescaled by ``scale·log2(e)``, ``exp2``), fp32 ``m, l, acc``;
``tl.dot`` accumulates in fp32 (IEEE for fp32 inputs, not TF32). Masked scores take a finite
``NEG`` and their probabilities are zeroed, so a row that sees no key keeps ``l = 0`` and
outputs zeros (``lse = +inf``), never NaN. Key blocks that the mask keeps entirely run without
any mask arithmetic; only the edge blocks of a band (or the flagged entries of a block list)
compute the mask. The slot/CSR tables come from :mod:`implementations._kernels.triton_plan`; the
shared building blocks from :mod:`implementations._kernels.triton_primitives`.

Argument lists are written several to a line, as the kernels' signatures are.
"""

from __future__ import annotations

import triton
import triton.language as tl

from implementations._kernels.triton_autotune import fwd_configs
from implementations._kernels.triton_primitives import NEG, band_ranges, keep_mask, load_rows, mma


@triton.jit
def _fwd_step(acc, l_i, m_i, q, p, row_ok, k_base, v_base, skn, svn, kr, kstep, c0, c_end,
              lo, hi, g, hg, sc2, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
              D: tl.constexpr, MASKED: tl.constexpr, PRECISION: tl.constexpr):
    """One key block (class keys c0 .. c0+BLOCK_N, absolute j = kr + kstep·c)."""
    c = c0 + tl.arange(0, BLOCK_N)
    j = kr + kstep * c
    dd = tl.arange(0, BLOCK_D)
    col_ok = c < c_end
    k = load_rows(k_base + j[:, None] * skn + dd[None, :], col_ok, D, BLOCK_D, MASKED)
    s = mma(q, tl.trans(k), None, PRECISION) * sc2
    if MASKED:
        keep = keep_mask(p, j, row_ok, col_ok, lo, hi, g, hg)
        s = tl.where(keep, s, NEG)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        pr = tl.where(keep, tl.math.exp2(s - m_new[:, None]), 0.0)  # all-masked rows: 0, not 1
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1))
        pr = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(pr, 1)
    v = load_rows(v_base + j[:, None] * svn + dd[None, :], col_ok, D, BLOCK_D, MASKED)
    acc = mma(pr.to(v.dtype), v, acc * alpha[:, None], PRECISION)
    return acc, l_i, m_new


@triton.jit
def _fwd_range(acc, l_i, m_i, q, p, row_ok, k_base, v_base, skn, svn, kr, kstep,
               c_start, c_stop, c_end, lo, hi, g, hg, sc2, BLOCK_N: tl.constexpr,
               BLOCK_D: tl.constexpr, D: tl.constexpr, MASKED: tl.constexpr,
               PRECISION: tl.constexpr):
    """The key blocks starting at c_start, c_start + BLOCK_N, ... below c_stop (class keys
    valid below c_end), each one :func:`_fwd_step`."""
    for c0 in range(c_start, c_stop, BLOCK_N):
        acc, l_i, m_i = _fwd_step(acc, l_i, m_i, q, p, row_ok, k_base, v_base, skn, svn, kr,
                                  kstep, c0, c_end, lo, hi, g, hg, sc2, BLOCK_N, BLOCK_D, D,
                                  MASKED, PRECISION)
    return acc, l_i, m_i


@triton.jit
def _band_keys(acc, l_i, m_i, q, p, row_ok, k_base, v_base, skn, svn, r, step, a0, a1,
               lo_rel, hi_rel, k_start, k_end, glob, g, hg, g_keys, sc2,
               BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, D: tl.constexpr,
               PRECISION: tl.constexpr):
    """Every key block that class rows a0..a1 of a slot see: the global keys (when the slot
    has a global segment), then the band's masked lower edge, its unmasked middle and its
    masked upper edge (ranges from :func:`band_ranges`)."""
    lo_abs = lo_rel * step
    hi_abs = hi_rel * step
    if glob != 0:  # global keys j < g, every class sees them (absolute, step 1)
        g_hi = tl.minimum(g_keys, r + step * a1 + hg + 1)
        acc, l_i, m_i = _fwd_range(acc, l_i, m_i, q, p, row_ok, k_base, v_base, skn, svn, 0, 1,
                                   0, g_hi, g_hi, lo_abs, hi_abs, g, hg, sc2, BLOCK_N, BLOCK_D,
                                   D, True, PRECISION)
    lo, hi_x, mid, post = band_ranges(a0, a1, lo_rel, hi_rel, k_start, k_end, BLOCK_N)
    acc, l_i, m_i = _fwd_range(acc, l_i, m_i, q, p, row_ok, k_base, v_base, skn, svn, r, step,
                               lo, tl.minimum(mid, hi_x), hi_x, lo_abs, hi_abs, g, hg, sc2,
                               BLOCK_N, BLOCK_D, D, True, PRECISION)
    acc, l_i, m_i = _fwd_range(acc, l_i, m_i, q, p, row_ok, k_base, v_base, skn, svn, r, step,
                               mid, post, hi_x, lo_abs, hi_abs, g, hg, sc2,
                               BLOCK_N, BLOCK_D, D, False, PRECISION)
    acc, l_i, m_i = _fwd_range(acc, l_i, m_i, q, p, row_ok, k_base, v_base, skn, svn, r, step,
                               tl.maximum(post, mid), hi_x, hi_x, lo_abs, hi_abs, g, hg, sc2,
                               BLOCK_N, BLOCK_D, D, True, PRECISION)
    return acc, l_i, m_i


@triton.jit
def _csr_keys(acc, l_i, m_i, q, p, row_ok, k_base, v_base, skn, svn, COLS, e_start, e_end,
              block, n_k, hg, sc2, TILE: tl.constexpr, BLOCK_D: tl.constexpr,
              D: tl.constexpr, MASKED: tl.constexpr, PRECISION: tl.constexpr):
    """The key blocks ``COLS[e_start:e_end]`` of a CSR row, each one :func:`_fwd_step`;
    MASKED ones are cut at n_k (the last block may be short)."""
    for e in range(e_start, e_end):
        j0 = tl.load(COLS + e)
        c_end = tl.minimum(block, n_k - j0) if MASKED else TILE
        acc, l_i, m_i = _fwd_step(acc, l_i, m_i, q, p, row_ok, k_base, v_base, skn, svn, j0, 1,
                                  0, c_end, -2 * n_k - 2, hg, 0, hg, sc2, TILE, BLOCK_D, D,
                                  MASKED, PRECISION)
    return acc, l_i, m_i


@triton.jit
def _finish(acc, l_i, m_i, o_ptrs, lse_ptrs, row_ok, ld):
    """Normalize and store; rows with no kept key get zeros and lse = +inf."""
    has = l_i > 0.0
    l_safe = tl.where(has, l_i, 1.0)
    out = acc / l_safe[:, None]
    tl.store(o_ptrs, out.to(o_ptrs.dtype.element_ty), mask=ld)
    lse = tl.where(has, m_i + tl.math.log2(l_safe), float("inf"))
    tl.store(lse_ptrs, lse, mask=row_ok)


@triton.autotune(configs=fwd_configs(), key=["n_bucket", "BLOCK_D", "MODE_KEY"])
@triton.jit
def band_fwd(Q, K, V, Out, LSE, SLOTS,
             sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son,
             H, n_q, n_k, off, g, hg, g_keys, sc2, n_bucket, MODE_KEY,
             D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Grid (row blocks, B·H, slots). O: (B, H, n_q, D); LSE: (B·H, n_q) fp32, base 2."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    sp = SLOTS + tl.program_id(2) * 9
    r, step, a_start, n_rows = tl.load(sp), tl.load(sp + 1), tl.load(sp + 2), tl.load(sp + 3)
    k_start, k_end = tl.load(sp + 4), tl.load(sp + 5)
    lo_rel, hi_rel, glob = tl.load(sp + 6), tl.load(sp + 7), tl.load(sp + 8)
    if pid_m * BLOCK_M < n_rows:
        b = bh // H
        h = bh % H
        q_base = Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh
        k_base = K + b.to(tl.int64) * skb + h.to(tl.int64) * skh
        v_base = V + b.to(tl.int64) * svb + h.to(tl.int64) * svh
        a0 = a_start + pid_m * BLOCK_M
        a = a0 + tl.arange(0, BLOCK_M)
        row_ok = a < a_start + n_rows
        a1 = tl.minimum(a0 + BLOCK_M, a_start + n_rows) - 1
        p = r + step * a
        i = p - off
        dd = tl.arange(0, BLOCK_D)
        ld = row_ok[:, None] & (dd[None, :] < D)
        q = tl.load(q_base + i[:, None] * sqn + dd[None, :], mask=ld, other=0.0)
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + NEG
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        acc, l_i, m_i = _band_keys(acc, l_i, m_i, q, p, row_ok, k_base, v_base, skn, svn, r,
                                   step, a0, a1, lo_rel, hi_rel, k_start, k_end, glob, g, hg,
                                   g_keys, sc2, BLOCK_N, BLOCK_D, D, PRECISION)
        o_ptrs = Out + b.to(tl.int64) * sob + h.to(tl.int64) * soh + i[:, None] * son + dd[None, :]
        _finish(acc, l_i, m_i, o_ptrs, LSE + bh.to(tl.int64) * n_q + i, row_ok, ld)


@triton.autotune(configs=fwd_configs(blocks=False), key=["n_bucket", "BLOCK_D", "MODE_KEY"])
@triton.jit
def blocks_fwd(Q, K, V, Out, LSE, Q_POS, STARTS, MIDS, ENDS, COLS, ORDER,
               sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son,
               H, n_q, n_k, off, block, hg, sc2, n_bucket, MODE_KEY,
               D: tl.constexpr, BLOCK_D: tl.constexpr, TILE: tl.constexpr,
               PRECISION: tl.constexpr):
    """Grid (CSR rows, B·H): query block ``ORDER[pid]`` visits its CSR list of key blocks,
    the unmasked ones ``[STARTS, MIDS)`` first, then the masked ``[MIDS, ENDS)``."""
    row = tl.load(ORDER + tl.program_id(0))
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    q_base = Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh
    k_base = K + b.to(tl.int64) * skb + h.to(tl.int64) * skh
    v_base = V + b.to(tl.int64) * svb + h.to(tl.int64) * svh
    lane = tl.arange(0, TILE)
    p = tl.load(Q_POS + row) + lane
    i = p - off
    row_ok = (lane < block) & (i >= 0) & (i < n_q)
    dd = tl.arange(0, BLOCK_D)
    ld = row_ok[:, None] & (dd[None, :] < D)
    q = tl.load(q_base + i[:, None] * sqn + dd[None, :], mask=ld, other=0.0)
    m_i = tl.zeros([TILE], dtype=tl.float32) + NEG
    l_i = tl.zeros([TILE], dtype=tl.float32)
    acc = tl.zeros([TILE, BLOCK_D], dtype=tl.float32)
    e0, e_mid, e1 = tl.load(STARTS + row), tl.load(MIDS + row), tl.load(ENDS + row)
    acc, l_i, m_i = _csr_keys(acc, l_i, m_i, q, p, row_ok, k_base, v_base, skn, svn, COLS, e0,
                              e_mid, block, n_k, hg, sc2, TILE, BLOCK_D, D, False, PRECISION)
    acc, l_i, m_i = _csr_keys(acc, l_i, m_i, q, p, row_ok, k_base, v_base, skn, svn, COLS,
                              e_mid, e1, block, n_k, hg, sc2, TILE, BLOCK_D, D, True, PRECISION)
    o_ptrs = Out + b.to(tl.int64) * sob + h.to(tl.int64) * soh + i[:, None] * son + dd[None, :]
    _finish(acc, l_i, m_i, o_ptrs, LSE + bh.to(tl.int64) * n_q + i, row_ok, ld)
