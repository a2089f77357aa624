"""The two paths of the sparse families (``local``, ``dilated``, ``longformer``, ``bigbird``):
the fused Triton kernels (:mod:`implementations._kernels.triton.masked_attention`) on CUDA
(fp32/fp16/bf16, D <= 256), the CPU tile path
(:mod:`implementations._kernels.tiles.tile_attention`) elsewhere.

Which pairs either path computes comes from the mask alone (a band, residue classes, a block
layout: the tile plan, the fused kernels' tables), so one direct call, one prepared call and
one cost model serve every family.
"""

from __future__ import annotations

from torch import Tensor

from harness.masks import MaskSpec
from harness.spec import AttnFn, Cost, Problem
from implementations._kernels.tiles.tile_attention import (
    device_plan,
    plan_shape,
    plan_workspace_bytes,
    tile_attention,
)
from implementations._kernels.triton.masked_attention import (
    executed_pairs,
    masked_workspace_bytes,
    prepare_tables,
    triton_attention,
    use_triton,
)


def sparse_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float | None = None
) -> Tensor:
    """q: (B, H, n_q, D), k/v: (B, H, n_k, D) -> (B, H, n_q, D), the mask's tiles only."""
    if use_triton(q.device, q.dtype, q.shape[-1]):
        return triton_attention(q, k, v, mask, scale)
    plan = device_plan(mask, q.shape[-2], k.shape[-2], q.dtype, str(q.device))
    return tile_attention(q, k, v, plan, scale)


def prepare(problem: Problem) -> AttnFn:
    """The call with its plan (tiles, or the fused kernels' index tables) built outside the
    timing."""
    mask = problem.mask
    if use_triton(problem.device, problem.dtype, problem.head_dim):
        prepare_tables(problem)  # index tables built and cached here, not in the call
        return lambda q, k, v: triton_attention(q, k, v, mask)
    plan = device_plan(mask, problem.n_q, problem.n_k, problem.dtype, problem.device)
    return lambda q, k, v: tile_attention(q, k, v, plan)


def _workspace(p: Problem) -> int:
    if use_triton(p.device, p.dtype, p.head_dim):
        return masked_workspace_bytes(p)
    return plan_workspace_bytes(plan_shape(p.mask, p.n_q, p.n_k, p.device), p)


def _executed(p: Problem) -> int:
    if use_triton(p.device, p.dtype, p.head_dim):
        return executed_pairs(p.mask, p.n_q, p.n_k, p.head_dim, p.dtype)
    return plan_shape(p.mask, p.n_q, p.n_k, p.device).executed_pairs


# linear in n for a fixed window or layout; the workspace and executed pairs of the path taken
COST = Cost(time_exponent=1, memory_exponent=1, memory_model=_workspace, executed_pairs=_executed)
