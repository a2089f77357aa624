"""Causal feature-map attention in the chunkwise form, fused: three Triton launches.

    out_i = φ(q_i)ᵀ S_i / φ(q_i)ᵀ z_i,  S_i = Σ_{j <= i} φ(k_j) v_jᵀ,  z_i = Σ_{j <= i} φ(k_j)

with φ = elu + 1 (``linear``, F = D features: the key's columns) or FAVOR+'s positive random
features (``performer``, F = m, logits ``x·W'ᵀ``), flash-linear-attention's ``chunk``
algorithm, split along the sequence so that a long sequence of few heads still fills the GPU:
the n positions of each K/V head are cut into ``n_split`` contiguous splits (whole tiles,
:func:`feature_attention.key_splits`), and

1. ``feature_state`` (:mod:`.feature_kernels`, the non-causal key pass) writes each split's own
   state ``U_s = Σ_{j ∈ s} φ(k_j) [v_j | 1]ᵀ`` (F × (Dv + 1), fp32); FAVOR+: under the split's
   own running maximum per feature, m_{s,f}, written beside it;
2. :func:`feature_scan`, grid (B·H_kv, F / BLOCK_F), turns them in place into the state
   *before* each split, ``P_s = Σ_{s' < s} U_s'``, summed in split order (no atomics: the same
   bits every call). FAVOR+: first M, the head's largest key logit (the largest m_{s,f} over
   every split and feature), then each U_s' weighted by exp(m_{s',f} − M) <= 1, so every P_s
   is under the one shift M — the non-causal combine's rule — and M is stored for step 3;
3. :func:`feature_chunk`, grid (n_split, B·H, Dv / BLOCK_V), walks one split of one query head
   chunk by chunk (BLOCK_C positions) from ``P_s`` with the state in registers in fp32: each
   chunk's output is ``φ(Q_c) S + (φ(Q_c) φ(K_c)ᵀ ⊙ M) V_c`` over ``φ(Q_c) z + rowsum(φ(Q_c)
   φ(K_c)ᵀ ⊙ M)`` (M the causal mask inside the chunk, on positions), then ``S += φ(K_c)ᵀ
   V_c``, ``z += Σ φ(K_c)``. The features, the chunk states and the C × C products never
   touch HBM: φ is made in registers from q, k (and W').

The stabiliser. φ = elu + 1 needs none: φ > 0 is bounded by x + 1, and the normaliser of a
query that keeps a key (every query: the diagonal is kept) is positive. FAVOR+ keys: every
feature a chunk adds to the state is exp(l_jf − M), the shift that P_s carries, so the state
is Σ_{j <= i} exp(l_jf − M)[v_j | 1] for every query — the reference's global key maximum,
exactly, with every exponent <= 0. FAVOR+ queries: each row is shifted by its own largest
logit over all F features (the whole feature row is in registers: F <= 256), a per-row
constant that cancels between numerator and normaliser, as does −s|q|²/2, left unformed.

The chunk size is the tile, BLOCK_C (:func:`feature_attention.chunk_tiles`); where the chunks
fall changes only the rounding (the definition has no chunks). n need not be a multiple of
anything: rows past a split's end (or past n) load as zero features, which add nothing to a
product or a state, and store nothing. Grouped K/V: each query head carries its own copy of its
K/V head's state (the group's programs read the same k and v). Precision as
:mod:`.feature_kernels`: fp32 operands, TF32 tensor cores for 16-bit inputs, "tf32x3" for fp32
ones, IEEE in the interpreter.
"""

from __future__ import annotations

import triton
import triton.language as tl

from implementations._kernels.triton.feature_kernels import (
    FAVOR,
    elu_features,
    head_max,
    logit_product,
    split_weight,
)
from implementations._kernels.triton.primitives import NEG


@triton.jit
def feature_scan(PART_S, PART_Z, PART_M, TOP, n_split, F,
                   D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_F: tl.constexpr,
                   MAP: tl.constexpr):
    """Grid (B·H_kv, cdiv(F, BLOCK_F)): PART_S (B·H_kv, n_split, F, D) and PART_Z (B·H_kv,
    n_split, F) fp32, each split's own sums on entry, the sums of the splits before it (an
    exclusive prefix, split 0's zero) on exit. FAVOR+: PART_M (B·H_kv, n_split, F), the splits'
    own maxima; the prefix is under the head's largest key logit M, stored in TOP (B·H_kv)."""
    bhk, fc = tl.program_id(0), tl.program_id(1)
    ff = fc * BLOCK_F + tl.arange(0, BLOCK_F)
    f_ok = ff < F
    dd = tl.arange(0, BLOCK_D)
    ld = f_ok[:, None] & (dd[None, :] < D)
    head = bhk.to(tl.int64) * n_split * F
    big = head_max(PART_M, head, n_split, F, BLOCK_F, MAP)  # M, the head's largest key logit
    if MAP == FAVOR:
        tl.store(TOP + bhk, big, mask=fc == 0)
    acc = tl.zeros([BLOCK_F, BLOCK_D], dtype=tl.float32)
    z = tl.zeros([BLOCK_F], dtype=tl.float32)
    for s in range(0, n_split):
        part = head + s * F + ff
        s_ptrs = PART_S + part[:, None] * D + dd[None, :]
        w = split_weight(PART_M, part, f_ok, big, BLOCK_F, MAP)
        own = w[:, None] * tl.load(s_ptrs, mask=ld, other=0.0)
        own_z = w * tl.load(PART_Z + part, mask=f_ok, other=0.0)
        tl.store(s_ptrs, acc, mask=ld)
        tl.store(PART_Z + part, z, mask=f_ok)
        acc += own
        z += own_z


@triton.jit
def favor_chunk_features(base, row_off, ok, W, top, F, D, half_scale, QUERY: tl.constexpr,
                         BLOCK_F: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
                         PRECISION: tl.constexpr):
    """FAVOR+ features of a chunk's rows (C, BLOCK_F) fp32, zero in rows not ``ok`` and in
    features >= F: the logits x·W'ᵀ over BLOCK_K columns of x at a time (rows at ``base +
    row_off``, unit column stride; W: (2, F, D) as :func:`.feature_kernels.favor_logits`,
    formed by :func:`.feature_kernels.logit_product` per slice), so neither a whole row of x
    nor a whole W' tile is held; a query row shifted by its own largest logit, a key by
    s|k|²/2 and the head's largest key logit ``top``."""
    ff = tl.arange(0, BLOCK_F)
    f_ok = ff < F
    kk = tl.arange(0, BLOCK_K)
    logits = tl.zeros([row_off.shape[0], BLOCK_F], dtype=tl.float32)
    norm = tl.zeros([row_off.shape[0]], dtype=tl.float32)
    for d0 in range(0, BLOCK_D, BLOCK_K):
        c_ok = d0 + kk < D
        x = tl.load(base + d0 + row_off[:, None] + kk[None, :],
                    mask=ok[:, None] & c_ok[None, :], other=0.0).to(tl.float32)
        w_ptrs = W + d0 + ff[:, None] * D + kk[None, :]
        ld = f_ok[:, None] & c_ok[None, :]
        logits = logit_product(x, tl.load(w_ptrs, mask=ld, other=0.0),
                               tl.load(w_ptrs + F * D, mask=ld, other=0.0), logits, PRECISION)
        if not QUERY:  # a query's −s|q|²/2 cancels: not formed
            norm += tl.sum(x * x, 1)
    logits = tl.where(f_ok[None, :], logits, NEG)
    if QUERY:  # noqa: SIM108 (a constexpr branch: each variant forms only its shift)
        shift = tl.max(logits, 1)
    else:
        shift = half_scale * norm + top
    return tl.where(ok[:, None] & f_ok[None, :], tl.exp(logits - shift[:, None]), 0.0)


@triton.jit
def feature_chunk(Q, K, V, W, PART_S, PART_Z, TOP, Out, sqb, sqh, sqn, skb, skh, skn,
                  svb, svh, svn, sob, soh, son, H, GROUP, n, off, per_split, F, half_scale,
                  D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_F: tl.constexpr,
                  BLOCK_V: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr,
                  MAP: tl.constexpr, PRECISION: tl.constexpr):
    """Grid (n_split, B·H, cdiv(D, BLOCK_V)): the causal outputs of one split of one query head,
    value columns ``vb·BLOCK_V ..``, stored in Out's dtype. PART_S, PART_Z: the states before
    each split (:func:`feature_scan`), F features (φ = elu + 1: F = D, BLOCK_F = BLOCK_D).
    k, v: (n, D) per head, q and Out: (n - off, D); key position p holds query row p - off
    (bottom-right: ``off`` = n_k - n_q), so a program walks key positions and a position
    before ``off`` has no query. FAVOR+: W (2, F, D) as :func:`.feature_kernels.favor_logits`,
    read BLOCK_K columns at a time, TOP (B·H_kv) the heads' largest key logits."""
    split, bh, vb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n_split = tl.num_programs(0)
    b, h = bh // H, bh % H
    h_kv = H // GROUP
    bhk = b * h_kv + h // GROUP
    dk = tl.arange(0, BLOCK_D)  # the key's columns
    ff = tl.arange(0, BLOCK_F)  # features
    dv = vb * BLOCK_V + tl.arange(0, BLOCK_V)  # value columns
    k_ok, v_ok = dk < D, dv < D
    part = (bhk * n_split + split).to(tl.int64) * F
    state = tl.load(PART_S + (part + ff)[:, None] * D + dv[None, :],
                    mask=(ff < F)[:, None] & v_ok[None, :], other=0.0)
    z = tl.load(PART_Z + part + ff, mask=ff < F, other=0.0)
    top = 0.0
    if MAP == FAVOR:
        top = tl.load(TOP + bhk)
    start = split * per_split
    row0 = start.to(tl.int64)
    q_ptr = Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh + (row0 - off) * sqn
    k_ptr = K + b.to(tl.int64) * skb + (h // GROUP).to(tl.int64) * skh + row0 * skn
    v_ptr = V + b.to(tl.int64) * svb + (h // GROUP).to(tl.int64) * svh + row0 * svn
    o_ptr = Out + b.to(tl.int64) * sob + h.to(tl.int64) * soh + (row0 - off) * son
    end = tl.minimum(start + per_split, n)
    pos = tl.arange(0, BLOCK_C)
    keep = pos[:, None] >= pos[None, :]  # inside a chunk: key position <= query position
    # the tiles' offsets from the chunk's first row, int32 and loop-invariant: the loop moves
    # one scalar base per tensor, not a tile of 64-bit pointers (a few registers fewer)
    q_off = pos[:, None] * sqn + dk[None, :]
    k_off = pos[:, None] * skn + dk[None, :]
    v_off = pos[:, None] * svn + dv[None, :]
    o_off = pos[:, None] * son + dv[None, :]
    for c0 in range(start, end, BLOCK_C):
        ok = c0 + pos < end
        q_ok = ok & (c0 + pos >= off)  # a query at this key position
        v = tl.load(v_ptr + v_off, mask=ok[:, None] & v_ok[None, :], other=0.0).to(tl.float32)
        if MAP == FAVOR:
            fq = favor_chunk_features(q_ptr, pos * sqn, q_ok, W, top, F, D, half_scale, True,
                                      BLOCK_F, BLOCK_D, BLOCK_K, PRECISION)
            fk = favor_chunk_features(k_ptr, pos * skn, ok, W, top, F, D, half_scale, False,
                                      BLOCK_F, BLOCK_D, BLOCK_K, PRECISION)
        else:  # the features are the columns: elu(0) + 1 = 1, so padding is masked again
            q_cols = q_ok[:, None] & k_ok[None, :]
            k_cols = ok[:, None] & k_ok[None, :]
            q = tl.load(q_ptr + q_off, mask=q_cols, other=0.0).to(tl.float32)
            k = tl.load(k_ptr + k_off, mask=k_cols, other=0.0).to(tl.float32)
            fq = tl.where(q_cols, elu_features(q), 0.0)
            fk = tl.where(k_cols, elu_features(k), 0.0)
        scores = tl.dot(fq, tl.trans(fk), input_precision=PRECISION)
        scores = tl.where(keep, scores, 0.0)
        num = tl.dot(fq, state, input_precision=PRECISION)
        num = tl.dot(scores, v, num, input_precision=PRECISION)
        den = tl.sum(fq * z[None, :], 1) + tl.sum(scores, 1)
        has = den > 0.0  # rows without a query (FAVOR+: or every feature underflowed): zeros
        out = tl.where(has[:, None], num / tl.where(has, den, 1.0)[:, None], 0.0)
        tl.store(o_ptr + o_off, out.to(Out.dtype.element_ty),
                 mask=q_ok[:, None] & v_ok[None, :])
        q_ptr += BLOCK_C * sqn
        k_ptr += BLOCK_C * skn
        v_ptr += BLOCK_C * svn
        o_ptr += BLOCK_C * son
        state = tl.dot(tl.trans(fk), v, state, input_precision=PRECISION)
        z += tl.sum(fk, 0)
