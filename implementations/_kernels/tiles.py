"""Tile plans for sparse attention: which query rows meet which key ranges, built once per shape.

A :class:`Plan` lists tiles. A tile is a run of query rows plus the key ranges those rows may
need; a bias of 0/-inf inside the tile removes the pairs the mask drops. Every kept pair of
:func:`harness.masks.mask_rows` lies in exactly one tile, so the kernel in
:mod:`implementations._kernels.tilekernel` computes exactly the masked softmax while touching only
``sum(rows * keys)`` pairs: the executed pairs at tile granularity.

Dilation is handled by residue classes: query position ``p`` only keeps keys with
``j ≡ p (mod d)``, so permuting queries and keys into ``d`` classes turns a dilated window into
``d`` contiguous undilated bands (``Plan.classes = d``: plan rows are the queries of class 0,
then class 1, ...; likewise the keys). That is what makes the cost O(n·w) instead of O(n·w·d).

Rows with no kept key are in no tile: their output stays zero. Only rows before the first key
(``p < 0``, when ``n_q > n_k``) can be empty: every other row keeps its own position (``rel = 0``
is in every window, every dilation class and every layout's diagonal block). Plan building
asserts that no tile row is empty, so a disagreement with the mask fails loudly, not as NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from harness.masks import MaskSpec, block_layout, keep_pairs

BAND_BLOCK = 64  # query rows per band tile: (64, 64 + w) tiles measured fastest on 2-core CPU

Ranges = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Tile:
    """Query rows ``[r0, r1)`` (in ``Plan.q_index`` order) against the concatenated key ranges.

    ``bias``: (r1 - r0, n_cols) 0/-inf in the plan's dtype, or None when every pair is kept.
    """

    r0: int
    r1: int
    keys: Ranges
    bias: Tensor | None

    @property
    def n_cols(self) -> int:
        return sum(b - a for a, b in self.keys)


@dataclass(frozen=True)
class Plan:
    """Tiles over rows and keys in class order: with ``classes = d`` the plan's rows are the
    queries with ``p ≡ 0 (mod d)`` (ascending), then ``p ≡ 1``, ...; its keys likewise by
    ``j mod d``. ``classes = 1`` is the identity order."""

    n_q: int
    n_k: int
    tiles: tuple[Tile, ...]
    classes: int = 1

    @property
    def executed_pairs(self) -> int:
        """(query, key) pairs computed per (batch, head), counting masked pairs inside tiles."""
        return sum((t.r1 - t.r0) * t.n_cols for t in self.tiles)

    @property
    def covers_all_rows(self) -> bool:
        """Whether every query row is in some tile (else the others must be zeroed)."""
        return sum(t.r1 - t.r0 for t in self.tiles) == self.n_q

    def to(self, device: torch.device | str) -> Plan:
        """The same plan with its bias tensors on ``device``."""
        tiles = tuple(
            Tile(t.r0, t.r1, t.keys, None if t.bias is None else t.bias.to(device))
            for t in self.tiles
        )
        return Plan(self.n_q, self.n_k, tiles, self.classes)


class _BiasMaker:
    """Turns keep masks into 0/-inf biases, sharing one tensor among equal masks (band tiles
    in the interior of the sequence all have the same pattern: memory O(w²), not O(n·w))."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        self.cache: dict[tuple, Tensor] = {}

    def __call__(self, keep: Tensor) -> Tensor | None:
        if not bool(keep.any(-1).all()):
            raise AssertionError("a tile row keeps no key: plan and mask disagree")
        if bool(keep.all()):
            return None
        key = (tuple(keep.shape), keep.numpy().tobytes())
        if key not in self.cache:
            bias = torch.zeros(keep.shape, dtype=self.dtype)
            self.cache[key] = bias.masked_fill_(~keep, float("-inf"))
        return self.cache[key]


def _merge(ranges: list[tuple[int, int]]) -> Ranges:
    """Drop empty ranges and join touching neighbours, so a band stays one view, not a copy."""
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        if b <= a:
            continue
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return tuple(out)


def _cols(keys: Ranges, k_index: Tensor | None) -> Tensor:
    """Original key indices of a tile's concatenated ranges, (1, n_cols)."""
    cols = torch.cat([torch.arange(a, b) for a, b in keys])
    return (cols if k_index is None else k_index[cols])[None, :]


@lru_cache(maxsize=32)
def window_plan(
    spec: MaskSpec, n_q: int, n_k: int, dtype: torch.dtype = torch.float32, block: int = BAND_BLOCK
) -> Plan:
    """Band tiles for window + causal + dilation + global tokens (no ``block_size``).

    Per residue class r (p ≡ j ≡ r mod d), class coordinates a = (p - r) / d, c = (j - r) / d
    turn the dilated window into the band ``a - left <= c <= a + right``. A tile of ``block``
    consecutive class queries takes the key span of its first and last query, plus the global
    keys of every class; the first ``g`` positions (global rows) take every key.
    """
    d, off, g = spec.dilation, n_k - n_q, spec.global_tokens
    left, right = spec.left, spec.right
    if spec.causal:
        right = 0 if right is None else min(right, 0)
    p_all = torch.arange(n_q) + off
    j_all = torch.arange(n_k)
    q_order = torch.cat([p_all[(p_all - r) % d == 0] - off for r in range(d)])
    k_order = torch.cat([j_all[(j_all - r) % d == 0] for r in range(d)])
    k_start = [0]  # where class r's keys begin in the permuted key order
    for r in range(d):
        k_start.append(k_start[-1] + len(range(r, n_k, d)))
    globals_ = [
        (k_start[r], k_start[r] + min(max(math.ceil((g - r) / d), 0), k_start[r + 1] - k_start[r]))
        for r in range(d)
    ]
    make_bias, tiles = _BiasMaker(dtype), []
    row = 0
    for r in range(d):
        rows = q_order[(q_order + off - r) % d == 0]  # class r's query rows, ascending
        n_keys = k_start[r + 1] - k_start[r]
        first_a = (int(rows[0]) + off - r) // d if len(rows) else 0
        a = torch.arange(len(rows)) + first_a  # class coordinates of the rows
        empty = _empty_rows(spec, a, rows + off, right, n_keys)
        starts = _row_runs(rows + off, empty, g, block)
        for s, e, is_global in starts:
            if is_global:
                keys = ((0, n_k),)
            else:
                a0, a1 = first_a + s, first_a + e - 1  # class coordinates of the run's ends
                lo = max(0 if left is None else a0 - left, globals_[r][1] - k_start[r])
                hi = min(n_keys - 1 if right is None else a1 + right, n_keys - 1)
                keys = _merge([*globals_, (k_start[r] + lo, k_start[r] + hi + 1)])
            p = (rows[s:e] + off)[:, None]
            keep = keep_pairs(spec, n_q, n_k, p, _cols(keys, None if d == 1 else k_order))
            tiles.append(Tile(row + s, row + e, keys, make_bias(keep)))
        row += len(rows)
    return Plan(n_q, n_k, tuple(tiles), classes=d)


def _empty_rows(spec: MaskSpec, a: Tensor, p: Tensor, right: int | None, n_keys: int) -> int:
    """How many of a class's first rows keep no key (they form a prefix: keys only shrink as
    p falls). a: class coordinates, p: positions, both ascending; ``right`` in class steps."""
    if spec.causal:
        return int((p < 0).sum())  # p >= 0 keeps itself; p < 0 sees no key at or before it
    if spec.global_tokens:
        return 0  # p < 0 < g: a global row, keeps every key
    if n_keys == 0:
        return len(p)
    return 0 if right is None else int((a + right < 0).sum())


def _row_runs(p: Tensor, empty: int, g: int, block: int) -> list[tuple[int, int, bool]]:
    """Split one class's rows (positions p, ascending) into runs (start, end, is_global):
    the first ``empty`` rows are skipped; global rows (p < g) and band rows never share a run."""
    n_global = max(int((p < g).sum()), empty)
    runs = []
    for lo, hi, is_global in ((empty, n_global, True), (n_global, len(p), False)):
        for s in range(lo, hi, block):
            runs.append((s, min(s + block, hi), is_global))
    return runs


@lru_cache(maxsize=32)
def bigbird_plan(spec: MaskSpec, n_q: int, n_k: int, dtype: torch.dtype = torch.float32) -> Plan:
    """One tile per BigBird query block: the key blocks of its layout row, the global key
    blocks (every block for a global query block), causal future blocks dropped."""
    if spec.block_size is None:
        raise ValueError("bigbird_plan needs block_size")
    b, off = spec.block_size, n_k - n_q
    layout = block_layout(spec, n_q, n_k)
    nb, g_blocks = layout.shape[0], spec.global_tokens // b
    kb = torch.arange(nb)
    make_bias, tiles = _BiasMaker(dtype), []
    if spec.global_tokens and not spec.causal:  # rows before the first key (p < 0) are global
        for r0 in range(0, min(-off, n_q), b):
            r1 = min(r0 + b, -off, n_q)
            tiles.append(Tile(r0, r1, ((0, n_k),), None))
    for qb in range(nb):
        r0, r1 = max(qb * b - off, 0), min((qb + 1) * b - off, n_q)
        if r1 <= r0:
            continue
        cols = torch.ones(nb, dtype=torch.bool) if qb < g_blocks else layout[qb] | (kb < g_blocks)
        if spec.causal:
            cols &= kb <= qb
        keys = _merge([(int(c) * b, min((int(c) + 1) * b, n_k)) for c in cols.nonzero().flatten()])
        # Inside the gathered blocks the layout and global rules keep every pair: only
        # causality masks (the diagonal block). Tests hold this against dense_mask.
        p = (torch.arange(r0, r1) + off)[:, None]
        cols = _cols(keys, None)
        keep = cols <= p if spec.causal else torch.ones(len(p), cols.shape[1], dtype=torch.bool)
        tiles.append(Tile(r0, r1, keys, make_bias(keep)))
    return Plan(n_q, n_k, tuple(tiles))


def band_block(device: str) -> int:
    """Query rows per band tile: 64 on CPU (measured best: less masked waste than 128, GEMMs
    still efficient); 256 on GPUs, where each tile's kernel launches, not its FLOPs, set the
    pace."""
    return BAND_BLOCK if torch.device(device).type == "cpu" else 256


def tile_plan(spec: MaskSpec, n_q: int, n_k: int, dtype: torch.dtype, device: str) -> Plan:
    """The plan of a mask for a device, on the host: BigBird's layout tiles when
    ``spec.block_size`` is set, else the band tiles of :func:`band_block` rows."""
    if spec.block_size is not None:
        return bigbird_plan(spec, n_q, n_k, dtype)
    return window_plan(spec, n_q, n_k, dtype, band_block(device))


@lru_cache(maxsize=32)
def device_plan(spec: MaskSpec, n_q: int, n_k: int, dtype: torch.dtype, device: str) -> Plan:
    """:func:`tile_plan` with its tensors moved to ``device``, cached (built once, outside the
    timed calls)."""
    return tile_plan(spec, n_q, n_k, dtype, device).to(device)
