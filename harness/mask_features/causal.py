"""Causality: ``j <= p`` (rule 3 of :mod:`harness.masks`), cutting everything before it.

Where the field uses it: ``causal = true`` (decoders; bottom-right aligned when n_q != n_k, as
FlashAttention >= 2.1).

- Clause: :func:`clause` (an AND after the pattern and the visible runs, before the prefix;
  without visible runs it folds into the window's right side, :func:`harness.masks.pair_keep`).
- Count: ``causal`` of the rules, the band's ``hi`` capped at 0.
- Block plan: key blocks right of a query block's last row are never listed.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor


def clause(spec) -> Callable[[Tensor], Tensor] | None:
    """``rel -> rel <= 0``; None when not causal."""
    return (lambda rel: rel <= 0) if spec.causal else None
