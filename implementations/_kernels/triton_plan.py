"""Iteration spaces of the fused Triton kernels, built on the host once per (spec, n_q, n_k).

No Triton here: these are small int32 tables the kernels read, plus the executed-pair count at
the kernel's block granularity.

Band masks (``flash-tiled`` full/causal, ``local``, ``dilated``, ``longformer``) are described by
*slots*. A slot is a set of query rows in class coordinates: positions ``p = r + step·a`` for
``a`` in ``[a_start, a_start + n_rows)`` (query row ``i = p - off``), attending to keys
``j = r + step·c`` for ``c`` in ``[k_start, k_end)`` with ``lo_rel <= c - a <= hi_rel``. With
dilation d, class r (``p ≡ j ≡ r mod d``) is a slot with ``step = d``: the dilated window is a
plain band there, and the kernel loads its rows with stride ``d·stride_n`` (no permutation).
Global tokens add one slot for the global query rows (``p < g``: every key, causality kept) and,
in each class slot, a segment over the global keys ``j < g`` (all classes see them).

The backward's dK/dV kernel iterates the transposed space: *key slots*, one per class (keys
``j >= g`` of the class, seeing the class's band rows and every global row) and one for the
global keys (seen by every query row).

BigBird layouts become CSR lists: per query block the key blocks to visit, the ones that need
no mask first (``starts[row], mids[row], ends[row]`` split them), and the transpose for dK/dV.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from harness.masks import MaskSpec, block_layout

SLOT_FIELDS = 9  # r, step, a_start, n_rows, k_start, k_end, lo_rel, hi_rel, global_segment


def ceil_div(a: int, b: int) -> int:
    """Ceiling of a / b for positive b."""
    return -((-a) // b)


@dataclass(frozen=True)
class BandPlan:
    """Row slots (forward, dQ) and key slots (dK/dV) of a band mask, as int rows."""

    n_q: int
    n_k: int
    big: int  # stands for an unbounded window side
    hg: int  # how far right of p a global key/row may be: 0 if causal else ``big``
    g: int  # global tokens
    slots: tuple[tuple[int, ...], ...]
    key_slots: tuple[tuple[int, ...], ...]
    n_global_rows: int  # rows i in [0, n_global_rows) are global (p < g)

    @property
    def max_rows(self) -> int:
        return max((s[3] for s in self.slots), default=0)

    @property
    def max_keys(self) -> int:
        return max((s[3] - s[2] for s in self.key_slots), default=0)


@lru_cache(maxsize=64)
def band_plan(spec: MaskSpec, n_q: int, n_k: int) -> BandPlan:
    """The slots of a window/causal/dilation/global mask (no ``block_size``)."""
    if spec.block_size is not None:
        raise ValueError("band_plan is for masks without block_size")
    d, g, off = spec.dilation, spec.global_tokens, n_k - n_q
    big = 2 * (n_q + n_k) + 2
    left, right = spec.left, spec.right
    if spec.causal:
        right = 0 if right is None else min(right, 0)
    lo_rel = -big if left is None else -left
    hi_rel = big if right is None else right
    hg = 0 if spec.causal else big
    n_glob = max(0, min(n_q, g - off)) if g else 0
    slots, key_slots = [], []
    if n_glob:
        slots.append((0, 1, off, n_glob, 0, n_k, -big, hg, 0))
    first_p = max(off, g) if g else off  # rows p < g belong to the global slot
    for r in range(d):
        a_start = ceil_div(first_p - r, d)
        n_rows = max(0, (n_k - 1 - r) // d - a_start + 1)
        nk = max(0, ceil_div(n_k - r, d))
        gk = min(max(ceil_div(g - r, d), 0), nk)  # class keys below g: in the global segment
        slots.append((r, d, a_start, n_rows, gk, nk, lo_rel, hi_rel, int(g > 0)))
        key_slots.append((r, d, gk, nk, a_start, n_rows, lo_rel, hi_rel, int(n_glob > 0)))
    if g and n_k:
        key_slots.insert(0, (0, 1, 0, min(g, n_k), off, n_q, -big, hg, 0))
    return BandPlan(n_q, n_k, big, hg, g, tuple(slots), tuple(key_slots), n_glob)


def _ranges(x0, x1, lo_rel, hi_rel, lo_bound, hi_bound, block: int):
    """The forward loop bounds (mirrors ``_kernels._band_ranges``), numpy-free ints or tensors:
    for rows [x0, x1] the partner range [lo, hi_x) and its mask-free middle [mid, post)."""
    lo = torch.clamp(x0 + lo_rel, min=lo_bound)
    hi_x = torch.clamp(x1 + hi_rel + 1, max=hi_bound)
    safe_lo = torch.maximum(x1 + lo_rel, lo)
    safe_hi = torch.minimum(x0 + hi_rel + 1, hi_x)
    mid = lo + torch.div((safe_lo - lo).clamp_min(0) + block - 1, block, rounding_mode="floor")
    mid = lo + (mid - lo) * block
    return lo, hi_x, mid, safe_hi


def band_executed_pairs(plan: BandPlan, block_m: int, block_n: int) -> int:
    """(query, key) lanes the forward kernel computes per (batch, head): every program's
    ``block_m`` rows times ``block_n`` keys per key block it visits (masked lanes included)."""
    total = 0
    for r, step, a_start, n_rows, k_start, k_end, lo_rel, hi_rel, glob in plan.slots:
        if n_rows <= 0:
            continue
        a0 = torch.arange(a_start, a_start + n_rows, block_m, dtype=torch.int64)
        a1 = torch.clamp(a0 + block_m, max=a_start + n_rows) - 1
        lo, hi_x, _, _ = _ranges(a0, a1, lo_rel, hi_rel, k_start, k_end, block_m)
        blocks = torch.div((hi_x - lo).clamp_min(0) + block_n - 1, block_n, rounding_mode="floor")
        if glob:
            p_last = r + step * a1
            g_hi = torch.clamp(p_last + plan.hg + 1, max=min(plan.g, plan.n_k)).clamp_min(0)
            blocks = blocks + torch.div(g_hi + block_n - 1, block_n, rounding_mode="floor")
        total += int(blocks.sum()) * block_m * block_n
    return total


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


@lru_cache(maxsize=32)
def block_plan(spec: MaskSpec, n_q: int, n_k: int, tile: int) -> BlockPlan:
    """CSR lists of a BigBird layout for kernel tiles of ``tile >= block_size`` lanes.

    A (query block, key block) entry needs a mask when it straddles the causal diagonal, or its
    key block is cut by ``n_k``, or the tile is wider than the layout block (padding lanes)."""
    if spec.block_size is None:
        raise ValueError("block_plan needs block_size")
    b, off, g = spec.block_size, n_k - n_q, spec.global_tokens
    layout = block_layout(spec, n_q, n_k)
    nb, g_blocks = layout.shape[0], g // b
    padded = tile != b or n_k % b != 0
    rows, entries = [], []
    first_qb = math.floor(off / b)  # query blocks start at absolute position qb * b
    for qb in range(first_qb, math.ceil(n_k / b)):
        if qb < 0:  # rows before the first key: global (every key) unless causal
            cols = [] if (spec.causal or not g) else list(range(nb))
        else:
            keep = torch.ones(nb, dtype=torch.bool) if qb < g_blocks else layout[qb].clone()
            keep[:g_blocks] = True
            if spec.causal:
                keep[qb + 1 :] = False
            cols = keep.nonzero().flatten().tolist()
        rows.append(qb * b)
        entries.append([(kb * b, padded or (spec.causal and kb == qb)) for kb in cols])
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


def block_executed_pairs(plan: BlockPlan) -> int:
    """Lanes computed per (batch, head): one ``tile × tile`` product per CSR entry."""
    return plan.n_entries * block_tile(plan.block) ** 2
