"""Predicate features: an element rule that restricts the mask, attention-gym's ``mask_mod`` form.

A *predicate feature* states which (query, key) pairs it allows, as a function of their
positions; the mask keeps a pair only when the rest of the rules keep it **and** every
predicate feature allows it (rule 6 of :mod:`harness.masks`, applied last, inside each document
with document-local positions). AND is the one sound composition that every path can honour
without knowing the predicate: a path visits what it would visit without the feature and
masks element by element; where the feature's block classification proves a block empty, the
block plan drops it. Examples from the field: attention-gym's ``mask_mod`` (any
``(b, h, q_idx, kv_idx) -> bool``), strided or chunked key patterns, per-position masks.

A subclass is a frozen dataclass (a MaskSpec is hashed as a cache key) and gives:

- :meth:`PredicateFeature.keep`: the torch element predicate, ``(p, j) -> bool`` on broadcast
  integer tensors (``p`` the query's absolute position ``i + n_k - n_q``, negative for rows
  before the first key; ``j`` the key), elementwise ops only (Flex traces it into its kernel).
  The dense rule, the CPU tiles' partial tiles and Flex's ``mask_mod`` call it;
- ``triton_keep``: the same predicate as a ``@triton.jit`` function ``(p, j) -> bool`` on int32
  tensors, which the fused band kernels take as a ``tl.constexpr`` argument, or the string
  ``"package.module:function"`` naming it (resolved where Triton is imported, in
  ``implementations``; this module never imports Triton). None: the fused kernels refuse the
  feature by name;
- :meth:`PredicateFeature.classify`: per rectangle of positions, whether the predicate allows
  none (SKIP), all (FULL) or some (PARTIAL) of its pairs, vectorised numpy, O(rectangles). The
  default says PARTIAL everywhere (sound, no skipping).

The kept-pair count of a mask with a predicate feature is not closed form: it is the sum of the
block plan's per-block counts, where a block the predicate classifies FULL keeps the closed-form
count of the other rules and a PARTIAL one is counted element by element
(:func:`harness.masks.block_pair_counts`): O(partial blocks x block area), not O(n_q x n_k).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from torch import Tensor

SKIP, PARTIAL, FULL = 0, 1, 2  # the block plan's states (harness.block_plan re-exports them)


@dataclass(frozen=True)
class PredicateFeature:
    """A plug-in mask feature that allows a pair when :meth:`keep` says so (rule 6)."""

    name: ClassVar[str] = "predicate"  # the feature's name in refusals and labels
    needs: ClassVar[str] = "predicate"  # the capability a path needs: it evaluates the rule
    triton_keep: ClassVar[object] = None  # a @triton.jit (p, j) -> bool, or "module:function"

    def check(self) -> None:
        """Raise ``ValueError`` for fields out of range (called by MaskSpec)."""

    def label(self) -> str:
        """A short label for :meth:`MaskSpec.describe`."""
        return self.name

    def keep(self, p: Tensor, j: Tensor) -> Tensor:
        """The element predicate: query positions ``p`` and keys ``j`` (integer tensors that
        broadcast) -> bool, True = allowed."""
        raise NotImplementedError

    def classify(self, p0: np.ndarray, p1: np.ndarray, j0: np.ndarray, j1: np.ndarray
                 ) -> np.ndarray:
        """int8 state per rectangle ``positions [p0, p1) x keys [j0, j1)`` (int64 arrays, non
        empty rectangles): SKIP when no pair is allowed, FULL when every pair is, else PARTIAL."""
        return np.full(np.shape(p0), PARTIAL, dtype=np.int8)


def predicates(spec) -> tuple[PredicateFeature, ...]:
    """The spec's predicate features, in order."""
    return tuple(f for f in spec.extra if isinstance(f, PredicateFeature))


def clause(spec) -> Callable[[Tensor, Tensor], Tensor] | None:
    """``(p, j) -> every predicate feature allows (p, j)``; None when the spec has none."""
    features = predicates(spec)
    if not features:
        return None

    def allowed(p: Tensor, j: Tensor) -> Tensor:
        keep = features[0].keep(p, j)
        for feature in features[1:]:
            keep = keep & feature.keep(p, j)
        return keep

    return allowed


def classify(spec, p0, p1, j0, j1) -> np.ndarray:
    """int8 state per rectangle of every predicate feature together (AND): SKIP if one skips,
    FULL if all are full, else PARTIAL."""
    out = np.full(np.shape(p0), FULL, dtype=np.int8)
    for feature in predicates(spec):
        out = np.minimum(out, np.asarray(feature.classify(p0, p1, j0, j1), dtype=np.int8))
    return out
