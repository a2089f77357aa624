"""Nyströmformer in four Triton launches, whatever n: landmarks, the landmarks' pass over the
keys, the m × m pseudo-inverse, the outputs.

    Q̃, K̃ = row-group means of Q, K (row j in row group ⌊j·m/n⌋)
    out = softmax(s·Q K̃ᵀ) · W,   W = Ã⁺ · (softmax(s·Q̃ Kᵀ) V),   Ã = softmax(s·Q̃ K̃ᵀ)

1. :func:`nys_landmarks`, grid (m, B·H): the mean of one row group of q (and, for the first query
   head of each K/V head, of k), fp32.
2. :func:`nys_key_pass`, grid (n_split, B·H, D / BLOCK_V): the m landmark queries of a head
   over one split of the keys, FlashAttention's online softmax (running row maximum, every
   rescale exp(old − new) <= 1): an unnormalised partial B̃V (m × D), its row maxima and row
   sums.
3. :func:`nys_pinv`, grid (B·H): the partials combined (each rescaled to the row's largest
   maximum, as a split-KV decode combines), Ã = softmax(s·Q̃K̃ᵀ) in registers, Z₀ = Ãᵀ /
   (‖Ã‖₁‖Ã‖∞), ``iters`` times Z ← ¼ Z (13I − ÃZ (15I − ÃZ (7I − ÃZ))), then W = Z·B̃V
   (m × D), the only m-sized buffer the outputs read. The iteration's products take the
   call's precision: tf32x3 (about fp32's accuracy: the iteration is not stable in half
   precision) for fp32 inputs, TF32 for 16-bit ones (whose output rounding, 2^-8 for bf16, is
   far above TF32's 2^-11), IEEE in the interpreter.
4. :func:`nys_output`, grid (n_q / BLOCK_M, B·H): softmax(s·Q K̃ᵀ) of a block of query rows
   (m columns, in registers) times W, stored in the output's dtype.

Nothing of size n·m is written: the n-sized products stay in registers. The landmark and key
matrices are padded to BLOCK_L, a power of two >= 16 (m <= 64: two m × m matrices and their
products live in registers); padded rows and columns are zeros in Ã and Z, which the
iteration keeps zero. Grouped K/V: query head h reads K/V head h // GROUP.
"""

from __future__ import annotations

import triton
import triton.language as tl

from implementations._kernels.triton.feature_kernels import load_tile, query_block, store_rows
from implementations._kernels.triton.primitives import NEG


@triton.jit
def landmark_mean(base, stride_n, i, n, m, D, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    """The mean of row group i of the m row groups of a (n, D) matrix at ``base`` (unit column
    stride): rows ⌈i·n/m⌉ .. ⌈(i+1)·n/m⌉ − 1, fp32 (BLOCK_D)."""
    dd = tl.arange(0, BLOCK_D)
    start = (i * n + m - 1) // m
    end = ((i + 1) * n + m - 1) // m
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for r0 in range(start, end, BLOCK_N):
        r = r0 + tl.arange(0, BLOCK_N)
        acc += tl.sum(load_tile(base, r, r < end, dd, stride_n, D), 0)
    return acc / (end - start)


@triton.jit
def nys_landmarks(Q, K, QT, KT, sqb, sqh, sqn, skb, skh, skn, H, GROUP, n_q, n_k, m,
                  D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    """Grid (m, B·H). QT: (B·H, m, D), KT: (B·H_kv, m, D) fp32 (:func:`landmark_mean`); the
    first query head of each K/V head makes its key landmark."""
    i, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    dd = tl.arange(0, BLOCK_D)
    q_base = Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh
    mean = landmark_mean(q_base, sqn, i, n_q, m, D, BLOCK_D, BLOCK_N)
    tl.store(QT + (bh.to(tl.int64) * m + i) * D + dd, mean, mask=dd < D)
    if h % GROUP == 0:
        hk = h // GROUP
        k_base = K + b.to(tl.int64) * skb + hk.to(tl.int64) * skh
        mean = landmark_mean(k_base, skn, i, n_k, m, D, BLOCK_D, BLOCK_N)
        bhk = b * (H // GROUP) + hk
        tl.store(KT + (bhk.to(tl.int64) * m + i) * D + dd, mean, mask=dd < D)


@triton.jit
def nys_key_pass(QT, K, V, PART_O, PART_M, PART_L, skb, skh, skn, svb, svh, svn,
                 H, GROUP, n_k, keys_per_split, m, scale,
                 D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, PRECISION: tl.constexpr):
    """Grid (n_split, B·H, cdiv(D, BLOCK_V)): softmax(s·Q̃ Kᵀ) V over one split of the keys,
    value columns ``vb·BLOCK_V ..``, unnormalised. PART_O: (B·H, n_split, m, D), PART_M and
    PART_L: (B·H, n_split, m) fp32 (written by the first value block)."""
    split, bh, vb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n_split = tl.num_programs(0)
    b, h = bh // H, bh % H
    hk = h // GROUP
    ll = tl.arange(0, BLOCK_L)
    dd = tl.arange(0, BLOCK_D)
    dv = vb * BLOCK_V + tl.arange(0, BLOCK_V)
    l_ok, d_ok, v_ok = ll < m, dd < D, dv < D
    qt = tl.load(QT + (bh.to(tl.int64) * m + ll[:, None]) * D + dd[None, :],
                 mask=l_ok[:, None] & d_ok[None, :], other=0.0) * scale
    k_base = K + b.to(tl.int64) * skb + hk.to(tl.int64) * skh
    v_base = V + b.to(tl.int64) * svb + hk.to(tl.int64) * svh
    acc = tl.zeros([BLOCK_L, BLOCK_V], dtype=tl.float32)
    top = tl.zeros([BLOCK_L], dtype=tl.float32) + NEG
    total = tl.zeros([BLOCK_L], dtype=tl.float32)
    start = split * keys_per_split
    end = tl.minimum(start + keys_per_split, n_k)
    for s0 in range(start, end, BLOCK_N):
        r = s0 + tl.arange(0, BLOCK_N)
        ok = r < end
        k = tl.load(k_base + r[:, None].to(tl.int64) * skn + dd[None, :],
                    mask=ok[:, None] & d_ok[None, :], other=0.0)
        v = tl.load(v_base + r[:, None].to(tl.int64) * svn + dv[None, :],
                    mask=ok[:, None] & v_ok[None, :], other=0.0)
        scores = tl.dot(qt, tl.trans(k.to(tl.float32)), input_precision=PRECISION)
        scores = tl.where(ok[None, :], scores, NEG)
        new_top = tl.maximum(top, tl.max(scores, 1))
        alpha = tl.exp(top - new_top)  # <= 1
        p = tl.exp(scores - new_top[:, None])
        p = tl.where(ok[None, :], p, 0.0)
        acc = tl.dot(p, v.to(tl.float32), acc * alpha[:, None], input_precision=PRECISION)
        total = total * alpha + tl.sum(p, 1)
        top = new_top
    part = (bh.to(tl.int64) * n_split + split) * m + ll
    tl.store(PART_O + part[:, None] * D + dv[None, :], acc, mask=l_ok[:, None] & v_ok[None, :])
    if vb == 0:  # every value block has the same maxima and sums
        tl.store(PART_M + part, top, mask=l_ok)
        tl.store(PART_L + part, total, mask=l_ok)


@triton.jit
def nys_pinv(QT, KT, PART_O, PART_M, PART_L, W, H, GROUP, n_split, m, iters, scale,
             D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr,
             PRECISION: tl.constexpr):
    """Grid (B·H): B̃V from the partials, Ã, its iterative pseudo-inverse Z, W = Z·B̃V.
    W: (B·H, m, D) fp32."""
    bh = tl.program_id(0)
    b, h = bh // H, bh % H
    bhk = b * (H // GROUP) + h // GROUP
    ll = tl.arange(0, BLOCK_L)
    lc = tl.arange(0, BLOCK_L)
    dd = tl.arange(0, BLOCK_D)
    l_ok, d_ok = ll < m, dd < D
    ld = l_ok[:, None] & d_ok[None, :]
    qt = tl.load(QT + (bh.to(tl.int64) * m + ll[:, None]) * D + dd[None, :], mask=ld, other=0.0)
    kt = tl.load(KT + (bhk.to(tl.int64) * m + ll[:, None]) * D + dd[None, :], mask=ld,
                 other=0.0)
    scores = tl.dot(qt * scale, tl.trans(kt), input_precision=PRECISION)
    valid = l_ok[:, None] & (lc < m)[None, :]
    scores = tl.where(valid, scores, NEG)
    a = tl.exp(scores - tl.max(scores, 1)[:, None])
    a = tl.where(valid, a, 0.0)
    a = a / tl.where(l_ok, tl.sum(a, 1), 1.0)[:, None]
    norm_1 = tl.max(tl.sum(tl.abs(a), 0), 0)  # the largest column sum
    norm_inf = tl.max(tl.sum(tl.abs(a), 1), 0)  # the largest row sum (1 for a softmax)
    z = tl.trans(a) / (norm_1 * norm_inf)
    diag = (ll[:, None] == lc[None, :]) & l_ok[:, None]  # cI − X as where(diag, c − X, −X)
    for _ in range(0, iters):
        az = tl.dot(a, z, input_precision=PRECISION)
        t = tl.where(diag, 7.0 - az, -az)
        t = tl.dot(az, t, input_precision=PRECISION)
        t = tl.where(diag, 15.0 - t, -t)
        t = tl.dot(az, t, input_precision=PRECISION)
        t = tl.where(diag, 13.0 - t, -t)
        z = 0.25 * tl.dot(z, t, input_precision=PRECISION)
    # B̃V from the partials, after the iteration: its tile is not live during it
    head = bh.to(tl.int64) * n_split * m
    top = tl.zeros([BLOCK_L], dtype=tl.float32) + NEG
    for s in range(0, n_split):
        top = tl.maximum(top, tl.load(PART_M + head + s * m + ll, mask=l_ok, other=NEG))
    bv = tl.zeros([BLOCK_L, BLOCK_D], dtype=tl.float32)
    total = tl.zeros([BLOCK_L], dtype=tl.float32)
    for s in range(0, n_split):  # in split order: the same bits every call
        part = head + s * m + ll
        w = tl.exp(tl.load(PART_M + part, mask=l_ok, other=NEG) - top)  # <= 1
        bv += w[:, None] * tl.load(PART_O + part[:, None] * D + dd[None, :], mask=ld, other=0.0)
        total += w * tl.load(PART_L + part, mask=l_ok, other=0.0)
    bv = bv / tl.where(l_ok, total, 1.0)[:, None]
    w_out = tl.dot(z, bv, input_precision=PRECISION)
    tl.store(W + (bh.to(tl.int64) * m + ll[:, None]) * D + dd[None, :], w_out, mask=ld)


@triton.jit
def nys_output(Q, KT, W, Out, sqb, sqh, sqn, sob, soh, son, H, GROUP, n_q, m, scale,
               D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr,
               BLOCK_M: tl.constexpr, PRECISION: tl.constexpr):
    """Grid (cdiv(n_q, BLOCK_M), B·H): softmax(s·Q K̃ᵀ) W for BLOCK_M query rows, stored in
    Out's dtype."""
    b, h, bhk, rows, ok = query_block(H, GROUP, n_q, BLOCK_M)
    ll = tl.arange(0, BLOCK_L)
    dd = tl.arange(0, BLOCK_D)
    l_ok, d_ok = ll < m, dd < D
    q = load_tile(Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh, rows, ok, dd, sqn, D)
    kt = tl.load(KT + (bhk.to(tl.int64) * m + ll[:, None]) * D + dd[None, :],
                 mask=l_ok[:, None] & d_ok[None, :], other=0.0)
    scores = tl.dot(q, tl.trans(kt * scale), input_precision=PRECISION)
    scores = tl.where(l_ok[None, :], scores, NEG)
    p = tl.exp(scores - tl.max(scores, 1)[:, None])
    p = tl.where(l_ok[None, :], p, 0.0)
    p = p / tl.sum(p, 1)[:, None]
    w = tl.load(W + ((b * H + h).to(tl.int64) * m + ll[:, None]) * D + dd[None, :],
                mask=l_ok[:, None] & d_ok[None, :], other=0.0)
    out = tl.dot(p, w, input_precision=PRECISION)
    store_rows(Out + b.to(tl.int64) * sob + h.to(tl.int64) * soh, rows, ok, son, out, D, BLOCK_D)
