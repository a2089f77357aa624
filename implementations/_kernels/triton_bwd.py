"""Fused FlashAttention-2 backward kernels in Triton, over the forward's iteration spaces.

``delta = rowsum(dO ∘ O)`` first; then a dK/dV kernel (each program holds one key block and
walks the query blocks that see it: the transposed band, or the transposed CSR list) and a dQ
kernel (each program holds one query block and walks the forward's key blocks). Probabilities
are recomputed from the forward's base-2 log-sum-exp; rows with no kept key have ``lse = +inf``
and contribute nothing. No atomics: every gradient element is written by one program.
"""

from __future__ import annotations

import triton
import triton.language as tl

from implementations._kernels.triton_autotune import bwd_configs, dq_configs, fwd_configs
from implementations._kernels.triton_primitives import band_ranges, keep_mask, load_rows, mma


@triton.jit
def delta_kernel(Out, DO, DELTA, sob, soh, son, sdb, sdh, sdn, H, n_q,
                 D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK: tl.constexpr):
    """DELTA (B·H, n_q) fp32 = rowsum(dO ∘ O). Grid (row blocks, B·H)."""
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    dd = tl.arange(0, BLOCK_D)
    ld = (i[:, None] < n_q) & (dd[None, :] < D)
    o = tl.load(Out + b.to(tl.int64) * sob + h.to(tl.int64) * soh + i[:, None] * son + dd[None, :],
                mask=ld, other=0.0)
    do = tl.load(DO + b.to(tl.int64) * sdb + h.to(tl.int64) * sdh + i[:, None] * sdn + dd[None, :],
                 mask=ld, other=0.0)
    tl.store(DELTA + bh.to(tl.int64) * n_q + i, tl.sum(o.to(tl.float32) * do.to(tl.float32), 1),
             mask=i < n_q)


@triton.jit
def _dq_step(dq, q, do, lse, delta, p, row_ok, k_base, v_base, skn, svn, kr, kstep, c0, c_end,
             lo, hi, g, hg, sc2, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, D: tl.constexpr,
             MASKED: tl.constexpr, PRECISION: tl.constexpr):
    c = c0 + tl.arange(0, BLOCK_N)
    j = kr + kstep * c
    dd = tl.arange(0, BLOCK_D)
    col_ok = c < c_end
    k = load_rows(k_base + j[:, None] * skn + dd[None, :], col_ok, D, BLOCK_D, MASKED)
    v = load_rows(v_base + j[:, None] * svn + dd[None, :], col_ok, D, BLOCK_D, MASKED)
    pr = tl.math.exp2(mma(q, tl.trans(k), None, PRECISION) * sc2 - lse[:, None])
    if MASKED:
        pr = tl.where(keep_mask(p, j, row_ok, col_ok, lo, hi, g, hg), pr, 0.0)
    ds = pr * (mma(do, tl.trans(v), None, PRECISION) - delta[:, None])
    return mma(ds.to(k.dtype), k, dq, PRECISION)


@triton.jit
def _dkdv_step(dk, dv, k, v, j, col_ok, q_base, do_base, lse_base, delta_base, sqn, sdn,
               rq, stepq, a0, a_lo, a_hi, off, lo, hi, g, hg, sc2,
               BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, D: tl.constexpr,
               MASKED: tl.constexpr, PRECISION: tl.constexpr):
    a = a0 + tl.arange(0, BLOCK_M)
    row_ok = (a >= a_lo) & (a < a_hi)
    p = rq + stepq * a
    i = p - off
    dd = tl.arange(0, BLOCK_D)
    q = load_rows(q_base + i[:, None] * sqn + dd[None, :], row_ok, D, BLOCK_D, True)
    do = load_rows(do_base + i[:, None] * sdn + dd[None, :], row_ok, D, BLOCK_D, True)
    lse = tl.load(lse_base + i, mask=row_ok, other=float("inf"))
    delta = tl.load(delta_base + i, mask=row_ok, other=0.0)
    pt = tl.math.exp2(mma(k, tl.trans(q), None, PRECISION) * sc2 - lse[None, :])  # (keys, rows)
    if MASKED:
        pt = tl.where(tl.trans(keep_mask(p, j, row_ok, col_ok, lo, hi, g, hg)), pt, 0.0)
    dv = mma(pt.to(do.dtype), do, dv, PRECISION)
    dst = pt * (mma(v, tl.trans(do), None, PRECISION) - delta[None, :])
    return mma(dst.to(q.dtype), q, dk, PRECISION), dv


@triton.autotune(configs=dq_configs(), key=["n_bucket", "BLOCK_D", "MODE_KEY"])
@triton.jit
def band_dq(Q, K, V, DO, DQ, LSE, DELTA, SLOTS,
            sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb, sdh, sdn, sgb, sgh, sgn,
            H, n_q, n_k, off, g, hg, g_keys, sc2, scale, n_bucket, MODE_KEY,
            D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """dQ over the forward's iteration space. Grid (row blocks, B·H, slots)."""
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    sp = SLOTS + tl.program_id(2) * 9
    r, step, a_start, n_rows = tl.load(sp), tl.load(sp + 1), tl.load(sp + 2), tl.load(sp + 3)
    k_start, k_end = tl.load(sp + 4), tl.load(sp + 5)
    lo_rel, hi_rel, glob = tl.load(sp + 6), tl.load(sp + 7), tl.load(sp + 8)
    if pid_m * BLOCK_M < n_rows:
        b, h = bh // H, bh % H
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
        bo, ho = b.to(tl.int64), h.to(tl.int64)
        q = tl.load(Q + bo * sqb + ho * sqh + i[:, None] * sqn + dd[None, :], mask=ld, other=0.0)
        do = tl.load(DO + bo * sdb + ho * sdh + i[:, None] * sdn + dd[None, :], mask=ld, other=0.0)
        lse = tl.load(LSE + bh.to(tl.int64) * n_q + i, mask=row_ok, other=float("inf"))
        delta = tl.load(DELTA + bh.to(tl.int64) * n_q + i, mask=row_ok, other=0.0)
        dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        lo_abs, hi_abs = lo_rel * step, hi_rel * step
        if glob != 0:
            g_hi = tl.minimum(g_keys, r + step * a1 + hg + 1)
            for c0 in range(0, g_hi, BLOCK_N):
                dq = _dq_step(dq, q, do, lse, delta, p, row_ok, k_base, v_base, skn, svn, 0, 1,
                              c0, g_hi, lo_abs, hi_abs, g, hg, sc2, BLOCK_N, BLOCK_D, D, True,
                              PRECISION)
        lo, hi_x, mid, post = band_ranges(a0, a1, lo_rel, hi_rel, k_start, k_end, BLOCK_N)
        for c0 in range(lo, tl.minimum(mid, hi_x), BLOCK_N):
            dq = _dq_step(dq, q, do, lse, delta, p, row_ok, k_base, v_base, skn, svn, r, step,
                          c0, hi_x, lo_abs, hi_abs, g, hg, sc2, BLOCK_N, BLOCK_D, D, True,
                          PRECISION)
        for c0 in range(mid, post, BLOCK_N):
            dq = _dq_step(dq, q, do, lse, delta, p, row_ok, k_base, v_base, skn, svn, r, step,
                          c0, hi_x, lo_abs, hi_abs, g, hg, sc2, BLOCK_N, BLOCK_D, D, False,
                          PRECISION)
        for c0 in range(post, hi_x, BLOCK_N):
            dq = _dq_step(dq, q, do, lse, delta, p, row_ok, k_base, v_base, skn, svn, r, step,
                          c0, hi_x, lo_abs, hi_abs, g, hg, sc2, BLOCK_N, BLOCK_D, D, True,
                          PRECISION)
        tl.store(DQ + bo * sgb + ho * sgh + i[:, None] * sgn + dd[None, :],
                 (dq * scale).to(DQ.dtype.element_ty), mask=ld)


@triton.autotune(configs=bwd_configs(), key=["n_bucket", "BLOCK_D", "MODE_KEY"])
@triton.jit
def band_dkdv(Q, K, V, DO, DK, DV, LSE, DELTA, KSLOTS,
              sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb, sdh, sdn, sgb, sgh, sgn,
              H, n_q, n_k, off, g, hg, big, n_glob, sc2, scale, n_bucket, MODE_KEY,
              D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """dK, dV: each program one key block of a key slot. Grid (key blocks, B·H, key slots).
    DK/DV share the strides sg*."""
    pid_n, bh = tl.program_id(0), tl.program_id(1)
    sp = KSLOTS + tl.program_id(2) * 9
    r, step, c_start, c_end = tl.load(sp), tl.load(sp + 1), tl.load(sp + 2), tl.load(sp + 3)
    a_start, n_rows = tl.load(sp + 4), tl.load(sp + 5)
    lo_rel, hi_rel, phase_a = tl.load(sp + 6), tl.load(sp + 7), tl.load(sp + 8)
    c0 = c_start + pid_n * BLOCK_N
    if c0 < c_end:
        b, h = bh // H, bh % H
        bo, ho = b.to(tl.int64), h.to(tl.int64)
        q_base, do_base = Q + bo * sqb + ho * sqh, DO + bo * sdb + ho * sdh
        lse_base, delta_base = LSE + bh.to(tl.int64) * n_q, DELTA + bh.to(tl.int64) * n_q
        c = c0 + tl.arange(0, BLOCK_N)
        col_ok = c < c_end
        c1 = tl.minimum(c0 + BLOCK_N, c_end) - 1
        j = r + step * c
        dd = tl.arange(0, BLOCK_D)
        ld = col_ok[:, None] & (dd[None, :] < D)
        k = tl.load(K + bo * skb + ho * skh + j[:, None] * skn + dd[None, :], mask=ld, other=0.0)
        v = tl.load(V + bo * svb + ho * svh + j[:, None] * svn + dd[None, :], mask=ld, other=0.0)
        dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        lo_abs, hi_abs = lo_rel * step, hi_rel * step
        if phase_a != 0:  # the global rows p < g see every key (causality kept)
            for a0 in range(off, off + n_glob, BLOCK_M):
                dk, dv = _dkdv_step(dk, dv, k, v, j, col_ok, q_base, do_base, lse_base,
                                    delta_base, sqn, sdn, 0, 1, a0, off, off + n_glob, off, -big,
                                    hg, g, hg, sc2, BLOCK_M, BLOCK_D, D, True, PRECISION)
        a_end = a_start + n_rows
        lo, hi_x, mid, post = band_ranges(c0, c1, -hi_rel, -lo_rel, a_start, a_end, BLOCK_M)
        full = c0 + BLOCK_N <= c_end  # a cut key block takes the mask everywhere
        mid = tl.where(full, mid, hi_x)
        post = tl.where(full, post, hi_x)
        for a0 in range(lo, tl.minimum(mid, hi_x), BLOCK_M):
            dk, dv = _dkdv_step(dk, dv, k, v, j, col_ok, q_base, do_base, lse_base, delta_base,
                                sqn, sdn, r, step, a0, a_start, a_end, off, lo_abs, hi_abs, g,
                                hg, sc2, BLOCK_M, BLOCK_D, D, True, PRECISION)
        for a0 in range(mid, post, BLOCK_M):
            dk, dv = _dkdv_step(dk, dv, k, v, j, col_ok, q_base, do_base, lse_base, delta_base,
                                sqn, sdn, r, step, a0, a_start, a_end, off, lo_abs, hi_abs, g,
                                hg, sc2, BLOCK_M, BLOCK_D, D, False, PRECISION)
        for a0 in range(tl.maximum(post, lo), hi_x, BLOCK_M):
            dk, dv = _dkdv_step(dk, dv, k, v, j, col_ok, q_base, do_base, lse_base, delta_base,
                                sqn, sdn, r, step, a0, a_start, a_end, off, lo_abs, hi_abs, g,
                                hg, sc2, BLOCK_M, BLOCK_D, D, True, PRECISION)
        g_ptr = bo * sgb + ho * sgh + j[:, None] * sgn + dd[None, :]
        tl.store(DK + g_ptr, (dk * scale).to(DK.dtype.element_ty), mask=ld)
        tl.store(DV + g_ptr, dv.to(DV.dtype.element_ty), mask=ld)


@triton.autotune(configs=fwd_configs(blocks=False), key=["n_bucket", "BLOCK_D", "MODE_KEY"])
@triton.jit
def blocks_dq(Q, K, V, DO, DQ, LSE, DELTA, Q_POS, STARTS, MIDS, ENDS, COLS, ORDER,
              sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb, sdh, sdn, sgb, sgh, sgn,
              H, n_q, n_k, off, block, hg, sc2, scale, n_bucket, MODE_KEY,
              D: tl.constexpr, BLOCK_D: tl.constexpr, TILE: tl.constexpr,
              PRECISION: tl.constexpr):
    """dQ over the CSR lists. Grid (CSR rows, B·H)."""
    row, bh = tl.load(ORDER + tl.program_id(0)), tl.program_id(1)
    b, h = bh // H, bh % H
    bo, ho = b.to(tl.int64), h.to(tl.int64)
    k_base, v_base = K + bo * skb + ho * skh, V + bo * svb + ho * svh
    lane = tl.arange(0, TILE)
    p = tl.load(Q_POS + row) + lane
    i = p - off
    row_ok = (lane < block) & (i >= 0) & (i < n_q)
    dd = tl.arange(0, BLOCK_D)
    ld = row_ok[:, None] & (dd[None, :] < D)
    q = tl.load(Q + bo * sqb + ho * sqh + i[:, None] * sqn + dd[None, :], mask=ld, other=0.0)
    do = tl.load(DO + bo * sdb + ho * sdh + i[:, None] * sdn + dd[None, :], mask=ld, other=0.0)
    lse = tl.load(LSE + bh.to(tl.int64) * n_q + i, mask=row_ok, other=float("inf"))
    delta = tl.load(DELTA + bh.to(tl.int64) * n_q + i, mask=row_ok, other=0.0)
    dq = tl.zeros([TILE, BLOCK_D], dtype=tl.float32)
    e0, e_mid, e1 = tl.load(STARTS + row), tl.load(MIDS + row), tl.load(ENDS + row)
    for e in range(e0, e_mid):
        j0 = tl.load(COLS + e)
        dq = _dq_step(dq, q, do, lse, delta, p, row_ok, k_base, v_base, skn, svn, j0, 1, 0,
                      TILE, -2 * n_k - 2, hg, 0, hg, sc2, TILE, BLOCK_D, D, False, PRECISION)
    for e in range(e_mid, e1):
        j0 = tl.load(COLS + e)
        dq = _dq_step(dq, q, do, lse, delta, p, row_ok, k_base, v_base, skn, svn, j0, 1, 0,
                      tl.minimum(block, n_k - j0), -2 * n_k - 2, hg, 0, hg, sc2, TILE,
                      BLOCK_D, D, True, PRECISION)
    tl.store(DQ + bo * sgb + ho * sgh + i[:, None] * sgn + dd[None, :],
             (dq * scale).to(DQ.dtype.element_ty), mask=ld)


@triton.autotune(configs=fwd_configs(blocks=False), key=["n_bucket", "BLOCK_D", "MODE_KEY"])
@triton.jit
def blocks_dkdv(Q, K, V, DO, DK, DV, LSE, DELTA, K_POS, STARTS, MIDS, ENDS, ROWS, ORDER,
                sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb, sdh, sdn, sgb, sgh, sgn,
                H, n_q, n_k, off, block, hg, sc2, scale, n_bucket, MODE_KEY,
                D: tl.constexpr, BLOCK_D: tl.constexpr, TILE: tl.constexpr,
                PRECISION: tl.constexpr):
    """dK, dV over the transposed CSR lists (key block -> query blocks). Grid (key blocks,
    B·H). Rows are loaded with their validity mask everywhere (a query block may be cut)."""
    row, bh = tl.load(ORDER + tl.program_id(0)), tl.program_id(1)
    b, h = bh // H, bh % H
    bo, ho = b.to(tl.int64), h.to(tl.int64)
    q_base, do_base = Q + bo * sqb + ho * sqh, DO + bo * sdb + ho * sdh
    lse_base, delta_base = LSE + bh.to(tl.int64) * n_q, DELTA + bh.to(tl.int64) * n_q
    lane = tl.arange(0, TILE)
    j = tl.load(K_POS + row) + lane
    col_ok = (lane < block) & (j < n_k)
    dd = tl.arange(0, BLOCK_D)
    ld = col_ok[:, None] & (dd[None, :] < D)
    k = tl.load(K + bo * skb + ho * skh + j[:, None] * skn + dd[None, :], mask=ld, other=0.0)
    v = tl.load(V + bo * svb + ho * svh + j[:, None] * svn + dd[None, :], mask=ld, other=0.0)
    dk = tl.zeros([TILE, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([TILE, BLOCK_D], dtype=tl.float32)
    e0, e_mid, e1 = tl.load(STARTS + row), tl.load(MIDS + row), tl.load(ENDS + row)
    for e in range(e0, e_mid):
        p0 = tl.load(ROWS + e)
        a_lo, a_hi = tl.maximum(off - p0, 0), tl.minimum(n_k - p0, block)  # rows 0 <= i < n_q
        dk, dv = _dkdv_step(dk, dv, k, v, j, col_ok, q_base, do_base, lse_base, delta_base,
                            sqn, sdn, p0, 1, 0, a_lo, a_hi, off, -2 * n_k - 2, hg, 0, hg, sc2,
                            TILE, BLOCK_D, D, False, PRECISION)
    for e in range(e_mid, e1):
        p0 = tl.load(ROWS + e)
        a_lo, a_hi = tl.maximum(off - p0, 0), tl.minimum(n_k - p0, block)  # rows 0 <= i < n_q
        dk, dv = _dkdv_step(dk, dv, k, v, j, col_ok, q_base, do_base, lse_base, delta_base,
                            sqn, sdn, p0, 1, 0, a_lo, a_hi, off, -2 * n_k - 2, hg, 0, hg, sc2,
                            TILE, BLOCK_D, D, True, PRECISION)
    g_ptr = bo * sgb + ho * sgh + j[:, None] * sgn + dd[None, :]
    tl.store(DK + g_ptr, (dk * scale).to(DK.dtype.element_ty), mask=ld)
    tl.store(DV + g_ptr, dv.to(DV.dtype.element_ty), mask=ld)
