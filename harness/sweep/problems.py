"""The attention calls a decode point makes, as :class:`harness.spec.Problem` shapes.

Pure functions of a point's fields (``point`` is a :class:`harness.sweep.point.Point`; this
module does not import it, since ``Point.problem`` calls :func:`step_problem`). Masks are
bottom-right aligned: one query at the newest position sees the last keys.

- :func:`prefill_problem`: the parallel prefill, seq_len queries over seq_len keys, causal.
- :func:`step_problem`: one generated token at position seq_len, per layer.
- :func:`sequence_problem`: the whole seq_len + gen_tokens sequence in one causal call (the
  recomputation the agreement check compares the cached steps with).
"""

from __future__ import annotations

from harness.masks import MaskSpec
from harness.spec import Problem


def single_query_mask(mask: MaskSpec) -> MaskSpec:
    """The mask of one query at the newest position: plain causal keeps every key there (the
    last query of a bottom-right-aligned causal mask sees all keys), so it is the dense mask;
    a window still cuts the oldest keys."""
    if mask.features <= {"causal"}:
        return MaskSpec()
    return mask


def decode_problem(point, n_q: int, n_k: int, mask: MaskSpec) -> Problem:
    """One attention call of ``point``'s model: q (B, H, n_q, D), k/v (B, H_kv, n_k, D)."""
    return Problem(
        batch=point.batch,
        heads=point.heads,
        n_q=n_q,
        n_k=n_k,
        head_dim=point.head_dim,
        dtype=point.torch_dtype,
        device=point.device,
        mask=mask,
        kv_heads=point.kv_heads,
    )


def prefill_problem(point) -> Problem:
    """The attention call of the (parallel) prefill: seq_len queries and keys, causal."""
    return decode_problem(point, point.seq_len, point.seq_len, point.mask)


def sequence_problem(point) -> Problem:
    """All seq_len + gen_tokens tokens in one causal call (a recomputation without a cache)."""
    total = point.seq_len + point.gen_tokens
    return decode_problem(point, total, total, point.mask)


def step_problem(point) -> Problem:
    """The attention call of one timed step at position seq_len (per layer): what the runner
    should check support and count FLOPs with for a decode point."""
    n = point.seq_len
    if point.cache == "none":
        return decode_problem(point, n + 1, n + 1, point.mask)
    if point.cache == "rolling":  # every held slot is in the window: no mask on the ring
        return decode_problem(point, 1, min(n + 1, point.window_left + 1), MaskSpec())
    return decode_problem(point, 1, n + 1, single_query_mask(point.mask))
