"""``xformers``: ``xformers.ops.memory_efficient_attention`` (CUTLASS / FlashAttention kernels).

xformers ships no CPU operator, so on a machine without CUDA this stays registered and says
why it is unavailable. Layout: xformers takes (B, N, H, D); we transpose from (B, H, N, D).

Packed documents use ``BlockDiagonalMask`` (``.make_causal()`` for causal): xformers wants
them as one batch row, so the B sequences of the call are laid end to end, (1, B·N, H, D),
with the document lengths repeated B times; each document is its own sequence there, as the
mask definition says. (Not run on this project's CPU machines: xformers has no CPU kernel.)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from harness.masks import MaskSpec
from harness.registry import TinyCall, register
from harness.spec import FLOAT_DTYPES, Capabilities, Cost


def _availability() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU (xformers has no CPU operator); install with the `gpu` extra"
    return None


def _bias(mask: MaskSpec, n_q: int, n_k: int, batch: int):
    from xformers.ops.fmha import attn_bias

    if mask.documents is not None:  # one row of B x documents
        diagonal = attn_bias.BlockDiagonalMask.from_seqlens(list(mask.documents) * batch)
        return diagonal.make_causal() if mask.causal else diagonal
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
        mask_features={"causal", "documents"},
        max_head_dim=256,
    ),
    cost=Cost(time_exponent=2, memory_exponent=1),
    description="xformers.ops.memory_efficient_attention (CUDA)",
    availability=_availability,
    probe=TinyCall(),  # a wheel whose operators do not load fails it: "No operator found"
)
def xformers_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float | None = None
) -> Tensor:
    """q: (B, H, n_q, D), k/v: (B, H, n_k, D) -> (B, H, n_q, D)."""
    import xformers.ops as xops

    b, h, n_q, _ = q.shape
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # (B, N, H, D)
    if mask.documents is not None:  # (B, N, H, D) -> (1, B·N, H, D): sequences end to end
        q, k, v = (x.reshape(1, -1, *x.shape[2:]) for x in (q, k, v))
    out = xops.memory_efficient_attention(
        q, k, v, attn_bias=_bias(mask, n_q, k.shape[1], b), scale=scale
    )
    return out.reshape(b, n_q, h, out.shape[-1]).transpose(1, 2)
