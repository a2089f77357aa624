"""``local``, ``dilated``, ``longformer``: sliding-window attention that computes only the band.

On CUDA (fp32/fp16/bf16, D <= 256) all three run the fused Triton kernels of
:mod:`implementations._kernels.triton.fused_attention`: one launch per call, the band computed
arithmetically per query block, forward and backward fused (``fused_reasons`` refuses the mask
features those kernels lack, rather than computing another mask). On CPU, and for float64,
they run the CPU tile path (:mod:`implementations._kernels.tiles.tile_attention`) over its
plan's band tiles: query blocks of 64 rows each attend to the key span
``[first - left, last + right]`` of the block (a view, no copy), so a causal window of w keys
costs ``64 + w - 1`` executed keys per query: time and memory O(n·w), never O(n²).

- ``local``: window ``(left, right)``, causal or not; a bidirectional prefix (prefix-LM).
- ``dilated``: Longformer's dilated window. Queries and keys are regrouped into the d residue
  classes ``p mod d`` (a permutation, O(n) copies), where the dilated window is a plain band:
  cost O(n·w), not O(n·w·d).
- ``longformer``: window (optionally dilated) plus global tokens, the first g or at named
  positions: each band tile also takes the global keys (up to its causal bound), and global
  rows take every key up to theirs: O(n·(w + g)).

All three take packed documents: each document is planned as its own sequence (equal
documents are folded into the batch), so no tile holds a key outside its rows' document and
the work is Σ over documents, not n².
"""

from __future__ import annotations

from torch import Tensor

from harness.masks import MaskSpec
from harness.registry import register
from harness.spec import FLOAT_DTYPES, AttnFn, Capabilities, Cost, Problem
from implementations._kernels.tiles.tile_attention import (
    device_plan,
    plan_shape,
    plan_workspace_bytes,
    tile_attention,
)
from implementations._kernels.triton.fused_attention import (
    executed_pairs,
    fused_reasons,
    fused_workspace_bytes,
    prepare_tables,
    triton_attention,
    use_triton,
)


def banded_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float | None = None
) -> Tensor:
    """q: (B, H, n_q, D), k/v: (B, H, n_k, D) -> (B, H, n_q, D), band tiles only."""
    if use_triton(q.device, q.dtype, q.shape[-1]):
        return triton_attention(q, k, v, mask, scale)
    plan = device_plan(mask, q.shape[-2], k.shape[-2], q.dtype, str(q.device))
    return tile_attention(q, k, v, plan, scale)


def _prepare(problem: Problem) -> AttnFn:
    """Build (and move) the plan outside the timed call."""
    mask = problem.mask
    if use_triton(problem.device, problem.dtype, problem.head_dim):
        prepare_tables(problem)  # index tables built and cached here, not in the call
        return lambda q, k, v: triton_attention(q, k, v, mask)
    plan = device_plan(problem.mask, problem.n_q, problem.n_k, problem.dtype, problem.device)
    return lambda q, k, v: tile_attention(q, k, v, plan)


def _workspace(p: Problem) -> int:
    if use_triton(p.device, p.dtype, p.head_dim):
        return fused_workspace_bytes(p)
    return plan_workspace_bytes(plan_shape(p.mask, p.n_q, p.n_k, p.device), p)


def _executed(p: Problem) -> int:
    if use_triton(p.device, p.dtype, p.head_dim):
        return executed_pairs(p.mask, p.n_q, p.n_k, p.head_dim, p.dtype)
    return plan_shape(p.mask, p.n_q, p.n_k, p.device).executed_pairs


_COST = Cost(time_exponent=1, memory_exponent=1, memory_model=_workspace, executed_pairs=_executed)

_PACKED = {"causal", "window", "documents", "prefix"}
_VARIANTS = {
    "local": (_PACKED, "sliding window computed band tile by band tile, O(n·w)"),
    "dilated": (
        _PACKED | {"dilation"},
        "dilated sliding window via residue classes, O(n·w) for any dilation",
    ),
    "longformer": (
        _PACKED | {"dilation", "global", "global_positions"},
        "sliding (dilated) window plus global rows and columns, O(n·(w+g))",
    ),
}

for _name, (_features, _description) in _VARIANTS.items():
    register(
        _name,
        family="local",
        caps=Capabilities(dtypes=FLOAT_DTYPES, mask_features=_features),
        cost=_COST,
        description=_description,
        extra_reasons=fused_reasons,
        prepare=_prepare,
    )(banded_attention)
