"""Exact counts of kept (query, key) pairs over rectangles, by interval arithmetic.

:mod:`harness.masks` resolves a mask into a :class:`BandRule` (window, dilation, global runs,
prefix, causality) or a :class:`LayoutRule` (a BigBird block layout) in one document's (or the
whole sequence's) coordinates; this module counts the pairs such a rule keeps in any number
of rectangles ``rows [r0, r1) x keys [c0, c1)`` at once, without visiting a pair:

- a band ``lo <= j - p <= hi`` with ``(j - p) % d == 0`` over a rectangle is a sum over
  diagonals of a trapezoid, four arithmetic series (:func:`band_pairs`);
- global rows and keys are sorted runs; inclusion-exclusion over them needs only the band
  counts of the rectangle's sub-rectangles (:func:`rect_pairs`);
- the prefix square is added and what the other rules already keep in it taken away.

Cost: O(rectangles x global runs they touch) numpy work, independent of the pairs counted.
Everything is int64 numpy; counts up to n² are exact for n below ~3·10⁹.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BIG = 1 << 40  # stands for an unbounded side; clipped to the rectangle before any product

Arr = np.ndarray


def _i64(x) -> Arr:
    return np.asarray(x, dtype=np.int64)


def _series(r_lo: Arr, r_hi: Arr, d: Arr, alpha: Arr, beta: int) -> Arr:
    """Sum of ``alpha + beta * r`` over the multiples r of d in [r_lo, r_hi] (0 when empty)."""
    m0 = -((-r_lo) // d)  # ceil
    m1 = r_hi // d
    cnt = np.maximum(m1 - m0 + 1, 0)
    # (m0 + m1) and cnt have opposite parity when cnt > 0: the halving is exact
    total = cnt * alpha + beta * d * ((m0 + m1) * cnt // 2)
    return np.where(cnt > 0, total, 0)


def band_pairs(a0, a1, b0, b1, lo, hi, d=1) -> Arr:
    """Pairs (p, j) with p in [a0, a1), j in [b0, b1), lo <= j - p <= hi and (j - p) % d == 0,
    elementwise over broadcast integer arrays.

    Along diagonal r = j - p the rectangle holds ``min(a1, b1 - r) - max(a0, b0 - r)`` pairs:
    a trapezoid in r whose kinks are at ``b1 - a1`` and ``b0 - a0``, so the sum over the
    multiples of d in [lo, hi] is four arithmetic series.
    """
    a0, a1, b0, b1, lo, hi, d = np.broadcast_arrays(*map(_i64, (a0, a1, b0, b1, lo, hi, d)))
    r_lo = np.maximum(lo, b0 - a1 + 1)
    r_hi = np.minimum(hi, b1 - 1 - a0)
    k1, k2 = b1 - a1, b0 - a0  # r <= k1: the row bound a1 binds; r <= k2: the key bound b0 binds
    total = _series(r_lo, np.minimum(r_hi, np.minimum(k1, k2)), d, a1 - b0, 1)
    total = total + _series(np.maximum(r_lo, k1 + 1), np.minimum(r_hi, k2), d, b1 - b0, 0)
    total = total + _series(np.maximum(r_lo, k2 + 1), np.minimum(r_hi, k1), d, a1 - a0, 0)
    total = total + _series(np.maximum(r_lo, np.maximum(k1, k2) + 1), r_hi, d, b1 - a0, -1)
    empty = (a1 <= a0) | (b1 <= b0) | (r_hi < r_lo)
    return np.where(empty, 0, total)


Runs = tuple[tuple[int, int], ...]  # sorted, disjoint [start, end) intervals


def positions_to_runs(positions: tuple[int, ...]) -> Runs:
    """Sorted distinct positions -> maximal runs of consecutive positions."""
    runs: list[list[int]] = []
    for x in positions:
        if runs and runs[-1][1] == x:
            runs[-1][1] = x + 1
        else:
            runs.append([x, x + 1])
    return tuple((a, b) for a, b in runs)


def _overlaps(r0: Arr, r1: Arr, runs: Runs) -> tuple[Arr, Arr, Arr]:
    """Every (rectangle, run) overlap of intervals [r0, r1) with sorted disjoint runs:
    (rectangle index, overlap start, overlap end), one entry per overlapping pair."""
    if not runs or r0.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts, ends = _i64([a for a, _ in runs]), _i64([b for _, b in runs])
    first = np.searchsorted(ends, r0, side="right")  # first run ending after r0
    stop = np.searchsorted(starts, r1, side="left")  # runs starting before r1
    rect, run = expand(first, np.maximum(stop - first, 0))
    return rect, np.maximum(r0[rect], starts[run]), np.minimum(r1[rect], ends[run])


def expand(first: Arr, count: Arr) -> tuple[Arr, Arr]:
    """Ragged ranges ``[first[i], first[i] + count[i])`` flattened: (i, value) per element."""
    owner = np.repeat(np.arange(first.size), count)
    within = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    return owner, np.repeat(first, count) + within


def _sum_by(index: Arr, values: Arr, size: int) -> Arr:
    out = np.zeros(size, np.int64)
    np.add.at(out, index, values)
    return out


@dataclass(frozen=True)
class BandRule:
    """keep(p, j) = ((band | p in rows_g | j in keys_g) & causal) | (p < prefix & j < prefix).

    band: ``lo <= j - p <= hi`` (hi already capped at 0 when causal) and ``(j - p) % d == 0``.
    ``keys_g``: global key runs; ``rows_g``: global row runs (as keys_g, with the run at 0
    reaching down to -BIG: rows before the first key count as position 0)."""

    lo: int
    hi: int
    d: int
    causal: bool
    keys_g: Runs = ()
    rows_g: Runs = ()
    prefix: int = 0

    def band(self, a0, a1, b0, b1) -> Arr:
        return band_pairs(a0, a1, b0, b1, self.lo, self.hi, self.d)

    def causal_only(self, a0, a1, b0, b1) -> Arr:
        return band_pairs(a0, a1, b0, b1, -BIG, 0 if self.causal else BIG, 1)


@dataclass(frozen=True)
class LayoutRule:
    """keep(p, j) = ((layout block (p // b, j // b) kept | global) & causal) | prefix.

    ``layout``: bool (nb, nb), global blocks folded in; ``rows``/``cols``: its kept blocks in
    row-major order and ``row_ptr`` (nb + 1,) where each row's start there. Rows before the
    first key (p < 0) lie in no block: they keep the global keys ``keys_g``, or every key when
    ``negative_rows_global``."""

    b: int
    layout: Arr
    causal: bool
    keys_g: Runs = ()
    negative_rows_global: bool = False
    prefix: int = 0

    def __post_init__(self) -> None:
        rows, cols = np.nonzero(self.layout)  # row-major
        object.__setattr__(self, "rows", rows.astype(np.int64))
        object.__setattr__(self, "cols", cols.astype(np.int64))
        ptr = np.searchsorted(rows, np.arange(self.layout.shape[0] + 1), side="left")
        object.__setattr__(self, "row_ptr", ptr.astype(np.int64))

    def causal_only(self, a0, a1, b0, b1) -> Arr:
        return band_pairs(a0, a1, b0, b1, -BIG, 0 if self.causal else BIG, 1)


def _band_rest(rule: BandRule, r0: Arr, r1: Arr, c0: Arr, c1: Arr) -> Arr:
    """Pairs kept by ``((band | global) & causal)`` in each rectangle, by inclusion-exclusion:
    C(GR×K) + BC(R×K) − BC(GR×K) + C(R×GK) − C(GR×GK) − BC(R×GK) + BC(GR×GK), where C counts
    causal pairs, BC band-and-causal pairs, GR the global rows and GK the global keys."""
    n = r0.size
    total = rule.band(r0, r1, c0, c1)
    gr, gr0, gr1 = _overlaps(r0, r1, rule.rows_g)
    if gr.size:
        piece = rule.causal_only(gr0, gr1, c0[gr], c1[gr]) - rule.band(gr0, gr1, c0[gr], c1[gr])
        total = total + _sum_by(gr, piece, n)
    gk, gk0, gk1 = _overlaps(c0, c1, rule.keys_g)
    if gk.size:
        piece = rule.causal_only(r0[gk], r1[gk], gk0, gk1) - rule.band(r0[gk], r1[gk], gk0, gk1)
        total = total + _sum_by(gk, piece, n)
        # the rows that are global and the keys that are global: every row x key pair of one
        # rectangle; both lists are grouped by rectangle, so pair them group by group
        for rect in np.intersect1d(gr, gk):
            rows, keys = gr == rect, gk == rect
            a0, a1 = gr0[rows][:, None], gr1[rows][:, None]
            b0, b1 = gk0[keys][None, :], gk1[keys][None, :]
            both = rule.causal_only(a0, a1, b0, b1) - rule.band(a0, a1, b0, b1)
            total[rect] -= int(both.sum())
    return total


def _layout_rest(rule: LayoutRule, r0: Arr, r1: Arr, c0: Arr, c1: Arr) -> Arr:
    """Pairs kept by ``(layout | global) & causal``: each kept layout block's overlap with the
    rectangle, causal pairs only. A rectangle's blocks are found either in its sub-grid of the
    layout or in its layout rows' lists, whichever is shorter (a small block: the sub-grid;
    the whole matrix: the lists), so the work is O(kept blocks) either way."""
    n, b, nb = r0.size, rule.b, rule.layout.shape[0]
    q_first = np.clip(np.maximum(r0, 0) // b, 0, nb)
    q_stop = np.maximum(np.clip(-((-r1) // b), 0, nb), q_first)
    k_first = np.clip(c0 // b, 0, nb)
    k_stop = np.maximum(np.clip(-((-c1) // b), 0, nb), k_first)
    in_rows = rule.row_ptr[q_stop] - rule.row_ptr[q_first]
    width = k_stop - k_first
    grid = (q_stop - q_first) * width <= in_rows
    rect, cell = expand(np.zeros(n, np.int64), np.where(grid, (q_stop - q_first) * width, 0))
    qb = q_first[rect] + cell // np.maximum(width[rect], 1)
    kb = k_first[rect] + cell % np.maximum(width[rect], 1)
    hit = rule.layout[qb, kb]
    rect, qb, kb = rect[hit], qb[hit], kb[hit]
    listed, blk = expand(rule.row_ptr[q_first], np.where(grid, 0, in_rows))
    rect, qb = np.concatenate([rect, listed]), np.concatenate([qb, rule.rows[blk]])
    kb = np.concatenate([kb, rule.cols[blk]])
    a0, a1 = np.maximum(r0[rect], qb * b), np.minimum(r1[rect], qb * b + b)
    b0, b1 = np.maximum(c0[rect], kb * b), np.minimum(c1[rect], kb * b + b)
    total = _sum_by(rect, rule.causal_only(a0, a1, b0, b1), n)
    neg1 = np.minimum(r1, 0)
    if rule.negative_rows_global:
        return total + rule.causal_only(r0, neg1, c0, c1)
    rect, g0, g1 = _overlaps(c0, c1, rule.keys_g)
    return total + _sum_by(rect, rule.causal_only(r0[rect], neg1[rect], g0, g1), n)


def rect_pairs(rule: BandRule | LayoutRule, r0, r1, c0, c1) -> Arr:
    """Kept pairs in each rectangle ``rows [r0, r1) x keys [c0, c1)`` (int64 array), rows as
    positions in the rule's coordinates. Adds the prefix square, minus what the other rules
    already keep inside it."""
    bounds = np.broadcast_arrays(*map(_i64, (r0, r1, c0, c1)))
    r0, r1, c0, c1 = (np.atleast_1d(x).copy() for x in bounds)
    rest = _band_rest if isinstance(rule, BandRule) else _layout_rest
    total = rest(rule, r0, r1, c0, c1)
    if rule.prefix:
        p1, k1 = np.minimum(r1, rule.prefix), np.minimum(c1, rule.prefix)
        square = np.maximum(p1 - r0, 0) * np.maximum(k1 - c0, 0)
        inside = rest(rule, r0, np.maximum(p1, r0), c0, np.maximum(k1, c0))
        total = total + square - inside
    return total


def candidate_keys(rule: BandRule | LayoutRule, x0: Arr, x1: Arr, length: Arr) -> tuple[Arr, ...]:
    """Key intervals that hold every key the rows ``[x0, x1)`` of a piece may keep, as
    (piece index, key start, key end) within ``[0, length)`` (a superset; counting decides).

    Band rules: the band's span, each global key run, every key for pieces with a global row,
    the prefix for pieces with a prefix row. Layout rules: the key blocks of every kept
    layout block whose rows meet the piece (pieces ascending and disjoint there)."""
    n = x0.size
    hi_row = np.where(rule.causal, x1 - 1, BIG)  # no kept key lies right of this (but prefix)
    parts = []
    if isinstance(rule, BandRule):
        parts.append((np.arange(n), x0 + rule.lo, x1 - 1 + rule.hi + 1))
        for a, b in rule.keys_g:
            parts.append((np.arange(n), np.full(n, a), np.minimum(b, hi_row + 1)))
        piece, _, _ = _overlaps(x0, x1, rule.rows_g)
        parts.append((piece, np.zeros(piece.size, np.int64), hi_row[piece] + 1))
    else:
        # pieces are one region's query blocks here: ascending and disjoint
        b = rule.b
        first = np.searchsorted(x1, rule.rows * b, side="right")
        stop = np.searchsorted(x0, rule.rows * b + b, side="left")
        blk, piece = expand(first, np.maximum(stop - first, 0))
        parts.append((piece, rule.cols[blk] * b, rule.cols[blk] * b + b))
        meets = np.nonzero(x0 < 0)[0]  # rows before the first key: in no layout block
        parts.append((meets, np.zeros(meets.size, np.int64), hi_row[meets] + 1))
    if rule.prefix:
        meets = np.nonzero(x0 < rule.prefix)[0]
        parts.append((meets, np.zeros(meets.size, np.int64), np.full(meets.size, rule.prefix)))
    piece = np.concatenate([p for p, _, _ in parts])
    lo = np.maximum(np.concatenate([a for _, a, _ in parts]), 0)
    hi = np.minimum(np.concatenate([e for _, _, e in parts]), length[piece])
    keep = hi > lo
    return piece[keep], lo[keep], hi[keep]
