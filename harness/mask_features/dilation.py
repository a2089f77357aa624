"""Dilation: a window over every d-th key, ``(j - p) % d == 0`` (rule 1 of :mod:`harness.masks`).

Where the field uses it: ``dilation = d`` (Longformer's dilated sliding window, the
``dilated`` and ``flex-dilated`` methods). Not with ``block_size``.

- Clause: :func:`clause`.
- Count: the step ``d`` of :class:`harness.paircount.BandRule` (the band scaled by d,
  diagonals counted by arithmetic series).
- Block plan: the CPU tiles and the Triton band slots regroup rows and keys by residue class
  (:func:`class_sizes`, :func:`class_order`, :func:`in_class`), where the dilated window is a
  plain band (:func:`harness.mask_features.window.class_band`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor


def step(spec) -> int:
    """The dilation d (1: none)."""
    return spec.dilation


def clause(spec) -> Callable[[Tensor], Tensor] | None:
    """``rel -> rel % d == 0``; None without dilation. A power of two is a bit mask (two's
    complement: ``rel & (d - 1)`` is ``rel mod d`` for negatives too): the element code of
    Flex's kernel, where a modulo per element costs."""
    d = step(spec)
    if d == 1:
        return None
    if d & (d - 1) == 0:
        return lambda rel: (rel & (d - 1)) == 0
    return lambda rel: rel % d == 0


def class_sizes(n: int, d: int) -> np.ndarray:
    """How many of positions 0..n-1 fall in each class r (``p ≡ r mod d``), int64 (d,)."""
    return np.maximum(-((np.arange(d) - n) // d), 0).astype(np.int64)


def in_class(u, v, r, d: int):
    """How many j in [u, v) have ``j ≡ r (mod d)``, elementwise (numpy or ints)."""
    # floor((v - 1 - r) / d) - ceil((u - r) / d) + 1
    return np.maximum((v - 1 - r) // d + (r - u) // d + 1, 0)


def class_order(first: int, n: int, d: int) -> Tensor:
    """The indices 0..n-1 of positions ``first .. first + n - 1`` in class order: the class
    of position 0 first, each class ascending, int64 (n,)."""
    return torch.cat([torch.arange(min((r - first) % d, n), n, d) for r in range(d)])
