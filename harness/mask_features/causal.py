"""Causality: ``j <= p`` (rule 3 of :mod:`harness.masks`), cutting everything before it.

Where the field uses it: ``causal = true`` (decoders; bottom-right aligned when n_q != n_k, as
FlashAttention >= 2.1).

- Clause: :func:`clause` (an AND after the pattern and the visible runs, before the prefix).
- Count: ``causal`` of the rules, the band's ``hi`` capped at 0.
- Block plan: key blocks right of a query block's last row are never listed.
"""

from __future__ import annotations

from torch import Tensor


def clause(spec, rel: Tensor) -> Tensor | None:
    """``rel <= 0``; None when not causal."""
    return (rel <= 0) if spec.causal else None
