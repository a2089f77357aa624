"""Sliding window: ``-left·d <= j - p <= right·d`` (rule 1 of :mod:`harness.masks`).

Where the field uses it: ``window = [left, right]`` in a suite (``-1`` = unbounded side),
``window_left``/``window_right`` in result rows (``None`` = unbounded); Mistral/HF
``sliding_window=W`` is ``(W - 1, 0)``, Longformer's window, the band of ``local``/``dilated``.

- Clause: :func:`clause`, on ``rel = j - p``.
- Count: the band ``[lo, hi]`` of :class:`harness.paircount.BandRule` (:func:`band`).
- Block plan: a block pair meets the band iff its ``rel`` range does; the count decides.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from harness.mask_features.dilation import step

UNBOUNDED = -1  # how a suite and a CLI spell an unbounded side


def side(value: int | None) -> int | None:
    """One window side as a MaskSpec holds it: ``-1`` or None -> None (unbounded), else an
    int >= 0. The one place that reads ``-1``; raises ``ValueError`` below -1."""
    if value is None or value == UNBOUNDED:
        return None
    if int(value) < 0:
        raise ValueError(f"window sides must be >= 0 or -1/None, got {value}")
    return int(value)


def spelled(value: int | None) -> int:
    """A MaskSpec's window side as a suite spells it: None (unbounded) -> ``-1``."""
    return UNBOUNDED if value is None else value


def band(spec) -> tuple[int | None, int | None]:
    """(lo, hi) bounds on ``rel = j - p`` in positions (dilation applied), None = unbounded."""
    d = step(spec)
    lo = None if spec.left is None else -spec.left * d
    hi = None if spec.right is None else spec.right * d
    return lo, hi


def class_band(spec) -> tuple[int | None, int | None]:
    """The band in class coordinates, causality folded in: with dilation d a position
    ``p = r + d·a`` keeps the keys ``j = r + d·c`` of its class with ``lo <= c - a <= hi``
    (:func:`band` divided by d; None = unbounded). The CPU tiles and the Triton band slots
    walk each residue class as this plain band."""
    lo = None if spec.left is None else -spec.left
    hi = spec.right
    if spec.causal:
        hi = 0 if hi is None else min(hi, 0)
    return lo, hi


def clause(spec, causal_cut: bool = False) -> Callable[[Tensor], Tensor] | None:
    """``rel -> lo <= rel <= hi`` on Python constants (only the bounded sides are tested);
    None when both sides are unbounded. ``causal_cut``: causality folded into the right
    side (``hi = min(hi, 0)``), for a mask where nothing is OR-ed in between."""
    lo, hi = band(spec)
    if causal_cut:
        hi = 0 if hi is None else min(hi, 0)
    if lo is None and hi is None:
        return None
    if hi is None:
        return lambda rel: rel >= lo
    if lo is None:
        return lambda rel: rel <= hi
    return lambda rel: (rel >= lo) & (rel <= hi)
