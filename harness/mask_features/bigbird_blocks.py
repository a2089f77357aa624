"""BigBird block sparsity: pairs kept block by block (rule 1 of :mod:`harness.masks`, instead
of the window): sliding blocks, ``random_blocks`` seeded random key blocks per query block,
global tokens as whole blocks.

Where the field uses it: ``block_size = b`` with ``window`` counted in blocks and
``random_blocks``/``seed`` (Zaheer et al. 2020; HF ``BigBirdSelfAttention``); the
``bigbird`` and ``flex-blocksparse`` methods. Not with dilation or documents.

- Clause: :func:`clause`, one lookup in :func:`block_layout`.
- Count: :class:`harness.paircount.LayoutRule` over :func:`folded_layout`.
- Block plan: a layout block is full but for causality and the sequence's ends.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import torch
from torch import Tensor

from harness.mask_features import MaskError


@lru_cache(maxsize=64)
def block_layout(spec, n_q: int, n_k: int) -> Tensor:
    """The BigBird block layout, bool (n_blocks, n_blocks) over absolute block indices.

    Row = query block ``p // b``, column = key block ``j // b``. Holds the sliding blocks and the
    seeded random blocks; global tokens are added token-wise by the dense rule."""
    if spec.block_size is None:
        raise MaskError("block_layout needs block_size")
    b = spec.block_size
    nb = max(math.ceil(n_k / b), 1)
    qb = torch.arange(nb)[:, None]
    kb = torch.arange(nb)[None, :]
    rel = kb - qb
    layout = torch.ones(nb, nb, dtype=torch.bool)
    if spec.left is not None:
        layout &= rel >= -spec.left
    if spec.right is not None:
        layout &= rel <= spec.right
    if spec.random_blocks:
        g_blocks = sorted({x // b for x in spec.global_positions(nb * b)})
        for row in range(nb):
            taken = layout[row].clone()
            taken[g_blocks] = True
            if spec.causal:
                taken[row + 1 :] = True  # causally masked anyway: never spend a random block there
            candidates = (~taken).nonzero().flatten()
            if candidates.numel() == 0:
                continue
            gen = torch.Generator().manual_seed(spec.seed * 1_000_003 + row)
            pick = torch.randperm(candidates.numel(), generator=gen)[: spec.random_blocks]
            layout[row, candidates[pick]] = True
    return layout


def global_blocks(spec) -> list[int]:
    """The blocks the global runs cover (they are whole blocks)."""
    b = spec.block_size
    return sorted({x // b for a, e in spec.global_runs for x in range(a, e, b)})


def folded_layout(spec, n_q: int, n_k: int) -> Tensor:
    """:func:`block_layout` with the global blocks' rows and columns set, a copy."""
    layout = block_layout(spec, n_q, n_k).clone()
    g = global_blocks(spec)
    layout[g] = True
    layout[:, g] = True
    return layout


def clause(spec, n_q: int, n_k: int, device: str = "cpu") -> Callable[[Tensor, Tensor], Tensor]:
    """``(p, j) -> query block p // b keeps key block j // b`` in :func:`block_layout` (rows
    before the first key: no), one lookup in the flattened layout (a captured bool table);
    the block index is a shift when b is a power of two."""
    b = spec.block_size
    layout = block_layout(spec, n_q, n_k)
    nb = layout.shape[0]
    flat = layout.flatten().to(device)  # (nb * nb,)
    shift = b.bit_length() - 1 if b & (b - 1) == 0 else None
    before_first = n_q > n_k  # only then are there rows p < 0

    def keep(p: Tensor, j: Tensor) -> Tensor:
        qb, kb = (p >> shift, j >> shift) if shift is not None else (p // b, j // b)
        out = flat[qb.clamp(0, nb - 1) * nb + kb.clamp(0, nb - 1)]
        return out & (p >= 0) if before_first else out

    return keep
