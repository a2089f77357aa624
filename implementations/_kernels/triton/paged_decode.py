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

import triton
import triton.language as tl

from implementations._kernels.triton.autotune import SHAPES, configs, prune
from implementations._kernels.triton.decode_split_kv import merge_splits
from implementations._kernels.triton.forward import online
from implementations._kernels.triton.primitives import NEG, load_rows, mma

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
