"""The plan of the block-list (BigBird) kernels (the band's is :mod:`.band_plan`, both as device
tables :mod:`.plan_tables`): their iteration spaces, built on the host once per (spec, n_q, n_k):
CSR lists, per query block, of the key blocks to visit, the ones that need no mask first
(``starts[row], mids[row], ends[row]`` split them), and the transpose for dK/dV; and their entry
count in O(number of blocks), for executed pairs before a point runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from harness.mask_features import globals as globals_
from harness.mask_features.bigbird_blocks import folded_layout, global_blocks
from harness.masks import MaskSpec


@dataclass(frozen=True)
class BlockPlan:
    """CSR lists for a BigBird layout, on the host (int32 tensors; ``.to(device)`` for use).

    Forward/dQ: query block ``row`` starts at absolute position ``q_pos[row]`` and visits key
    blocks starting at ``cols[starts[row]:ends[row]]`` (absolute key positions); entries before
    ``mids[row]`` need no mask. ``order`` lists rows longest first (global rows go first so
    they do not form a tail). dK/dV: the same with key blocks as rows (``t_*``)."""

    block: int
    q_pos: Tensor
    starts: Tensor
    mids: Tensor
    ends: Tensor
    cols: Tensor
    order: Tensor
    t_pos: Tensor
    t_starts: Tensor
    t_mids: Tensor
    t_ends: Tensor
    t_cols: Tensor
    t_order: Tensor

    def to(self, device: torch.device | str) -> BlockPlan:
        fields = {k: getattr(self, k) for k in self.__dataclass_fields__}
        moved = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in fields.items()}
        return BlockPlan(**moved)

    @property
    def n_entries(self) -> int:
        return int(self.cols.numel())


def _csr(rows: list[int], entries: list[list[tuple[int, bool]]]) -> tuple[Tensor, ...]:
    """(pos, starts, mids, ends, cols, order) from per-row lists of (position, needs_mask)."""
    starts, mids, ends, cols = [], [], [], []
    for row in entries:
        row = sorted(row, key=lambda e: (e[1], e[0]))  # mask-free entries first
        starts.append(len(cols))
        mids.append(len(cols) + sum(not m for _, m in row))
        cols.extend(pos for pos, _ in row)
        ends.append(len(cols))
    lengths = torch.tensor([e - s for s, e in zip(starts, ends, strict=True)], dtype=torch.int64)
    order = torch.argsort(-lengths, stable=True)
    as_i32 = lambda x: torch.tensor(x, dtype=torch.int32)
    return as_i32(rows), as_i32(starts), as_i32(mids), as_i32(ends), as_i32(cols), order.int()


def block_reasons(spec: MaskSpec) -> list[str]:
    """Why the block-list kernels cannot run ``spec`` (empty: they can)."""
    unsupported = sorted({"documents", "prefix"} & spec.features)
    return [f"mask features {unsupported} with block_size are not in the fused kernels"] * bool(
        unsupported
    )


@lru_cache(maxsize=32)
def block_plan(spec: MaskSpec, n_q: int, n_k: int, tile: int) -> BlockPlan:
    """CSR lists of a BigBird layout for kernel tiles of ``tile >= block_size`` lanes.

    A (query block, key block) entry needs a mask when it straddles the causal diagonal, or its
    key or query block is cut by ``n_k`` or by the first query row, or the tile is wider than
    the layout block (padding lanes)."""
    if spec.block_size is None:
        raise ValueError("block_plan needs block_size")
    b, off = spec.block_size, n_k - n_q
    layout = folded_layout(spec, n_q, n_k)  # global blocks' rows and columns set
    nb = layout.shape[0]
    g_blocks = global_blocks(spec)
    padded = tile != b or n_k % b != 0
    rows, entries = [], []
    first_qb = math.floor(off / b)  # query blocks start at absolute position qb * b
    for qb in range(first_qb, math.ceil(n_k / b)):
        if qb < 0:  # rows before the first key: only global keys, never under causality
            cols = [] if spec.causal else (list(range(nb)) if globals_.row_zero(spec) else g_blocks)
        else:
            keep = layout[qb].clone()
            if spec.causal:
                keep[qb + 1 :] = False
            cols = keep.nonzero().flatten().tolist()
        rows.append(qb * b)
        cut = padded or qb * b < off  # a query block cut by the first row is masked too
        entries.append([(kb * b, cut or (spec.causal and kb == qb)) for kb in cols])
    fwd = _csr(rows, entries)
    by_key: dict[int, list[tuple[int, bool]]] = {kb * b: [] for kb in range(nb)}
    for q_pos, row in zip(rows, entries, strict=True):
        for k_pos, masked in row:
            by_key[k_pos].append((q_pos, masked))
    bwd = _csr(list(by_key), list(by_key.values()))
    return BlockPlan(b, *fwd, *bwd)


def block_tile(block_size: int) -> int:
    """Kernel tile (rows = keys) for a layout block: a power of two >= 16 (``tl.dot``)."""
    return max(16, 1 << (block_size - 1).bit_length())


def block_entry_count(spec: MaskSpec, n_q: int, n_k: int) -> int:
    """CSR entries (query block, key block) of :func:`block_plan`, in O(number of blocks): per
    query block its sliding blocks, the global blocks outside them and ``random_blocks`` among
    the rest (as :func:`harness.masks.block_layout` draws them), causality cutting the future."""
    b, off = spec.block_size, n_k - n_q
    nb = max(math.ceil(n_k / b), 1)
    g_blocks = torch.tensor(global_blocks(spec), dtype=torch.int64)
    qb = torch.arange(max(math.floor(off / b), 0), math.ceil(n_k / b), dtype=torch.int64)
    reach = qb + 1 if spec.causal else torch.full_like(qb, nb)  # key blocks [0, reach) allowed
    w_lo = (qb - spec.left).clamp(min=0) if spec.left is not None else torch.zeros_like(qb)
    w_hi = torch.minimum((qb + spec.right + 1) if spec.right is not None else reach, reach)
    window = (w_hi - w_lo).clamp(min=0)
    in_window = ((g_blocks[None, :] >= w_lo[:, None]) & (g_blocks[None, :] < w_hi[:, None])).sum(1)
    allowed_g = (g_blocks[None, :] < reach[:, None]).sum(1)
    count = window + allowed_g - in_window
    if spec.random_blocks:  # drawn among the blocks not already taken, the future excluded
        free = reach - count
        count = count + free.clamp(min=0).clamp(max=spec.random_blocks)
    is_global = torch.isin(qb, g_blocks)
    count = torch.where(is_global, reach, count)
    before = 0  # query blocks before the first key (n_q > n_k)
    first_qb = math.floor(off / b)
    if first_qb < 0 and not spec.causal:
        before = -first_qb * (nb if globals_.row_zero(spec) else len(g_blocks))
    return int(count.sum()) + before


def block_executed_pairs(spec: MaskSpec, n_q: int, n_k: int) -> int:
    """Lanes computed per (batch, head): one ``tile × tile`` product per CSR entry."""
    return block_entry_count(spec, n_q, n_k) * block_tile(spec.block_size) ** 2
