"""``bigbird``: BigBird block-sparse attention (Zaheer et al. 2020) computed block by block.

The layout is :func:`harness.masks.block_layout`, the very one ``dense_mask`` describes: sliding
blocks (``window`` counted in blocks), ``random_blocks`` seeded random key blocks per query
block, and global blocks (``global_tokens`` whole blocks: the first ones, or named ones such as
HF BigBird's first and last blocks) that attend to and are attended by everything.
Each query block is one tile whose keys are the blocks of its layout row (runs of adjacent
blocks stay views, others are gathered), so the executed pairs are exactly the layout's
blocks: O(n·b·(2w + 1 + r + g/b)). Causal drops future blocks and masks the diagonal.

On CUDA (fp32/fp16/bf16) the fused Triton kernels
(:mod:`implementations._kernels.triton.fused_attention`) run the same layout as CSR lists of
key blocks per query block (one launch; the transposed lists for dK/dV); CPU and float64 keep
the tile path.
"""

from __future__ import annotations

from torch import Tensor

from harness.masks import MaskSpec
from harness.registry import register
from harness.spec import FLOAT_DTYPES, AttnFn, Capabilities, Cost, Problem
from implementations._kernels.tiles.tile_attention import (
    device_plan,
    plan_shape,
    plan_workspace_bytes,
    tile_attention,
)
from implementations._kernels.triton.fused_attention import (
    executed_pairs,
    fused_reasons,
    fused_workspace_bytes,
    prepare_tables,
    triton_attention,
    use_triton,
)


def _prepare(problem: Problem) -> AttnFn:
    """Build the block layout and tiles outside the timed call."""
    if use_triton(problem.device, problem.dtype, problem.head_dim):
        mask = problem.mask
        prepare_tables(problem)
        return lambda q, k, v: triton_attention(q, k, v, mask)
    plan = device_plan(problem.mask, problem.n_q, problem.n_k, problem.dtype, problem.device)
    return lambda q, k, v: tile_attention(q, k, v, plan)


def _reasons(p: Problem) -> list[str]:
    return fused_reasons(p) if p.mask.block_size is not None else ["bigbird needs block_size"]


def _workspace(p: Problem) -> int:
    if use_triton(p.device, p.dtype, p.head_dim):
        return fused_workspace_bytes(p)
    return plan_workspace_bytes(plan_shape(p.mask, p.n_q, p.n_k, p.device), p)


def _executed(p: Problem) -> int:
    if use_triton(p.device, p.dtype, p.head_dim):
        return executed_pairs(p.mask, p.n_q, p.n_k, p.head_dim, p.dtype)
    return plan_shape(p.mask, p.n_q, p.n_k, p.device).executed_pairs


@register(
    "bigbird",
    family="block-sparse",
    caps=Capabilities(
        dtypes=FLOAT_DTYPES,
        mask_features={"causal", "window", "global", "global_positions", "block_sparse"},
    ),
    cost=Cost(
        time_exponent=1, memory_exponent=1, memory_model=_workspace, executed_pairs=_executed
    ),
    description="BigBird block-sparse: sliding, global and random blocks, layout blocks only",
    extra_reasons=_reasons,
    prepare=_prepare,
)
def bigbird_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float | None = None
) -> Tensor:
    """q: (B, H, n_q, D), k/v: (B, H, n_k, D) -> (B, H, n_q, D); needs ``mask.block_size``."""
    if mask.block_size is None:
        raise ValueError("bigbird needs mask.block_size")
    if use_triton(q.device, q.dtype, q.shape[-1]):
        return triton_attention(q, k, v, mask, scale)
    plan = device_plan(mask, q.shape[-2], k.shape[-2], q.dtype, str(q.device))
    return tile_attention(q, k, v, plan, scale)
