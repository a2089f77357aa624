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

from torch import Tensor

from harness.mask_features.visible_runs import Runs, RunsFeature, in_runs, merge_runs


def runs_features(spec) -> tuple[RunsFeature, ...]:
    """The spec's plug-in features made of visible runs (predicate features are rule 6)."""
    return tuple(f for f in spec.extra if isinstance(f, RunsFeature))


def key_runs(spec) -> Runs:
    """Keys every query keeps: the global positions and every plug-in's key runs."""
    return merge_runs(spec.global_runs, *(f.key_runs() for f in runs_features(spec)))


def row_runs(spec) -> Runs:
    """Rows that keep every key: the global positions and every plug-in's row runs."""
    return merge_runs(spec.global_runs, *(f.row_runs() for f in runs_features(spec)))


def clause(spec, member: Tensor, j: Tensor) -> Tensor | None:
    """``member`` or ``j`` global, or kept by a plug-in (member: query positions, rows before
    0 as 0); None when there is neither."""
    runs = spec.global_runs
    keep = (in_runs(member, runs) | in_runs(j, runs)) if runs else None
    for feature in runs_features(spec):  # each plug-in's own element predicate
        own = feature.keep(member, j)
        keep = own if keep is None else keep | own
    return keep
