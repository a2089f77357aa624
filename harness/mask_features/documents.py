"""Packed documents: each document is its own sequence (rule 5 of :mod:`harness.masks`).

Where the field uses it: ``documents = [l0, l1, ...]`` (or a packing rule in a suite, realised
per sequence length): FlashAttention's varlen ``cu_seqlens``, xformers' ``BlockDiagonalMask``,
attention-gym's ``generate_doc_mask_mod``. ``n_q == n_k``; not with ``block_size``.

- Clause: :func:`split` gives the same-document test and the positions inside the document;
  rules 1-4 run on those local positions.
- Count: one count per distinct document length, times how many there are (:func:`counts`).
- Block plan: each document is a region of rows and keys; no block pair across two documents
  is listed.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import Tensor


def starts(lengths: tuple[int, ...], device: torch.device | str = "cpu") -> Tensor:
    """The start of every position's document, int64 (sum(lengths),)."""
    counts = torch.tensor(lengths, dtype=torch.int64, device=device)
    first = torch.cumsum(counts, 0) - counts
    return torch.repeat_interleave(first, counts)


def ids(lengths: tuple[int, ...], device: torch.device | str = "cpu") -> Tensor:
    """The document index of every position, int64 (sum(lengths),): ``[0]*l0 + [1]*l1 + ...``."""
    counts = torch.tensor(lengths, dtype=torch.int64, device=device)
    return torch.repeat_interleave(torch.arange(len(lengths), device=device), counts)


def split(spec, p: Tensor, j: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(same document, p inside its document, j inside its document), broadcast like p, j:
    p (r, 1) absolute query positions, j (1, c) keys. Positions outside the sequence are in
    no document."""
    first = starts(spec.documents, p.device)
    n = first.numel()
    p_start, j_start = first[p.clamp(0, n - 1)], first[j.clamp(0, n - 1)]
    same = (p_start == j_start) & (p >= 0) & (p < n)
    return same, p - p_start, j - j_start


def counts(spec) -> Counter:
    """How many documents have each length."""
    return Counter(spec.documents)
