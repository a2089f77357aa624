"""The plan of the CPU tile path: which query rows meet which key ranges, built once per shape.

A :class:`Plan` lists tiles. A tile is a run of query rows plus the key ranges those rows may
need; a bias of 0/-inf over some of its columns removes the pairs the mask drops. Every kept
pair of :func:`harness.masks.dense_mask` lies in exactly one tile, so the kernel in
:mod:`.tile_attention` computes exactly the masked softmax while touching only
``sum(rows * keys)`` pairs: the executed pairs at tile granularity.

- Predicate features (:mod:`harness.mask_features.predicate`) restrict the pairs of the tiles
  below: their torch predicate is part of every tile's bias (:func:`harness.masks.keep_pairs`),
  the tiles' key ranges stay those of the other rules.
- Window masks (window, causal, dilation, global tokens, prefix): the band tiles of
  :mod:`.tile_plan_band`, the plan's band part (dilation by residue classes: the plan's rows
  and keys are regrouped, ``Plan.q_order``/``k_order``).
- BigBird layouts: one tile per query block holding the key blocks of its layout row.
- Packed documents: each document is its own sequence (the mask's rule 5), so the plan is one
  document plan per document, shifted to where the document starts: the iteration space never
  meets a key outside the query's document, and executed pairs are ~Σ lᵢ·(its band), not n².
  Equal documents are folded into the batch instead (``Plan.fold``): one plan of one document
  over ``B·H·count`` slices, the same GEMMs a batch of separate sequences runs.

:func:`plan_shape` gives what predictions need (executed pairs, the largest tile) from the
geometry alone, in O(tiles) numpy work: no bias, no mask. Bias tensors are built only by
:func:`tile_plan`, for a run.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

from harness.mask_features import globals as globals_
from harness.mask_features.bigbird_blocks import folded_layout
from harness.mask_features.dilation import class_order
from harness.masks import MaskSpec, check_fits, keep_pairs
from implementations._kernels.tiles.tile_plan_band import BandTiles, Ranges, band_tiles

BAND_BLOCK = 64  # query rows per band tile: (64, 64 + w) tiles measured fastest on 2-core CPU


@dataclass(frozen=True)
class Tile:
    """Query rows ``[r0, r1)`` (plan order) against the concatenated key ranges (plan order).

    ``bias``: (r1 - r0, width) 0/-inf in the plan's dtype over the tile's columns
    ``[bias_at, bias_at + width)``; None when every pair is kept."""

    r0: int
    r1: int
    keys: Ranges
    bias: Tensor | None
    bias_at: int = 0

    @property
    def n_cols(self) -> int:
        return sum(b - a for a, b in self.keys)


@dataclass(frozen=True)
class Plan:
    """Tiles over plan rows and keys. ``q_order``/``k_order`` (long): the query row / key of
    each plan position (None = identity). ``fold = m > 1``: the tiles are one document's and
    the sequence is m equal documents, run as m batch slices."""

    n_q: int
    n_k: int
    tiles: tuple[Tile, ...]
    q_order: Tensor | None = None
    k_order: Tensor | None = None
    fold: int = 1

    @property
    def executed_pairs(self) -> int:
        """(query, key) pairs computed per (batch, head) of the whole sequence."""
        return self.fold * sum((t.r1 - t.r0) * t.n_cols for t in self.tiles)

    @property
    def covers_all_rows(self) -> bool:
        """Whether every query row is in some tile (else the others must be zeroed)."""
        return sum(t.r1 - t.r0 for t in self.tiles) == self.n_q

    def to(self, device: torch.device | str) -> Plan:
        """The same plan with its tensors on ``device``."""
        tiles = tuple(
            Tile(t.r0, t.r1, t.keys, None if t.bias is None else t.bias.to(device), t.bias_at)
            for t in self.tiles
        )
        q, k = (None if o is None else o.to(device) for o in (self.q_order, self.k_order))
        return Plan(self.n_q, self.n_k, tiles, q, k, self.fold)


@dataclass(frozen=True)
class PlanShape:
    """A plan's size without building it: executed pairs per (batch, head), the largest tile
    (rows x keys) and widest key set, equal documents folded into the batch, and whether the
    rows and keys are regrouped (a copy of q, k, v and the output)."""

    n_q: int
    n_k: int
    executed_pairs: int
    max_area: int
    max_cols: int
    fold: int = 1
    permuted: bool = False


class _BiasMaker:
    """Turns keep masks into 0/-inf biases over the columns that drop a pair, sharing one
    tensor among equal masks (interior band tiles all have the same pattern, and a causal
    tile's masked columns are its last block: memory O(w²), not O(n·w))."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        self.cache: dict[tuple, Tensor] = {}

    def __call__(self, keep: Tensor) -> tuple[Tensor | None, int]:
        if not bool(keep.any(-1).all()):
            raise AssertionError("a tile row keeps no key: plan and mask disagree")
        dropped = (~keep).any(0).nonzero().flatten()
        if dropped.numel() == 0:
            return None, 0
        a, b = int(dropped[0]), int(dropped[-1]) + 1
        part = keep[:, a:b].contiguous()
        key = (tuple(part.shape), part.numpy().tobytes())
        if key not in self.cache:
            bias = torch.zeros(part.shape, dtype=self.dtype)
            self.cache[key] = bias.masked_fill_(~part, float("-inf"))
        return self.cache[key], a


def _orders(n_q: int, n_k: int, d: int) -> tuple[Tensor, Tensor]:
    """Query rows and keys in class order: positions ``p ≡ 0 (mod d)`` first, ascending."""
    return class_order(n_k - n_q, n_q, d), class_order(0, n_k, d)


def _band_plan_tiles(
    spec: MaskSpec, n_q: int, n_k: int, block: int, make_bias: _BiasMaker, shift: int
) -> list[Tile]:
    """The band tiles of one sequence (or document, at ``shift``), biases built."""
    geom = band_tiles(spec, n_q, n_k, block)
    d, tiles = spec.dilation, []
    k_order = None if d == 1 else _orders(n_q, n_k, d)[1]
    for t in range(geom.r.size):
        keys = geom.keys(t)
        rows = int(geom.a1[t] - geom.a0[t])
        p = (int(geom.r[t]) + d * torch.arange(int(geom.a0[t]), int(geom.a1[t])))[:, None]
        cols = torch.cat([torch.arange(a, b) for a, b in keys])
        cols = (cols if k_order is None else k_order[cols])[None, :]
        bias, at = make_bias(keep_pairs(spec, n_q, n_k, p, cols))
        r0 = int(geom.row0[t]) + shift
        tiles.append(Tile(r0, r0 + rows, tuple((a + shift, b + shift) for a, b in keys), bias, at))
    return tiles


def _bigbird_tiles(spec: MaskSpec, n_q: int, n_k: int, make_bias: _BiasMaker) -> list[Tile]:
    """One tile per BigBird query block: the key blocks of its layout row with the global
    blocks folded in (every block for a global query block), causal future blocks dropped;
    rows before the first key (n_q > n_k) see the global keys, or every key if 0 is global."""
    if "prefix" in spec.features:
        raise ValueError("the BigBird tile plan has no prefix rule")
    b, off = spec.block_size, n_k - n_q
    cols_of = _bigbird_columns(spec, n_q, n_k)
    tiles = []
    negative = min(-off, n_q)
    if negative > 0 and not spec.causal:
        keys = _runs_to_ranges(spec, n_k) if not globals_.row_zero(spec) else ((0, n_k),)
        for r0 in range(0, negative, b):
            if keys:
                tiles.append(Tile(r0, min(r0 + b, negative), keys, None))
    for qb in range(cols_of.shape[0]):
        r0, r1 = max(qb * b - off, 0), min((qb + 1) * b - off, n_q)
        if r1 <= r0:
            continue
        keys = _merge_blocks(cols_of[qb].nonzero().flatten().tolist(), b, n_k)
        p = (torch.arange(r0, r1) + off)[:, None]
        cols = torch.cat([torch.arange(a, e) for a, e in keys])[None, :]
        keep = cols <= p if spec.causal else torch.ones(r1 - r0, cols.shape[1], dtype=torch.bool)
        bias, at = make_bias(keep)  # inside the gathered blocks only causality drops pairs
        tiles.append(Tile(r0, r1, keys, bias, at))
    return tiles


def _runs_to_ranges(spec: MaskSpec, n_k: int) -> Ranges:
    return tuple((a, min(e, n_k)) for a, e in spec.global_runs if a < n_k)


@lru_cache(maxsize=32)
def _bigbird_columns(spec: MaskSpec, n_q: int, n_k: int) -> Tensor:
    """bool (nb, nb): the key blocks each query block's tile holds."""
    layout = folded_layout(spec, n_q, n_k)
    if spec.causal:
        layout &= torch.ones_like(layout).tril()
    return layout


def _merge_blocks(blocks: list[int], b: int, n_k: int) -> Ranges:
    out: list[tuple[int, int]] = []
    for c in blocks:
        a, e = c * b, min((c + 1) * b, n_k)
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], e)
        else:
            out.append((a, e))
    return tuple(out)


def band_block(device: str) -> int:
    """Query rows per band tile: 64 on CPU (measured best: less masked waste than 128, GEMMs
    still efficient); 256 on GPUs, where each tile's kernel launches, not its FLOPs, set the
    pace."""
    return BAND_BLOCK if torch.device(device).type == "cpu" else 256


def tile_plan(spec: MaskSpec, n_q: int, n_k: int, dtype: torch.dtype, device: str) -> Plan:
    """The plan of a mask for a device, on the host (biases built: O(executed pairs))."""
    check_fits(spec, n_q, n_k)  # a contradictory mask is refused here, before any tile
    make_bias, block = _BiasMaker(dtype), band_block(device)
    if spec.block_size is not None:
        return Plan(n_q, n_k, tuple(_bigbird_tiles(spec, n_q, n_k, make_bias)))
    local, d = spec.without_documents(), spec.dilation
    docs = spec.documents or (n_q,)
    if spec.documents is not None and len(set(docs)) == 1:  # equal documents: fold
        n, fold = docs[0], len(docs)
        tiles = _band_plan_tiles(local, n, n, block, make_bias, 0)
        return Plan(n, n, tuple(tiles), *_maybe_orders(n, n, d), fold=fold)
    if spec.documents is None:
        tiles = _band_plan_tiles(local, n_q, n_k, block, make_bias, 0)
        return Plan(n_q, n_k, tuple(tiles), *_maybe_orders(n_q, n_k, d))
    tiles, q_parts, start = [], [], 0
    for n in docs:
        tiles += _band_plan_tiles(local, n, n, block, make_bias, start)
        q_parts.append(start + (_orders(n, n, d)[0] if d > 1 else torch.arange(n)))
        start += n
    order = torch.cat(q_parts) if d > 1 else None
    return Plan(n_q, n_k, tuple(tiles), order, order)


def _maybe_orders(n_q: int, n_k: int, d: int) -> tuple[Tensor | None, Tensor | None]:
    return _orders(n_q, n_k, d) if d > 1 else (None, None)


def plan_shape(spec: MaskSpec, n_q: int, n_k: int, device: str) -> PlanShape:
    """:class:`PlanShape` of :func:`tile_plan`'s plan from its geometry alone: O(tiles)."""
    check_fits(spec, n_q, n_k)  # a contradictory mask is refused here, before any tile
    if spec.block_size is not None:
        return _bigbird_shape(spec, n_q, n_k)
    block, local = band_block(device), spec.without_documents()
    docs = Counter(spec.documents or (n_q,))
    executed = area = cols = 0
    for n, count in docs.items():
        m_q, m_k = (n, n) if spec.documents is not None else (n_q, n_k)
        geom: BandTiles = band_tiles(local, m_q, m_k, block)
        n_cols = geom.n_cols()
        executed += count * int((geom.rows * n_cols).sum())
        area = max(area, int((geom.rows * n_cols).max(initial=0)))
        cols = max(cols, int(n_cols.max(initial=0)))
    fold = len(spec.documents) if spec.documents is not None and len(docs) == 1 else 1
    return PlanShape(n_q, n_k, executed, area, cols, fold, permuted=spec.dilation > 1)


def _bigbird_shape(spec: MaskSpec, n_q: int, n_k: int) -> PlanShape:
    b, off = spec.block_size, n_k - n_q
    cols_of = _bigbird_columns(spec, n_q, n_k).numpy()
    nb = cols_of.shape[0]
    widths = np.minimum(b, n_k - np.arange(nb) * b)
    cols = cols_of.astype(np.int64) @ widths
    starts = np.arange(nb) * b - off
    rows = np.clip(np.minimum(starts + b, n_q) - np.maximum(starts, 0), 0, None)
    negative = max(min(-off, n_q), 0) if not spec.causal else 0
    neg_cols = n_k if globals_.row_zero(spec) else sum(e - a for a, e in _runs_to_ranges(spec, n_k))
    neg_rows = negative if neg_cols else 0
    executed = int((rows * cols).sum()) + neg_rows * neg_cols
    area = max(int((rows * cols).max(initial=0)), min(neg_rows, b) * neg_cols)
    widest = max(int(cols[rows > 0].max(initial=0)), neg_cols if neg_rows else 0)
    return PlanShape(n_q, n_k, executed, area, widest)


@lru_cache(maxsize=32)
def device_plan(spec: MaskSpec, n_q: int, n_k: int, dtype: torch.dtype, device: str) -> Plan:
    """:func:`tile_plan` with its tensors moved to ``device``, cached (built once, outside the
    timed calls)."""
    return tile_plan(spec, n_q, n_k, dtype, device).to(device)
