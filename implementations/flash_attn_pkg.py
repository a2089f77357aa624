"""``flash-attn``: the ``flash_attn`` package's ``flash_attn_func`` (FlashAttention-2/3, CUDA).

flash-attn >= 2.1 aligns causal masks bottom-right and its ``window_size=(left, right)`` is
exactly :mod:`harness.masks`'s window, so both map one to one. Grouped K/V is native.
Layout: flash-attn takes (B, N, H, D); we transpose from (B, H, N, D).

Packed documents run ``flash_attn_varlen_func``: the B sequences of the call laid end to end,
(B·N, H, D), with ``cu_seqlens`` the document boundaries repeated B times; causality and the
window apply inside each document, as the mask definition says. (Not run on this project's
CPU machines: flash-attn has no CPU path.)

Its paged form is ``flash_attn_with_kvcache(block_table=...)`` over the pool as it is (the
"NHD" pages of :mod:`harness.paged`); flash-attn 2 takes pages of a multiple of 256 tokens.
"""

from __future__ import annotations

import itertools
import math
from functools import lru_cache

import torch
from torch import Tensor

from harness.mask_features.window import spelled
from harness.masks import MaskSpec
from harness.registry import TinyCall, register
from harness.spec import HALF_DTYPES, Capabilities, Cost, Paged


def _availability() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU (flash-attn has no CPU path); install with the `gpu` extra"
    return None


@lru_cache(maxsize=16)
def _cu_seqlens(documents: tuple[int, ...], batch: int, device: str) -> Tensor:
    """int32 (batch·len(documents) + 1,) document boundaries of B sequences laid end to end
    (built once per shape, not in every timed call)."""
    bounds = [0, *itertools.accumulate(list(documents) * batch)]
    return torch.tensor(bounds, dtype=torch.int32, device=device)


def flash_attn_paged(
    q: Tensor,
    k_pages: Tensor,
    v_pages: Tensor,
    block_table: Tensor,
    context_lens: Tensor,
    scale: float | None = None,
) -> Tensor:
    """``flash_attn_with_kvcache`` over the paged pool: q (B, H, q_len, D) -> (B, H, q_len, D),
    causal bottom-right per sequence (:data:`harness.spec.PagedFn`)."""
    from flash_attn import flash_attn_with_kvcache

    out = flash_attn_with_kvcache(
        q.transpose(1, 2),
        k_pages,
        v_pages,
        cache_seqlens=context_lens,
        block_table=block_table,
        softmax_scale=scale,
        causal=True,
    )
    return out.transpose(1, 2)


@register(
    "flash-attn",
    family="flash",
    caps=Capabilities(
        devices={"cuda"},
        dtypes=HALF_DTYPES,
        mask_features={"causal", "window", "documents"},
        grouped_kv=True,
        max_head_dim=256,
    ),
    cost=Cost(time_exponent=2, memory_exponent=1),
    description="flash_attn.flash_attn_func (FlashAttention-2, CUDA)",
    availability=_availability,
    probe=TinyCall(),  # the import, the compiled extension and a kernel for this GPU
    paged=Paged(flash_attn_paged, page_multiple=256),
)
def flash_attn_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float | None = None
) -> Tensor:
    """q: (B, H, n_q, D), k/v: (B, H_kv, n_k, D) -> (B, H, n_q, D)."""
    from flash_attn import flash_attn_func, flash_attn_varlen_func

    window = (spelled(mask.left), spelled(mask.right))  # flash-attn spells unbounded -1 too
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    b, h, n_q, _ = q.shape
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # (B, N, H, D)
    if mask.documents is None:
        out = flash_attn_func(q, k, v, softmax_scale=scale, causal=mask.causal, window_size=window)
        return out.transpose(1, 2)
    q, k, v = (x.reshape(-1, *x.shape[2:]) for x in (q, k, v))  # (B·N, H, D), end to end
    cu_seqlens = _cu_seqlens(mask.documents, b, str(q.device))
    longest = max(mask.documents)
    out = flash_attn_varlen_func(
        q, k, v, cu_seqlens, cu_seqlens, longest, longest,
        softmax_scale=scale, causal=mask.causal, window_size=window,
    )
    return out.reshape(b, n_q, h, out.shape[-1]).transpose(1, 2)
