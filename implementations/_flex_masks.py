"""FlexAttention's ``mask_mod`` and ``BlockMask`` for a :class:`harness.masks.MaskSpec`: an
adapter over the mask's one geometry, with no geometry of its own.

- ``mask_mod`` is :func:`harness.masks.pair_keep` (the feature modules' clauses composed, as
  the dense rule composes them) on Flex's index tensors: the absolute query position is
  ``q_idx + n_k - n_q``. Those clauses are built on the spec's numbers as Python constants and
  hold only what the spec uses (no modulo without dilation, a bit mask for power-of-two
  dilations and documents, no unbounded window side, causality folded into the window when
  nothing is OR-ed in between); a table is captured only where constants cannot say it
  (unequal documents: int32 starts; more than four global runs: one bool table; a BigBird
  layout). A mask mod that read its numbers from a captured int64 tensor and evaluated every
  clause ran 25x slower on an H100 on the identical block layout (docs/FACTS).
- The ``BlockMask`` is :func:`harness.block_plan.block_plan` at Flex's 128 x 128 blocks:
  its partial blocks become ``kv_num_blocks``/``kv_indices``, its full blocks (no mask_mod
  runs there) ``full_kv_num_blocks``/``full_kv_indices``. The plan counts the candidate
  blocks in closed form (never the n_q x n_k grid), and a predicate feature's classification
  has already dropped the blocks it empties.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from harness.block_plan import BlockPlan, block_plan
from harness.masks import MaskSpec, pair_keep

if TYPE_CHECKING:  # the module pulls in torch._dynamo: imported where a mask is built
    from torch.nn.attention.flex_attention import BlockMask

BLOCK = 128  # FlexAttention's default (query, key) block size

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


@lru_cache(maxsize=256)
def mask_mod_for(spec: MaskSpec, n_q: int, n_k: int, device: str) -> MaskMod:
    """A FlexAttention ``mask_mod(b, h, q_idx, kv_idx) -> bool`` equal to ``dense_mask``
    (cached: the same key gives the same function, so a repeated point never recompiles)."""
    if spec.is_dense:
        from torch.nn.attention.flex_attention import noop_mask

        return noop_mask
    keep, off = pair_keep(spec, n_q, n_k, device), n_k - n_q

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return keep(q_idx + off if off else q_idx, kv_idx)

    # ``mask_causal_window_255_0_off0`` style: names the kernel in dynamo's and inductor's logs
    mask_mod.__name__ = re.sub(r"\W+", "_", f"mask_{spec.describe()}_off{off}")
    return mask_mod


def flex_plan(spec: MaskSpec, n_q: int, n_k: int) -> BlockPlan:
    """The block plan at Flex's block size."""
    return block_plan(spec, n_q, n_k, BLOCK, BLOCK)


@lru_cache(maxsize=32)
def block_counts(spec: MaskSpec, n_q: int, n_k: int) -> tuple[Tensor, Tensor, int]:
    """Per (128-query block, 128-key block) of the block plan: ``any`` kept pair and ``full``
    (all kept, block wholly inside the sequence), each bool (n_qb, n_kb); plus the executed
    pairs (every listed block at its clipped size). O(candidate blocks)."""
    plan = flex_plan(spec, n_q, n_k)
    any_ = torch.zeros(plan.shape, dtype=torch.bool)
    any_[torch.from_numpy(plan.qb), torch.from_numpy(plan.kb)] = True
    full = torch.zeros(plan.shape, dtype=torch.bool)
    full[torch.from_numpy(plan.qb[plan.full]), torch.from_numpy(plan.kb[plan.full])] = True
    return any_, full, plan.executed_pairs


def _kv_lists(plan: BlockPlan, which: np.ndarray, device: str) -> tuple[Tensor, Tensor]:
    """The plan's blocks selected by ``which`` (bool (listed,)) as Flex's lists:
    ``kv_num_blocks`` (1, 1, n_qb) and ``kv_indices`` (1, 1, n_qb, n_kb) int32, each row's key
    blocks first in ascending order (the plan is row-major), the rest of the row zeros."""
    n_qb, n_kb = plan.shape
    qb, kb = plan.qb[which], plan.kb[which]
    num = np.bincount(qb, minlength=n_qb)
    slot = np.arange(qb.size) - (np.cumsum(num) - num)[qb]  # rank inside its row
    indices = np.zeros((n_qb, n_kb), np.int32)
    indices[qb, slot] = kb
    as_kv = lambda x: torch.from_numpy(x.astype(np.int32))[None, None].to(device)
    return as_kv(num), as_kv(indices)


def build_block_mask(spec: MaskSpec, n_q: int, n_k: int, device: str) -> BlockMask:
    """The FlexAttention BlockMask for ``spec``, without materializing the n_q × n_k mask."""
    from torch.nn.attention.flex_attention import BlockMask

    plan = flex_plan(spec, n_q, n_k)
    kv_num, kv_idx = _kv_lists(plan, ~plan.full, device)
    full_num, full_idx = _kv_lists(plan, plan.full, device)
    return BlockMask.from_kv_blocks(
        kv_num,
        kv_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=BLOCK,
        mask_mod=mask_mod_for(spec, n_q, n_k, device),
        seq_lengths=(n_q, n_k),
    )
