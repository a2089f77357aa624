"""Public face of the fused Triton attention kernels: dispatch rule, autograd, executed pairs.

``triton_attention(q, k, v, mask)`` is exact masked attention for any band mask (full, causal,
window, dilation, global tokens) or BigBird layout, one kernel launch per forward call. The
implementations (``local``, ``dilated``, ``longformer``, ``bigbird``, ``flash-tiled``) call it on
CUDA; on CPU they keep the tile path, and tests call it on CPU tensors under
``TRITON_INTERPRET=1``. Triton is optional: without it (or with a Triton that fails to import)
this module still imports, the launches are absent and :func:`unavailable_reason` says why.

Launches live in :mod:`implementations._kernels.triton_launch`, kernels in ``triton_fwd`` and
``triton_bwd`` (building blocks in ``triton_primitives``), index tables and autotuner keys in
``triton_tables``, iteration spaces in ``triton_plan``.
"""

from __future__ import annotations

import importlib.util
import math

import torch
from torch import Tensor

from harness.dtypes import FLOAT_DTYPES
from harness.masks import MaskSpec
from harness.spec import Problem
from implementations._kernels.triton_plan import (
    band_executed_pairs,
    band_plan,
    block_executed_pairs,
    block_plan,
    block_tile,
)
from implementations._kernels.triton_tables import band_tables, block_tables, tune_key

try:  # the launches import Triton, an optional dependency
    from implementations._kernels import triton_launch
except Exception as exc:  # absent or broken: the tile paths still run, the reason says why
    triton_launch = None
    _LAUNCH_ERROR = f"the Triton kernels failed to import: {type(exc).__name__}: {exc}"

DTYPES = FLOAT_DTYPES - {torch.float64}  # the kernels have no float64 path
MAX_HEAD_DIM = 256


def unavailable_reason() -> str | None:
    """Why the fused kernels cannot run on this machine (None when Triton and the kernels
    import)."""
    if importlib.util.find_spec("triton") is None:
        return "triton not installed"
    return None if triton_launch is not None else _LAUNCH_ERROR


def supports_shape(dtype: torch.dtype, head_dim: int) -> bool:
    """Whether the kernels cover this dtype and head dim (float64 and D > 256 do not)."""
    return dtype in DTYPES and head_dim <= MAX_HEAD_DIM


def supports(dtype: torch.dtype, head_dim: int) -> bool:
    """Covered and Triton importable."""
    return supports_shape(dtype, head_dim) and unavailable_reason() is None


def use_triton(device: str | torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """The dispatch rule of the implementations: CUDA tensors the kernels cover."""
    return torch.device(device).type == "cuda" and supports(dtype, head_dim)


def executed_pairs(mask: MaskSpec, n_q: int, n_k: int, head_dim: int, dtype: torch.dtype) -> int:
    """Pairs the forward kernel computes per (batch, head) at its block granularity: the block
    sizes the autotuner chose for this shape in this process, else the first config's."""
    if mask.block_size is not None:
        return block_executed_pairs(block_plan(mask, n_q, n_k, block_tile(mask.block_size)))
    cfg = triton_launch.forward_blocks(tune_key(mask, n_q, n_k, head_dim, dtype))
    return band_executed_pairs(band_plan(mask, n_q, n_k), cfg["BLOCK_M"], cfg["BLOCK_N"])


def prepare_tables(problem: Problem) -> None:
    """Build and cache the problem's index tables on its device (outside any timed call)."""
    mask, n_q, n_k = problem.mask, problem.n_q, problem.n_k
    if mask.block_size is None:
        band_tables(mask, n_q, n_k, str(torch.device(problem.device)))
    else:
        block_tables(mask, n_q, n_k, str(torch.device(problem.device)))


def fused_reasons(problem: Problem) -> list[str]:
    """Extra reasons of a family with a fused CUDA path: none on CPU (tile path), and on CUDA
    only a missing Triton (float64 and D > 256 keep the tile path there)."""
    if problem.device_type != "cuda" or not supports_shape(problem.dtype, problem.head_dim):
        return []
    reason = unavailable_reason()
    return [f"unavailable: {reason}"] if reason else []


def fused_workspace_bytes(problem: Problem) -> int:
    """Extra memory of a fused call: the fp32 row log-sum-exp (and in backward the fp32 row
    delta and dQ/dK/dV accumulators' fp32 copies are not made: grads are written in place)."""
    rows = problem.batch * problem.heads * problem.n_q * 4
    return rows * (2 if problem.backward else 1)


class _TritonAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float) -> Tensor:
        out, lse = triton_launch.attention_forward(q, k, v, mask, scale)
        if any(ctx.needs_input_grad[:3]):
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.mask, ctx.scale = mask, scale
        return out

    @staticmethod
    def backward(ctx, dout: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = triton_launch.attention_backward(q, k, v, out, lse, dout, ctx.mask, ctx.scale)
        return dq, dk, dv, None, None


def triton_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float | None = None
) -> Tensor:
    """Exact masked attention in fused Triton kernels (forward and backward).

    q: (B, H, n_q, D), k/v: (B, H, n_k, D) with D <= 256, dtype fp32/fp16/bf16 -> (B, H, n_q, D).
    CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``."""
    if q.dtype not in DTYPES or q.shape[-1] > MAX_HEAD_DIM:
        raise ValueError(f"triton kernels cover fp32/fp16/bf16 and D <= {MAX_HEAD_DIM}")
    if k.shape[1] != q.shape[1]:
        raise ValueError("triton kernels need as many K/V heads as query heads")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return _TritonAttention.apply(q, k, v, mask, scale)
