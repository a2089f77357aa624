"""Mask semantics: the one executable definition every implementation is checked against.

Indices: query ``i`` in ``[0, n_q)``, key ``j`` in ``[0, n_k)``, ``off = n_k - n_q``: a query's
absolute position is ``p = i + off`` (bottom-right alignment, as FlashAttention >= 2.1 and
xformers' ``...FromBottomRightMask``; SDPA's ``is_causal`` is top-left and differs when
``n_q != n_k``). With ``rel = j - p``, a pair is kept when, in this order:

1. the pattern keeps it:
   - window ``(left, right)``: ``-left*d <= rel <= right*d`` and ``rel % d == 0`` where ``d`` is
     the dilation (``None``/``-1`` = unbounded on that side). A causal sliding window of W keys
     is ``(W - 1, 0)``; HF/Mistral's ``sliding_window=W`` is ``(W - 1, 0)``; attention-gym's
     ``q - kv <= W`` is ``(W, 0)`` (W + 1 keys); docs/masks.md has the full table. No window:
     every pair.
   - block-sparse (``block_size = b``, BigBird) instead: query block ``p // b`` and key block
     ``j // b`` are in the layout of sliding blocks (``window`` counted in *blocks* here) and
     ``random_blocks`` seeded random key blocks per query block;
2. or either side is a global token: ``global_tokens = g`` (an int) makes positions ``0..g-1``
   global; a tuple names the global positions (any positions, e.g. HF BigBird's first and last
   blocks; for block-sparse they must be whole blocks, the last block of the sequence possibly
   shorter). A tuple ``(0, ..., g - 1)`` is stored as ``g``. A global query attends to every
   key, a global key is attended by every query;
3. and, when ``causal``, ``rel <= 0``;
4. or both ``p < P`` and ``j < P`` for the prefix ``P`` (prefix-LM: the prefix attends to itself
   both ways; with ``causal`` and nothing else this is attention-gym's ``prefix_lm``,
   ``kv < P or q >= kv``).

For the membership of a query row in rules 2 and 4, a row before the first key (``p < 0``,
only when ``n_q > n_k``) counts as position 0.

5. With ``documents`` (the lengths of packed documents, in order, summing to the sequence
   length; ``n_q == n_k``; not with ``block_size``) each document is its own sequence: a pair
   is kept when query and key lie in the same document and rules 1-4 and 6 keep it with positions
   counted from that document's start. So ``global_tokens = 1`` is every document's first
   token, a prefix ``P`` every document's first P tokens, a tuple names positions inside
   each document, and nothing reaches across a document boundary. This is attention-gym's
   ``generate_doc_mask_mod(mask_mod, offsets)`` (it hands ``mask_mod`` document-local indices)
   and what FlashAttention's varlen and xformers' ``BlockDiagonal*Mask`` compute per sequence.
6. And every predicate feature (:mod:`harness.mask_features.predicate`, a plug-in in
   ``extra``) allows ``(p, j)``, positions counted as rules 1-4 count them (inside the
   document, with documents): an AND that restricts the rules above, attention-gym's
   ``mask_mod`` form. The named fields keep the diagonal ``j = p`` of every row inside the
   keys; a predicate can remove it. A row that rules 1-5 give keys and rule 6 leaves none
   makes the mask contradictory: :func:`check_rows` refuses it, in one line, before any path
   runs.

A query with no kept key (a row before the first key, ``n_q > n_k``) outputs zeros (never
NaN). :func:`reduced` is the simplest spec that keeps the same pairs at given lengths (one query
under causal keeps every key, a window wider than the sequence cuts nothing): every path is
handed it (:class:`harness.registry.Implementation`), so it takes its fast path for it.
:func:`kept_pairs` and :func:`block_pair_counts` count kept pairs exactly without visiting them
(:mod:`harness.paircount`; a predicate feature's partial blocks are evaluated element by
element); :func:`dense_mask` is the definition they are tested against.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

from harness.mask_features import (
    bigbird_blocks,
    causal,
    dilation,
    documents,
    predicate,
    prefix,
    window,
)
from harness.mask_features import globals as globals_
from harness.mask_fields import Globals, MaskError, MaskSpec, Side
from harness.paircount import BIG, BandRule, LayoutRule, candidate_keys, expand, rect_pairs

__all__ = [
    "Globals",
    "MaskError",
    "MaskSpec",
    "Side",
    "block_layout",
    "block_pair_counts",
    "check_fits",
    "check_rows",
    "dense_mask",
    "document_ids",
    "document_starts",
    "keep_pairs",
    "kept_pairs",
    "mask_rows",
    "pair_keep",
    "pair_rule",
    "reduced",
]

document_starts = documents.starts
document_ids = documents.ids
block_layout = bigbird_blocks.block_layout


PairKeep = Callable[[Tensor, Tensor], Tensor]


def keep_pairs(spec: MaskSpec, n_q: int, n_k: int, p: Tensor, j: Tensor) -> Tensor:
    """The mask rule at arbitrary pairs: p (r, 1) absolute query positions (``i + n_k - n_q``),
    j (1, c) key indices -> bool (r, c), True = attend. The one definition of the semantics:
    :func:`pair_keep`, the clauses of :mod:`harness.mask_features` composed."""
    return pair_keep(spec, n_q, n_k, str(p.device))(p, j)


@lru_cache(maxsize=256)
def pair_keep(spec: MaskSpec, n_q: int, n_k: int, device: str = "cpu") -> PairKeep:
    """The mask rule as one function ``(p, j) -> bool``: every feature module's clause, built
    once on the spec's numbers and composed in the order of the module docstring (and of
    :mod:`harness.mask_features`). Elementwise ops on broadcast integer tensors, nothing
    written in place, only the clauses the spec uses: the dense rule runs it on grids, and
    Flex's ``mask_mod`` is this function on its index tensors (under vmap and compile), so
    its kernel holds exactly these clauses. Cached: the same key gives the same function."""
    split = documents.split(spec, device)
    inner = _sequence_keep(spec.without_documents(), n_q, n_k, device)
    if split is None:
        return inner

    def keep_in_document(p: Tensor, j: Tensor) -> Tensor:  # rule 5: local positions
        same, p_local, j_local = split(p, j)
        return inner(p_local, j_local) & same

    return keep_in_document


def _sequence_keep(spec: MaskSpec, n_q: int, n_k: int, device: str) -> PairKeep:
    """Rules 1-4 and 6 of the module docstring (no documents). A clause that cuts nothing is
    None: ``keep`` None means every pair so far, so an OR into it is skipped."""
    visible = globals_.clause(spec, device)
    fold = spec.causal and visible is None and spec.block_size is None  # nothing OR-ed between
    if spec.block_size is not None:
        pattern = [bigbird_blocks.clause(spec, n_q, n_k, device)]
        bands = []
    else:
        pattern = []
        bands = [c for c in (window.clause(spec, causal_cut=fold), dilation.clause(spec)) if c]
    cut = None if fold else causal.clause(spec)
    square, allowed = prefix.clause(spec), predicate.clause(spec)

    def keep_pair(p: Tensor, j: Tensor) -> Tensor:
        rel = j - p
        keep = pattern[0](p, j) if pattern else None
        for band in bands:
            keep = _and(keep, band(rel))
        if keep is not None and visible is not None:
            keep = keep | visible(p, j)  # memberships count a row p < 0 as position 0
        if cut is not None:
            keep = _and(keep, cut(rel))
        if keep is not None and square is not None:
            keep = keep | square(p, j)
        if allowed is not None:
            keep = _and(keep, allowed(p, j))
        return torch.ones_like(rel, dtype=torch.bool) if keep is None else keep

    return keep_pair


def _and(keep: Tensor | None, clause: Tensor) -> Tensor:
    return clause if keep is None else keep & clause


def mask_rows(
    spec: MaskSpec, n_q: int, n_k: int, start: int, stop: int, device: torch.device | str = "cpu"
) -> Tensor:
    """Rows ``start:stop`` of the dense mask, bool (stop - start, n_k), True = attend.
    Raises :class:`MaskError` when the spec does not fit these lengths."""
    check_fits(spec, n_q, n_k)
    p = torch.arange(start, stop, device=device)[:, None] + (n_k - n_q)  # absolute positions
    j = torch.arange(n_k, device=device)[None, :]
    return keep_pairs(spec, n_q, n_k, p, j)


def dense_mask(spec: MaskSpec, n_q: int, n_k: int, device: torch.device | str = "cpu") -> Tensor:
    """The full mask, bool (n_q, n_k), True = attend. O(n_q * n_k) memory: for tests and refs."""
    return mask_rows(spec, n_q, n_k, 0, n_q, device)


def reduced(spec: MaskSpec, n_q: int, n_k: int) -> MaskSpec:
    """The simplest spec that keeps exactly the pairs ``spec`` keeps of n_q queries over n_k
    keys (>= 1): what a path should compute, so that it takes its fast path. O(1), on fields:

    - an undilated window side that reaches past every key (left: ``left >= n - 1`` for the
      last row; right: ``right >= n_q - 1`` for the first; ``n`` = n_k, or the longest
      document) is unbounded; under causal the right side is moot (kept as written), and an
      unbounded left side leaves no window;
    - causal over one query row (``n_q <= 1``, the newest position) keeps every key: dropped
      when no window is left (a window keeps its causal form: the same pairs either way);
    - with nothing left that cuts (no causal, window or dilation), global tokens, visible
      runs and a prefix add no pair: the dense mask; with causal the only cut, global tokens
      and visible runs add none (a prefix still does).

    Block-sparse specs (the window counts blocks) are returned as they are; predicate features
    and documents are kept (documents still cut). The seed stays (random features read it)."""
    if spec.block_size is not None:
        return spec
    n = max(spec.documents) if spec.documents is not None else n_k
    rows = n if spec.documents is not None else n_q
    d, causal, win = spec.dilation, spec.causal, spec.window
    if win is not None and d == 1:
        left = None if win[0] is not None and win[0] >= n - 1 else win[0]
        right = None if win[1] is not None and win[1] >= rows - 1 and not causal else win[1]
        win = None if left is None and (causal or right is None) else (left, right)
    if causal and win is None and n_q <= 1 and spec.documents is None:
        causal = False
    out = {"causal": causal, "window": win}
    if win is None and d == 1:  # OR-ed features add nothing where only causal (or nothing) cuts
        out.update(global_tokens=0, extra=predicate.predicates(spec))
        if not causal:
            out["prefix_len"] = 0
    if all(getattr(spec, k) == v for k, v in out.items()):
        return spec
    return replace(spec, **out)


# --- exact counts without visiting pairs -------------------------------------------------------


def pair_rule(spec: MaskSpec, n_q: int, n_k: int) -> BandRule | LayoutRule:
    """Rules 1-4 of ``spec`` (documents set aside) as numbers for :mod:`harness.paircount`:
    each feature module's part of the closed-form count."""
    keys = globals_.key_runs(spec)
    if spec.block_size is not None:
        layout = bigbird_blocks.folded_layout(spec, n_q, n_k)
        return LayoutRule(spec.block_size, layout.numpy(), spec.causal, keys,
                          bool(keys) and keys[0][0] == 0, prefix.length(spec))
    lo, hi = window.band(spec)
    hi = BIG if hi is None else hi
    rows_g = tuple((-BIG if a == 0 else a, e) for a, e in globals_.row_runs(spec))
    return BandRule(
        lo=-BIG if lo is None else lo,
        hi=min(hi, 0) if spec.causal else hi,
        d=dilation.step(spec),
        causal=spec.causal,
        keys_g=keys,
        rows_g=rows_g,
        prefix=prefix.length(spec),
    )


@lru_cache(maxsize=256)
def kept_pairs(spec: MaskSpec, n_q: int, n_k: int) -> int:
    """Exact number of kept (query, key) pairs, in closed form: O(distinct document lengths x
    global runs), or O(layout blocks) for block-sparse; never O(n_q * n_k). With a predicate
    feature: the sum of :func:`block_pair_counts` (not closed form, see there)."""
    check_fits(spec, n_q, n_k)
    if predicate.predicates(spec):
        return int(block_pair_counts(spec, n_q, n_k, COUNT_BLOCK, COUNT_BLOCK)[2].sum())
    if spec.is_dense:  # prefix and global rules only add pairs to a dense mask
        return n_q * n_k
    if spec.documents is None:
        rule, off = pair_rule(spec, n_q, n_k), n_k - n_q
        return int(rect_pairs(rule, off, off + n_q, 0, n_k)[0])
    local = spec.without_documents()
    counts = documents.counts(spec)
    lengths = np.array(sorted(counts), dtype=np.int64)
    per_doc = rect_pairs(pair_rule(local, 1, 1), 0, lengths, 0, lengths)
    return int(sum(int(c) * counts[int(n)] for n, c in zip(lengths, per_doc, strict=True)))


def block_pair_counts(
    spec: MaskSpec, n_q: int, n_k: int, block_q: int, block_k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (block_q x block_k) block of the (n_q, n_k) grid that keeps a pair: its query
    block (rows ``i``), key block and exact kept-pair count, three int64 arrays.

    O(candidate blocks): per query block (per document) only key blocks that the band, the
    global runs, the global rows or the prefix can reach are counted, each in closed form.
    With predicate features (rule 6), each such block is then classified by them
    (:func:`harness.mask_features.predicate.classify`, O(blocks)): SKIP blocks are dropped,
    FULL ones keep the closed-form count, PARTIAL ones (every block, with documents) are
    counted element by element: O(partial blocks x block_q x block_k)."""
    check_fits(spec, n_q, n_k)
    qb, kb, count = _listed_blocks(spec, n_q, n_k, block_q, block_k)
    if not predicate.predicates(spec):
        return qb, kb, count
    off = n_k - n_q
    if spec.documents is None:
        state = predicate.classify(spec, qb * block_q + off, np.minimum(qb * block_q + block_q, n_q)
                                   + off, kb * block_k, np.minimum(kb * block_k + block_k, n_k))
    else:  # positions are document-local there: evaluate every block
        state = np.full(qb.size, predicate.PARTIAL, np.int8)
    partial = np.nonzero(state == predicate.PARTIAL)[0]
    count = np.where(state == predicate.SKIP, 0, count)
    for at, keep in _block_keeps(spec, n_q, n_k, block_q, block_k, qb[partial], kb[partial]):
        count[partial[at]] = keep.sum((1, 2)).numpy()
    kept = count > 0
    return qb[kept], kb[kept], count[kept]


COUNT_BLOCK = 64  # the block of the per-block sum that counts a mask with predicate features
EVAL_CHUNK = 256  # blocks evaluated at once (256 x 64 x 64 bools: 1 MiB)


def _block_keeps(spec: MaskSpec, n_q: int, n_k: int, block_q: int, block_k: int,
                 qb: np.ndarray, kb: np.ndarray):
    """The dense rule on the listed blocks, chunk by chunk: yields (slice of the blocks, bool
    (m, block_q, block_k)), pairs outside the (n_q, n_k) grid False."""
    rows, cols = torch.arange(block_q)[None, :, None], torch.arange(block_k)[None, None, :]
    for s in range(0, qb.size, EVAL_CHUNK):
        at = slice(s, min(s + EVAL_CHUNK, qb.size))
        i = torch.from_numpy(qb[at])[:, None, None] * block_q + rows  # (m, block_q, 1)
        j = torch.from_numpy(kb[at])[:, None, None] * block_k + cols  # (m, 1, block_k)
        yield at, keep_pairs(spec, n_q, n_k, i + (n_k - n_q), j) & (i < n_q) & (j < n_k)


@lru_cache(maxsize=64)
def check_rows(spec: MaskSpec, n_q: int, n_k: int) -> None:
    """Raise :class:`MaskError` when a query row that the other rules give keys keeps none once
    the predicate features (rule 6) apply: a contradictory mask, refused the same way on every
    path before anything runs.

    The named fields keep every row inside the keys its diagonal ``j = p`` (window sides are
    >= 0, dilation keeps ``rel = 0``, a BigBird layout its diagonal block, a document its own
    positions), so only predicate features can empty a row; those masks are evaluated on the
    blocks the other rules list (O(their pairs)). A row before the first key (``n_q > n_k``)
    that the other rules give no key outputs zeros, by the alignment rule: no contradiction."""
    features = predicate.predicates(spec)
    if not features:
        return
    others = replace(spec, extra=tuple(f for f in spec.extra if f not in features))
    qb, kb, _ = _listed_blocks(spec, n_q, n_k, COUNT_BLOCK, COUNT_BLOCK)
    kept = torch.zeros(2, -(-n_q // COUNT_BLOCK) * COUNT_BLOCK, dtype=torch.int64)
    for which, rule in enumerate((spec, others)):
        for at, keep in _block_keeps(rule, n_q, n_k, COUNT_BLOCK, COUNT_BLOCK, qb, kb):
            rows = torch.from_numpy(qb[at])[:, None] * COUNT_BLOCK + torch.arange(COUNT_BLOCK)
            kept[which].index_add_(0, rows.flatten(), keep.sum(2).flatten())
    empty = torch.nonzero((kept[0, :n_q] == 0) & (kept[1, :n_q] > 0)).flatten()
    if empty.numel():
        i = int(empty[0])
        names = sorted(f.name for f in features)
        raise MaskError(
            f"contradictory mask {spec.describe()}: query row {i} (position {i + n_k - n_q}) "
            f"keeps no key ({empty.numel()} such rows of {n_q}); the predicate features "
            f"{names} remove every key the other rules keep there"
        )


def check_fits(spec: MaskSpec, n_q: int, n_k: int) -> None:
    """The one check of a mask against its lengths, made by every path before it runs:
    :meth:`MaskSpec.check_lengths` then :func:`check_rows`. Raises :class:`MaskError`."""
    spec.check_lengths(n_q, n_k)
    check_rows(spec, n_q, n_k)


def _listed_blocks(
    spec: MaskSpec, n_q: int, n_k: int, block_q: int, block_k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`block_pair_counts` of rules 1-5 (predicate features, rule 6, set aside)."""
    # regions: query rows [i0, i1) over keys [k0, k1); row i0 is local position pos0
    if spec.documents is None:
        i0, i1 = np.zeros(1, np.int64), np.array([n_q])
        k0, k1, pos0 = np.zeros(1, np.int64), np.array([n_k]), np.array([n_k - n_q])
    else:
        i1 = k1 = np.cumsum(np.array(spec.documents, dtype=np.int64))
        i0 = k0 = k1 - np.array(spec.documents, dtype=np.int64)
        pos0 = np.zeros_like(i0)
    rule = pair_rule(spec.without_documents(), n_q, n_k)
    first = i0 // block_q
    region, qb = expand(first, (i1 - 1) // block_q - first + 1)  # one piece per (region, block)
    x0 = np.maximum(qb * block_q, i0[region]) - i0[region] + pos0[region]
    x1 = np.minimum(qb * block_q + block_q, i1[region]) - i0[region] + pos0[region]
    piece, lo, hi = candidate_keys(rule, x0, x1, (k1 - k0)[region])
    shift = k0[region[piece]]
    kb_first = (lo + shift) // block_k
    owner, kb = expand(kb_first, (hi + shift - 1) // block_k - kb_first + 1)
    n_kb = -(-n_k // block_k)
    pairs = np.unique(piece[owner] * n_kb + kb)
    piece, kb = pairs // n_kb, pairs % n_kb
    reg = region[piece]
    c0 = np.maximum(kb * block_k, k0[reg]) - k0[reg]
    c1 = np.minimum(kb * block_k + block_k, k1[reg]) - k0[reg]
    counts = rect_pairs(rule, x0[piece], x1[piece], c0, c1)
    blocks, where = np.unique(qb[piece] * n_kb + kb, return_inverse=True)
    total = np.zeros(blocks.size, np.int64)
    np.add.at(total, where, counts)
    kept = total > 0
    return blocks[kept] // n_kb, blocks[kept] % n_kb, total[kept]
