"""``bigbird``: BigBird block-sparse attention (Zaheer et al. 2020) computed block by block.

The layout is :func:`harness.masks.block_layout`, the very one ``dense_mask`` describes: sliding
blocks (``window`` counted in blocks), ``random_blocks`` seeded random key blocks per query
block, and global blocks (``global_tokens`` whole blocks: the first ones, or named ones such as
HF BigBird's first and last blocks) that attend to and are attended by everything.
Each query block is one tile whose keys are the blocks of its layout row (runs of adjacent
blocks stay views, others are gathered), so the executed pairs are exactly the layout's
blocks: O(n·b·(2w + 1 + r + g/b)). Causal drops future blocks and masks the diagonal.

On CUDA (fp32/fp16/bf16) the fused Triton kernels
(:mod:`implementations._kernels.triton.masked_attention`) run the same layout as CSR lists of
key blocks per query block (one launch; the transposed lists for dK/dV); CPU and float64 keep
the tile path (both: :mod:`implementations._sparse_paths`).
"""

from __future__ import annotations

from torch import Tensor

from harness.masks import MaskSpec
from harness.registry import register
from harness.spec import FLOAT_DTYPES, Capabilities, Problem
from implementations._kernels.triton.masked_attention import masked_reasons
from implementations._sparse_paths import COST, prepare, sparse_attention


def _reasons(p: Problem) -> list[str]:
    return masked_reasons(p) if p.mask.block_size is not None else ["bigbird needs block_size"]


@register(
    "bigbird",
    family="block-sparse",
    caps=Capabilities(
        dtypes=FLOAT_DTYPES,
        mask_features={"causal", "window", "global", "global_positions", "block_sparse"},
    ),
    cost=COST,
    description="BigBird block-sparse: sliding, global and random blocks, layout blocks only",
    extra_reasons=_reasons,
    prepare=prepare,
)
def bigbird_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float | None = None
) -> Tensor:
    """q: (B, H, n_q, D), k/v: (B, H, n_k, D) -> (B, H, n_q, D); needs ``mask.block_size``."""
    if mask.block_size is None:
        raise ValueError("bigbird needs mask.block_size")
    return sparse_attention(q, k, v, mask, scale)
