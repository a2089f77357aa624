"""The attention scenario's agreement check: the output (and the gradients, for backward) of one
prepared call against the float64 reference on the same inputs and mask, judged by the
agreement rule of :mod:`harness.oracle.agreement` against a naive same-dtype implementation.

Long sequences are checked on sampled query rows (:func:`sample_rows`): every tile-boundary row
plus seeded random rows, so a tile-edge bug cannot hide between the samples.
"""

from __future__ import annotations

import torch
from torch import Tensor

from harness.oracle.agreement import grad_agreement, output_agreement
from harness.oracle.reference import naive_attention, reference_attention, reference_grads
from harness.scenarios.case import CheckPlan
from harness.scenarios.interface import Point
from harness.spec import AttnFn

SAMPLED_ROWS = 256  # seeded random rows, on top of the tile-boundary rows
# Query tiles of the implementations are powers of two from 16 to 256 rows. Every multiple of
# 64 is also a boundary of the 128- and 256-row tiles, so the first and last row of every 64-row
# tile cover all of 64/128/256 at 2·n/64 rows (n/32: the reference stays ~3% of a full check).
# Finer strides (16, 32) are used when their boundary rows fit in this budget.
BOUNDARY_ROWS_BUDGET = 512
TILE_STRIDES = (16, 32, 64)


def boundary_stride(n_q: int, budget: int = BOUNDARY_ROWS_BUDGET) -> int:
    """The finest tile stride in TILE_STRIDES whose boundary rows fit ``budget`` (64 at most,
    even over budget: a 64/128/256-row tile must never be missed)."""
    for stride in TILE_STRIDES[:-1]:
        if 2 * -(-n_q // stride) <= budget:
            return stride
    return TILE_STRIDES[-1]


def boundary_rows(n_q: int, stride: int) -> Tensor:
    """First and last row of every ``stride``-row tile, plus the last row (1-D long, sorted)."""
    starts = torch.arange(0, n_q, stride)
    return torch.cat([starts, starts[1:] - 1, torch.tensor([n_q - 1])]).unique()


def sample_rows(n_q: int, count: int = SAMPLED_ROWS, seed: int = 0) -> Tensor:
    """Sorted query rows to check (1-D long): every tile boundary row (see
    :func:`boundary_stride`) and ``count`` seeded random rows; all rows when that is not fewer."""
    edges = boundary_rows(n_q, boundary_stride(n_q))
    if n_q <= count + len(edges):
        return torch.arange(n_q)
    gen = torch.Generator().manual_seed(seed)
    picked = torch.randperm(n_q, generator=gen)[:count]
    return torch.cat([edges, picked]).unique()


def check_attention(
    attn: AttnFn,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    grad_out: Tensor | None,
    point: Point,
    plan: CheckPlan,
) -> dict:
    """Agreement columns of one prepared call of ``point`` against the float64 reference (same
    mask). q: (B, H, n_q, D), k/v: (B, H_kv, n_k, D); ``grad_out`` like q (backward) or None."""
    if plan.mode == "none":
        return {"agree": None}
    with torch.no_grad():
        out = attn(q, k, v)
    expected = (*q.shape[:-1], v.shape[-1])  # (B, H, n_q, D)
    if tuple(out.shape) != expected:  # a wrong shape is a wrong result, not a crash
        shown = " x ".join(map(str, out.shape)), " x ".join(map(str, expected))
        return {"agree": False, "mismatch_reason": f"output shape {shown[0]} ≠ expected {shown[1]}"}
    rows, ref, naive = checked_rows(q, k, v, point, plan)
    result = judge_rows(out, rows, ref, naive, point.torch_dtype)
    if plan.grads and grad_out is not None:
        grads = torch.autograd.grad(attn(q, k, v), (q, k, v), grad_out)
        ref_grads = reference_grads(q, k, v, grad_out, point.mask)
        result.update(grad_agreement(grads, ref_grads, point.torch_dtype))
        result["agree"] = result["agree"] and result["grad_agree"]
    return result


def checked_rows(
    q: Tensor, k: Tensor, v: Tensor, point: Point, plan: CheckPlan
) -> tuple[Tensor | None, Tensor, Tensor]:
    """(rows, reference, naive) for the rows ``plan`` checks: rows is None for a full check,
    else the sampled query rows (1-D long); reference is float64 and naive is the same math in
    the inputs' dtype, both (B, H, len(rows) or n_q, D), on the inputs' device."""
    rows = None if plan.mode == "full" else sample_rows(point.n_q, seed=point.seed)
    with torch.no_grad():
        ref = reference_attention(q, k, v, point.mask, rows=rows)
        naive = naive_attention(q, k, v, point.mask, rows=rows)
    return rows, ref, naive


def judge_rows(
    out: Tensor, rows: Tensor | None, ref: Tensor, naive: Tensor, dtype: torch.dtype
) -> dict:
    """Agreement columns of a full output ``out`` (B, H, n_q, D) at ``rows`` (None = all):
    judged against the naive same-dtype error of the same rows (k * naive + eps)."""
    picked = out if rows is None else out[..., rows.to(out.device), :]
    return output_agreement(picked, ref, dtype, naive=naive)
