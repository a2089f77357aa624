"""Packed documents: each document is its own sequence (rule 5 of :mod:`harness.masks`).

Where the field uses it: ``documents = [l0, l1, ...]`` (or a packing rule in a suite, realised
per sequence length): FlashAttention's varlen ``cu_seqlens``, xformers' ``BlockDiagonalMask``,
attention-gym's ``generate_doc_mask_mod``. ``n_q == n_k``; not with ``block_size``.

- Clause: :func:`split` gives the same-document test and the positions inside the document;
  rules 1-4 and 6 run on those local positions.
- Count: one count per distinct document length, times how many there are (:func:`counts`).
- Block plan: each document is a region of rows and keys; no block pair across two documents
  is listed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import lru_cache

import torch
from torch import Tensor


def starts(lengths: tuple[int, ...], device: torch.device | str = "cpu") -> Tensor:
    """The start of every position's document, int64 (sum(lengths),)."""
    counts = torch.tensor(lengths, dtype=torch.int64, device=device)
    first = torch.cumsum(counts, 0) - counts
    return torch.repeat_interleave(first, counts)


def edges(lengths: tuple[int, ...], p: Tensor) -> tuple[Tensor, Tensor]:
    """[start, end) of the document holding each position of ``p`` (int64 like p; positions
    outside the sequence read the nearest document). O(len(p) · log(documents))."""
    ends = torch.cumsum(torch.tensor(lengths, dtype=torch.int64, device=p.device), 0)
    at = torch.searchsorted(ends, p.clamp(0, int(ends[-1]) - 1), right=True)
    return (ends - torch.tensor(lengths, dtype=torch.int64, device=p.device))[at], ends[at]


def ids(lengths: tuple[int, ...], device: torch.device | str = "cpu") -> Tensor:
    """The document index of every position, int64 (sum(lengths),): ``[0]*l0 + [1]*l1 + ...``."""
    counts = torch.tensor(lengths, dtype=torch.int64, device=device)
    return torch.repeat_interleave(torch.arange(len(lengths), device=device), counts)


Split = Callable[[Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]


@lru_cache(maxsize=64)
def split(spec, device: str = "cpu") -> Split | None:
    """``(p, j) -> (same document, p inside its document, j inside its document)``, broadcast
    like p, j (absolute positions; ``n_q == n_k`` with documents); None without documents.

    Equal documents of length L need no tensor (document = ``x // L``, a shift when L is a
    power of two); unequal ones read one captured int32 table, the start of each position's
    document (same document = same start), where a position outside the sequence is in no
    document. The element code of Flex's kernel: it costs what a hand-written one costs."""
    if spec.documents is None:
        return None
    length = spec.documents[0]
    if all(x == length for x in spec.documents):
        if length & (length - 1) == 0:
            shift, low = length.bit_length() - 1, length - 1
            return lambda p, j: ((p >> shift) == (j >> shift), p & low, j & low)

        def split_equal(p: Tensor, j: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            pd, jd = p // length, j // length
            return pd == jd, p - pd * length, j - jd * length

        return split_equal
    first = starts(spec.documents).to(torch.int32).to(device)
    n = first.numel()

    def split_by_table(p: Tensor, j: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        p_start, j_start = first[p.clamp(0, n - 1)], first[j.clamp(0, n - 1)]
        return (p_start == j_start) & (p >= 0) & (p < n), p - p_start, j - j_start

    return split_by_table


def counts(spec) -> Counter:
    """How many documents have each length."""
    return Counter(spec.documents)
