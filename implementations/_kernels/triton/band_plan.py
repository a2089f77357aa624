"""The plan of the band kernels: their iteration spaces, built on the host once per
(spec, n_q, n_k). One of the family's plan's three parts: band slots (here), BigBird block
lists (:mod:`.blocklist_plan`), both as device tables (:mod:`.plan_tables`).

No Triton here: the slots the kernels read (small int rows), the per-position tables of
documents and global tokens (:class:`BandPlan` fields, made tensors in ``plan_tables``), and
the executed-pair count at the kernel's block granularity in O(number of blocks).

Band masks (``flash-tiled`` full/causal, ``local``, ``dilated``, ``longformer``) are described by
*slots*. A slot is a set of *own* positions (query rows in the forward and dQ, keys in dK/dV) in
class coordinates: ``p = r + step·x`` for ``x`` in ``[x_start, x_start + n_own)``, walking
*partner* positions of the same class ``r + step·c`` for ``c`` in ``[c_start, c_end)``. Own ``x``
keeps the partners in one interval (:func:`own_bounds`, mirrored by the kernels'
``primitives.own_bounds``): ``[x + lo_rel, x + hi_rel]`` (the window, causality folded
into ``hi_rel``); a position ``p < P`` also keeps ``[0, P)`` (the prefix P, prefix-LM, in
slots of step 1, where the two intervals meet); with documents the interval is cut to the
document ``[s, e)`` of ``p``, and the prefix is the document's own: ``p - s < P`` keeps
``[s, s + P)``. Both ends are nondecreasing in ``x``, so a block of owns walks one partner
range and the middle that every own keeps runs without a mask. With dilation d, class r
(``p ≡ j ≡ r mod d``) is a slot with ``step = d``: the dilated window is a plain band there.
The prefix spans every class, so a dilated class slot walks it apart: each own block visits
the partner positions from the least start to the greatest end of its owns' prefixes
(:func:`prefix_spans`), keeping those outside the band.

Global positions G (``global_tokens`` as a count or as positions; with documents each
document's own, as :func:`harness.mask_features.visible_runs.positions` lists them): a
*table* slot whose owns are G itself (every partner, causality and documents kept), and in
every class slot a *cross* span over the partners in G that the band does not already hold.
Class slots skip storing owns in G (the table slot writes them). The dK/dV *key slots* are the
same construction with keys as owns and ``(lo_rel, hi_rel)`` negated and swapped.

A predicate feature (:mod:`harness.mask_features.predicate`) changes no slot: its
``@triton.jit`` predicate is the kernels' ``PRED`` constexpr (:attr:`BandPlan.flags`), applied
to every block they visit (AND); the executed pairs are the slots' as without it.

BigBird layouts are CSR lists instead (:mod:`.blocklist_plan`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from harness.mask_features import dilation, predicate, prefix, window
from harness.mask_features import documents as documents_
from harness.mask_features import globals as globals_
from harness.mask_features.visible_runs import positions
from harness.masks import MaskSpec

SLOT_FIELDS = 9  # r, step, x_start, n_own, c_start, c_end, lo_rel, hi_rel, flags
# owns x in [x_start, x_start + n_own); partners c in [c_start, c_end), both in class coordinates
CROSS, TABLE = 1, 2  # slot flags: a cross span over G; owns gathered from the table of G
OWN_SHIFT = 2  # flags >> OWN_SHIFT: where the owns' counts start in GIDX (0: the partners')


def ceil_div(a: int, b: int) -> int:
    """Ceiling of a / b for positive b."""
    return -((-a) // b)


@dataclass(frozen=True)
class BandPlan:
    """Row slots (forward, dQ), key slots (dK/dV) and the mask's tables of a band mask.

    Global rows (``row_globals``: every key kept) and global keys (``key_globals``: kept by
    every row) are one list for global tokens and differ for plug-in features (attention
    sinks: keys only). Then each direction's tables list its *partners* first, then its
    *owns* (:meth:`gpos`): a TABLE slot's owns start past the partners, and the class slots'
    flags say where the owns' counts start."""

    n_q: int
    n_k: int
    big: int  # stands for an unbounded window side
    hg: int  # how far right of p a global key may be: 0 if causal else ``big``
    prefix: int  # the prefix P (0: none)
    row_globals: tuple[int, ...]  # global rows (absolute positions, rows p < 0 may be)
    key_globals: tuple[int, ...]  # global keys below n_k, ascending
    documents: tuple[int, ...] | None
    dilation: int
    slots: tuple[tuple[int, ...], ...]
    key_slots: tuple[tuple[int, ...], ...]
    predicate: object = None  # a predicate feature's @triton.jit (p, j) -> bool, or None

    @property
    def globals(self) -> tuple[int, ...]:
        """The global positions when rows and keys agree (global tokens), else the keys."""
        return self.key_globals

    @property
    def apart(self) -> bool:
        """Whether global rows and global keys differ (a plug-in feature's runs)."""
        return self.row_globals != self.key_globals

    def partner_owns(self, keys: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(partner list, own list) of the row slots, or of the key slots (``keys``)."""
        if keys:
            return self.row_globals, self.key_globals
        return self.key_globals, self.row_globals

    def gpos(self, keys: bool) -> tuple[int, ...]:
        """A direction's GPOS: its partners, then its owns when they differ."""
        partners, owns = self.partner_owns(keys)
        return partners + owns if self.apart else partners

    @property
    def max_rows(self) -> int:
        return max((s[3] for s in self.slots), default=0)

    @property
    def max_keys(self) -> int:
        return max((s[3] for s in self.key_slots), default=0)

    @property
    def gbase(self) -> int:
        """The lowest position the global tables index: min(off, 0)."""
        return min(self.n_k - self.n_q, 0)

    @property
    def flags(self) -> dict[str, object]:
        """The kernels' compile-time mask clauses: code for a clause exists only when used
        (``PRED``: the predicate function, present only with a predicate feature)."""
        out = {"GLOBAL": bool(self.row_globals or self.key_globals),
               "DILATED": self.dilation > 1, "DOCS": self.documents is not None,
               "PREFIX": self.prefix > 0}
        if self.apart:  # only then: every other launch compiles exactly as without it
            out["APART"] = True
        if self.predicate is not None:  # likewise
            out["PRED"] = self.predicate
        return out


def fused_band_reasons(spec: MaskSpec) -> list[str]:
    """Why the band kernels cannot run ``spec`` (empty: they run every band mask, plug-in
    runs features included: their runs are the kernels' global rows and keys; and one
    predicate feature that gives its ``@triton.jit`` predicate)."""
    features = predicate.predicates(spec)
    if len(features) > 1:
        names = sorted(f.name for f in features)
        return [f"the fused band kernels take one predicate feature, got {names}"]
    if features and features[0].triton_keep is None:
        return [f"mask feature {features[0].name!r} gives no @triton.jit predicate "
                f"(triton_keep) for the fused band kernels"]
    return []


def triton_predicate(spec: MaskSpec) -> object:
    """The spec's predicate feature's ``@triton.jit`` function (None without one): its
    ``triton_keep``, or the function a ``"package.module:function"`` string names (imported
    here, at the first plan of such a mask: the module imports Triton)."""
    features = predicate.predicates(spec)
    if not features:
        return None
    keep = type(features[0]).triton_keep
    if isinstance(keep, str):
        module, _, name = keep.partition(":")
        keep = getattr(importlib.import_module(module), name)
    return keep


@lru_cache(maxsize=64)
def band_plan(spec: MaskSpec, n_q: int, n_k: int) -> BandPlan:
    """The slots of a window/causal/dilation/global/prefix/documents mask (no ``block_size``),
    read from the feature modules (:mod:`harness.mask_features`)."""
    if spec.block_size is not None:
        raise ValueError("band_plan is for masks without block_size")
    if reasons := fused_band_reasons(spec):
        raise ValueError(reasons[0])
    d, off = dilation.step(spec), n_k - n_q
    big = 2 * (n_q + n_k) + 2
    lo_rel, hi_rel = window.class_band(spec)  # class coordinates, causality folded in
    lo_rel, hi_rel = (-big if lo_rel is None else lo_rel), (big if hi_rel is None else hi_rel)
    hg = 0 if spec.causal else big
    # a count g makes every p < g global, rows before the first key (p < 0) too; class slots
    # then start past them. With documents the globals are each document's own (local
    # positions): the table lists them as absolute positions, and no slot skips rows
    plain = (isinstance(spec.global_tokens, int) and not spec.documents
             and not globals_.runs_features(spec))  # a predicate feature changes no slot
    skip = spec.global_tokens if plain else 0
    if skip:
        rows_g = keys_g = tuple(range(min(off, 0), min(skip, n_k)))
    else:
        rows_g = positions(globals_.row_runs(spec), spec.documents, n_k, min(off, 0))
        keys_g = positions(globals_.key_runs(spec), spec.documents, n_k)
    # each direction's GPOS lists its partners, then (when rows and keys differ) its owns;
    # its GIDX the partners' counts, then the owns', found ``flags >> OWN_SHIFT`` further on
    apart = rows_g != keys_g
    skip_counts = (n_k - min(off, 0) + 2) << OWN_SHIFT if apart else 0
    slots, key_slots = [], []
    if rows_g:  # the TABLE slot of global rows
        first = sum(x < off for x in rows_g) + (len(keys_g) if apart else 0)
        slots.append((0, 1, first, len(rows_g) - first + (len(keys_g) if apart else 0), 0, n_k,
                      -big, hg, TABLE))
    if keys_g:  # the TABLE slot of global keys
        first = sum(x < 0 for x in keys_g) + (len(rows_g) if apart else 0)
        key_slots.append((0, 1, first, len(keys_g) - first + (len(rows_g) if apart else 0),
                          off, n_k, -hg, big, TABLE))
    sizes = dilation.class_sizes(n_k, d)  # keys per residue class
    for r in range(d):
        x_start = ceil_div((max(off, skip) if skip else off) - r, d)
        n_rows = max(0, (n_k - 1 - r) // d - x_start + 1)
        nk = int(sizes[r])
        gk = min(max(ceil_div(skip - r, d), 0), nk)  # class keys below g: the table slot's
        slots.append((r, d, x_start, n_rows, 0, nk, lo_rel, hi_rel,
                      (CROSS if keys_g else 0) | skip_counts))
        rows = (x_start, x_start + n_rows)
        key_slots.append((r, d, gk, nk - gk, *rows, -hi_rel, -lo_rel,
                          (CROSS if rows_g else 0) | skip_counts))
    return BandPlan(n_q, n_k, big, hg, prefix.length(spec), rows_g, keys_g, spec.documents, d,
                    tuple(slots), tuple(key_slots), triton_predicate(spec))


def doc_edges(documents: tuple[int, ...] | None, p: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """[start, end) of the document holding each position of ``p`` (int64,
    :func:`harness.mask_features.documents.edges`); without documents [0, n)."""
    if documents is None:
        return torch.zeros_like(p), torch.full_like(p, n)
    return documents_.edges(documents, p)


def own_bounds(plan: BandPlan, slot: tuple[int, ...], x: Tensor, p: Tensor):
    """The partner interval [lo, hi] (class coordinates, inclusive) that owns ``x`` at
    positions ``p`` keep: the window, the prefix, the document, the slot's partner range."""
    r, step, _, _, c_start, c_end, lo_rel, hi_rel, _ = slot
    lo, hi = x + lo_rel, x + hi_rel
    ds, de = doc_edges(plan.documents, p, plan.n_k)  # [0, n_k) without documents
    if plan.prefix and step == 1:  # class coordinates are positions (else: prefix_spans)
        inside = p - ds < plan.prefix
        # without documents a key's prefix rows start at the first row (rows p < 0 count as 0)
        first = ds if plan.documents is not None else torch.full_like(ds, c_start)
        lo = torch.where(inside, torch.minimum(lo, first), lo)
        hi = torch.where(inside, torch.maximum(hi, ds + plan.prefix - 1), hi)
    if plan.documents is not None:
        lo = torch.maximum(lo, -((r - ds) // step))  # ceil((ds - r) / step)
        hi = torch.minimum(hi, (de - 1 - r) // step)
    return lo.clamp(min=c_start), hi.clamp(max=c_end - 1)


def prefix_spans(plan: BandPlan, slot: tuple[int, ...], block: int, first: int) -> Tensor:
    """Partners (absolute positions) that each own block of a dilated class slot walks for its
    prefix, as the kernels' ``prefix_bounds``: from the least start to the greatest end of the
    owns' prefix intervals (``first``: the first partner position, 0 for keys, ``n_k - n_q``
    for rows); 0 for a block with no own in a prefix, and for slots of step 1 (their band holds
    the prefix). int64 (own blocks,). O(owns)."""
    r, step, x_start, n_own, *_, flags = slot
    n_blocks = ceil_div(max(n_own, 0), block)
    if not plan.prefix or step == 1 or flags & TABLE or n_blocks == 0:
        return torch.zeros(n_blocks, dtype=torch.int64)
    x = torch.arange(x_start, x_start + n_own, dtype=torch.int64)
    p = r + step * x
    ds, de = doc_edges(plan.documents, p, plan.n_k)
    if plan.documents is None:
        inside, plo = p < plan.prefix, torch.full_like(p, first)
        phi = torch.full_like(p, plan.prefix - 1)
    else:
        inside, plo, phi = p - ds < plan.prefix, ds, torch.minimum(ds + plan.prefix, de) - 1
    big = 1 << 30
    which = torch.div(x - x_start, block, rounding_mode="floor")
    seg_lo = torch.full((n_blocks,), big, dtype=torch.int64).scatter_reduce(
        0, which, torch.where(inside, plo, big), "amin")
    seg_hi = torch.full((n_blocks,), -big, dtype=torch.int64).scatter_reduce(
        0, which, torch.where(inside, phi, -big), "amax")
    return (seg_hi + 1 - seg_lo).clamp_min(0)


def _own_blocks(plan: BandPlan, slot: tuple[int, ...], block: int):
    """First and last own (x, p) of each own block of a slot, int64 tensors."""
    r, step, x_start, n_own, *_, flags = slot
    x0 = torch.arange(x_start, x_start + n_own, block, dtype=torch.int64)
    x1 = torch.clamp(x0 + block, max=x_start + n_own) - 1
    if flags & TABLE:
        table = torch.tensor(plan.gpos(keys=False), dtype=torch.int64)
        return table[x0], table[x0], table[x1], table[x1]
    return x0, r + step * x0, x1, r + step * x1


def band_executed_pairs(plan: BandPlan, block_m: int, block_n: int) -> int:
    """(query, key) lanes the forward kernel computes per (batch, head): every program's
    ``block_m`` rows times ``block_n`` keys per key block it visits (masked lanes included),
    band, cross and prefix spans. O(number of row blocks), O(rows) with a dilated prefix."""
    total = 0
    table = torch.tensor(plan.key_globals, dtype=torch.int64)  # the rows' partners
    for slot in plan.slots:
        if slot[3] <= 0:
            continue
        x0, p0, x1, p1 = _own_blocks(plan, slot, block_m)
        lo, _ = own_bounds(plan, slot, x0, p0)
        _, hi = own_bounds(plan, slot, x1, p1)
        blocks = torch.div((hi + 1 - lo).clamp_min(0) + block_n - 1, block_n, rounding_mode="floor")
        if slot[8] & CROSS:
            first, _ = doc_edges(plan.documents, p0, plan.n_k)
            _, end = doc_edges(plan.documents, p1, plan.n_k)
            last = torch.minimum(p1 + plan.hg, end - 1)
            count = torch.searchsorted(table, last, right=True) - torch.searchsorted(table, first)
            blocks = blocks + torch.div(count.clamp_min(0) + block_n - 1, block_n,
                                        rounding_mode="floor")
        span = prefix_spans(plan, slot, block_m, 0)
        blocks = blocks + torch.div(span + block_n - 1, block_n, rounding_mode="floor")
        total += int(blocks.sum()) * block_m * block_n
    return total
