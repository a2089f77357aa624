"""``masked-dense``: dense SDPA with the sparse pattern passed as an explicit boolean mask.

The deliberate "what if you just mask" baseline shown beside every real sparse variant: it
computes all n_q × n_k scores and throws most away, and the (n_q, n_k) mask itself is O(n²)
memory. Its fitted exponent should be ~2; the sparse families' ~1 is the difference.

SDPA turns a row with no kept key into NaN; such rows get one dummy key and are zeroed after,
so the output (and every gradient) is finite, as the mask semantics require.
"""

from __future__ import annotations

from functools import lru_cache

import torch.nn.functional as F
from torch import Tensor

from harness.masks import MaskSpec, dense_mask
from harness.registry import register
from harness.spec import FLOAT_DTYPES, MASK_FEATURES, AttnFn, Capabilities, Cost, Problem, itemsize


@lru_cache(maxsize=1)  # an (n, n) mask is 256 MiB at n = 16k: keep only the latest
def _mask(spec: MaskSpec, n_q: int, n_k: int, device: str) -> tuple[Tensor, Tensor | None]:
    """(attn_mask bool (n_q, n_k), has_key bool (n_q, 1) or None when every row keeps a key)."""
    keep = dense_mask(spec, n_q, n_k, device)
    has_key = keep.any(-1, keepdim=True)
    if bool(has_key.all()):
        return keep, None
    keep[:, :1] |= ~has_key  # a dummy key keeps SDPA's softmax finite; the row is zeroed below
    return keep, has_key


def _attend(
    q: Tensor, k: Tensor, v: Tensor, keep: Tensor, has_key: Tensor | None, scale: float | None
) -> Tensor:
    """q: (B, H, n_q, D), k/v: (B, H, n_k, D), keep: (n_q, n_k) -> (B, H, n_q, D)."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=scale)
    return out if has_key is None else out.masked_fill(~has_key, 0.0)


def _prepare(problem: Problem) -> AttnFn:
    """The dense mask is built once, outside the timed call (its memory is still O(n²))."""
    keep, has_key = _mask(problem.mask, problem.n_q, problem.n_k, problem.device)
    return lambda q, k, v: _attend(q, k, v, keep, has_key, None)


def _workspace(p: Problem) -> int:
    """The (n_q, n_k) bool mask plus the float additive copy SDPA makes of it (two in backward);
    the CPU flash kernel itself streams the scores. O(n²) either way: the point of this baseline."""
    elem = itemsize(p.dtype)
    return p.n_q * p.n_k * (1 + elem * (2 if p.backward else 1))


@register(
    "masked-dense",
    family="dense",
    caps=Capabilities(
        dtypes=FLOAT_DTYPES,
        mask_features=MASK_FEATURES,  # any mask: it is the definition, materialized
    ),
    cost=Cost(
        time_exponent=2,
        memory_exponent=2,
        memory_model=_workspace,
        executed_pairs=lambda p: p.n_q * p.n_k,
    ),
    description="dense SDPA with the pattern as an explicit (n_q, n_k) bool mask: the baseline",
    prepare=_prepare,
)
def masked_dense(
    q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float | None = None
) -> Tensor:
    """q: (B, H, n_q, D), k/v: (B, H, n_k, D) -> (B, H, n_q, D)."""
    keep, has_key = _mask(mask, q.shape[-2], k.shape[-2], str(q.device))
    return _attend(q, k, v, keep, has_key, scale)
