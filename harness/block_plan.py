"""The one block plan: for each (query block, key block) pair, skipped, full or partial.

Built from :func:`harness.masks.block_pair_counts`, the exact kept-pair count of every block
that keeps one, in closed form from the feature modules' parts of :func:`harness.masks.
pair_rule` (never the n_q x n_k grid): a block absent from the plan is skipped, one whose
count fills the whole ``block_q x block_k`` tile is full (no element predicate runs), any
other is partial (the dense rule, :func:`harness.masks.keep_pairs`, decides each element; a
block cut short by the sequence's end is partial, its padding lanes masked). A predicate
feature's classification (:mod:`harness.mask_features.predicate`) drops the blocks it skips,
and its partial blocks are counted element by element, so the counts stay exact.

Readers: Flex's ``BlockMask`` (:mod:`implementations._flex_masks`) and the executed-pair
counts of block-granular paths (:attr:`BlockPlan.executed_pairs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

from harness.mask_features.predicate import FULL, PARTIAL, SKIP
from harness.masks import block_pair_counts

__all__ = ["FULL", "PARTIAL", "SKIP", "BlockPlan", "block_plan"]


@dataclass(frozen=True)
class BlockPlan:
    """The listed blocks of a (n_q, n_k) grid of ``block_q x block_k`` blocks: query block
    ``qb``, key block ``kb`` and exact kept-pair ``count``, int64 arrays (listed,), row-major."""

    n_q: int
    n_k: int
    block_q: int
    block_k: int
    qb: np.ndarray
    kb: np.ndarray
    count: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        """(query blocks, key blocks)."""
        return -(-self.n_q // self.block_q), -(-self.n_k // self.block_k)

    @property
    def full(self) -> np.ndarray:
        """bool (listed,): every pair of the whole tile is kept (no predicate needed)."""
        return self.count == self.block_q * self.block_k

    @property
    def executed_pairs(self) -> int:
        """Pairs a block-skipping kernel computes per (batch, head): every listed block at its
        size clipped to the sequence."""
        heights = np.minimum(self.block_q, self.n_q - self.qb * self.block_q)
        widths = np.minimum(self.block_k, self.n_k - self.kb * self.block_k)
        return int((heights * widths).sum())

    def states(self) -> Tensor:
        """int8 (query blocks, key blocks): SKIP, PARTIAL or FULL per block pair."""
        out = torch.zeros(self.shape, dtype=torch.int8)
        state = np.where(self.full, FULL, PARTIAL).astype(np.int8)
        out[torch.from_numpy(self.qb), torch.from_numpy(self.kb)] = torch.from_numpy(state)
        return out


@lru_cache(maxsize=64)
def block_plan(spec, n_q: int, n_k: int, block_q: int, block_k: int) -> BlockPlan:
    """The block plan of ``spec`` over n_q queries and n_k keys. O(candidate blocks)."""
    qb, kb, count = block_pair_counts(spec, n_q, n_k, block_q, block_k)
    return BlockPlan(n_q, n_k, block_q, block_k, qb, kb, count)
