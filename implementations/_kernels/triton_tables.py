"""Host side of the fused Triton kernels that needs no Triton: the index tables per
(spec, n_q, n_k, device), cached, and the autotuner's key of a problem.

The tables are :mod:`implementations._kernels.triton_plan`'s plans as int32 tensors on the device;
building them is the part of a first call that :func:`triton_attn.prepare_tables` moves out
of the timed region.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor

from harness.masks import MaskSpec
from implementations._kernels.triton_plan import (
    BandPlan,
    BlockPlan,
    band_plan,
    block_plan,
    block_tile,
)


def triton_next_pow2(x: int) -> int:
    """The smallest power of two >= x (1 for x <= 1)."""
    return 1 << max(x - 1, 0).bit_length()


def block_d(head_dim: int) -> int:
    """BLOCK_D of the kernels: the head dim padded to a power of two, at least 16."""
    return max(16, triton_next_pow2(head_dim))


def mode_key(mask: MaskSpec) -> int:
    """Autotuning bucket of the mask's iteration space."""
    if mask.block_size is not None:
        return 5
    if mask.global_tokens:
        return 4
    if mask.dilation > 1:
        return 3
    if mask.window not in (None, (None, None)):
        return 2
    return int(mask.causal)


def tune_key(mask: MaskSpec, n_q: int, n_k: int, head_dim: int, dtype: torch.dtype) -> tuple:
    """(mode, length bucket, BLOCK_D, dtype): the autotuner's key of a problem (the kernels'
    ``MODE_KEY``, ``n_bucket`` and ``BLOCK_D`` arguments, and the dtype Triton adds)."""
    return (mode_key(mask), triton_next_pow2(max(n_q, n_k)), block_d(head_dim), dtype)


@lru_cache(maxsize=64)
def band_tables(mask: MaskSpec, n_q: int, n_k: int, device: str) -> tuple[BandPlan, Tensor, Tensor]:
    """The band plan, its slots and its key slots as flat int32 tensors on ``device``."""
    plan = band_plan(mask, n_q, n_k)
    as_t = lambda rows: torch.tensor(rows, dtype=torch.int32, device=device).reshape(-1)
    return plan, as_t(plan.slots), as_t(plan.key_slots)


@lru_cache(maxsize=32)
def block_tables(mask: MaskSpec, n_q: int, n_k: int, device: str) -> BlockPlan:
    """The CSR block lists of a block-sparse mask (``mask.block_size`` set) on ``device``."""
    assert mask.block_size is not None
    return block_plan(mask, n_q, n_k, block_tile(mask.block_size)).to(device)
