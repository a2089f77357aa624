"""Mask semantics: the one executable definition every implementation is checked against.

Indices: query ``i`` in ``[0, n_q)``, key ``j`` in ``[0, n_k)``, ``off = n_k - n_q``: a query's
absolute position is ``p = i + off`` (bottom-right alignment, as FlashAttention >= 2.1 and
xformers' ``...FromBottomRightMask``; SDPA's ``is_causal`` is top-left and differs when
``n_q != n_k``). With ``rel = j - p``, a pair is kept when, in this order:

1. the pattern keeps it:
   - window ``(left, right)``: ``-left*d <= rel <= right*d`` and ``rel % d == 0`` where ``d`` is
     the dilation (``None``/``-1`` = unbounded on that side). A causal sliding window of W keys
     is ``(W - 1, 0)``; HF/Mistral's ``sliding_window=W`` is ``(W - 1, 0)``; attention-gym's
     ``q - kv <= W`` is ``(W, 0)`` (W + 1 keys). No window: every pair.
   - block-sparse (``block_size = b``, BigBird) instead: query block ``p // b`` and key block
     ``j // b`` are in the layout of sliding blocks (``window`` counted in *blocks* here) and
     ``random_blocks`` seeded random key blocks per query block;
2. or either side is a global token: ``global_tokens = g`` (an int) makes positions ``p < g``
   and keys ``j < g`` global; a tuple names the global positions (any positions; for
   block-sparse they must be whole blocks). A tuple ``(0, ..., g - 1)`` is stored as ``g``;
3. and, when ``causal``, ``rel <= 0``;
4. or both ``p < prefix_len`` and ``j < prefix_len`` (prefix-LM: the prefix attends to itself
   both ways; with ``causal`` and nothing else this is attention-gym's ``prefix_lm``,
   ``kv < P or q >= kv``);
5. and, with ``documents`` (the lengths of packed documents, in order, summing to the sequence
   length; ``n_q == n_k``), query and key lie in the same document: no rule above, global
   tokens included, reaches across a document boundary.

A query with no kept key outputs zeros (never NaN).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

Side = int | None
Globals = int | tuple[int, ...]


class MaskError(ValueError):
    """A MaskSpec whose fields contradict each other."""


@dataclass(frozen=True)
class MaskSpec:
    """Which (query, key) pairs attend; see the module docstring for the exact rules."""

    causal: bool = False
    window: tuple[Side, Side] | None = None
    dilation: int = 1
    global_tokens: Globals = 0
    block_size: int | None = None
    random_blocks: int = 0
    seed: int = 0
    documents: tuple[int, ...] | None = None
    prefix_len: int = 0

    def __post_init__(self) -> None:
        if self.window is not None:
            left, right = (None if s is None or s == -1 else int(s) for s in self.window)
            if (left is not None and left < 0) or (right is not None and right < 0):
                raise MaskError(f"window sides must be >= 0 or -1/None, got {self.window}")
            object.__setattr__(self, "window", (left, right))
        if self.dilation < 1:
            raise MaskError(f"dilation must be >= 1, got {self.dilation}")
        object.__setattr__(self, "global_tokens", _normal_globals(self.global_tokens))
        if self.random_blocks < 0:
            raise MaskError("random_blocks must be >= 0")
        if self.prefix_len < 0:
            raise MaskError(f"prefix_len must be >= 0, got {self.prefix_len}")
        if self.documents is not None:
            docs = tuple(int(x) for x in self.documents)
            if not docs or min(docs) < 1:
                raise MaskError(f"documents must be lengths >= 1, got {self.documents}")
            object.__setattr__(self, "documents", docs)
        if self.block_size is not None:
            if self.block_size < 1:
                raise MaskError(f"block_size must be >= 1, got {self.block_size}")
            if self.dilation != 1:
                raise MaskError("dilation cannot be combined with block_size")
            _check_whole_blocks(self.global_tokens, self.block_size)
        elif self.random_blocks:
            raise MaskError("random_blocks needs block_size")

    @property
    def left(self) -> Side:
        return None if self.window is None else self.window[0]

    @property
    def right(self) -> Side:
        return None if self.window is None else self.window[1]

    @property
    def is_dense(self) -> bool:
        """True when every pair is kept (plain non-causal attention)."""
        return (
            not self.causal
            and self.window in (None, (None, None))
            and self.dilation == 1
            and self.block_size is None
            and self.documents is None
        )

    @property
    def features(self) -> frozenset[str]:
        """Mask features this spec uses, as named in ``Capabilities.mask_features``."""
        used = set()
        if self.causal:
            used.add("causal")
        if self.window not in (None, (None, None)):
            used.add("window")
        if self.dilation > 1:
            used.add("dilation")
        if self.global_tokens:
            used.add("global")
        if isinstance(self.global_tokens, tuple):
            used.add("global_positions")
        if self.block_size is not None:
            used.add("block_sparse")
        if self.documents is not None:
            used.add("documents")
        if self.prefix_len:
            used.add("prefix")
        return frozenset(used)

    def global_positions(self, n: int) -> tuple[int, ...]:
        """The global positions below ``n``, ascending."""
        g = self.global_tokens
        return tuple(range(min(g, n))) if isinstance(g, int) else tuple(x for x in g if x < n)

    def check_lengths(self, n_q: int, n_k: int) -> None:
        """Raise :class:`MaskError` when this spec cannot apply to n_q queries over n_k keys:
        documents need ``n_q == n_k`` and must sum to it; global positions and the prefix must
        lie inside the sequence."""
        if self.documents is not None:
            if n_q != n_k:
                raise MaskError(f"documents need n_q == n_k, got {n_q} queries over {n_k} keys")
            if sum(self.documents) != n_k:
                raise MaskError(
                    f"documents sum to {sum(self.documents)}, not the sequence length {n_k}"
                )
        if isinstance(self.global_tokens, tuple) and self.global_tokens[-1] >= n_k:
            raise MaskError(
                f"global position {self.global_tokens[-1]} is outside a sequence of {n_k}"
            )
        if self.prefix_len > n_k:
            raise MaskError(f"prefix_len {self.prefix_len} > sequence length {n_k}")

    def describe(self) -> str:
        """A short human label, e.g. ``causal,window=(255,0)``."""
        parts = []
        if self.causal:
            parts.append("causal")
        if self.window is not None:
            parts.append(f"window=({_side(self.left)},{_side(self.right)})")
        if self.dilation > 1:
            parts.append(f"dilation={self.dilation}")
        if isinstance(self.global_tokens, tuple):
            parts.append(f"global=[{' '.join(map(str, self.global_tokens))}]")
        elif self.global_tokens:
            parts.append(f"global={self.global_tokens}")
        if self.block_size is not None:
            parts.append(f"block={self.block_size},random={self.random_blocks}")
        if self.prefix_len:
            parts.append(f"prefix={self.prefix_len}")
        if self.documents is not None:
            parts.append(f"documents={len(self.documents)}")
        return ",".join(parts) or "dense"


def _side(s: Side) -> str:
    return "-1" if s is None else str(s)


def _normal_globals(g) -> Globals:
    """An int count stays; a collection of positions becomes a sorted tuple without repeats,
    stored as the count ``g`` when it is exactly ``0..g-1`` (one spelling per mask)."""
    if isinstance(g, bool) or not isinstance(g, int | tuple | list):
        raise MaskError(f"global_tokens must be a count or a tuple of positions, got {g!r}")
    if isinstance(g, int):
        if g < 0:
            raise MaskError(f"global_tokens must be >= 0, got {g}")
        return g
    positions = tuple(sorted({int(x) for x in g}))
    if positions and positions[0] < 0:
        raise MaskError(f"global positions must be >= 0, got {positions[0]}")
    if positions == tuple(range(len(positions))):
        return len(positions)
    return positions


def _check_whole_blocks(g: Globals, b: int) -> None:
    """Block-sparse global tokens must be whole blocks (a count or a set of positions)."""
    if isinstance(g, int):
        if g % b:
            raise MaskError(f"global_tokens={g} must be a multiple of block_size={b}")
        return
    blocks = {x // b for x in g}
    if len(g) != len(blocks) * b:
        raise MaskError(f"global positions must be whole blocks of block_size={b}, got {g}")


def document_ids(lengths: tuple[int, ...], device: torch.device | str = "cpu") -> Tensor:
    """The document index of every position, int64 (sum(lengths),): ``[0]*l0 + [1]*l1 + ...``."""
    counts = torch.tensor(lengths, dtype=torch.int64, device=device)
    return torch.repeat_interleave(torch.arange(len(lengths), device=device), counts)


@lru_cache(maxsize=64)
def block_layout(spec: MaskSpec, n_q: int, n_k: int) -> Tensor:
    """The BigBird block layout, bool (n_blocks, n_blocks) over absolute block indices.

    Row = query block ``p // b``, column = key block ``j // b``. Holds the sliding blocks and the
    seeded random blocks; global tokens are added token-wise by :func:`mask_rows`.
    """
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


def keep_pairs(spec: MaskSpec, n_q: int, n_k: int, p: Tensor, j: Tensor) -> Tensor:
    """The mask rule at arbitrary pairs: p (r, 1) absolute query positions (``i + n_k - n_q``),
    j (1, c) key indices -> bool (r, c), True = attend. The one definition of the semantics."""
    rel = j - p
    if spec.block_size is not None:
        layout = block_layout(spec, n_q, n_k).to(p.device)
        nb = layout.shape[0]
        qb = torch.div(p, spec.block_size, rounding_mode="floor")
        valid = (qb >= 0) & (qb < nb)
        keep = layout[qb.clamp(0, nb - 1), j // spec.block_size] & valid
    else:
        keep = torch.ones(rel.shape, dtype=torch.bool, device=p.device)
        d = spec.dilation
        if spec.left is not None:
            keep &= rel >= -spec.left * d
        if spec.right is not None:
            keep &= rel <= spec.right * d
        if d > 1:
            keep &= torch.remainder(rel, d) == 0
    if isinstance(spec.global_tokens, tuple):
        g = torch.tensor(spec.global_tokens, device=p.device)
        keep |= torch.isin(p, g) | torch.isin(j, g)
    elif spec.global_tokens:
        keep |= (p < spec.global_tokens) | (j < spec.global_tokens)
    if spec.causal:
        keep &= rel <= 0
    if spec.prefix_len:
        keep |= (p < spec.prefix_len) & (j < spec.prefix_len)
    if spec.documents is not None:
        doc = document_ids(spec.documents, p.device)
        n = doc.numel()
        p_doc = torch.where((p >= 0) & (p < n), doc[p.clamp(0, n - 1)], -1)
        keep &= p_doc == doc[j.clamp(0, n - 1)]
    return keep


def mask_rows(
    spec: MaskSpec, n_q: int, n_k: int, start: int, stop: int, device: torch.device | str = "cpu"
) -> Tensor:
    """Rows ``start:stop`` of the dense mask, bool (stop - start, n_k), True = attend.
    Raises :class:`MaskError` when the spec does not fit these lengths."""
    spec.check_lengths(n_q, n_k)
    p = torch.arange(start, stop, device=device)[:, None] + (n_k - n_q)  # absolute positions
    j = torch.arange(n_k, device=device)[None, :]
    return keep_pairs(spec, n_q, n_k, p, j)


def dense_mask(spec: MaskSpec, n_q: int, n_k: int, device: torch.device | str = "cpu") -> Tensor:
    """The full mask, bool (n_q, n_k), True = attend. O(n_q * n_k) memory: for tests and refs."""
    return mask_rows(spec, n_q, n_k, 0, n_q, device)


@lru_cache(maxsize=256)
def kept_pairs(spec: MaskSpec, n_q: int, n_k: int, chunk: int = 1024) -> int:
    """Exact number of kept (query, key) pairs.

    Closed form per query row (O(n_q)) for causal/window/dilation/global-prefix masks; other
    masks are counted from :func:`mask_rows` in row chunks (bounded memory, O(n_q·n_k) time).
    """
    if spec.is_dense:  # prefix and global rules only add pairs to a dense mask
        return n_q * n_k
    closed_form = not ({"documents", "prefix", "global_positions"} & spec.features)
    if spec.block_size is None and closed_form:
        return int(_row_counts(spec, n_q, n_k).sum())
    return sum(
        int(mask_rows(spec, n_q, n_k, s, min(s + chunk, n_q)).sum()) for s in range(0, n_q, chunk)
    )


def _count_multiples(lo: Tensor, hi: Tensor, d: int) -> Tensor:
    """How many multiples of d lie in [lo, hi] (elementwise; 0 when empty)."""
    first = -torch.div(-lo, d, rounding_mode="floor")  # ceil(lo / d)
    last = torch.div(hi, d, rounding_mode="floor")
    return (last - first + 1).clamp_min(0)


def _row_counts(spec: MaskSpec, n_q: int, n_k: int) -> Tensor:
    """Kept keys per query row for non-block masks, int64 (n_q,), by interval arithmetic."""
    big = 4 * (n_q + n_k) + 1
    p = torch.arange(n_q, dtype=torch.int64) + (n_k - n_q)
    d = spec.dilation
    rel_lo = -spec.left * d if spec.left is not None else -big
    rel_hi = spec.right * d if spec.right is not None else big
    if spec.causal:
        rel_hi = min(rel_hi, 0)
    causal_hi = (
        torch.minimum(p, torch.tensor(n_k - 1)) if spec.causal else torch.full_like(p, n_k - 1)
    )

    def local_in(j_lo: Tensor | int, j_hi: Tensor) -> Tensor:
        """Local-pattern keys with j in [j_lo, j_hi]: multiples of d in the rel interval."""
        lo = torch.maximum(p + rel_lo, torch.as_tensor(j_lo)) - p
        hi = torch.minimum(p + rel_hi, j_hi) - p
        return torch.where(hi >= lo, _count_multiples(lo, hi, d), 0)

    counts = local_in(0, torch.full_like(p, n_k - 1))
    g = spec.global_tokens
    if g:
        # keys j < g are seen by every query (within causality): add those the pattern missed
        g_hi = torch.minimum(torch.full_like(p, g - 1), causal_hi)
        seen_global = (g_hi + 1).clamp_min(0)
        counts = counts - local_in(0, g_hi) + seen_global
        # global queries (p < g) see every key allowed by causality
        counts = torch.where(p < g, (causal_hi + 1).clamp_min(0), counts)
    return counts
