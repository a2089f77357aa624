"""``flash-tiled``: the FlashAttention algorithm written out in readable PyTorch.

Forward: for each query block, stream over key blocks keeping a running row max ``m``, row sum
``l`` and an un-normalized accumulator (online softmax, Milakov & Gimelshein 2018; Dao et al.
2022, Alg. 1). Key blocks entirely in a query block's causal future are never computed. Only
(BLOCK_Q, BLOCK_K) tiles exist at any time, so extra memory is O(n), not O(n²); the result is
exact up to floating-point reassociation.

Backward (Dao 2023, Alg. 2): saves only the output and the per-row log-sum-exp, recomputes each
tile's probabilities, and accumulates dQ, dK, dV tile by tile: again O(n) memory.

That is the CPU path. On CUDA (fp32/fp16/bf16, D <= 256) the same algorithm runs as fused
Triton kernels (:mod:`implementations._kernels.triton_attn`): one launch for the forward, the causal
triangle's interior blocks without mask arithmetic, FlashAttention-2's backward.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from harness.masks import MaskSpec
from harness.registry import register
from harness.spec import Capabilities, Cost, Problem
from implementations._kernels.triton_attn import (
    executed_pairs,
    fused_reasons,
    fused_workspace_bytes,
    triton_attention,
    use_triton,
)

BLOCK_Q = 256
BLOCK_K = 512


def _tiles(n_q: int, n_k: int, causal: bool):
    """Yield (qs, qe, ks, ke, partial): the tiles that hold at least one kept pair."""
    off = n_k - n_q
    for qs in range(0, n_q, BLOCK_Q):
        qe = min(qs + BLOCK_Q, n_q)
        hi = min(n_k, qe + off) if causal else n_k  # last key any query here may see, + 1
        for ks in range(0, max(hi, 0), BLOCK_K):
            ke = min(ks + BLOCK_K, hi)
            yield qs, qe, ks, ke, causal and ke - 1 > qs + off


def _tile_scores(
    q_blk: Tensor, k_blk: Tensor, scale: float, qs: int, ks: int, off: int, partial: bool
) -> Tensor:
    """(B, H, bq, D) x (B, H, bk, D) -> float32 scores (B, H, bq, bk), causal future at -inf."""
    s = (q_blk @ k_blk.transpose(-2, -1)).float().mul_(scale)
    if partial:
        p = torch.arange(qs, qs + q_blk.shape[-2], device=s.device)[:, None] + off
        j = torch.arange(ks, ks + k_blk.shape[-2], device=s.device)[None, :]
        s.masked_fill_(j > p, float("-inf"))
    return s


def _forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    """q: (B, H, n_q, D), k/v: (B, H, n_k, D) -> out (B, H, n_q, D), lse float32 (B, H, n_q)."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    off = n_k - n_q
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:-1], float("inf"), dtype=torch.float32, device=q.device)
    state: dict[int, tuple[Tensor, Tensor, Tensor]] = {}
    for qs, qe, ks, ke, partial in _tiles(n_q, n_k, causal):
        s = _tile_scores(q[..., qs:qe, :], k[..., ks:ke, :], scale, qs, ks, off, partial)
        m, row_sum, acc = state.get(qs) or (
            torch.full(s.shape[:-1], float("-inf"), device=q.device),
            torch.zeros(s.shape[:-1], device=q.device),
            torch.zeros((*s.shape[:-1], q.shape[-1]), device=q.device),
        )
        m_new = torch.maximum(m, s.amax(-1))
        m_safe = m_new.masked_fill(m_new == float("-inf"), 0.0)  # fully masked so far: no NaN
        p = torch.exp(s - m_safe[..., None])
        alpha = torch.exp(m - m_safe)
        row_sum = row_sum * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + (p.to(v.dtype) @ v[..., ks:ke, :]).float()
        state[qs] = (m_new, row_sum, acc)
        if ke == (min(n_k, qe + off) if causal else n_k):  # last tile of this query block
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
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients (dq, dk, dv), shapes as q, k, v, recomputing tile probabilities from lse."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    off = n_k - n_q
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dk = torch.zeros(k.shape, dtype=torch.float32, device=q.device)
    dv = torch.zeros(v.shape, dtype=torch.float32, device=q.device)
    delta = (dout.float() * out.float()).sum(-1)  # (B, H, n_q): rowsum(dO ∘ O)
    for qs, qe, ks, ke, partial in _tiles(n_q, n_k, causal):
        q_blk, k_blk, v_blk, do_blk = (
            q[..., qs:qe, :],
            k[..., ks:ke, :],
            v[..., ks:ke, :],
            dout[..., qs:qe, :],
        )
        s = _tile_scores(q_blk, k_blk, scale, qs, ks, off, partial)
        p = torch.exp(s - lse[..., qs:qe, None])  # (B, H, bq, bk); masked and empty rows -> 0
        dv[..., ks:ke, :] += p.transpose(-2, -1) @ do_blk.float()
        dp = do_blk.float() @ v_blk.float().transpose(-2, -1)
        ds = p * (dp - delta[..., qs:qe, None]) * scale
        dq[..., qs:qe, :] += ds @ k_blk.float()
        dk[..., ks:ke, :] += ds.transpose(-2, -1) @ q_blk.float()
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _FlashTiled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> Tensor:
        out, lse = _forward(q, k, v, causal, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale = causal, scale
        return out

    @staticmethod
    def backward(ctx, dout: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward(q, k, v, out, lse, dout.contiguous(), ctx.causal, ctx.scale)
        return dq, dk, dv, None, None


def _workspace_bytes(p: Problem) -> int:
    """A few fp32 (BLOCK_Q, BLOCK_K) tiles plus O(n) row state and fp32 grads."""
    if use_triton(p.device, p.dtype, p.head_dim):
        return fused_workspace_bytes(p)
    tile = p.batch * p.heads * BLOCK_Q * BLOCK_K * 4
    rows = p.batch * p.heads * p.n_q * 4 * (p.head_dim + 3)
    return 4 * tile + rows * (3 if p.backward else 1)


def _executed(p: Problem) -> int:
    """Block-granular pairs: the fused kernel's blocks on CUDA, the PyTorch tiles on CPU."""
    if use_triton(p.device, p.dtype, p.head_dim):
        return executed_pairs(p.mask, p.n_q, p.n_k, p.head_dim, p.dtype)
    return sum((qe - qs) * (ke - ks) for qs, qe, ks, ke, _ in _tiles(p.n_q, p.n_k, p.mask.causal))


@register(
    "flash-tiled",
    family="flash",
    caps=Capabilities(mask_features={"causal"}),
    cost=Cost(
        time_exponent=2,
        memory_exponent=1,
        memory_model=_workspace_bytes,
        executed_pairs=_executed,
    ),
    extra_reasons=fused_reasons,
    description="tiled online-softmax FlashAttention in plain PyTorch (exact, O(n) memory)",
)
def flash_tiled(
    q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float | None = None
) -> Tensor:
    """q: (B, H, n_q, D), k/v: (B, H, n_k, D) -> (B, H, n_q, D); causal bottom-right aligned."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if use_triton(q.device, q.dtype, q.shape[-1]):
        return triton_attention(q, k, v, MaskSpec(causal=mask.causal), scale)
    return _FlashTiled.apply(q, k, v, mask.causal, scale)
