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

import torch
from torch import Tensor


def step(spec) -> int:
    """The dilation d (1: none)."""
    return spec.dilation


def clause(spec, rel: Tensor) -> Tensor | None:
    """``rel % d == 0``; None without dilation."""
    d = step(spec)
    return None if d == 1 else torch.remainder(rel, d) == 0
