"""``xformers``: ``xformers.ops.memory_efficient_attention`` (CUTLASS / FlashAttention kernels).

xformers ships no CPU operator, so on a machine without CUDA this stays registered and says
why it is unavailable. Layout: xformers takes (B, N, H, D); we transpose from (B, H, N, D).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from harness.dtypes import FLOAT_DTYPES
from harness.masks import MaskSpec
from harness.registry import register, tiny_qkv
from harness.spec import Capabilities, Cost


def _availability() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU (xformers has no CPU operator); install with the `gpu` extra"
    return None


def _probe(device_type: str) -> Tensor:
    """One tiny real call: a wheel that imports but whose operators do not load fails here
    (\"No operator found for memory_efficient_attention_forward\")."""
    return xformers_attention(*tiny_qkv(device_type, torch.float16), MaskSpec(causal=True))


def _bias(mask: MaskSpec, n_q: int, n_k: int):
    from xformers.ops.fmha import attn_bias

    if not mask.causal:
        return None
    if n_q == n_k:
        return attn_bias.LowerTriangularMask()
    return attn_bias.LowerTriangularFromBottomRightMask()


DTYPES = FLOAT_DTYPES - {torch.float64}  # fmha has no float64 kernels


@register(
    "xformers",
    family="xformers",
    caps=Capabilities(
        devices={"cuda"},
        dtypes=DTYPES,
        mask_features={"causal"},
        max_head_dim=256,
    ),
    cost=Cost(time_exponent=2, memory_exponent=1),
    description="xformers.ops.memory_efficient_attention (CUDA)",
    availability=_availability,
    probe=_probe,
)
def xformers_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float | None = None
) -> Tensor:
    """q: (B, H, n_q, D), k/v: (B, H, n_k, D) -> (B, H, n_q, D)."""
    import xformers.ops as xops

    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out = xops.memory_efficient_attention(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),  # (B, N, H, D)
        attn_bias=_bias(mask, q.shape[-2], k.shape[-2]),
        scale=scale,
    )
    return out.transpose(1, 2)
