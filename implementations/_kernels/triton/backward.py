"""Fused FlashAttention-2 backward kernels in Triton over the band's iteration spaces.

``delta = rowsum(dO ∘ O)`` first; then a dK/dV kernel (each program holds one key block of a
key slot and walks the query rows that keep it: the transposed band, the global rows outside
it, the prefix's rows under dilation, for every query head of its K/V head) and a dQ kernel
(each program holds one query block and walks the forward's key blocks). Probabilities are
recomputed from the forward's base-2 log-sum-exp in one multiply-add and an ``exp2``; rows with
no kept key have ``lse = +inf`` and contribute nothing. Masks as in the forward: one unsigned
compare per score in the edge blocks, none in the middle. No atomics: every gradient element is
written by one program (grouped-query K/V heads sum their query heads inside the program). The
block-list (BigBird) backward is in :mod:`.backward_blocks`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from implementations._kernels.triton.autotune import TUNE_KEY, configs, prune
from implementations._kernels.triton.forward import row_tiles, stored_rows
from implementations._kernels.triton.primitives import (
    allowed,
    cross_keep,
    edge_start,
    global_span,
    kept,
    key_block,
    load_rows,
    mma,
    own_block,
    own_bounds,
    own_start,
    prefix_bounds,
    span_block,
    walk,
)


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
def dq_tile(dq, q, do, lse, delta, k, v, keep, sc2, MASKED: tl.constexpr,
            PRECISION: tl.constexpr):
    """dQ += dS K for one key tile (rows, keys); ``keep`` applies when MASKED."""
    pr = tl.math.exp2(mma(q, tl.trans(k), None, PRECISION) * sc2 - lse[:, None])
    if MASKED:
        pr = tl.where(keep, pr, 0.0)
    ds = pr * (mma(do, tl.trans(v), None, PRECISION) - delta[:, None])
    return mma(ds.to(k.dtype), k, dq, PRECISION)


@triton.jit
def dq_step(dq, q, do, lse, delta, lo, hi, k_base, v_base, skn, svn, r, step, c0, c_end, sc2,
            p, ds, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, D: tl.constexpr,
            MASKED: tl.constexpr, DILATED: tl.constexpr, PRECISION: tl.constexpr,
            PRED: tl.constexpr):
    """One key block of the band for dQ (class keys c0 .. c0 + BLOCK_N; a masked block's keys
    clamped to the last, as in the forward; every block masked by a predicate feature)."""
    c, j = key_block(c0, c_end, r, step, BLOCK_N, MASKED, DILATED)
    dd = tl.arange(0, BLOCK_D)
    k = load_rows(k_base + j[:, None] * skn + dd[None, :], c, D, BLOCK_D, False)
    v = load_rows(v_base + j[:, None] * svn + dd[None, :], c, D, BLOCK_D, False)
    keep = kept(tl.arange(0, BLOCK_N), lo - c0, hi - c0)
    if PRED is not None:
        keep = keep & allowed(p, j, ds, PRED, True)
        dq = dq_tile(dq, q, do, lse, delta, k, v, keep, sc2, True, PRECISION)
    else:
        dq = dq_tile(dq, q, do, lse, delta, k, v, keep, sc2, MASKED, PRECISION)
    return dq


@triton.jit
def dq_cross(dq, q, do, lse, delta, lo, hi, glo, ghi, k_base, v_base, skn, svn, GPOS, e0, e1,
             r, step, sc2, p, ds, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
             D: tl.constexpr, DILATED: tl.constexpr, GATHER: tl.constexpr,
             PRECISION: tl.constexpr, PRED: tl.constexpr):
    """dQ from the keys outside the rows' band, each row's in [glo, ghi]: the global keys
    ``GPOS[e0:e1]`` (GATHER), or the keys ``[e0, e1)`` of a dilated prefix (as
    :func:`~.forward.fwd_cross`)."""
    dd = tl.arange(0, BLOCK_D)
    for e in range(e0, e1, BLOCK_N):
        j, col_ok = span_block(GPOS, e, e1, BLOCK_N, GATHER)
        k = load_rows(k_base + j[:, None] * skn + dd[None, :], col_ok, D, BLOCK_D, False)
        v = load_rows(v_base + j[:, None] * svn + dd[None, :], col_ok, D, BLOCK_D, False)
        keep = cross_keep(j, glo, ghi, lo, hi, r, step, DILATED, GATHER)
        if PRED is not None:
            keep = keep & allowed(p, j, ds, PRED, True)
        dq = dq_tile(dq, q, do, lse, delta, k, v, keep & col_ok[None, :], sc2, True, PRECISION)
    return dq


@triton.jit
def dq_rows(dq, q, do, lse, delta, x, p, ok, x0, p0, x1, p1, r, step, flags, SP, GPOS, GIDX,
            DS, DE, k_base, v_base, skn, svn, n_k, hg, P, sc2, BLOCK_N: tl.constexpr,
            BLOCK_D: tl.constexpr, D: tl.constexpr, GLOBAL: tl.constexpr,
            DILATED: tl.constexpr, DOCS: tl.constexpr, PREFIX: tl.constexpr,
            PRECISION: tl.constexpr, PRED: tl.constexpr):
    """dQ of one row block over the forward's keys: the cross span, the prefix span
    (dilated), the masked edges, the unmasked middle."""
    lo, hi = own_bounds(x, p, ok, SP, P, DS, DE, PREFIX, DOCS, DILATED)
    ds = own_start(p, ok, DS, DOCS, PRED)
    if GLOBAL:  # noqa: SIM102 (a compile-time clause around a runtime one)
        if (flags & 1) != 0:
            glo, ghi, e0, e1 = global_span(p, ok, p0, p1, GIDX, -n_k - 1, hg, 0, n_k, P, DS,
                                              DE, DOCS, PREFIX, DILATED)
            dq = dq_cross(dq, q, do, lse, delta, lo, hi, glo, ghi, k_base, v_base, skn, svn,
                          GPOS, e0, e1, r, step, sc2, p, ds, BLOCK_N, BLOCK_D, D, DILATED,
                          True, PRECISION, PRED)
    if PREFIX:  # noqa: SIM102 (compile-time clauses around a runtime one)
        if DILATED:  # noqa: SIM102
            if (flags & 2) == 0:
                plo, phi = prefix_bounds(p, ok, 0, P, DS, DE, DOCS)
                dq = dq_cross(dq, q, do, lse, delta, lo, hi, plo, phi, k_base, v_base, skn, svn,
                              GPOS, tl.min(plo, 0), tl.max(phi, 0) + 1, r, step, sc2, p, ds,
                              BLOCK_N, BLOCK_D, D, DILATED, False, PRECISION, PRED)
    lo0, hi0 = own_bounds(x0, p0, p0 >= 0, SP, P, DS, DE, PREFIX, DOCS, DILATED)
    lo1, hi1 = own_bounds(x1, p1, p1 >= 0, SP, P, DS, DE, PREFIX, DOCS, DILATED)
    start, mid, post, end = walk(lo0, hi0, lo1, hi1, BLOCK_N)
    c_end = tl.load(SP + 5)
    n_lo = tl.cdiv(mid - start, BLOCK_N)
    for i in range(0, n_lo + tl.cdiv(end - post, BLOCK_N)):
        c0 = edge_start(i, start, post, n_lo, BLOCK_N)
        dq = dq_step(dq, q, do, lse, delta, lo, hi, k_base, v_base, skn, svn, r, step, c0,
                     c_end, sc2, p, ds, BLOCK_N, BLOCK_D, D, True, DILATED, PRECISION, PRED)
    for c0 in range(mid, post, BLOCK_N):
        dq = dq_step(dq, q, do, lse, delta, lo, hi, k_base, v_base, skn, svn, r, step, c0,
                     c_end, sc2, p, ds, BLOCK_N, BLOCK_D, D, False, DILATED, PRECISION, PRED)
    return dq


@triton.jit
def dq_inputs(Q, DO, LSE, DELTA, bo, ho, bh, i, ok, sqb, sqh, sqn, sdb, sdh, sdn, n_q,
              D: tl.constexpr, BLOCK_D: tl.constexpr):
    """The inputs of a dQ program's rows ``i`` (valid ``ok``) of batch ``bo``, head ``ho``
    (int64; ``bh`` = b·H + h): Q and dO tiles (rows, BLOCK_D), zeros past D and in invalid
    rows, their lse and delta (an invalid row's lse +inf: it contributes nothing), and the
    tiles' mask ``ld`` (rows, BLOCK_D)."""
    dd = tl.arange(0, BLOCK_D)
    ld = ok[:, None] & (dd[None, :] < D)
    q = tl.load(Q + bo * sqb + ho * sqh + i[:, None] * sqn + dd[None, :], mask=ld, other=0.0)
    do = tl.load(DO + bo * sdb + ho * sdh + i[:, None] * sdn + dd[None, :], mask=ld, other=0.0)
    lse = tl.load(LSE + bh.to(tl.int64) * n_q + i, mask=ok, other=float("inf"))
    delta = tl.load(DELTA + bh.to(tl.int64) * n_q + i, mask=ok, other=0.0)
    return q, do, lse, delta, ld


@triton.autotune(configs=configs("band_dq"), key=TUNE_KEY,
                 prune_configs_by={"early_config_prune": prune("band_dq")})
@triton.jit
def band_dq(Q, K, V, DO, DQ, LSE, DELTA, SLOTS, GPOS, GIDX, DS, DE,
            sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb, sdh, sdn, sgb, sgh, sgn,
            H, GROUP, n_q, n_k, off, hg, P, GB, sc2, scale, n_bucket, q_bucket, MASK_KEY,
            D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, GLOBAL: tl.constexpr,
            DILATED: tl.constexpr, DOCS: tl.constexpr, PREFIX: tl.constexpr,
            APART: tl.constexpr = False, PRED: tl.constexpr = None, TMA: tl.constexpr = False,
            WS: tl.constexpr = False):
    """dQ over the forward's iteration space. Grid (row blocks, B·H, slots). ``TMA`` (a mask
    without clauses, the host checks): Q, dO, K, V tiles loaded and dQ stored through tensor
    descriptors (:func:`dq_block_tma`); ``WS``: its key loop warp-specialized."""
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    SP = SLOTS + tl.program_id(2) * 9
    GIDX -= GB  # GIDX[x] counts the global positions below x >= GB (negative: rows)
    if TMA:  # one slot of all rows, no idle row block: no runtime branch (as the forward's)
        tl.static_assert(not (GLOBAL or DILATED or DOCS or PREFIX), "TMA: no mask clauses")
        tl.static_assert(PRED is None, "TMA: no predicate")
        dq_block_tma(Q, K, V, DO, DQ, LSE, DELTA, SP, DS, DE, pid_m, bh, sqb, sqh, sqn, skb,
                     skh, skn, svb, svh, svn, sdb, sdh, sdn, sgb, sgh, sgn, H, GROUP, n_q, n_k,
                     off, P, sc2, scale, D, BLOCK_D, BLOCK_M, BLOCK_N, PRECISION, WS)
    elif pid_m * BLOCK_M < tl.load(SP + 3):
        b, h = bh // H, bh % H
        bo, ho, hk = b.to(tl.int64), h.to(tl.int64), (h // GROUP).to(tl.int64)
        x, p, ok, x0, p0, x1, p1, r, step, flags = own_block(SP, GPOS, pid_m, BLOCK_M)
        i = p - off
        q, do, lse, delta, ld = dq_inputs(Q, DO, LSE, DELTA, bo, ho, bh, i, ok, sqb, sqh, sqn,
                                          sdb, sdh, sdn, n_q, D, BLOCK_D)
        dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        dq = dq_rows(dq, q, do, lse, delta, x, p, ok, x0, p0, x1, p1, r, step, flags, SP, GPOS,
                     GIDX, DS, DE, K + bo * skb + hk * skh, V + bo * svb + hk * svh, skn, svn,
                     n_k, hg, P, sc2, BLOCK_N, BLOCK_D, D, GLOBAL, DILATED, DOCS, PREFIX,
                     PRECISION, PRED)
        store = stored_rows(ok, p, flags, GIDX, GLOBAL, APART)
        dd = tl.arange(0, BLOCK_D)
        tl.store(DQ + bo * sgb + ho * sgh + i[:, None] * sgn + dd[None, :],
                 (dq * scale).to(DQ.dtype.element_ty), mask=ld & store[:, None])


@triton.jit
def dkdv_tile(dk, dv, k, v, q, do, lse, delta, keep, sc2, MASKED: tl.constexpr,
              PRECISION: tl.constexpr):
    """dV += Pᵀ dO, dK += dSᵀ Q for one tile of query rows; ``keep`` (keys, rows)."""
    pt = tl.math.exp2(mma(k, tl.trans(q), None, PRECISION) * sc2 - lse[None, :])
    if MASKED:
        pt = tl.where(keep, pt, 0.0)
    dv = mma(pt.to(do.dtype), do, dv, PRECISION)
    dst = pt * (mma(v, tl.trans(do), None, PRECISION) - delta[None, :])
    return mma(dst.to(q.dtype), q, dk, PRECISION), dv


@triton.jit
def dkdv_step(dk, dv, k, v, lo, hi, q_base, do_base, lse_base, delta_base, sqn, sdn, r, step,
              c0, c_start, c_end, off, sc2, j, ds, BLOCK_M: tl.constexpr,
              BLOCK_D: tl.constexpr, D: tl.constexpr, MASKED: tl.constexpr,
              DILATED: tl.constexpr, PRECISION: tl.constexpr, PRED: tl.constexpr):
    """One block of query rows (class rows c0 .. c0 + BLOCK_M, valid in [c_start, c_end))
    for dK/dV. A masked block clamps its rows into the valid ones (no predicated loads): rows
    outside are outside every key's interval, so they contribute nothing; an unmasked block
    holds valid rows only."""
    a = c0 + tl.arange(0, BLOCK_M)
    if MASKED:
        a = tl.minimum(tl.maximum(a, c_start), c_end - 1)
    pos = r + step * a if DILATED else a
    i = pos - off
    dd = tl.arange(0, BLOCK_D)
    q = load_rows(q_base + i[:, None] * sqn + dd[None, :], a, D, BLOCK_D, False)
    do = load_rows(do_base + i[:, None] * sdn + dd[None, :], a, D, BLOCK_D, False)
    lse = tl.load(lse_base + i)
    delta = tl.load(delta_base + i)
    keep = kept(tl.arange(0, BLOCK_M), lo - c0, hi - c0)
    if PRED is not None:  # keys j own the tile: keep (keys, rows)
        keep = keep & allowed(j, pos, ds, PRED, False)
        dk, dv = dkdv_tile(dk, dv, k, v, q, do, lse, delta, keep, sc2, True, PRECISION)
    else:
        dk, dv = dkdv_tile(dk, dv, k, v, q, do, lse, delta, keep, sc2, MASKED, PRECISION)
    return dk, dv


@triton.jit
def dkdv_cross(dk, dv, k, v, lo, hi, glo, ghi, q_base, do_base, lse_base, delta_base, sqn,
               sdn, GPOS, e0, e1, r, step, off, sc2, j, ds, BLOCK_M: tl.constexpr,
               BLOCK_D: tl.constexpr, D: tl.constexpr, DILATED: tl.constexpr,
               GATHER: tl.constexpr, PRECISION: tl.constexpr, PRED: tl.constexpr):
    """The query rows that keep these keys outside their band, each key's in [glo, ghi]: the
    global rows ``GPOS[e0:e1]`` (GATHER), or the rows at positions ``[e0, e1)`` of a dilated
    prefix."""
    dd = tl.arange(0, BLOCK_D)
    for e in range(e0, e1, BLOCK_M):
        p, row_ok = span_block(GPOS, e, e1, BLOCK_M, GATHER)
        i = p - off
        q = load_rows(q_base + i[:, None] * sqn + dd[None, :], row_ok, D, BLOCK_D, False)
        do = load_rows(do_base + i[:, None] * sdn + dd[None, :], row_ok, D, BLOCK_D, False)
        lse = tl.load(lse_base + i)
        delta = tl.load(delta_base + i)
        keep = cross_keep(p, glo, ghi, lo, hi, r, step, DILATED, GATHER) & row_ok[None, :]
        if PRED is not None:
            keep = keep & allowed(j, p, ds, PRED, False)
        dk, dv = dkdv_tile(dk, dv, k, v, q, do, lse, delta, keep, sc2, True, PRECISION)
    return dk, dv


@triton.jit
def dkdv_inputs(K, V, bo, hko, j, ok, skb, skh, skn, svb, svh, svn, D: tl.constexpr,
                BLOCK_D: tl.constexpr):
    """The K and V tiles (keys, BLOCK_D) of a dK/dV program's keys ``j`` (valid ``ok``) of
    batch ``bo``, K/V head ``hko`` (int64), zeros past D and in invalid keys, and the tiles'
    mask ``ld`` (keys, BLOCK_D)."""
    dd = tl.arange(0, BLOCK_D)
    ld = ok[:, None] & (dd[None, :] < D)
    k = tl.load(K + bo * skb + hko * skh + j[:, None] * skn + dd[None, :], mask=ld, other=0.0)
    v = tl.load(V + bo * svb + hko * svh + j[:, None] * svn + dd[None, :], mask=ld, other=0.0)
    return k, v, ld


@triton.autotune(configs=configs("band_dkdv"), key=TUNE_KEY,
                 prune_configs_by={"early_config_prune": prune("band_dkdv")})
@triton.jit
def band_dkdv(Q, K, V, DO, DK, DV, LSE, DELTA, KSLOTS, GPOS, GIDX, DS, DE,
              sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb, sdh, sdn, sgb, sgh, sgn,
              H, GROUP, n_q, n_k, off, hg, P, GB, sc2, scale, n_bucket, q_bucket, MASK_KEY,
              D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, GLOBAL: tl.constexpr,
              DILATED: tl.constexpr, DOCS: tl.constexpr, PREFIX: tl.constexpr,
              APART: tl.constexpr = False, PRED: tl.constexpr = None, TMA: tl.constexpr = False,
              WS: tl.constexpr = False):
    """dK, dV: each program one key block of a key slot, summed over the GROUP query heads of
    its K/V head. Grid (key blocks, B·H_kv, key slots). DK/DV share the strides sg*. ``TMA``
    (a mask without clauses, the host checks): K, V, Q, dO tiles loaded and dK, dV stored
    through tensor descriptors (:func:`dkdv_block_tma`); ``WS``: one row loop over every
    query head of the group, warp-specialized."""
    pid_n, bhk = tl.program_id(0), tl.program_id(1)
    SP = KSLOTS + tl.program_id(2) * 9
    GIDX -= GB  # GIDX[x] counts the global positions below x >= GB (negative: rows)
    if TMA:  # one key slot of all keys, no idle key block: no runtime branch
        tl.static_assert(not (GLOBAL or DILATED or DOCS or PREFIX), "TMA: no mask clauses")
        tl.static_assert(PRED is None, "TMA: no predicate")
        dkdv_block_tma(Q, K, V, DO, DK, DV, LSE, DELTA, SP, DS, DE, pid_n, bhk, sqb, sqh, sqn,
                       skb, skh, skn, svb, svh, svn, sdb, sdh, sdn, sgb, sgh, sgn, H, GROUP,
                       n_q, n_k, off, P, sc2, scale, D, BLOCK_D, BLOCK_M, BLOCK_N, PRECISION,
                       WS)
    elif pid_n * BLOCK_N < tl.load(SP + 3):
        hkv = H // GROUP
        b, hk = bhk // hkv, bhk % hkv
        bo, hko = b.to(tl.int64), hk.to(tl.int64)
        x, j, ok, x0, j0, x1, j1, r, step, flags = own_block(SP, GPOS, pid_n, BLOCK_N)
        k, v, ld = dkdv_inputs(K, V, bo, hko, j, ok, skb, skh, skn, svb, svh, svn, D, BLOCK_D)
        dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        for g in range(0, GROUP):
            hq = hk * GROUP + g
            ho, bh = hq.to(tl.int64), (b * H + hq).to(tl.int64)
            dk, dv = dkdv_keys(dk, dv, k, v, x, j, ok, x0, j0, x1, j1, r, step, flags, SP, GPOS,
                               GIDX, DS, DE, Q + bo * sqb + ho * sqh, DO + bo * sdb + ho * sdh,
                               LSE + bh * n_q, DELTA + bh * n_q, sqn, sdn, n_k, off, hg, P, sc2,
                               BLOCK_M, BLOCK_D, D, GLOBAL, DILATED, DOCS, PREFIX, PRECISION,
                               PRED)
        store = stored_rows(ok, j, flags, GIDX, GLOBAL, APART)
        dd = tl.arange(0, BLOCK_D)
        g_ptr = bo * sgb + hko * sgh + j[:, None] * sgn + dd[None, :]
        tl.store(DK + g_ptr, (dk * scale).to(DK.dtype.element_ty), mask=ld & store[:, None])
        tl.store(DV + g_ptr, dv.to(DV.dtype.element_ty), mask=ld & store[:, None])


@triton.jit
def dkdv_keys(dk, dv, k, v, x, j, ok, x0, j0, x1, j1, r, step, flags, SP, GPOS, GIDX, DS, DE,
              q_base, do_base, lse_base, delta_base, sqn, sdn, n_k, off, hg, P, sc2,
              BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, D: tl.constexpr,
              GLOBAL: tl.constexpr, DILATED: tl.constexpr, DOCS: tl.constexpr,
              PREFIX: tl.constexpr, PRECISION: tl.constexpr, PRED: tl.constexpr):
    """dK/dV of one key block from one query head: the global rows outside the band, the
    prefix rows (dilated), the masked edges, the unmasked middle of the transposed band."""
    lo, hi = own_bounds(x, j, ok, SP, P, DS, DE, PREFIX, DOCS, DILATED)
    ds = own_start(j, ok, DS, DOCS, PRED)
    if GLOBAL:  # noqa: SIM102 (a compile-time clause around a runtime one)
        if (flags & 1) != 0:
            glo, ghi, e0, e1 = global_span(j, ok, j0, j1, GIDX, -hg, n_k + 1, off, n_k, P, DS,
                                              DE, DOCS, PREFIX, DILATED)
            dk, dv = dkdv_cross(dk, dv, k, v, lo, hi, glo, ghi, q_base, do_base, lse_base,
                                delta_base, sqn, sdn, GPOS, e0, e1, r, step, off, sc2, j, ds,
                                BLOCK_M, BLOCK_D, D, DILATED, True, PRECISION, PRED)
    if PREFIX:  # noqa: SIM102 (compile-time clauses around a runtime one)
        if DILATED:  # noqa: SIM102
            if (flags & 2) == 0:
                plo, phi = prefix_bounds(j, ok, off, P, DS, DE, DOCS)
                dk, dv = dkdv_cross(dk, dv, k, v, lo, hi, plo, phi, q_base, do_base, lse_base,
                                    delta_base, sqn, sdn, GPOS, tl.min(plo, 0),
                                    tl.max(phi, 0) + 1, r, step, off, sc2, j, ds, BLOCK_M,
                                    BLOCK_D, D, DILATED, False, PRECISION, PRED)
    lo0, hi0 = own_bounds(x0, j0, j0 >= 0, SP, P, DS, DE, PREFIX, DOCS, DILATED)
    lo1, hi1 = own_bounds(x1, j1, j1 >= 0, SP, P, DS, DE, PREFIX, DOCS, DILATED)
    start, mid, post, end = walk(lo0, hi0, lo1, hi1, BLOCK_M)
    c_start, c_end = tl.load(SP + 4), tl.load(SP + 5)
    n_lo = tl.cdiv(mid - start, BLOCK_M)
    for i in range(0, n_lo + tl.cdiv(end - post, BLOCK_M)):
        c0 = edge_start(i, start, post, n_lo, BLOCK_M)
        dk, dv = dkdv_step(dk, dv, k, v, lo, hi, q_base, do_base, lse_base, delta_base, sqn,
                           sdn, r, step, c0, c_start, c_end, off, sc2, j, ds, BLOCK_M,
                           BLOCK_D, D, True, DILATED, PRECISION, PRED)
    for c0 in range(mid, post, BLOCK_M):
        dk, dv = dkdv_step(dk, dv, k, v, lo, hi, q_base, do_base, lse_base, delta_base, sqn,
                           sdn, r, step, c0, c_start, c_end, off, sc2, j, ds, BLOCK_M,
                           BLOCK_D, D, False, DILATED, PRECISION, PRED)
    return dk, dv


# --- the Hopper path: tiles through tensor descriptors (masks without clauses) ---------------
# One slot of owns in order, partners in order (``autotune.tma_allowed``): rows (keys) x0 ..
# x0 + BLOCK of the slot are rows i0 .. i0 + BLOCK of the tensors, so one descriptor load
# (``UTMALDG``) brings a tile; rows or columns past a tensor's end read as zeros and are not
# written. The masked blocks' partners past the ends are outside every own's interval.


@triton.jit
def slot_block(SP, pid, BLOCK: tl.constexpr):
    """The owns of block ``pid`` of a slot of step 1 with no table (no branch, which would
    keep a loop after it from being warp-specialized): coordinates ``x`` (BLOCK,), validity,
    the first and last valid own, and the class start ``r`` (positions ``r + x``)."""
    r, x_start, n_own = tl.load(SP), tl.load(SP + 2), tl.load(SP + 3)
    x0 = x_start + pid * BLOCK
    x = x0 + tl.arange(0, BLOCK)
    ok = x < x_start + n_own
    x1 = tl.minimum(x0 + BLOCK, x_start + n_own) - 1
    return x, ok, x0, x1, r


@triton.jit
def dq_step_tma(dq, q, do, lse, delta, lo, hi, k_desc, v_desc, c0, sc2, BLOCK_N: tl.constexpr,
                MASKED: tl.constexpr, PRECISION: tl.constexpr):
    """:func:`dq_step` with K and V tiles through tensor descriptors."""
    k = k_desc.load([c0, 0])
    v = v_desc.load([c0, 0])
    keep = kept(tl.arange(0, BLOCK_N), lo - c0, hi - c0)
    return dq_tile(dq, q, do, lse, delta, k, v, keep, sc2, MASKED, PRECISION)


@triton.jit
def dq_block_tma(Q, K, V, DO, DQ, LSE, DELTA, SP, DS, DE, pid_m, bh, sqb, sqh, sqn, skb, skh,
                 skn, svb, svh, svn, sdb, sdh, sdn, sgb, sgh, sgn, H, GROUP, n_q, n_k, off, P,
                 sc2, scale, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, WS: tl.constexpr):
    """dQ of one row block of a mask without clauses, tiles through tensor descriptors: the
    masked edge blocks, then the unmasked middle, software-pipelined; ``WS``: every block in
    one masked loop, warp-specialized. Rows past n_q read zeros, lse +inf: they contribute
    nothing and are not written."""
    b, h = bh // H, bh % H
    b64, h64, hk = b.to(tl.int64), h.to(tl.int64), (h // GROUP).to(tl.int64)
    x, ok, x0, x1, r = slot_block(SP, pid_m, BLOCK_M)
    p, p0, p1 = r + x, r + x0, r + x1
    i0 = p0 - off  # the block's first row: rows i0 .. i0 + BLOCK_M in order
    q = row_tiles(Q + b64 * sqb + h64 * sqh, sqn, n_q, D, BLOCK_M, BLOCK_D).load([i0, 0])
    do = row_tiles(DO + b64 * sdb + h64 * sdh, sdn, n_q, D, BLOCK_M, BLOCK_D).load([i0, 0])
    i = p - off
    lse = tl.load(LSE + bh.to(tl.int64) * n_q + i, mask=ok, other=float("inf"))
    delta = tl.load(DELTA + bh.to(tl.int64) * n_q + i, mask=ok, other=0.0)
    k_desc = row_tiles(K + b64 * skb + hk * skh, skn, n_k, D, BLOCK_N, BLOCK_D)
    v_desc = row_tiles(V + b64 * svb + hk * svh, svn, n_k, D, BLOCK_N, BLOCK_D)
    lo, hi = own_bounds(x, p, ok, SP, P, DS, DE, False, False, False)
    lo0, hi0 = own_bounds(x0, p0, p0 >= 0, SP, P, DS, DE, False, False, False)
    lo1, hi1 = own_bounds(x1, p1, p1 >= 0, SP, P, DS, DE, False, False, False)
    start, mid, post, end = walk(lo0, hi0, lo1, hi1, BLOCK_N)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if WS:  # the edges and the middle are blocks start + i·BLOCK_N alike
        for c0 in tl.range(start, end, BLOCK_N, warp_specialize=True):
            dq = dq_step_tma(dq, q, do, lse, delta, lo, hi, k_desc, v_desc, c0, sc2, BLOCK_N,
                             True, PRECISION)
    else:
        n_lo = tl.cdiv(mid - start, BLOCK_N)
        for e in range(0, n_lo + tl.cdiv(end - post, BLOCK_N)):
            c0 = edge_start(e, start, post, n_lo, BLOCK_N)
            dq = dq_step_tma(dq, q, do, lse, delta, lo, hi, k_desc, v_desc, c0, sc2, BLOCK_N,
                             True, PRECISION)
        for c0 in tl.range(mid, post, BLOCK_N):
            dq = dq_step_tma(dq, q, do, lse, delta, lo, hi, k_desc, v_desc, c0, sc2, BLOCK_N,
                             False, PRECISION)
    row_tiles(DQ + b64 * sgb + h64 * sgh, sgn, n_q, D, BLOCK_M, BLOCK_D).store(
        [i0, 0], (dq * scale).to(DQ.dtype.element_ty))


@triton.jit
def dkdv_step_tma(dk, dv, k, v, lo, hi, q_desc, do_desc, hq, lse_base, delta_base, c0, c_start,
                  c_end, off, sc2, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                  MASKED: tl.constexpr, PRECISION: tl.constexpr):
    """:func:`dkdv_step` with the Q and dO tiles of query head ``hq`` through (heads, rows,
    D) tensor descriptors: rows past n_q read zeros; a masked block's lse and delta are read
    at rows clamped into the valid ones (rows outside are outside every key's interval)."""
    a = c0 + tl.arange(0, BLOCK_M)
    if MASKED:
        a = tl.minimum(tl.maximum(a, c_start), c_end - 1)
    q = q_desc.load([hq, c0 - off, 0]).reshape(BLOCK_M, BLOCK_D)
    do = do_desc.load([hq, c0 - off, 0]).reshape(BLOCK_M, BLOCK_D)
    lse = tl.load(lse_base + a - off)
    delta = tl.load(delta_base + a - off)
    keep = kept(tl.arange(0, BLOCK_M), lo - c0, hi - c0)
    return dkdv_tile(dk, dv, k, v, q, do, lse, delta, keep, sc2, MASKED, PRECISION)


@triton.jit
def head_tiles(base, head_stride, stride, H, n, D: tl.constexpr, BLOCK: tl.constexpr,
               BLOCK_D: tl.constexpr):
    """A tensor descriptor over the (H, n, D) heads and rows at ``base`` in (1, BLOCK,
    BLOCK_D) tiles: one descriptor serves every query head of a group."""
    return tl.make_tensor_descriptor(base, shape=[H, n, D], strides=[head_stride, stride, 1],
                                     block_shape=[1, BLOCK, BLOCK_D])


@triton.jit
def dkdv_block_tma(Q, K, V, DO, DK, DV, LSE, DELTA, SP, DS, DE, pid_n, bhk, sqb, sqh, sqn, skb,
                   skh, skn, svb, svh, svn, sdb, sdh, sdn, sgb, sgh, sgn, H, GROUP, n_q, n_k,
                   off, P, sc2, scale, D: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
                   WS: tl.constexpr):
    """dK, dV of one key block of a mask without clauses, summed over the GROUP query heads of
    its K/V head, tiles through tensor descriptors: per head the masked edge row blocks, then
    the unmasked middle; ``WS``: one masked loop over (head, row block), warp-specialized.
    Keys past n_k read zeros and are not written."""
    hkv = H // GROUP
    b, hk = bhk // hkv, bhk % hkv
    bo, hko = b.to(tl.int64), hk.to(tl.int64)
    x, ok, x0, x1, r = slot_block(SP, pid_n, BLOCK_N)
    j, j0, j1 = r + x, r + x0, r + x1
    k = row_tiles(K + bo * skb + hko * skh, skn, n_k, D, BLOCK_N, BLOCK_D).load([j0, 0])
    v = row_tiles(V + bo * svb + hko * svh, svn, n_k, D, BLOCK_N, BLOCK_D).load([j0, 0])
    q_desc = head_tiles(Q + bo * sqb, sqh, sqn, H, n_q, D, BLOCK_M, BLOCK_D)
    do_desc = head_tiles(DO + bo * sdb, sdh, sdn, H, n_q, D, BLOCK_M, BLOCK_D)
    lo, hi = own_bounds(x, j, ok, SP, P, DS, DE, False, False, False)
    lo0, hi0 = own_bounds(x0, j0, j0 >= 0, SP, P, DS, DE, False, False, False)
    lo1, hi1 = own_bounds(x1, j1, j1 >= 0, SP, P, DS, DE, False, False, False)
    start, mid, post, end = walk(lo0, hi0, lo1, hi1, BLOCK_M)
    c_start, c_end = tl.load(SP + 4), tl.load(SP + 5)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    lse_head = LSE + (b * H + hk * GROUP).to(tl.int64) * n_q  # the group's first query head
    delta_head = DELTA + (b * H + hk * GROUP).to(tl.int64) * n_q
    if WS:  # one loop over (head g, row block e): blocks start + e·BLOCK_M of each head
        n_blocks = tl.cdiv(end - start, BLOCK_M)
        for t in tl.range(0, GROUP * n_blocks, warp_specialize=True):
            g = t // n_blocks
            c0 = start + (t - g * n_blocks) * BLOCK_M
            dk, dv = dkdv_step_tma(dk, dv, k, v, lo, hi, q_desc, do_desc, hk * GROUP + g,
                                   lse_head + g * n_q, delta_head + g * n_q, c0, c_start,
                                   c_end, off, sc2, BLOCK_M, BLOCK_D, True, PRECISION)
    else:
        n_lo = tl.cdiv(mid - start, BLOCK_M)
        for g in range(0, GROUP):
            hq = hk * GROUP + g
            lse_base, delta_base = lse_head + g * n_q, delta_head + g * n_q
            for e in range(0, n_lo + tl.cdiv(end - post, BLOCK_M)):
                c0 = edge_start(e, start, post, n_lo, BLOCK_M)
                dk, dv = dkdv_step_tma(dk, dv, k, v, lo, hi, q_desc, do_desc, hq, lse_base,
                                       delta_base, c0, c_start, c_end, off, sc2, BLOCK_M,
                                       BLOCK_D, True, PRECISION)
            for c0 in tl.range(mid, post, BLOCK_M):
                dk, dv = dkdv_step_tma(dk, dv, k, v, lo, hi, q_desc, do_desc, hq, lse_base,
                                       delta_base, c0, c_start, c_end, off, sc2, BLOCK_M,
                                       BLOCK_D, False, PRECISION)
    row_tiles(DK + bo * sgb + hko * sgh, sgn, n_k, D, BLOCK_N, BLOCK_D).store(
        [j0, 0], (dk * scale).to(DK.dtype.element_ty))
    row_tiles(DV + bo * sgb + hko * sgh, sgn, n_k, D, BLOCK_N, BLOCK_D).store(
        [j0, 0], dv.to(DV.dtype.element_ty))
