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

from torch import Tensor


def length(spec) -> int:
    """P, the prefix length (0: none)."""
    return spec.prefix_len


def clause(spec, member: Tensor, j: Tensor) -> Tensor | None:
    """``member < P and j < P`` (member: query positions, rows before 0 as 0); None if P = 0."""
    n = length(spec)
    return ((member < n) & (j < n)) if n else None
