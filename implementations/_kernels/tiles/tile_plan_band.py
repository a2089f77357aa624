"""The band part of the tile plan (:mod:`.tile_plan`): the geometry of the band tiles of a
window mask over one sequence, which query rows meet which key ranges, as int arrays with one
entry per tile, and their executed pairs in closed form.

The masks are window + causal + dilation + visible runs (global tokens, plug-in features
such as attention sinks) + prefix (no ``block_size``, no documents: :mod:`.tile_plan` runs one
geometry per document), read as the closed-form count reads them
(:func:`harness.masks.pair_rule`): the tiles and the count share one geometry. Dilation d is
handled by residue classes: query position ``p`` only keeps window keys with
``j ≡ p (mod d)``, so in *class coordinates* (``p = r + d·a``, ``j = r + d·c``) the window
is the plain band ``a - left <= c <= a + right``. Plan rows are the queries of class 0
(ascending), then class 1, ...; keys likewise (``k_start[c]`` is where class c's keys begin).

A tile is up to ``block`` consecutive rows of one class and one *kind*:

- band rows take the band's key range of their class, plus the visible key runs up to the
  causal bound of their last row, plus the prefix keys when they are prefix rows;
- rows of a visible row run (global rows) take every key up to that bound (and the prefix
  keys when in the prefix).

Rows that keep no key (only rows before the first key, when n_q > n_k) are in no tile. Kinds
change only at the ends of global runs, the prefix end and the start of the sequence, so
building the arrays is O(tiles + runs) numpy work, and :meth:`BandTiles.n_cols` (the executed
pairs' factor) is closed form per tile: predictions never visit a pair.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from harness.mask_features import window
from harness.mask_features.dilation import class_sizes, in_class
from harness.masks import MaskSpec, pair_rule
from harness.paircount import BIG, BandRule, Runs, expand

GLOBAL, BAND = 0, 1

Ranges = tuple[tuple[int, int], ...]


def _cdiv(a, b):
    return -((-a) // b)


@dataclass(frozen=True)
class BandTiles:
    """One entry per tile: class ``r``, class rows ``[a0, a1)``, plan rows ``[row0, row0 +
    a1 - a0)``, ``kind`` (GLOBAL/BAND), ``prefix`` (rows in the prefix), ``bound`` (no key
    right of this position is kept, prefix aside), band keys in class coordinates
    ``[c_lo, c_hi)``. ``covers_all_rows``: every row is in a tile."""

    n_q: int
    n_k: int
    d: int
    global_runs: Runs  # keys every row keeps (global keys, plug-in key runs)
    prefix_keys: int  # the prefix P: prefix rows keep keys [0, P)
    k_start: np.ndarray
    r: np.ndarray
    a0: np.ndarray
    a1: np.ndarray
    row0: np.ndarray
    kind: np.ndarray
    prefix: np.ndarray
    bound: np.ndarray
    c_lo: np.ndarray
    c_hi: np.ndarray
    covers_all_rows: bool

    @property
    def rows(self) -> np.ndarray:
        return self.a1 - self.a0

    def n_cols(self) -> np.ndarray:
        """Keys per tile (its key ranges' total length), closed form, int64 (tiles,)."""
        top = np.minimum(self.bound, self.n_k - 1)  # last key by causality, inside the sequence
        p_len = np.where(self.prefix, min(self.prefix_keys, self.n_k), 0)
        everything = np.maximum(np.maximum(top + 1, 0), p_len)  # global rows
        band_pos = (self.r + self.d * self.c_lo, self.r + self.d * (self.c_hi - 1) + 1)
        band = np.maximum(self.c_hi - self.c_lo, 0)
        g_all = self._global_keys(0, top + 1)
        g_in_p = self._global_keys(0, np.minimum(top + 1, p_len))
        extras = g_all + p_len - g_in_p
        u, v = band_pos
        shared = (
            self._global_keys(u, np.minimum(v, top + 1), self.r)
            + in_class(np.maximum(u, 0), np.minimum(v, p_len), self.r, self.d)
            - self._global_keys(u, np.minimum(v, np.minimum(top + 1, p_len)), self.r)
        )
        shared = np.where(band > 0, shared, 0)
        return np.where(self.kind == GLOBAL, everything, band + extras - shared)

    def _global_keys(self, u, v, r=None) -> np.ndarray:
        """Global positions in [u, v) (of class r when given), elementwise over tiles."""
        u = np.broadcast_to(np.asarray(u, np.int64), self.r.shape).copy()
        v = np.broadcast_to(np.asarray(v, np.int64), self.r.shape).copy()
        out = np.zeros(self.r.size, np.int64)
        if not self.global_runs:
            return out
        starts = np.array([a for a, _ in self.global_runs], np.int64)
        ends = np.array([b for _, b in self.global_runs], np.int64)
        first = np.searchsorted(ends, u, side="right")
        tile, run = expand(first, np.maximum(np.searchsorted(starts, v) - first, 0))
        lo, hi = np.maximum(u[tile], starts[run]), np.minimum(v[tile], ends[run])
        counts = np.maximum(hi - lo, 0) if r is None else in_class(lo, hi, r[tile], self.d)
        np.add.at(out, tile, counts)
        return out

    def keys(self, t: int) -> Ranges:
        """Tile t's key ranges in plan (class-permuted) key order, ascending and merged."""
        r, top = int(self.r[t]), min(int(self.bound[t]), self.n_k - 1)
        p_len = min(self.prefix_keys, self.n_k) if self.prefix[t] else 0
        if self.kind[t] == GLOBAL:
            positions: list[tuple[int, int]] = [(0, max(top + 1, p_len))]
            band: list[tuple[int, int]] = []
        else:
            positions = [(a, min(b, top + 1)) for a, b in self.global_runs] + [(0, p_len)]
            k0 = int(self.k_start[r])
            band = [(k0 + int(self.c_lo[t]), k0 + int(self.c_hi[t]))]
        ranges = band + [rng for u, v in positions if v > u for rng in self._by_class(u, v)]
        return _merge(sorted(ranges))

    def _by_class(self, u: int, v: int) -> list[tuple[int, int]]:
        """Positions [u, v) as ranges of plan key order, one per class."""
        out = []
        for c in range(self.d):
            lo, hi = max(_cdiv(u - c, self.d), 0), max(_cdiv(v - c, self.d), 0)
            hi = min(hi, int(self.k_start[c + 1] - self.k_start[c]))
            if hi > lo:
                out.append((int(self.k_start[c]) + lo, int(self.k_start[c]) + hi))
        return out


def _merge(ranges: list[tuple[int, int]]) -> Ranges:
    """Sorted ranges -> disjoint ranges, touching neighbours joined (a band stays one view)."""
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        if b <= a:
            continue
        if out and out[-1][1] >= a:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return tuple(out)


@lru_cache(maxsize=64)
def band_tiles(spec: MaskSpec, n_q: int, n_k: int, block: int) -> BandTiles:
    """The tiles of ``spec`` (no documents, no block_size) over n_q queries and n_k keys, read
    from the mask's geometry (:func:`harness.masks.pair_rule`: the band, the visible row and
    key runs of global tokens and plug-in features, the prefix, causality)."""
    rule = pair_rule(spec, n_q, n_k)
    assert isinstance(rule, BandRule), "band tiles are for masks without block_size"
    d, off = rule.d, n_k - n_q
    lo, hi = window.class_band(spec)  # the band in class coordinates, causality folded in
    left, right = (BIG if lo is None else -lo), (BIG if hi is None else hi)
    sizes = class_sizes(n_k, d)
    k_start = np.concatenate([[0], np.cumsum(sizes)])
    parts, row = [], 0
    for r in range(d):
        a_lo, a_hi = _cdiv(off - r, d), (off + n_q - 1 - r) // d  # class r's rows, inclusive
        if a_hi < a_lo:
            continue
        cuts = {a_lo, a_hi + 1, _cdiv(-r, d), _cdiv(rule.prefix - r, d), -right}
        cuts |= {_cdiv(x - r, d) for run in rule.rows_g for x in run}
        cuts = sorted(x for x in cuts if a_lo <= x <= a_hi + 1)
        for x, y in itertools.pairwise(cuts):
            kind, in_prefix, empty = _between_cuts(rule, r + d * x, x + right, sizes[r])
            if empty:
                continue
            a0 = np.arange(x, y, block, dtype=np.int64)
            parts.append((r, a0, np.minimum(a0 + block, y), row + a0 - a_lo, kind, in_prefix))
        row += a_hi - a_lo + 1
    return _assemble(rule, n_q, n_k, k_start, parts, left, right)


def _between_cuts(rule: BandRule, p: int, band_top: int, n_class_keys: int):
    """(kind, prefix rows?, empty?) of the rows from position p on, up to the next cut.
    Only rows before the first key (p < 0) can be empty: every other row keeps itself."""
    is_global = any(a <= p < b for a, b in rule.rows_g)
    in_prefix = max(p, 0) < rule.prefix
    if p >= 0 or in_prefix:
        return (GLOBAL if is_global else BAND), in_prefix, False
    if rule.causal:  # keys j <= p < 0: none
        return BAND, False, True
    if is_global or rule.keys_g:
        return (GLOBAL if is_global else BAND), False, False
    return BAND, False, band_top < 0 or n_class_keys == 0


def _assemble(rule: BandRule, n_q, n_k, k_start, parts, left, right) -> BandTiles:
    d = rule.d
    if parts:
        r = np.concatenate([np.full(p[1].size, p[0], np.int64) for p in parts])
        a0, a1, row0 = (np.concatenate([p[i] for p in parts]) for i in (1, 2, 3))
        kind = np.concatenate([np.full(p[1].size, p[4], np.int64) for p in parts])
        prefix = np.concatenate([np.full(p[1].size, p[5], bool) for p in parts])
    else:
        r = a0 = a1 = row0 = kind = np.zeros(0, np.int64)
        prefix = np.zeros(0, bool)
    n_class = k_start[r + 1] - k_start[r]
    c_lo = np.clip(a0 - left, 0, n_class)
    c_hi = np.clip(a1 - 1 + right + 1, c_lo, n_class)
    p_last = r + d * (a1 - 1)
    bound = np.minimum(p_last, n_k - 1) if rule.causal else np.full(r.size, n_k - 1)
    return BandTiles(
        n_q, n_k, d, rule.keys_g, rule.prefix, k_start, r, a0, a1, row0, kind,
        prefix, bound, c_lo, c_hi, covers_all_rows=int((a1 - a0).sum()) == n_q,
    )
