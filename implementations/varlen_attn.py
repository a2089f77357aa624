"""``varlen-attn``: torch's ``torch.nn.attention.varlen.varlen_attn`` (torch >= 2.13; Flash
kernels, CUDA): the ragged-batch attention of PyTorch itself.

The plain form lays the B sequences end to end, (B·N, H, D), with ``cu_seq`` boundaries every N
tokens: what a ragged prefill of B sequences of N tokens each runs. Causal is
``window_size=(-1, 0)``, bottom-right aligned as in :mod:`harness.masks`; a causal sliding
window of W keys is ``(W - 1, 0)``. The paged form reads the pool of :mod:`harness.paged` as it
lies: ``block_table`` and ``seqused_k`` (the lengths) over the pages, the step's queries end to
end. Not run on this project's CPU machines (the Flash kernels are CUDA only).
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from harness.masks import MaskSpec
from harness.registry import TinyCall, register
from harness.spec import HALF_DTYPES, Capabilities, Cost, Paged


@functools.cache
def _varlen():
    """torch's ``varlen_attn`` (torch >= 2.13), imported at its first use: importing it loads
    torch._dynamo, inductor and sympy (3.7-4.8 s at load 4 on 2 cores), which every process
    that loads the plug-ins paid (each CLI command, the isolation forkserver) though only a
    CUDA run of this implementation calls it."""
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn


def _availability() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU (varlen_attn runs Flash kernels, CUDA only)"
    try:
        _varlen()
    except ImportError as missing:
        return f"torch {torch.__version__} has no varlen_attn ({missing})"
    return None


def _bounds(batch: int, length: int, device: torch.device) -> Tensor:
    """int32 (B + 1,) boundaries of B sequences of ``length`` tokens laid end to end."""
    return torch.arange(0, (batch + 1) * length, length, dtype=torch.int32, device=device)


def _window(mask: MaskSpec) -> tuple[int, int]:
    left = -1 if mask.left is None else mask.left
    right = -1 if mask.right is None else mask.right
    return (left, 0 if mask.causal else right)


def varlen_paged(q: Tensor, k_pages: Tensor, v_pages: Tensor, block_table: Tensor,
                 context_lens: Tensor, scale: float | None = None) -> Tensor:  # fmt: skip
    """varlen_attn over the paged pool (:data:`harness.spec.PagedFn`): q (B, H, q_len, D) ->
    (B, H, q_len, D), causal within the step."""
    b, h, q_len, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    max_k = block_table.shape[1] * k_pages.shape[1]
    out = _varlen()(
        q.transpose(1, 2).reshape(b * q_len, h, d), k_pages, v_pages,
        _bounds(b, q_len, q.device), None, q_len, max_k, scale=scale, window_size=(-1, 0),
        enable_gqa=k_pages.shape[2] != h, seqused_k=context_lens, block_table=block_table,
    )  # fmt: skip
    return out.reshape(b, q_len, h, d).transpose(1, 2)


@register(
    "varlen-attn",
    family="flash",
    caps=Capabilities(
        devices={"cuda"},
        dtypes=HALF_DTYPES,
        mask_features={"causal", "window"},
        grouped_kv=True,
        backward=False,
        max_head_dim=256,
    ),
    cost=Cost(time_exponent=2, memory_exponent=1),
    description="torch.nn.attention.varlen.varlen_attn (Flash kernels, CUDA)",
    availability=_availability,
    probe=TinyCall(),
    paged=Paged(varlen_paged),
)
def varlen_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float | None = None
) -> Tensor:
    """q: (B, H, n_q, D), k/v: (B, H_kv, n_k, D) -> (B, H, n_q, D)."""
    b, h, n_q, d = q.shape
    n_k = k.shape[2]
    rows = [x.transpose(1, 2).reshape(-1, x.shape[1], d) for x in (q, k, v)]  # (B·N, H, D)
    out = _varlen()(
        *rows, _bounds(b, n_q, q.device), _bounds(b, n_k, q.device), n_q, n_k,
        scale=scale, window_size=_window(mask), enable_gqa=k.shape[1] != h,
    )  # fmt: skip
    return out.reshape(b, n_q, h, d).transpose(1, 2)
