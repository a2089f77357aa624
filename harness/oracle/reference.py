"""The float64 oracle: ``softmax(QKᵀ·scale + (-inf where not kept)) V`` over :func:`dense_mask`.

Computed in query chunks so memory stays O(chunk * n_k) however long the sequence; a row
with no kept key outputs zeros. Grouped K/V (fewer K/V heads than query heads) is handled by
repeating K/V heads, which is the definition GQA/MQA implementations must match.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Concatenate, ParamSpec

import torch
from torch import Tensor

from harness.masks import MaskSpec, check_rows, keep_pairs

P = ParamSpec("P")


def repeat_kv(x: Tensor, heads: int) -> Tensor:
    """(B, H_kv, n, D) -> (B, heads, n, D), each K/V head shared by heads // H_kv query heads."""
    h_kv = x.shape[1]
    if h_kv == heads:
        return x
    if heads % h_kv:
        raise ValueError(f"heads={heads} is not a multiple of kv_heads={h_kv}")
    return x.repeat_interleave(heads // h_kv, dim=1)


_HALF = (torch.float16, torch.bfloat16)


def _matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` in the inputs' dtype. On CPU, half-precision inputs are multiplied in float32
    and the product rounded back: what a half GEMM with float32 accumulation computes, ~10x
    faster than CPU half matmuls on machines without native bf16/fp16 units."""
    if a.dtype in _HALF and a.device.type == "cpu":
        return (a.float() @ b.float()).to(a.dtype)
    return a @ b


def _attend_rows(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, scale: float) -> Tensor:
    """q: (B, H, c, D), k/v: (B, H, n_k, D), keep: (c, n_k) or None (all kept)
    -> (B, H, c, D) in v's dtype.

    Scores and softmax run in at least float32 (float64 stays float64), as kernels do.
    """
    acc = torch.promote_types(q.dtype, torch.float32)
    scores = _matmul(q, k.transpose(-2, -1)).to(acc) * scale  # (B, H, c, n_k), a fresh tensor
    if keep is None:
        return _matmul(torch.softmax(scores, dim=-1).to(v.dtype), v)
    scores.masked_fill_(~keep, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # empty rows -> zeros
    return _matmul(probs.to(v.dtype), v)


def naive_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: MaskSpec | None = None,
    scale: float | None = None,
    rows: Tensor | None = None,
    chunk: int = 256,
) -> Tensor:
    """The same math in the inputs' own dtype (the error scale an optimized kernel is judged
    by), over query chunks: memory O(chunk * n_k). q: (B, H, n_q, D), k/v: (B, H_kv, n_k, D) ->
    (B, H, n_q, D), or (B, H, len(rows), D) for the 1-D long query ``rows``."""
    mask = mask or MaskSpec()
    n_q = q.shape[-2]
    check_rows(mask, n_q, k.shape[-2])  # a contradictory mask: the error every path gives
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])
    row_ids = torch.arange(n_q) if rows is None else rows.cpu()
    outs = []
    for s in range(0, len(row_ids), chunk):
        ids = row_ids[s : s + chunk]
        outs.append(_rows_attention(q[..., ids.to(q.device), :], k, v, mask, scale, n_q, ids))
    return torch.cat(outs, dim=-2)


def in_float64(
    fn: Callable[Concatenate[Tensor, Tensor, Tensor, P], Tensor],
) -> Callable[Concatenate[Tensor, Tensor, Tensor, P], Tensor]:
    """``fn`` evaluated on float64 copies of its q, k, v (autograd flows back to the
    originals); its other arguments pass through unchanged."""

    def wide(q: Tensor, k: Tensor, v: Tensor, *args: P.args, **kwargs: P.kwargs) -> Tensor:
        return fn(q.double(), k.double(), v.double(), *args, **kwargs)

    return wide


# the oracle: the naive computation in float64 (differentiable: autograd flows to q, k, v)
reference_attention = in_float64(naive_attention)
reference_attention.__name__ = reference_attention.__qualname__ = "reference_attention"
reference_attention.__doc__ = """float64 attention: :func:`naive_attention` on float64 copies of
q, k, v. q: (B, H, n_q, D), k/v: (B, H_kv, n_k, D) -> (B, H, n_q, D) float64; ``rows`` (1-D
long) restricts it to those query rows: (B, H, len(rows), D)."""


def _rows_attention(
    q_rows: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float, n_q: int, ids: Tensor
) -> Tensor:
    """The query rows ``ids`` of n_q queries (q_rows: (B, H, len(ids), D)) over every key, k/v
    (B, H, n_k, D) with their heads repeated -> (B, H, len(ids), D)."""
    keep = None if mask.is_dense else _rows_mask(mask, n_q, k.shape[-2], ids).to(q_rows.device)
    return _attend_rows(q_rows, k, v, keep, scale)


def _rows_mask(mask: MaskSpec, n_q: int, n_k: int, ids: Tensor) -> Tensor:
    """Mask rows for arbitrary (sorted or not) query ids: bool (len(ids), n_k).

    Evaluated at exactly those rows, so a sample spread over a long sequence costs
    O(len(ids) * n_k), not the span between its first and last row.
    """
    p = ids.long()[:, None] + (n_k - n_q)  # absolute query positions
    return keep_pairs(mask, n_q, n_k, p, torch.arange(n_k)[None, :])


def reference_grads(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    grad_out: Tensor,
    mask: MaskSpec | None = None,
    scale: float | None = None,
    chunk: int = 256,
) -> tuple[Tensor, Tensor, Tensor]:
    """float64 (dq, dk, dv) of ``(out * grad_out).sum()``, query chunk by query chunk.

    The loss is a sum over rows, so each chunk's backward is independent and dk/dv accumulate:
    peak memory stays O(chunk * n_k). Shapes as q, k, v.
    """
    mask = mask or MaskSpec()
    n_q, heads = q.shape[-2], q.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    q64 = q.detach().double()
    k64 = k.detach().double().requires_grad_(True)
    v64 = v.detach().double().requires_grad_(True)
    g64 = grad_out.double()
    dq = torch.zeros_like(q64)
    for s in range(0, n_q, chunk):
        ids = torch.arange(s, min(s + chunk, n_q))
        q_chunk = q64[..., s : s + len(ids), :].clone().requires_grad_(True)
        # K/V heads repeated inside each chunk's graph: each backward frees its own
        k_rep, v_rep = repeat_kv(k64, heads), repeat_kv(v64, heads)
        out = _rows_attention(q_chunk, k_rep, v_rep, mask, scale, n_q, ids)
        (out * g64[..., s : s + len(ids), :]).sum().backward()
        dq[..., s : s + len(ids), :] = q_chunk.grad
    return dq, k64.grad, v64.grad
