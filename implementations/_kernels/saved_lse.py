"""The autograd of an exact attention that keeps its row log-sum-exp (FlashAttention's
contract), shared by the CPU tiles and the fused Triton kernels: the forward returns the
output and the lse, the backward recomputes probabilities from the saved lse. Each family
states its two calls as :class:`LseOps`; :func:`attention_with_lse` is the one
``autograd.Function`` over them."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor


class LseOps(NamedTuple):
    """A family's calls. ``forward(q, k, v, how, scale, want_lse) -> (out, lse or None)``;
    ``backward(q, k, v, out, lse, dout, how, scale) -> (dq, dk, dv)``; ``how``: what the
    family needs to know of the mask (a tile plan, a MaskSpec)."""

    forward: Callable[..., tuple[Tensor, Tensor | None]]
    backward: Callable[..., tuple[Tensor, Tensor, Tensor]]


class _SavedLse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, how: object, scale: float,
                ops: LseOps) -> Tensor:
        want_grad = any(ctx.needs_input_grad[:3])
        out, lse = ops.forward(q, k, v, how, scale, want_grad)
        if want_grad:
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.how, ctx.scale, ctx.ops = how, scale, ops
        return out

    @staticmethod
    def backward(ctx, dout: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ctx.ops.backward(q, k, v, out, lse, dout.contiguous(), ctx.how, ctx.scale)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


def attention_with_lse(q: Tensor, k: Tensor, v: Tensor, how: object, scale: float,
                       ops: LseOps) -> Tensor:
    """``ops.forward``'s output, differentiable through ``ops.backward`` (shapes as the
    family's: q (…, n_q, D), k/v (…, n_k, D))."""
    return _SavedLse.apply(q, k, v, how, scale, ops)
