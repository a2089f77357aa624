"""Fused FlashAttention-2 forward kernels in Triton: a band kernel and a block-list kernel.

Online softmax in base 2, fp32 ``m, l, acc``; ``tl.dot`` accumulates in fp32 (IEEE for fp32
inputs, not TF32). The row max ``m`` is kept in raw (unscaled) score units, so that each
probability is one fused multiply-add and an ``exp2``: ``exp2(s·scale·log2e − m·scale·log2e)``.
Masked scores take a finite ``NEG``; a row that has seen no kept key has its exponent's bias
clamped (``HALF_NEG``), so its masked probabilities are 0 and a row that sees no key at all
keeps ``l = 0`` and outputs zeros (``lse = +inf``), never NaN. A masked block costs one
unsigned compare and one select per score (:func:`~.primitives.kept`); the blocks every
row keeps run without either. Order of work per row block: the cross span over global keys
(when the slot has one), the prefix's keys (a dilated class slot whose rows reach into the
prefix), the masked edge blocks, then the unmasked middle, so the mask's interval is dead
during the middle. Slots and tables come from ``band_plan``/``plan_tables``.

Argument lists are written several to a line, as the kernels' signatures are.
"""

from __future__ import annotations

import triton
import triton.language as tl

from implementations._kernels.triton.autotune import TUNE_KEY, configs, prune
from implementations._kernels.triton.primitives import (
    HALF_NEG,
    NEG,
    allowed,
    cross_keep,
    csr_rows,
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
def online(acc, l_i, m_i, s, v, sc2, MASKED: tl.constexpr, PRECISION: tl.constexpr):
    """Fold raw scores ``s`` (rows, keys) and values ``v`` into the running (acc, l, m)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if MASKED:  # noqa: SIM108 (no kept key yet: masked scores must give 0, not exp2(0))
        bias = tl.maximum(m_new, HALF_NEG) * sc2
    else:
        bias = m_new * sc2
    pr = tl.math.exp2(s * sc2 - bias[:, None])
    alpha = tl.math.exp2(m_i * sc2 - bias)
    l_i = l_i * alpha + tl.sum(pr, 1)
    acc = mma(pr.to(v.dtype), v, acc * alpha[:, None], PRECISION)
    return acc, l_i, m_new


@triton.jit
def fwd_step(acc, l_i, m_i, q, lo, hi, k_base, v_base, skn, svn, r, step, c0, c_end, sc2,
             p, ds, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, D: tl.constexpr,
             MASKED: tl.constexpr, DILATED: tl.constexpr, PRECISION: tl.constexpr,
             PRED: tl.constexpr):
    """One key block of the band: class keys c0 .. c0 + BLOCK_N (:func:`~.primitives.key_block`;
    a masked block's keys clamped to the last). With a predicate feature (PRED) every block
    is masked by it: rows at positions ``p``, document starts ``ds``."""
    c, j = key_block(c0, c_end, r, step, BLOCK_N, MASKED, DILATED)
    dd = tl.arange(0, BLOCK_D)
    k = load_rows(k_base + j[:, None] * skn + dd[None, :], c, D, BLOCK_D, False)
    s = mma(q, tl.trans(k), None, PRECISION)
    if MASKED:
        s = tl.where(kept(tl.arange(0, BLOCK_N), lo - c0, hi - c0), s, NEG)
    v = load_rows(v_base + j[:, None] * svn + dd[None, :], c, D, BLOCK_D, False)
    if PRED is not None:  # a row may keep none of this block's keys: the masked update
        s = tl.where(allowed(p, j, ds, PRED, True), s, NEG)
        acc, l_i, m_i = online(acc, l_i, m_i, s, v, sc2, True, PRECISION)
    else:
        acc, l_i, m_i = online(acc, l_i, m_i, s, v, sc2, MASKED, PRECISION)
    return acc, l_i, m_i


@triton.jit
def fwd_cross(acc, l_i, m_i, q, lo, hi, glo, ghi, k_base, v_base, skn, svn, GPOS, e0, e1,
              r, step, sc2, p, ds, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
              D: tl.constexpr, DILATED: tl.constexpr, GATHER: tl.constexpr,
              PRECISION: tl.constexpr, PRED: tl.constexpr):
    """The keys outside the rows' band, each row's in [glo, ghi]: the global keys
    ``GPOS[e0:e1]`` (GATHER), or the keys ``[e0, e1)`` of a dilated prefix."""
    dd = tl.arange(0, BLOCK_D)
    for e in range(e0, e1, BLOCK_N):
        j, col_ok = span_block(GPOS, e, e1, BLOCK_N, GATHER)
        k = load_rows(k_base + j[:, None] * skn + dd[None, :], col_ok, D, BLOCK_D, False)
        s = mma(q, tl.trans(k), None, PRECISION)
        keep = cross_keep(j, glo, ghi, lo, hi, r, step, DILATED, GATHER) & col_ok[None, :]
        if PRED is not None:
            keep = keep & allowed(p, j, ds, PRED, True)
        v = load_rows(v_base + j[:, None] * svn + dd[None, :], col_ok, D, BLOCK_D, False)
        acc, l_i, m_i = online(acc, l_i, m_i, tl.where(keep, s, NEG), v, sc2, True, PRECISION)
    return acc, l_i, m_i


@triton.jit
def fwd_band(acc, l_i, m_i, q, lo, hi, k_base, v_base, skn, svn, r, step, c_end,
             lo_end, mid, post, end, sc2, p, ds, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
             D: tl.constexpr, DILATED: tl.constexpr, PRECISION: tl.constexpr,
             PRED: tl.constexpr):
    """The band's key blocks [lo_end, end): the masked edges, then the unmasked [mid, post)."""
    n_lo = tl.cdiv(mid - lo_end, BLOCK_N)
    n_edge = n_lo + tl.cdiv(end - post, BLOCK_N)
    for i in range(0, n_edge):
        c0 = edge_start(i, lo_end, post, n_lo, BLOCK_N)
        acc, l_i, m_i = fwd_step(acc, l_i, m_i, q, lo, hi, k_base, v_base, skn, svn, r, step,
                                 c0, c_end, sc2, p, ds, BLOCK_N, BLOCK_D, D, True, DILATED,
                                 PRECISION, PRED)
    for c0 in range(mid, post, BLOCK_N):
        acc, l_i, m_i = fwd_step(acc, l_i, m_i, q, lo, hi, k_base, v_base, skn, svn, r, step,
                                 c0, c_end, sc2, p, ds, BLOCK_N, BLOCK_D, D, False, DILATED,
                                 PRECISION, PRED)
    return acc, l_i, m_i


@triton.jit
def finish(acc, l_i, m_i, o_ptrs, lse_ptrs, store, ld, sc2):
    """Normalize and store the rows ``store``; rows with no kept key get zeros, lse = +inf."""
    has = l_i > 0.0
    l_safe = tl.where(has, l_i, 1.0)
    out = acc / l_safe[:, None]
    tl.store(o_ptrs, out.to(o_ptrs.dtype.element_ty), mask=ld & store[:, None])
    lse = tl.where(has, m_i * sc2 + tl.math.log2(l_safe), float("inf"))
    tl.store(lse_ptrs, lse, mask=store)


@triton.jit
def stored_rows(ok, p, flags, GIDX, GLOBAL: tl.constexpr, APART: tl.constexpr):
    """Rows (keys in dK/dV) this program writes: valid ones, and with global tokens not the
    global owns of a class slot (the TABLE slot writes those). The owns' counts are GIDX's,
    or, when global rows and keys differ (APART: a plug-in feature's runs), ``flags >> 2``
    entries further on (:func:`band_plan.band_plan`)."""
    if GLOBAL:
        OWN = GIDX + (flags >> 2) if APART else GIDX
        n_global = tl.load(OWN + p + 1, mask=ok, other=0) - tl.load(OWN + p, mask=ok, other=0)
        ok = ok & (n_global * (1 - ((flags >> 1) & 1)) == 0)  # a TABLE slot writes every row
    return ok


@triton.autotune(configs=configs("band_fwd"), key=TUNE_KEY,
                 prune_configs_by={"early_config_prune": prune("band_fwd")})
@triton.jit
def band_fwd(Q, K, V, Out, LSE, SLOTS, GPOS, GIDX, DS, DE,
             sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son,
             H, GROUP, n_q, n_k, off, hg, P, GB, sc2, n_bucket, q_bucket, MASK_KEY,
             D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, GLOBAL: tl.constexpr,
             DILATED: tl.constexpr, DOCS: tl.constexpr, PREFIX: tl.constexpr,
             TMA: tl.constexpr = False, WS: tl.constexpr = False, APART: tl.constexpr = False,
             PRED: tl.constexpr = None):
    """Grid (row blocks, B·H, slots). O: (B, H, n_q, D); LSE: (B·H, n_q) fp32, base 2.
    K/V head ``h // GROUP`` (grouped-query attention). ``TMA`` (a mask without clauses, the
    host checks): tiles through tensor descriptors (:func:`fwd_block_tma`); ``WS``: its
    unmasked loop warp-specialized. ``PRED``: a predicate feature's ``@triton.jit (p, j) ->
    bool`` (None: no code for it), applied to every block visited."""
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    SP = SLOTS + tl.program_id(2) * 9
    GIDX -= GB  # GIDX[x] counts the global positions below x >= GB (negative: rows)
    if TMA:  # one slot of all rows: its grid has no idle row block (no runtime branch, which
        # would keep the loop from being warp-specialized)
        tl.static_assert(not (GLOBAL or DILATED or DOCS or PREFIX), "TMA: no mask clauses")
        fwd_block_tma(Q, K, V, Out, LSE, SP, GPOS, DS, DE, pid_m, bh, sqb, sqh, sqn, skb, skh,
                      skn, svb, svh, svn, sob, soh, son, H, GROUP, n_q, n_k, off, P, sc2, D,
                      BLOCK_D, BLOCK_M, BLOCK_N, PRECISION, WS)
    elif pid_m * BLOCK_M < tl.load(SP + 3):
        b, h = bh // H, bh % H
        x, p, ok, x0, p0, x1, p1, r, step, flags = own_block(SP, GPOS, pid_m, BLOCK_M)
        i = p - off
        dd = tl.arange(0, BLOCK_D)
        ld = ok[:, None] & (dd[None, :] < D)
        q_base = Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh
        q = tl.load(q_base + i[:, None] * sqn + dd[None, :], mask=ld, other=0.0)
        hk = (h // GROUP).to(tl.int64)
        k_base = K + b.to(tl.int64) * skb + hk * skh
        v_base = V + b.to(tl.int64) * svb + hk * svh
        acc, l_i, m_i = fwd_rows(q, x, p, ok, x0, p0, x1, p1, r, step, flags, SP, GPOS, GIDX,
                                 DS, DE, k_base, v_base, skn, svn, n_k, hg, P, sc2, BLOCK_M,
                                 BLOCK_N, BLOCK_D, D, GLOBAL, DILATED, DOCS, PREFIX, PRECISION,
                                 PRED)
        o_ptrs = Out + b.to(tl.int64) * sob + h.to(tl.int64) * soh + i[:, None] * son + dd[None, :]
        store = stored_rows(ok, p, flags, GIDX, GLOBAL, APART)
        finish(acc, l_i, m_i, o_ptrs, LSE + bh.to(tl.int64) * n_q + i, store, ld, sc2)


@triton.jit
def row_tiles(base, stride, n, D: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
    """A tensor descriptor over the (n, D) rows at ``base``, ``stride`` elements apart, in
    (BLOCK, BLOCK_D) tiles (past n rows or D columns: zeros read, nothing written)."""
    return tl.make_tensor_descriptor(base, shape=[n, D], strides=[stride, 1],
                                     block_shape=[BLOCK, BLOCK_D])


@triton.jit
def fwd_step_tma(acc, l_i, m_i, q, lo, hi, k_desc, v_desc, c0, sc2, BLOCK_N: tl.constexpr,
                 MASKED: tl.constexpr, PRECISION: tl.constexpr):
    """:func:`fwd_step` with K and V tiles through tensor descriptors: keys past the end read
    as zeros (a masked block's interval excludes them)."""
    k = k_desc.load([c0, 0])
    s = mma(q, tl.trans(k), None, PRECISION)
    if MASKED:
        s = tl.where(kept(tl.arange(0, BLOCK_N), lo - c0, hi - c0), s, NEG)
    v = v_desc.load([c0, 0])
    return online(acc, l_i, m_i, s, v, sc2, MASKED, PRECISION)


@triton.jit
def fwd_block_tma(Q, K, V, Out, LSE, SP, GPOS, DS, DE, pid_m, bh, sqb, sqh, sqn, skb, skh,
                  skn, svb, svh, svn, sob, soh, son, H, GROUP, n_q, n_k, off, P, sc2,
                  D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, WS: tl.constexpr):
    """One row block of a mask without clauses (one slot: the rows in order, keys [0, n_k))
    with Q, K, V loaded and O stored through tensor descriptors (the bulk tensor copies of
    sm_90): rows and columns past the ends read as zeros and are not written. The masked edge
    blocks, then the unmasked middle, software-pipelined; ``WS``: every block in one masked
    loop, warp-specialized (Triton specializes a loop on sm_90 only when it is the kernel's one
    loop over the descriptors, at 4 warps)."""
    b, h = bh // H, bh % H
    b64, h64, hk = b.to(tl.int64), h.to(tl.int64), (h // GROUP).to(tl.int64)
    # own_block's positions for a slot of step 1 and no table (no branch before the loop,
    # which would also keep it from being warp-specialized)
    r, x_start, n_own = tl.load(SP), tl.load(SP + 2), tl.load(SP + 3)
    x0 = x_start + pid_m * BLOCK_M
    x = x0 + tl.arange(0, BLOCK_M)
    ok = x < x_start + n_own
    x1 = tl.minimum(x0 + BLOCK_M, x_start + n_own) - 1
    p, p0, p1 = r + x, r + x0, r + x1
    i0 = p0 - off  # the block's first row: rows i0 .. i0 + BLOCK_M in order
    q = row_tiles(Q + b64 * sqb + h64 * sqh, sqn, n_q, D, BLOCK_M, BLOCK_D).load([i0, 0])
    k_desc = row_tiles(K + b64 * skb + hk * skh, skn, n_k, D, BLOCK_N, BLOCK_D)
    v_desc = row_tiles(V + b64 * svb + hk * svh, svn, n_k, D, BLOCK_N, BLOCK_D)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + NEG
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    lo, hi = own_bounds(x, p, ok, SP, P, DS, DE, False, False, False)
    lo0, hi0 = own_bounds(x0, p0, p0 >= 0, SP, P, DS, DE, False, False, False)
    lo1, hi1 = own_bounds(x1, p1, p1 >= 0, SP, P, DS, DE, False, False, False)
    lo_end, mid, post, end = walk(lo0, hi0, lo1, hi1, BLOCK_N)
    if WS:  # the edges and the middle are blocks lo_end + i·BLOCK_N alike
        for c0 in tl.range(lo_end, end, BLOCK_N, warp_specialize=True):
            acc, l_i, m_i = fwd_step_tma(acc, l_i, m_i, q, lo, hi, k_desc, v_desc, c0, sc2,
                                         BLOCK_N, True, PRECISION)
    else:
        n_lo = tl.cdiv(mid - lo_end, BLOCK_N)
        for i in range(0, n_lo + tl.cdiv(end - post, BLOCK_N)):
            c0 = edge_start(i, lo_end, post, n_lo, BLOCK_N)
            acc, l_i, m_i = fwd_step_tma(acc, l_i, m_i, q, lo, hi, k_desc, v_desc, c0, sc2,
                                         BLOCK_N, True, PRECISION)
        for c0 in tl.range(mid, post, BLOCK_N):
            acc, l_i, m_i = fwd_step_tma(acc, l_i, m_i, q, lo, hi, k_desc, v_desc, c0, sc2,
                                         BLOCK_N, False, PRECISION)
    has = l_i > 0.0
    l_safe = tl.where(has, l_i, 1.0)
    out = (acc / l_safe[:, None]).to(Out.dtype.element_ty)
    row_tiles(Out + b64 * sob + h64 * soh, son, n_q, D, BLOCK_M, BLOCK_D).store([i0, 0], out)
    lse = tl.where(has, m_i * sc2 + tl.math.log2(l_safe), float("inf"))
    tl.store(LSE + bh.to(tl.int64) * n_q + p - off, lse, mask=ok)


@triton.jit
def fwd_spans(acc, l_i, m_i, q, lo, hi, p, ok, p0, p1, r, step, flags, walks, GPOS, GIDX,
                 DS, DE, k_base, v_base, skn, svn, n_k, hg, P, sc2, ds, BLOCK_N: tl.constexpr,
                 BLOCK_D: tl.constexpr, D: tl.constexpr, GLOBAL: tl.constexpr,
                 DILATED: tl.constexpr, DOCS: tl.constexpr, PREFIX: tl.constexpr,
                 PRECISION: tl.constexpr, PRED: tl.constexpr):
    """The keys of a row block outside its band, when the program ``walks`` them (the
    forward: always; a split decode: its first chunk): the cross span over global keys
    (a slot with one), then a dilated class slot's prefix span."""
    if GLOBAL:  # noqa: SIM102 (a compile-time clause around a runtime one)
        if ((flags & 1) != 0) & walks:
            glo, ghi, e0, e1 = global_span(p, ok, p0, p1, GIDX, -n_k - 1, hg, 0, n_k, P, DS,
                                              DE, DOCS, PREFIX, DILATED)
            acc, l_i, m_i = fwd_cross(acc, l_i, m_i, q, lo, hi, glo, ghi, k_base, v_base, skn,
                                      svn, GPOS, e0, e1, r, step, sc2, p, ds, BLOCK_N, BLOCK_D,
                                      D, DILATED, True, PRECISION, PRED)
    if PREFIX:  # noqa: SIM102 (compile-time clauses around a runtime one)
        if DILATED:  # noqa: SIM102
            if ((flags & 2) == 0) & walks:
                plo, phi = prefix_bounds(p, ok, 0, P, DS, DE, DOCS)
                acc, l_i, m_i = fwd_cross(acc, l_i, m_i, q, lo, hi, plo, phi, k_base, v_base,
                                          skn, svn, GPOS, tl.min(plo, 0), tl.max(phi, 0) + 1,
                                          r, step, sc2, p, ds, BLOCK_N, BLOCK_D, D, DILATED,
                                          False, PRECISION, PRED)
    return acc, l_i, m_i


@triton.jit
def fwd_rows(q, x, p, ok, x0, p0, x1, p1, r, step, flags, SP, GPOS, GIDX, DS, DE,
             k_base, v_base, skn, svn, n_k, hg, P, sc2, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, D: tl.constexpr,
             GLOBAL: tl.constexpr, DILATED: tl.constexpr, DOCS: tl.constexpr,
             PREFIX: tl.constexpr, PRECISION: tl.constexpr, PRED: tl.constexpr):
    """(acc, l, m) of one row block over every key its slot gives it: cross, prefix, band."""
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + NEG
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    lo, hi = own_bounds(x, p, ok, SP, P, DS, DE, PREFIX, DOCS, DILATED)
    ds = own_start(p, ok, DS, DOCS, PRED)
    acc, l_i, m_i = fwd_spans(acc, l_i, m_i, q, lo, hi, p, ok, p0, p1, r, step, flags, True,
                                 GPOS, GIDX, DS, DE, k_base, v_base, skn, svn, n_k, hg, P, sc2,
                                 ds, BLOCK_N, BLOCK_D, D, GLOBAL, DILATED, DOCS, PREFIX,
                                 PRECISION, PRED)
    lo0, hi0 = own_bounds(x0, p0, p0 >= 0, SP, P, DS, DE, PREFIX, DOCS, DILATED)
    lo1, hi1 = own_bounds(x1, p1, p1 >= 0, SP, P, DS, DE, PREFIX, DOCS, DILATED)
    lo_end, mid, post, end = walk(lo0, hi0, lo1, hi1, BLOCK_N)
    return fwd_band(acc, l_i, m_i, q, lo, hi, k_base, v_base, skn, svn, r, step,
                    tl.load(SP + 5), lo_end, mid, post, end, sc2, p, ds, BLOCK_N, BLOCK_D, D,
                    DILATED, PRECISION, PRED)


@triton.jit
def csr_keys(acc, l_i, m_i, q, p, k_base, v_base, skn, svn, COLS, e_start, e_end,
             block, n_k, hg, sc2, TILE: tl.constexpr, BLOCK_D: tl.constexpr,
             D: tl.constexpr, MASKED: tl.constexpr, PRECISION: tl.constexpr):
    """The key blocks ``COLS[e_start:e_end]`` of a CSR row, each one :func:`fwd_step`;
    MASKED ones keep keys j in [j0, j0 + block), j < n_k and j <= p + hg."""
    for e in range(e_start, e_end):
        j0 = tl.load(COLS + e)
        hi = tl.minimum(tl.minimum(p + hg, n_k - 1), j0 + block - 1)
        acc, l_i, m_i = fwd_step(acc, l_i, m_i, q, j0 + 0 * p, hi, k_base, v_base, skn, svn,
                                 0, 1, j0, n_k, sc2, p, p, TILE, BLOCK_D, D, MASKED, False,
                                 PRECISION, None)
    return acc, l_i, m_i


@triton.autotune(configs=configs("blocks_fwd"), key=TUNE_KEY,
                 prune_configs_by={"early_config_prune": prune("blocks_fwd")})
@triton.jit
def blocks_fwd(Q, K, V, Out, LSE, Q_POS, STARTS, MIDS, ENDS, COLS, ORDER,
               sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son,
               H, GROUP, n_q, n_k, off, block, hg, sc2, n_bucket, q_bucket, MASK_KEY,
               D: tl.constexpr, BLOCK_D: tl.constexpr, TILE: tl.constexpr,
               PRECISION: tl.constexpr):
    """Grid (CSR rows, B·H): query block ``ORDER[pid]`` visits its CSR list of key blocks,
    the unmasked ones ``[STARTS, MIDS)`` first, then the masked ``[MIDS, ENDS)``."""
    row = tl.load(ORDER + tl.program_id(0))
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    hk = (h // GROUP).to(tl.int64)
    q_base = Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh
    k_base = K + b.to(tl.int64) * skb + hk * skh
    v_base = V + b.to(tl.int64) * svb + hk * svh
    p, i, row_ok = csr_rows(Q_POS, row, off, n_q, block, TILE)
    dd = tl.arange(0, BLOCK_D)
    ld = row_ok[:, None] & (dd[None, :] < D)
    q = tl.load(q_base + i[:, None] * sqn + dd[None, :], mask=ld, other=0.0)
    m_i = tl.zeros([TILE], dtype=tl.float32) + NEG
    l_i = tl.zeros([TILE], dtype=tl.float32)
    acc = tl.zeros([TILE, BLOCK_D], dtype=tl.float32)
    e0, e_mid, e1 = tl.load(STARTS + row), tl.load(MIDS + row), tl.load(ENDS + row)
    acc, l_i, m_i = csr_keys(acc, l_i, m_i, q, p, k_base, v_base, skn, svn, COLS, e_mid, e1,
                             block, n_k, hg, sc2, TILE, BLOCK_D, D, True, PRECISION)
    acc, l_i, m_i = csr_keys(acc, l_i, m_i, q, p, k_base, v_base, skn, svn, COLS, e0, e_mid,
                             block, n_k, hg, sc2, TILE, BLOCK_D, D, False, PRECISION)
    o_ptrs = Out + b.to(tl.int64) * sob + h.to(tl.int64) * soh + i[:, None] * son + dd[None, :]
    finish(acc, l_i, m_i, o_ptrs, LSE + bh.to(tl.int64) * n_q + i, row_ok, ld, sc2)
