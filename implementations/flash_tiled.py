"""``flash-tiled``: the FlashAttention algorithm written out in readable PyTorch.

Forward: for each query block, stream over key blocks keeping a running row max ``m``, row sum
``l`` and an un-normalized accumulator (online softmax, Milakov & Gimelshein 2018; Dao et al.
2022, Alg. 1). Key blocks entirely in a query block's causal future are never computed. Only
(BLOCK_Q, BLOCK_K) tiles exist at any time, so extra memory is O(n), not O(n²); the result is
exact up to floating-point reassociation. Scores, softmax statistics and the accumulator are
float32, or float64 for float64 inputs (the precision the implementation declares).

Backward (Dao 2023, Alg. 2): saves only the output and the per-row log-sum-exp, recomputes each
tile's probabilities, and accumulates dQ, dK, dV tile by tile: again O(n) memory.

Packed documents run as FlashAttention's varlen does: each document is tiled on its own (its
query blocks against its own key blocks), so the work is Σ lᵢ², never n²; equal documents are
folded into the batch.

That is the CPU path. On CUDA (fp32/fp16/bf16, D <= 256) the same algorithm runs as fused
Triton kernels (:mod:`implementations._kernels.triton.masked_attention`): one launch for the
forward, the causal triangle's interior blocks without mask arithmetic, FlashAttention-2's
backward;
``masked_reasons`` refuses the mask features those kernels lack.

Its paged form (the decode scenario's paged and ragged steps) is the fused split-KV Triton
kernel that reads the pages through the block table
(``implementations._kernels.triton.paged_attention``, loaded on first use): CUDA only.
"""

from __future__ import annotations

import importlib
import itertools
import math
from collections import Counter

import numpy as np
import torch
from torch import Tensor

from harness.masks import MaskSpec
from harness.registry import register
from harness.spec import HALF_DTYPES, Capabilities, Cost, Paged, Problem, itemsize
from implementations._kernels.saved_lse import LseOps, attention_with_lse
from implementations._kernels.triton.masked_attention import (
    executed_pairs,
    masked_reasons,
    masked_workspace_bytes,
    triton_attention,
    use_triton,
)

BLOCK_Q = 256
BLOCK_K = 512

DocSpans = tuple[tuple[int, int], ...]  # [start, end) of each document; one document: none


def _acc(dtype: torch.dtype) -> torch.dtype:
    """Scores, softmax statistics and accumulator: float32, float64 for float64 inputs."""
    return torch.promote_types(dtype, torch.float32)


def _tiles(n_q: int, n_k: int, causal: bool, doc_spans: DocSpans | None = None):
    """Yield (qs, qe, ks, ke, partial, last): the tiles that hold at least one kept pair, each
    document's on its own; ``partial``: the causal diagonal crosses it; ``last``: the last
    tile of its query block."""
    for s, e in doc_spans or ((0, None),):
        m_q, m_k = (n_q, n_k) if e is None else (e - s, e - s)
        off = m_k - m_q
        for qs in range(0, m_q, BLOCK_Q):
            qe = min(qs + BLOCK_Q, m_q)
            hi = min(m_k, qe + off) if causal else m_k  # last key any query here may see, + 1
            for ks in range(0, max(hi, 0), BLOCK_K):
                ke = min(ks + BLOCK_K, hi)
                yield qs + s, qe + s, ks + s, ke + s, causal and ke - 1 > qs + off, ke == hi


def _tile_scores(
    q_blk: Tensor, k_blk: Tensor, scale: float, qs: int, ks: int, off: int, partial: bool
) -> Tensor:
    """(B, H, bq, D) x (B, H, bk, D) -> scores (B, H, bq, bk) in the accumulation dtype,
    causal future at -inf."""
    s = (q_blk @ k_blk.transpose(-2, -1)).to(_acc(q_blk.dtype)).mul_(scale)
    if partial:
        p = torch.arange(qs, qs + q_blk.shape[-2], device=s.device)[:, None] + off
        j = torch.arange(ks, ks + k_blk.shape[-2], device=s.device)[None, :]
        s.masked_fill_(j > p, float("-inf"))
    return s


def _forward(
    q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, doc_spans: DocSpans | None
) -> tuple[Tensor, Tensor]:
    """q: (B, H, n_q, D), k/v: (B, H, n_k, D) -> out (B, H, n_q, D), lse (B, H, n_q) in the
    accumulation dtype (+inf on rows without a key)."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    off = n_k - n_q if doc_spans is None else 0
    acc_t = _acc(q.dtype)
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:-1], float("inf"), dtype=acc_t, device=q.device)
    state: dict[int, tuple[Tensor, Tensor, Tensor]] = {}
    for qs, qe, ks, ke, partial, last in _tiles(n_q, n_k, causal, doc_spans):
        s = _tile_scores(q[..., qs:qe, :], k[..., ks:ke, :], scale, qs, ks, off, partial)
        m, row_sum, acc = state.get(qs) or (
            torch.full(s.shape[:-1], float("-inf"), dtype=acc_t, device=q.device),
            torch.zeros(s.shape[:-1], dtype=acc_t, device=q.device),
            torch.zeros((*s.shape[:-1], q.shape[-1]), dtype=acc_t, device=q.device),
        )
        m_new = torch.maximum(m, s.amax(-1))
        m_safe = m_new.masked_fill(m_new == float("-inf"), 0.0)  # fully masked so far: no NaN
        p = torch.exp(s - m_safe[..., None])
        alpha = torch.exp(m - m_safe)
        row_sum = row_sum * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + (p.to(v.dtype) @ v[..., ks:ke, :]).to(acc_t)
        state[qs] = (m_new, row_sum, acc)
        if last:
            has_key = row_sum > 0
            out[..., qs:qe, :] = torch.where(
                has_key[..., None], acc / row_sum.clamp_min(1e-30)[..., None], 0.0
            ).to(q.dtype)
            lse[..., qs:qe] = torch.where(has_key, m_safe + torch.log(row_sum), float("inf"))
            del state[qs]
    return out, lse


def _backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    dout: Tensor,
    causal: bool,
    scale: float,
    doc_spans: DocSpans | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients (dq, dk, dv), shapes as q, k, v, recomputing tile probabilities from lse."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    off = n_k - n_q if doc_spans is None else 0
    acc_t = lse.dtype
    dq = torch.zeros(q.shape, dtype=acc_t, device=q.device)
    dk = torch.zeros(k.shape, dtype=acc_t, device=q.device)
    dv = torch.zeros(v.shape, dtype=acc_t, device=q.device)
    delta = (dout.to(acc_t) * out.to(acc_t)).sum(-1)  # (B, H, n_q): rowsum(dO ∘ O)
    for qs, qe, ks, ke, partial, _ in _tiles(n_q, n_k, causal, doc_spans):
        q_blk, k_blk, v_blk, do_blk = (
            q[..., qs:qe, :],
            k[..., ks:ke, :],
            v[..., ks:ke, :],
            dout[..., qs:qe, :].to(acc_t),
        )
        s = _tile_scores(q_blk, k_blk, scale, qs, ks, off, partial)
        p = torch.exp(s - lse[..., qs:qe, None])  # (B, H, bq, bk); masked and empty rows -> 0
        dv[..., ks:ke, :] += p.transpose(-2, -1) @ do_blk
        dp = do_blk @ v_blk.to(acc_t).transpose(-2, -1)
        ds = p * (dp - delta[..., qs:qe, None]) * scale
        dq[..., qs:qe, :] += ds @ k_blk.to(acc_t)
        dk[..., ks:ke, :] += ds.transpose(-2, -1) @ q_blk.to(acc_t)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


# the shared autograd (implementations._kernels.saved_lse); ``how`` = (causal, doc_spans)
_OPS = LseOps(
    lambda q, k, v, how, scale, want_lse: _forward(q, k, v, how[0], scale, how[1]),
    lambda q, k, v, out, lse, dout, how, scale: _backward(
        q, k, v, out, lse, dout, how[0], scale, how[1]
    ),
)


def _doc_spans(documents: tuple[int, ...] | None) -> DocSpans | None:
    if documents is None:
        return None
    ends = list(itertools.accumulate(documents))
    return tuple(zip([0, *ends[:-1]], ends, strict=True))


def _fold(documents: tuple[int, ...] | None) -> int:
    """How many equal documents fold into the batch (1: none, or unequal documents)."""
    return len(documents) if documents is not None and len(set(documents)) == 1 else 1


def _workspace_bytes(p: Problem) -> int:
    """A few (BLOCK_Q, BLOCK_K) tiles in the accumulation dtype, per folded document slice,
    plus O(n) row state and the gradients."""
    if use_triton(p.device, p.dtype, p.head_dim):
        return masked_workspace_bytes(p)
    acc = itemsize(_acc(p.dtype))
    fold = _fold(p.mask.documents)
    rows, cols = min(BLOCK_Q, p.n_q // fold), min(BLOCK_K, p.n_k // fold)  # per slice
    tile = p.batch * p.heads * fold * rows * cols * acc
    rows = p.batch * p.heads * p.n_q * acc * (p.head_dim + 3)
    return 4 * tile + rows * (3 if p.backward else 1)


def _executed(p: Problem) -> int:
    """Block-granular pairs: the fused kernel's blocks on CUDA, the PyTorch tiles on CPU
    (each query block times the keys up to its causal bound, per document), closed form."""
    if use_triton(p.device, p.dtype, p.head_dim):
        return executed_pairs(p.mask, p.n_q, p.n_k, p.head_dim, p.dtype)
    lengths = Counter(p.mask.documents or ())
    if not lengths:
        return _segment_pairs(p.n_q, p.n_k, p.mask.causal)
    return sum(c * _segment_pairs(n, n, p.mask.causal) for n, c in lengths.items())


def _segment_pairs(n_q: int, n_k: int, causal: bool) -> int:
    qs = np.arange(0, n_q, BLOCK_Q)
    qe = np.minimum(qs + BLOCK_Q, n_q)
    hi = np.clip(qe + n_k - n_q, 0, n_k) if causal else np.full(qs.size, n_k)
    return int(((qe - qs) * hi).sum())


def _paged_kernel_reason() -> str | None:
    """Why the fused paged kernel cannot load here (None: it can)."""
    try:
        importlib.import_module("implementations._kernels.triton.paged_attention")
    except ImportError as exc:
        return f"the fused paged kernel does not load: {exc}"
    return None


def paged_triton(
    q: Tensor,
    k_pages: Tensor,
    v_pages: Tensor,
    block_table: Tensor,
    context_lens: Tensor,
    scale: float | None = None,
) -> Tensor:
    """The fused paged decode kernel (:data:`harness.spec.PagedFn`; CUDA)."""
    kernel = importlib.import_module("implementations._kernels.triton.paged_attention")
    return kernel.paged_decode_attention(q, k_pages, v_pages, block_table, context_lens, scale)


PAGED = Paged(
    paged_triton,
    devices=frozenset({"cuda"}),
    availability=_paged_kernel_reason,
    max_q_len=16,  # the kernel's query rows per program
    layouts=("NHD", "HND"),  # it reads the pages through their strides
    caps=Capabilities(
        devices={"cuda"},
        dtypes={torch.float32, *HALF_DTYPES},
        mask_features={"causal"},
        grouped_kv=True,
        max_head_dim=256,
    ),
)


@register(
    "flash-tiled",
    family="flash",
    caps=Capabilities(mask_features={"causal", "documents"}),
    cost=Cost(
        time_exponent=2,
        memory_exponent=1,
        memory_model=_workspace_bytes,
        executed_pairs=_executed,
    ),
    extra_reasons=masked_reasons,
    description="tiled online-softmax FlashAttention in plain PyTorch (exact, O(n) memory)",
    paged=PAGED,
)
def flash_tiled(
    q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float | None = None
) -> Tensor:
    """q: (B, H, n_q, D), k/v: (B, H, n_k, D) -> (B, H, n_q, D); causal bottom-right aligned;
    packed documents each attend within themselves."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if use_triton(q.device, q.dtype, q.shape[-1]):
        return triton_attention(q, k, v, mask, scale)
    b, h, n = q.shape[:3]
    fold = _fold(mask.documents)
    if fold > 1:  # equal documents: (B, H, m·l, D) -> (B, H·m, l, D), a view
        q, k, v = (x.reshape(b, h * fold, n // fold, x.shape[-1]) for x in (q, k, v))
        out = attention_with_lse(q, k, v, (mask.causal, None), scale, _OPS)
        return out.reshape(b, h, n, v.shape[-1])
    return attention_with_lse(q, k, v, (mask.causal, _doc_spans(mask.documents)), scale, _OPS)
