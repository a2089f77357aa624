"""Fused backward kernels of the block-list (BigBird) iteration space: dQ over each query
block's CSR list of key blocks, dK/dV over each key block's transposed list (summed over the
query heads of its K/V head). The tiles and steps are the band backward's
(:mod:`.backward`): an entry's mask is the interval of keys (or rows) of its layout block that
causality and the sequence ends leave.
"""

from __future__ import annotations

import triton
import triton.language as tl

from implementations._kernels.triton.autotune import TUNE_KEY, configs, prune
from implementations._kernels.triton.backward import dkdv_inputs, dkdv_step, dq_inputs, dq_step
from implementations._kernels.triton.primitives import csr_rows


@triton.jit
def csr_dq(dq, q, do, lse, delta, p, k_base, v_base, skn, svn, COLS, e_start, e_end, block,
           n_k, hg, sc2, TILE: tl.constexpr, BLOCK_D: tl.constexpr, D: tl.constexpr,
           MASKED: tl.constexpr, PRECISION: tl.constexpr):
    """dQ over the key blocks ``COLS[e_start:e_end]``: keys [j0, j0 + block), j < n_k,
    j <= p + hg."""
    for e in range(e_start, e_end):
        j0 = tl.load(COLS + e)
        hi = tl.minimum(tl.minimum(p + hg, n_k - 1), j0 + block - 1)
        dq = dq_step(dq, q, do, lse, delta, j0 + 0 * p, hi, k_base, v_base, skn, svn, 0, 1, j0,
                     n_k, sc2, p, p, TILE, BLOCK_D, D, MASKED, False, PRECISION, None)
    return dq


@triton.autotune(configs=configs("blocks_dq"), key=TUNE_KEY,
                 prune_configs_by={"early_config_prune": prune("blocks_dq")})
@triton.jit
def blocks_dq(Q, K, V, DO, DQ, LSE, DELTA, Q_POS, STARTS, MIDS, ENDS, COLS, ORDER,
              sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb, sdh, sdn, sgb, sgh, sgn,
              H, GROUP, n_q, n_k, off, block, hg, sc2, scale, n_bucket, q_bucket, MASK_KEY,
              D: tl.constexpr, BLOCK_D: tl.constexpr, TILE: tl.constexpr,
              PRECISION: tl.constexpr):
    """dQ over the CSR lists. Grid (CSR rows, B·H)."""
    row, bh = tl.load(ORDER + tl.program_id(0)), tl.program_id(1)
    b, h = bh // H, bh % H
    bo, ho, hk = b.to(tl.int64), h.to(tl.int64), (h // GROUP).to(tl.int64)
    p, i, row_ok = csr_rows(Q_POS, row, off, n_q, block, TILE)
    q, do, lse, delta, ld = dq_inputs(Q, DO, LSE, DELTA, bo, ho, bh, i, row_ok, sqb, sqh, sqn,
                                      sdb, sdh, sdn, n_q, D, BLOCK_D)
    dq = tl.zeros([TILE, BLOCK_D], dtype=tl.float32)
    k_base, v_base = K + bo * skb + hk * skh, V + bo * svb + hk * svh
    e0, e_mid, e1 = tl.load(STARTS + row), tl.load(MIDS + row), tl.load(ENDS + row)
    dq = csr_dq(dq, q, do, lse, delta, p, k_base, v_base, skn, svn, COLS, e0, e_mid, block, n_k,
                hg, sc2, TILE, BLOCK_D, D, False, PRECISION)
    dq = csr_dq(dq, q, do, lse, delta, p, k_base, v_base, skn, svn, COLS, e_mid, e1, block, n_k,
                hg, sc2, TILE, BLOCK_D, D, True, PRECISION)
    dd = tl.arange(0, BLOCK_D)
    tl.store(DQ + bo * sgb + ho * sgh + i[:, None] * sgn + dd[None, :],
             (dq * scale).to(DQ.dtype.element_ty), mask=ld)


@triton.jit
def csr_dkdv(dk, dv, k, v, j, q_base, do_base, lse_base, delta_base, sqn, sdn, ROWS, e_start,
             e_end, block, n_k, off, hg, sc2, TILE: tl.constexpr, BLOCK_D: tl.constexpr,
             D: tl.constexpr, MASKED: tl.constexpr, PRECISION: tl.constexpr):
    """dK/dV from the query blocks ``ROWS[e_start:e_end]`` (one query head): rows
    [p0, p0 + block) with off <= p < n_k and p >= j - hg."""
    for e in range(e_start, e_end):
        p0 = tl.load(ROWS + e)
        c_start, c_end = tl.maximum(p0, off), tl.minimum(p0 + block, n_k)
        lo = tl.maximum(j - hg, c_start)
        dk, dv = dkdv_step(dk, dv, k, v, lo, c_end - 1 + 0 * j, q_base, do_base, lse_base,
                           delta_base, sqn, sdn, 0, 1, p0, c_start, c_end, off, sc2, j, j,
                           TILE, BLOCK_D, D, MASKED, False, PRECISION, None)
    return dk, dv


@triton.autotune(configs=configs("blocks_dkdv"), key=TUNE_KEY,
                 prune_configs_by={"early_config_prune": prune("blocks_dkdv")})
@triton.jit
def blocks_dkdv(Q, K, V, DO, DK, DV, LSE, DELTA, K_POS, STARTS, MIDS, ENDS, ROWS, ORDER,
                sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb, sdh, sdn, sgb, sgh, sgn,
                H, GROUP, n_q, n_k, off, block, hg, sc2, scale, n_bucket, q_bucket, MASK_KEY,
                D: tl.constexpr, BLOCK_D: tl.constexpr, TILE: tl.constexpr,
                PRECISION: tl.constexpr):
    """dK, dV over the transposed CSR lists (key block -> query blocks), summed over the GROUP
    query heads of each K/V head. Grid (key blocks, B·H_kv)."""
    row, bhk = tl.load(ORDER + tl.program_id(0)), tl.program_id(1)
    hkv = H // GROUP
    b, hk = bhk // hkv, bhk % hkv
    bo, hko = b.to(tl.int64), hk.to(tl.int64)
    lane = tl.arange(0, TILE)
    j = tl.load(K_POS + row) + lane
    col_ok = (lane < block) & (j < n_k)
    k, v, ld = dkdv_inputs(K, V, bo, hko, j, col_ok, skb, skh, skn, svb, svh, svn, D, BLOCK_D)
    dk = tl.zeros([TILE, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([TILE, BLOCK_D], dtype=tl.float32)
    e0, e_mid, e1 = tl.load(STARTS + row), tl.load(MIDS + row), tl.load(ENDS + row)
    for g in range(0, GROUP):
        hq = hk * GROUP + g
        ho, bh = hq.to(tl.int64), (b * H + hq).to(tl.int64)
        q_base, do_base = Q + bo * sqb + ho * sqh, DO + bo * sdb + ho * sdh
        lse_base, delta_base = LSE + bh * n_q, DELTA + bh * n_q
        dk, dv = csr_dkdv(dk, dv, k, v, j, q_base, do_base, lse_base, delta_base, sqn, sdn, ROWS,
                          e0, e_mid, block, n_k, off, hg, sc2, TILE, BLOCK_D, D, False,
                          PRECISION)
        dk, dv = csr_dkdv(dk, dv, k, v, j, q_base, do_base, lse_base, delta_base, sqn, sdn, ROWS,
                          e_mid, e1, block, n_k, off, hg, sc2, TILE, BLOCK_D, D, True,
                          PRECISION)
    dd = tl.arange(0, BLOCK_D)
    g_ptr = bo * sgb + hko * sgh + j[:, None] * sgn + dd[None, :]
    tl.store(DK + g_ptr, (dk * scale).to(DK.dtype.element_ty), mask=ld)
    tl.store(DV + g_ptr, dv.to(DV.dtype.element_ty), mask=ld)
