"""Prefix-LM: the first P positions attend to each other both ways (rule 4 of
:mod:`harness.masks`), on top of everything else, causality included.

Where the field uses it: ``prefix_len = P`` (T5/UniLM prefix-LM, attention-gym's
``prefix_lm``: ``kv < P or q >= kv`` with causal); with documents every document's first P.

- Clause: :func:`clause` (an OR after causality).
- Count: the prefix square of the rules (:func:`length`), minus what the others keep in it.
- Block plan: blocks inside the square are full; the candidate keys of a prefix row include
  ``[0, P)``.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor


def length(spec) -> int:
    """P, the prefix length (0: none)."""
    return spec.prefix_len


def clause(spec) -> Callable[[Tensor, Tensor], Tensor] | None:
    """``(p, j) -> p < P and j < P``; None if P = 0. A row before the first key (p < 0) counts
    as position 0, which ``p < P`` already says."""
    n = length(spec)
    return (lambda p, j: (p < n) & (j < n)) if n else None
