"""FlexAttention ``mask_mod``s and ``BlockMask``s for :class:`harness.masks.MaskSpec`.

The ``mask_mod`` is the code the kernel runs on every element of a partial block, so it must
cost what a hand-written one costs: :func:`mask_mod_for` specializes on the spec's numbers as
Python constants and emits only the clauses the spec uses (no modulo without dilation, a bit
mask instead of a modulo for power-of-two dilations, no global clause without global tokens, no
window side that is unbounded, the causal bound folded into the window's right side). A mask
mod that read its numbers from a captured int64 tensor and always evaluated every clause ran
25x slower on an H100 on the identical block layout.

- Packed documents (each document its own sequence): equal documents of length L need no
  tensor at all (document = ``idx // L``, a shift when L is a power of two); unequal ones read
  one captured int32 table, the start of each position's document (same document = same
  start; the position inside it = index - start).
- Global positions: up to four runs of positions are range tests on constants; more read a
  captured bool table.
- BigBird: one lookup in the flattened block layout, global blocks folded in.
- Predicate features (:mod:`harness.mask_features.predicate`): their torch predicate, traced
  into the mask mod last (an AND on document-local positions); the block plan's states
  already drop the blocks their classification skips.

:func:`block_counts` reads the one block plan (:mod:`harness.block_plan`:
exact counts of the candidate blocks, never the n_q x n_k grid), so blocks across documents,
outside the window or past causality are never listed. The numbers each clause specializes
on come from the feature modules of :mod:`harness.mask_features` (plug-in features such as
attention sinks arrive as visible row/key runs).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from harness.block_plan import FULL, SKIP, block_plan
from harness.mask_features import bigbird_blocks, dilation, predicate, window
from harness.mask_features import globals as globals_
from harness.mask_features import prefix as prefix_clause
from harness.masks import MaskSpec, document_starts

if TYPE_CHECKING:  # the module pulls in torch._dynamo: imported where a mask is built
    from torch.nn.attention.flex_attention import BlockMask

BLOCK = 128  # FlexAttention's default (query, key) block size
MAX_CONSTANT_RUNS = 4  # global runs tested as constants; more read a table

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
Split = Callable[[Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]


@lru_cache(maxsize=256)
def mask_mod_for(spec: MaskSpec, n_q: int, n_k: int, device: str) -> MaskMod:
    """A FlexAttention ``mask_mod(b, h, q_idx, kv_idx) -> bool`` equal to ``dense_mask``,
    specialized on the spec's numbers (cached: the same key gives the same function, so a
    repeated point never recompiles)."""
    if spec.block_size is not None:
        return _layout_mod(spec, n_q, n_k, device)
    if spec.is_dense:
        from torch.nn.attention.flex_attention import noop_mask

        return noop_mask
    return _window_mod(spec, n_q, n_k, device)


def _window_mod(spec: MaskSpec, n_q: int, n_k: int, device: str) -> MaskMod:
    """Window / dilation / global / causal / prefix / documents with every number a Python
    constant. The branches on constants run while dynamo traces, so the kernel holds only the
    clauses taken."""
    d, prefix, off = dilation.step(spec), prefix_clause.length(spec), n_k - n_q
    lo, hi = window.band(spec)  # rel >= lo, rel <= hi (None: unbounded)
    rows, keys = globals_.row_runs(spec), globals_.key_runs(spec)
    causal_apart = spec.causal and bool(rows or keys)  # visible runs sit before causality
    if spec.causal and not causal_apart:
        hi = 0 if hi is None else min(hi, 0)
    pow2 = d & (d - 1) == 0  # two's complement: rel & (d - 1) == rel mod d, negatives too
    length = max(spec.documents or (n_k,))
    row_global = _membership(rows, length, device)
    key_global = row_global if keys == rows else _membership(keys, length, device)  # one table
    split = _document_split(spec.documents, device)
    allowed = predicate.predicates(spec)

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        rel = kv_idx - (q_idx + off if off else q_idx)  # the same inside a document
        if split is not None:  # positions inside the document (unused ones are traced away)
            same, p, kv = split(q_idx, kv_idx)
        else:
            same, p, kv = None, (q_idx + off if off else q_idx), kv_idx
        keep = None
        if lo is not None:
            keep = rel >= lo
        if hi is not None:
            keep = _and(keep, rel <= hi)
        if d > 1:
            keep = _and(keep, ((rel & (d - 1)) if pow2 else (rel % d)) == 0)
        if keep is not None:  # nothing cut yet: all kept already
            if row_global is not None:
                keep = keep | row_global(p)
            if key_global is not None:
                keep = keep | key_global(kv)
        if causal_apart:
            keep = _and(keep, rel <= 0)
        if prefix and keep is not None:
            keep = keep | ((p < prefix) & (kv < prefix))
        for feature in allowed:  # rule 6: an AND, on the positions inside the document
            keep = _and(keep, feature.keep(p, kv))
        if same is not None:
            keep = _and(keep, same)
        return keep if keep is not None else rel == rel

    mask_mod.__name__ = _mod_name(spec, off)
    return mask_mod


def _membership(runs, length: int, device: str) -> Callable[[Tensor], Tensor] | None:
    """``x -> x is a global position`` for positions x < ``length`` (one below 0 counts as 0):
    range tests on constants for up to four runs, else a lookup in a captured bool table."""
    if not runs:
        return None
    if len(runs) <= MAX_CONSTANT_RUNS:

        def member(x: Tensor) -> Tensor:
            out = None
            for a, e in runs:  # unrolled while tracing
                inside = (x < e) if a == 0 else ((x >= a) & (x < e))
                out = inside if out is None else out | inside
            return out

        return member
    table = torch.zeros(max(length, runs[-1][1]), dtype=torch.bool)  # (length,)
    for a, e in runs:
        table[a:e] = True
    table = table.to(device)
    last = table.numel() - 1
    return lambda x: table[x.clamp(0, last)]


def _document_split(documents: tuple[int, ...] | None, device: str) -> Split | None:
    """``(q_idx, kv_idx) -> (same document, q position in it, kv position in it)``."""
    if documents is None:
        return None
    length = documents[0]
    if all(x == length for x in documents):
        if length & (length - 1) == 0:
            shift, low = length.bit_length() - 1, length - 1
            return lambda q, kv: ((q >> shift) == (kv >> shift), q & low, kv & low)

        def split(q: Tensor, kv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            qd, kd = q // length, kv // length
            return qd == kd, q - qd * length, kv - kd * length

        return split
    starts = document_starts(documents).to(torch.int32).to(device)

    def split_by_table(q: Tensor, kv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        sq, sk = starts[q], starts[kv]
        return sq == sk, q - sq, kv - sk

    return split_by_table


def _and(a: Tensor | None, b: Tensor) -> Tensor:
    return b if a is None else a & b


def _mod_name(spec: MaskSpec, off: int) -> str:
    """``mask_causal_window_255_0_`` style: names the kernel in dynamo's and inductor's logs."""
    return re.sub(r"\W+", "_", f"mask_{spec.describe()}_off{off}")


def _layout_mod(spec: MaskSpec, n_q: int, n_k: int, device: str) -> MaskMod:
    """BigBird: one lookup in the flattened block layout, global blocks folded in (global
    tokens are whole blocks), causality apart; the block index is a shift when b is 2^k. With
    more queries than keys, rows before the first key read an extra layout row: every key if
    position 0 is global, else the global key blocks."""
    b, off, runs = spec.block_size, n_k - n_q, spec.global_runs
    layout = bigbird_blocks.folded_layout(spec, n_q, n_k)
    g_blocks = bigbird_blocks.global_blocks(spec)
    nb = layout.shape[0]
    negative = torch.zeros(1, nb, dtype=torch.bool)
    negative[0, g_blocks] = True
    if runs and runs[0][0] == 0:
        negative[:] = True
    flat = torch.cat([layout, negative]).flatten().to(device)
    shift = b.bit_length() - 1 if b & (b - 1) == 0 else None
    causal, prefix = spec.causal, prefix_clause.length(spec)

    def mask_mod(bi: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        p = q_idx + off if off else q_idx
        qb, kb = (p >> shift, kv_idx >> shift) if shift is not None else (p // b, kv_idx // b)
        if off < 0:  # queries before position 0 read the extra row
            qb = torch.where(p < 0, nb, qb)
        keep = flat[qb * nb + kb]
        if causal:
            keep = keep & (kv_idx <= p)
        return keep | ((p < prefix) & (kv_idx < prefix)) if prefix else keep

    mask_mod.__name__ = _mod_name(spec, off)
    return mask_mod


@lru_cache(maxsize=32)
def block_counts(spec: MaskSpec, n_q: int, n_k: int) -> tuple[Tensor, Tensor, int]:
    """Per (128-query block, 128-key block) of the one block plan
    (:func:`harness.block_plan.block_plan`): ``any`` kept pair and ``full`` (all
    kept, block wholly inside the sequence), each bool (n_qb, n_kb); plus the executed pairs
    (every block with any kept pair, at its clipped size). O(candidate blocks)."""
    plan = block_plan(spec, n_q, n_k, BLOCK, BLOCK)
    states = plan.states()
    return states != SKIP, states == FULL, plan.executed_pairs


def _indices(blocks: Tensor, device: str) -> tuple[Tensor, Tensor]:
    """bool (n_qb, n_kb) -> kv_num_blocks (1, 1, n_qb), kv_indices (1, 1, n_qb, n_kb) int32,
    the selected key blocks first (stable order)."""
    num = blocks.sum(-1).to(torch.int32)
    order = torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return num[None, None].to(device), order[None, None].to(device)


def build_block_mask(spec: MaskSpec, n_q: int, n_k: int, device: str) -> BlockMask:
    """The FlexAttention BlockMask for ``spec``, without materializing the n_q × n_k mask."""
    from torch.nn.attention.flex_attention import BlockMask

    any_, full, _ = block_counts(spec, n_q, n_k)
    kv_num, kv_idx = _indices(any_ & ~full, device)
    full_num, full_idx = _indices(full, device)
    return BlockMask.from_kv_blocks(
        kv_num,
        kv_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=BLOCK,
        mask_mod=mask_mod_for(spec, n_q, n_k, device),
        seq_lengths=(n_q, n_k),
    )
