"""``flash-attn``: the ``flash_attn`` package's ``flash_attn_func`` (FlashAttention-2/3, CUDA).

flash-attn >= 2.1 aligns causal masks bottom-right and its ``window_size=(left, right)`` is
exactly :mod:`harness.masks`'s window, so both map one to one. Grouped K/V is native.
Layout: flash-attn takes (B, N, H, D); we transpose from (B, H, N, D).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from harness.dtypes import HALF_DTYPES
from harness.masks import MaskSpec
from harness.registry import register, tiny_qkv
from harness.spec import Capabilities, Cost


def _availability() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU (flash-attn has no CPU path); install with the `gpu` extra"
    return None


def _probe(device_type: str) -> Tensor:
    """One tiny real call: the import, the compiled extension and a kernel for this GPU."""
    return flash_attn_attention(*tiny_qkv(device_type, torch.float16), MaskSpec(causal=True))


@register(
    "flash-attn",
    family="flash",
    caps=Capabilities(
        devices={"cuda"},
        dtypes=HALF_DTYPES,
        mask_features={"causal", "window"},
        grouped_kv=True,
        max_head_dim=256,
    ),
    cost=Cost(time_exponent=2, memory_exponent=1),
    description="flash_attn.flash_attn_func (FlashAttention-2, CUDA)",
    availability=_availability,
    probe=_probe,
)
def flash_attn_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float | None = None
) -> Tensor:
    """q: (B, H, n_q, D), k/v: (B, H_kv, n_k, D) -> (B, H, n_q, D)."""
    from flash_attn import flash_attn_func

    left = -1 if mask.left is None else mask.left
    right = -1 if mask.right is None else mask.right
    out = flash_attn_func(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),  # (B, N, H, D)
        softmax_scale=1.0 / math.sqrt(q.shape[-1]) if scale is None else scale,
        causal=mask.causal,
        window_size=(left, right),
    )
    return out.transpose(1, 2)
