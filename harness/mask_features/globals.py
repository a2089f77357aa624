"""Global tokens: a global query sees every key, a global key is seen by every query (rule 2
of :mod:`harness.masks`), before causality.

Where the field uses it: ``global_tokens = g`` (the first g positions: Longformer's
``global_attention_mask`` on [CLS]) or a list of positions (HF BigBird's first and last
blocks); with documents, each document's own positions. Plug-in features of the same shape
(keys only, e.g. attention sinks) add their runs here: :class:`.runs.RunsFeature`.

- Clause: :func:`clause`.
- Count: the runs ``rows_g``/``keys_g`` of the rules (:func:`row_runs`, :func:`key_runs`),
  by inclusion-exclusion over the band (:mod:`harness.paircount`).
- Block plan: a key block inside a key run is full for every row; a global row's blocks
  reach every key up to its causal bound.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from harness.mask_features.visible_runs import Runs, RunsFeature, membership, merge_runs


def runs_features(spec) -> tuple[RunsFeature, ...]:
    """The spec's plug-in features made of visible runs (predicate features are rule 6)."""
    return tuple(f for f in spec.extra if isinstance(f, RunsFeature))


def key_runs(spec) -> Runs:
    """Keys every query keeps: the global positions and every plug-in's key runs."""
    return merge_runs(spec.global_runs, *(f.key_runs() for f in runs_features(spec)))


def row_runs(spec) -> Runs:
    """Rows that keep every key: the global positions and every plug-in's row runs."""
    return merge_runs(spec.global_runs, *(f.row_runs() for f in runs_features(spec)))


def row_zero(spec) -> bool:
    """Position 0 is a visible row, so a row before the first key (``n_q > n_k``: p < 0,
    which counts as position 0) keeps every key."""
    return any(a == 0 for a, _ in row_runs(spec))


def clause(spec, device: str = "cpu") -> Callable[[Tensor, Tensor], Tensor] | None:
    """``(p, j) -> p a visible row or j a visible key``: the global positions and every
    plug-in's runs (their element predicate is their runs, :meth:`RunsFeature.keep`), as
    :func:`.visible_runs.membership` tests (a row before the first key counts as position 0);
    None when there are none."""
    rows = membership(row_runs(spec), device)
    keys = membership(key_runs(spec), device)
    if rows is None and keys is None:
        return None
    if keys is None:
        return lambda p, j: rows(p)
    if rows is None:
        return lambda p, j: keys(j)
    return lambda p, j: rows(p) | keys(j)
