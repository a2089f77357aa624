"""``full``: eager softmax(QKᵀ/√D)V with the whole (n_q, n_k) score matrix materialized.

The textbook method and the O(n²)-memory baseline every efficient variant is measured against.
Its paged form is the plain path over a paged KV cache, :func:`harness.paged.paged_attention`
(gather each sequence's pages, attend over its real keys): the definition the decode
scenario's float64 check runs too.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from harness.masks import MaskSpec, dense_mask
from harness.paged import paged_attention
from harness.registry import register
from harness.spec import MASK_FEATURES, Capabilities, Cost, Paged, Problem, itemsize


def _scores_bytes(p: Problem) -> int:
    """Up to three (B, H, n_q, n_k) tensors at once (scores, masked scores, probabilities)
    plus the (n_q, n_k) boolean mask when masked; two when dense."""
    tensors = 2 if p.mask.is_dense else 3
    mask = 0 if p.mask.is_dense else p.n_q * p.n_k
    return tensors * p.batch * p.heads * p.n_q * p.n_k * itemsize(p.dtype) + mask


@register(
    "full",
    family="dense",
    caps=Capabilities(mask_features=MASK_FEATURES, grouped_kv=True),  # the definition itself
    cost=Cost(
        time_exponent=2,
        memory_exponent=2,
        memory_model=_scores_bytes,
        executed_pairs=lambda p: p.n_q * p.n_k,  # every score is computed, then masked
    ),
    description="eager softmax(QK^T)V, materialized (n_q, n_k) scores",
    paged=Paged(paged_attention, layouts=("NHD", "HND")),
)
def full_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float | None = None
) -> Tensor:
    """q: (B, H, n_q, D), k/v: (B, H_kv, n_k, D) -> (B, H, n_q, D)."""
    heads, n_q, n_k, d = q.shape[1], q.shape[-2], k.shape[-2], q.shape[-1]
    if k.shape[1] != heads:  # (B, H_kv, n_k, D) -> (B, H, n_k, D)
        k = k.repeat_interleave(heads // k.shape[1], dim=1)
        v = v.repeat_interleave(heads // v.shape[1], dim=1)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, n_q, n_k)
    if not mask.is_dense:
        scores = scores.masked_fill(~dense_mask(mask, n_q, n_k, q.device), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if not mask.is_dense:
        probs = probs.nan_to_num(0.0)  # rows with no kept key -> zeros, never NaN
    return probs @ v
