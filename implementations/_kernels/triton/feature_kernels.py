"""Non-causal feature-map attention in three Triton launches: key state, combine, outputs
(two with the key pass combining its own partial states, ``COMBINE``).

    out_i = φ(q_i)ᵀ S / (φ(q_i)ᵀ z),  S = Σ_j φ(k_j) v_jᵀ (F, Dv),  z = Σ_j φ(k_j) (F)

with φ = elu + 1 (``linear``, F = D) or FAVOR+'s positive random features (``performer``, F = m,
logits ``x·W'ᵀ`` with W' = √s·W). What moves through memory: q, k, v once in their dtype, the
output once, and per (batch, K/V head) ``n_split`` partial states of F·(Dv + 2) floats.

1. :func:`feature_state`, grid (n_split, B·H_kv, F / BLOCK_F): a program walks its split of
   the keys (whole BLOCK_N tiles), makes φ(K) of its BLOCK_F features in registers in fp32
   and accumulates ``φ(K)ᵀ V`` and ``Σ φ(K)``; it writes them to the partial-state buffers.
   FAVOR+ keys: the logits ``l_jf = k_j·W'_f − s|k_j|²/2`` are exponentiated under the
   program's running maximum per feature, ``m_f`` (online, as FlashAttention's softmax: when a
   tile raises ``m_f`` the accumulators are scaled by exp(m_old − m_new) <= 1), which is
   written beside the partial state.
2. :func:`feature_combine`, grid (B·H_kv, F / BLOCK_F): ``S = Σ_s w_s S_s`` in a fixed order
   (no atomics: the same bits every call). ``linear``: w = 1. FAVOR+: with M the largest
   ``m_f`` of the head over all splits and features, the largest key logit of the head, each
   partial feature row gets w = exp(m_{s,f} − M) <= 1, so the combined row is
   ``Σ_j exp(l_jf − M) [v_j | 1]``: the reference's stabiliser (the global key maximum)
   exactly, in exact arithmetic. Nothing overflows: every exponent is <= 0.
3. :func:`feature_output`, grid (n_q / BLOCK_M, B·H): a program makes φ(Q) of its rows in
   registers, then ``φ(Q)·S`` and ``φ(Q)·z`` feature block by feature block, and stores their
   ratio in the output's dtype. FAVOR+: one pass over the feature blocks, each row shifted by
   its running largest logit (online: a block that raises it scales the row's numerator and
   normaliser by exp(old − new) <= 1), so at the end both carry the row's largest logit, which
   cancels between them, as does the query's −s|q|²/2, left unformed; the logits are made
   once. Query head h reads K/V head ``h // (H / H_kv)``'s state (grouped K/V). A row whose
   normaliser is 0 (every feature underflowed, as in the reference) stores zeros.

Matrix products take fp32 operands (16-bit inputs are upcast in registers, exactly: bf16 and
fp16 fit TF32) on TF32 tensor cores for 16-bit inputs (the features and the state then carry
TF32's 2^-11 rounding, below fp16's output rounding; the FAVOR+ logits, which an exponential
amplifies, come from W' split in two, :func:`logit_product`), "tf32x3" (three TF32 products,
about fp32's accuracy) for fp32 inputs, IEEE in the interpreter. Odd D: loads are masked to
BLOCK_D, a power of two >= 16.
"""

from __future__ import annotations

import triton
import triton.language as tl

from implementations._kernels.triton.primitives import NEG

ELU: tl.constexpr = tl.constexpr(0)  # φ = elu + 1 (``linear``)
FAVOR: tl.constexpr = tl.constexpr(1)  # FAVOR+ positive random features (``performer``)


@triton.jit
def load_tile(base, rows, ok, cols, stride_n, D):
    """x[rows, cols] of a (n, D) matrix with unit column stride, as fp32; zero outside ``ok``
    rows and columns >= D: (R, C)."""
    ptrs = base + rows[:, None].to(tl.int64) * stride_n + cols[None, :]
    x = tl.load(ptrs, mask=ok[:, None] & (cols[None, :] < D), other=0.0)
    return x.to(tl.float32)


@triton.jit
def query_block(H, GROUP, n_q, BLOCK_M: tl.constexpr):
    """An output program of grid (cdiv(n_q, BLOCK_M), B·H): its batch b, query head h, K/V
    head row b·H_kv + h // GROUP, its BLOCK_M query rows and which of them exist."""
    qb, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    rows = qb * BLOCK_M + tl.arange(0, BLOCK_M)
    return b, h, b * (H // GROUP) + h // GROUP, rows, rows < n_q


@triton.jit
def store_rows(base, rows, ok, stride_n, x, D, BLOCK_D: tl.constexpr):
    """Store x (R, BLOCK_D) fp32 as rows ``rows`` of a (n, D) matrix with unit column stride,
    in the matrix's dtype; rows not ``ok`` and columns >= D untouched."""
    dd = tl.arange(0, BLOCK_D)
    ptrs = base + rows[:, None].to(tl.int64) * stride_n + dd[None, :]
    tl.store(ptrs, x.to(base.dtype.element_ty), mask=ok[:, None] & (dd[None, :] < D))


@triton.jit
def favor_logits(x, W, f0, F, D, BLOCK_F: tl.constexpr, BLOCK_D: tl.constexpr,
                 PRECISION: tl.constexpr):
    """x (R, BLOCK_D) fp32 times rows f0 .. f0 + BLOCK_F of W' -> (R, BLOCK_F) fp32, NEG in the
    columns of features >= F. W: (2, F, D), W' = W[0] + W[1] with W[0] W' rounded to bf16.
    :func:`logit_product` forms the product."""
    ff = f0 + tl.arange(0, BLOCK_F)
    dd = tl.arange(0, BLOCK_D)
    ptrs = W + ff[:, None] * D + dd[None, :]
    ld = (ff[:, None] < F) & (dd[None, :] < D)
    logits = tl.zeros([x.shape[0], BLOCK_F], dtype=tl.float32)
    logits = logit_product(x, tl.load(ptrs, mask=ld, other=0.0),
                           tl.load(ptrs + F * D, mask=ld, other=0.0), logits, PRECISION)
    return tl.where((ff < F)[None, :], logits, NEG)


@triton.jit
def logit_product(x, high, low, acc, PRECISION: tl.constexpr):
    """``acc + x·(high + low)ᵀ`` in fp32, x (R, C), high/low (F, C) the two parts of W'.
    TF32 (16-bit inputs, which TF32 holds exactly): two products, x·highᵀ exact and x·lowᵀ
    rounded far below it, so the logits come to ~2^-19 where one TF32 product of W' would
    round W' to 2^-11. "tf32x3" and IEEE products already resolve an fp32 W', so there one
    product of ``high + low`` (exactly W' in fp32: the split is exact): a second product
    would only add its own rounding of the logits' full magnitude, which the exponential
    amplifies (twice the logit error in the interpreter's IEEE products, measured)."""
    if PRECISION == "tf32":
        acc = tl.dot(x, tl.trans(high), acc, input_precision=PRECISION)
        acc = tl.dot(x, tl.trans(low), acc, input_precision=PRECISION)
    else:
        acc = tl.dot(x, tl.trans(high + low), acc, input_precision=PRECISION)
    return acc


@triton.jit
def elu_features(x):
    """φ(x) = elu(x) + 1 elementwise, in fp32."""
    return tl.where(x > 0.0, x + 1.0, tl.exp(tl.minimum(x, 0.0)))


@triton.jit
def feature_state(K, V, W, PART_S, PART_Z, PART_M, skb, skh, skn, svb, svh, svn,
                  H_KV, n_k, keys_per_split, F, half_scale, S, Z, COUNT,
                  D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_F: tl.constexpr, MAP: tl.constexpr, PRECISION: tl.constexpr,
                  COMBINE: tl.constexpr = False):
    """Grid (n_split, B·H_kv, cdiv(F, BLOCK_F)). PART_S: (B·H_kv, n_split, F, D) fp32,
    PART_Z and PART_M (FAVOR+ only): (B·H_kv, n_split, F) fp32.

    ``COMBINE``: the key pass also combines (two launches a call instead of three): after
    storing its partial state a program counts itself in COUNT[head, feature block] (int32,
    zero on entry) with an acquire-release atomic, after a barrier so every thread's stores
    precede it; the program that counts last (it has seen every other program's release) runs
    :func:`combine_head` into S, Z and sets the counter back to zero for the next call. The
    sum is in split order whichever program combines: the same bits every call."""
    split, bhk, fc = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n_split = tl.num_programs(0)
    b, hk = bhk // H_KV, bhk % H_KV
    k_base = K + b.to(tl.int64) * skb + hk.to(tl.int64) * skh
    v_base = V + b.to(tl.int64) * svb + hk.to(tl.int64) * svh
    ff = fc * BLOCK_F + tl.arange(0, BLOCK_F)
    f_ok = ff < F
    dd = tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_F, BLOCK_D], dtype=tl.float32)
    z = tl.zeros([BLOCK_F], dtype=tl.float32)
    m = tl.zeros([BLOCK_F], dtype=tl.float32) + NEG
    start = split * keys_per_split
    end = tl.minimum(start + keys_per_split, n_k)
    for s0 in range(start, end, BLOCK_N):
        rows = s0 + tl.arange(0, BLOCK_N)
        ok = rows < end
        v = load_tile(v_base, rows, ok, dd, svn, D)
        if MAP == FAVOR:
            k = load_tile(k_base, rows, ok, dd, skn, D)
            norm = half_scale * tl.sum(k * k, 1)
            logits = favor_logits(k, W, fc * BLOCK_F, F, D, BLOCK_F, BLOCK_D, PRECISION)
            logits = tl.where(ok[:, None], logits - norm[:, None], NEG)
            m_new = tl.maximum(m, tl.max(logits, 0))
            alpha = tl.exp(m - m_new)  # <= 1; exactly 1 for the padded features (NEG - NEG)
            acc = acc * alpha[:, None]
            z = z * alpha
            m = m_new
            phi = tl.exp(logits - m_new[None, :])
            phi = tl.where(ok[:, None] & f_ok[None, :], phi, 0.0)
        else:
            k = load_tile(k_base, rows, ok, ff, skn, D)  # the features are the key's columns
            phi = tl.where(ok[:, None] & f_ok[None, :], elu_features(k), 0.0)
        acc = tl.dot(tl.trans(phi), v, acc, input_precision=PRECISION)
        z += tl.sum(phi, 0)
    part = (bhk * n_split + split).to(tl.int64) * F + ff
    tl.store(PART_S + part[:, None] * D + dd[None, :], acc,
             mask=f_ok[:, None] & (dd[None, :] < D))
    tl.store(PART_Z + part, z, mask=f_ok)
    if MAP == FAVOR:
        tl.store(PART_M + part, m, mask=f_ok)
    if COMBINE:
        tl.debug_barrier()  # every thread's partial stores before the release below
        slot = COUNT + bhk * tl.num_programs(2) + fc
        if tl.atomic_add(slot, 1, sem="acq_rel") == n_split - 1:
            combine_head(PART_S, PART_Z, PART_M, S, Z, bhk, fc, n_split, F, D, BLOCK_D,
                         BLOCK_F, MAP)
            tl.atomic_xchg(slot, 0)  # ready for the next call: no memset launch


@triton.jit
def head_max(PART_M, head, n_split, F, BLOCK_F: tl.constexpr, MAP: tl.constexpr):
    """FAVOR+: M, the largest partial maximum m_{s,f} over every split and feature of the head
    whose partials start at ``head`` (PART_M: (…, n_split, F)), the head's largest key logit;
    φ = elu + 1: NEG (unused)."""
    top = tl.zeros([BLOCK_F], dtype=tl.float32) + NEG
    if MAP == FAVOR:
        for s in range(0, n_split):
            for f0 in range(0, F, BLOCK_F):
                every = f0 + tl.arange(0, BLOCK_F)
                got = tl.load(PART_M + head + s * F + every, mask=every < F, other=NEG)
                top = tl.maximum(top, got)
    return tl.max(top, 0)


@triton.jit
def split_weight(PART_M, part, f_ok, big, BLOCK_F: tl.constexpr, MAP: tl.constexpr):
    """The weight of one split's partial feature rows ``part`` (BLOCK_F) in a sum under the
    head's shift ``big``: FAVOR+ exp(m_{s,f} − M) <= 1, φ = elu + 1: 1."""
    w = tl.zeros([BLOCK_F], dtype=tl.float32) + 1.0
    if MAP == FAVOR:
        w = tl.exp(tl.load(PART_M + part, mask=f_ok, other=NEG) - big)
    return w


@triton.jit(noinline=True)
def combine_head(PART_S, PART_Z, PART_M, S, Z, bhk, fc, n_split, F,
                 D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_F: tl.constexpr,
                 MAP: tl.constexpr):
    """The partial states of features ``fc·BLOCK_F ..`` of K/V head ``bhk`` summed in split
    order into S, Z, FAVOR+'s rescaled to the head's largest key logit. Not inlined: inside
    FAVOR+'s key pass (``COMBINE``) it spilled 24 bytes on sm_80 at D = 64, as a call none."""
    ff = fc * BLOCK_F + tl.arange(0, BLOCK_F)
    f_ok = ff < F
    dd = tl.arange(0, BLOCK_D)
    ld = f_ok[:, None] & (dd[None, :] < D)
    head = bhk.to(tl.int64) * n_split * F
    big = head_max(PART_M, head, n_split, F, BLOCK_F, MAP)
    acc = tl.zeros([BLOCK_F, BLOCK_D], dtype=tl.float32)
    z = tl.zeros([BLOCK_F], dtype=tl.float32)
    for s in range(0, n_split):
        part = head + s * F + ff
        w = split_weight(PART_M, part, f_ok, big, BLOCK_F, MAP)
        acc += w[:, None] * tl.load(PART_S + part[:, None] * D + dd[None, :], mask=ld, other=0.0)
        z += w * tl.load(PART_Z + part, mask=f_ok, other=0.0)
    out = bhk.to(tl.int64) * F + ff
    tl.store(S + out[:, None] * D + dd[None, :], acc, mask=ld)
    tl.store(Z + out, z, mask=f_ok)


@triton.jit
def feature_combine(PART_S, PART_Z, PART_M, S, Z, n_split, F,
                    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_F: tl.constexpr,
                    MAP: tl.constexpr):
    """Grid (B·H_kv, cdiv(F, BLOCK_F)): :func:`combine_head` of each head and feature block.
    S: (B·H_kv, F, D), Z: (B·H_kv, F) fp32."""
    combine_head(PART_S, PART_Z, PART_M, S, Z, tl.program_id(0), tl.program_id(1), n_split, F,
                 D, BLOCK_D, BLOCK_F, MAP)


@triton.jit
def feature_output(Q, W, S, Z, Out, sqb, sqh, sqn, sob, soh, son, H, GROUP, n_q, F,
                   D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_F: tl.constexpr, MAP: tl.constexpr, PRECISION: tl.constexpr):
    """Grid (cdiv(n_q, BLOCK_M), B·H): ``φ(Q)·S / φ(Q)·z`` of BLOCK_M query rows of one head,
    stored in Out's dtype. S, Z: the combined state (B·H_kv, F, D), (B·H_kv, F) fp32."""
    b, h, bhk, rows, ok = query_block(H, GROUP, n_q, BLOCK_M)
    dd = tl.arange(0, BLOCK_D)
    q_base = Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh
    s_base = S + bhk.to(tl.int64) * F * D
    z_base = Z + bhk.to(tl.int64) * F
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    den = tl.zeros([BLOCK_M], dtype=tl.float32)
    if MAP == FAVOR:
        q = load_tile(q_base, rows, ok, dd, sqn, D)
        top = tl.zeros([BLOCK_M], dtype=tl.float32) + NEG
        for f0 in range(0, F, BLOCK_F):  # one pass: the row's running largest logit (online)
            ff = f0 + tl.arange(0, BLOCK_F)
            logits = favor_logits(q, W, f0, F, D, BLOCK_F, BLOCK_D, PRECISION)
            new_top = tl.maximum(top, tl.max(logits, 1))
            alpha = tl.exp(top - new_top)  # <= 1; 0 on the first block (NEG - a logit)
            acc = acc * alpha[:, None]
            den = den * alpha
            top = new_top
            phi = tl.where((ff < F)[None, :], tl.exp(logits - top[:, None]), 0.0)
            state = tl.load(s_base + ff[:, None] * D + dd[None, :],
                            mask=(ff[:, None] < F) & (dd[None, :] < D), other=0.0)
            acc = tl.dot(phi, state, acc, input_precision=PRECISION)
            den += tl.sum(phi * tl.load(z_base + ff, mask=ff < F, other=0.0)[None, :], 1)
    else:
        for f0 in range(0, F, BLOCK_F):
            ff = f0 + tl.arange(0, BLOCK_F)
            x = load_tile(q_base, rows, ok, ff, sqn, D)  # the features are the query's columns
            phi = tl.where((ff < F)[None, :], elu_features(x), 0.0)
            state = tl.load(s_base + ff[:, None] * D + dd[None, :],
                            mask=(ff[:, None] < F) & (dd[None, :] < D), other=0.0)
            acc = tl.dot(phi, state, acc, input_precision=PRECISION)
            den += tl.sum(phi * tl.load(z_base + ff, mask=ff < F, other=0.0)[None, :], 1)
    has = den > 0.0
    out = tl.where(has[:, None], acc / tl.where(has, den, 1.0)[:, None], 0.0)
    store_rows(Out + b.to(tl.int64) * sob + h.to(tl.int64) * soh, rows, ok, son, out, D,
               BLOCK_D)
