"""Dilation: a window over every d-th key, ``(j - p) % d == 0`` (rule 1 of :mod:`harness.masks`).

Where the field uses it: ``dilation = d`` (Longformer's dilated sliding window, the
``dilated`` and ``flex-dilated`` methods). Not with ``block_size``.

- Clause: :func:`clause`.
- Count: the step ``d`` of :class:`harness.paircount.BandRule` (the band scaled by d,
  diagonals counted by arithmetic series).
- Block plan: the CPU tiles regroup rows and keys by residue class, where the dilated window
  is a plain band (:mod:`implementations._kernels.tiles.tile_plan_band`).
"""

from __future__ import annotations

from collections.abc import Callable

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
