"""The attention scenario's agreement check: the output (and the gradients, for backward) of one
prepared call against the float64 reference on the same inputs and mask, judged by the
agreement rule of :mod:`harness.oracle.agreement` against a naive same-dtype implementation.
An approximation is held to its own definition (:mod:`harness.oracle.definition`: the same
random features or projections) by that rule, and its distance from exact softmax attention on
the same rows is the ``approx_err`` column, measured, never gated.

Long sequences are checked on sampled query rows (:func:`sample_rows`): every tile-boundary row
plus seeded random rows, so a tile-edge bug cannot hide between the samples.
"""

from __future__ import annotations

import torch
from torch import Tensor

from harness.oracle.agreement import grad_agreement, output_agreement
from harness.oracle.definition import Definition, approximation_error
from harness.oracle.reference import reference_grads
from harness.scenarios.case import CheckChoice
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
    choice: CheckChoice,
    definition: Definition | None = None,
) -> dict:
    """Agreement columns of one prepared call of ``point`` against the float64 reference (same
    mask): softmax attention, or ``definition`` for an approximation (then ``approx_err`` too).
    q: (B, H, n_q, D), k/v: (B, H_kv, n_k, D); ``grad_out`` like q (backward) or None."""
    definition = definition or Definition()
    if choice.extent == "none":
        return {"agree": None}
    with torch.no_grad():
        out = attn(q, k, v)
    expected = (*q.shape[:-1], v.shape[-1])  # (B, H, n_q, D)
    if tuple(out.shape) != expected:  # a wrong shape is a wrong result, not a crash
        shown = " x ".join(map(str, out.shape)), " x ".join(map(str, expected))
        return {"agree": False, "mismatch_reason": f"output shape {shown[0]} ≠ expected {shown[1]}"}
    rows, ref, naive = checked_rows(q, k, v, point, choice, definition)
    result = judge_rows(out, rows, ref, naive, point.torch_dtype)
    if definition.approximate:
        picked = out if rows is None else out[..., rows.to(out.device), :]
        with torch.no_grad():
            result["approx_err"] = approximation_error(picked, q, k, v, point.mask, rows)
    if choice.grads and grad_out is not None:
        grads = torch.autograd.grad(attn(q, k, v), (q, k, v), grad_out)
        ref_grads = definition_grads(q, k, v, grad_out, point, definition)
        result.update(grad_agreement(grads, ref_grads, point.torch_dtype))
        result["agree"] = result["agree"] and result["grad_agree"]
    return result


def checked_rows(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    point: Point,
    choice: CheckChoice,
    definition: Definition | None = None,
) -> tuple[Tensor | None, Tensor, Tensor]:
    """(rows, reference, naive) for the rows ``choice`` checks: rows is None for a full check,
    else the sampled query rows (1-D long); reference is ``definition`` (softmax attention by
    default) in float64 and naive the same math in the inputs' dtype, both
    (B, H, len(rows) or n_q, D), on the inputs' device."""
    definition = definition or Definition()
    rows = None if choice.extent == "full" else sample_rows(point.n_q, seed=point.seed)
    with torch.no_grad():
        ref = definition.float64(q, k, v, point.mask, rows=rows)
        naive = definition.evaluate(q, k, v, point.mask, rows=rows)
    return rows, ref, naive


def definition_grads(
    q: Tensor, k: Tensor, v: Tensor, grad_out: Tensor, point: Point, definition: Definition
) -> tuple[Tensor, ...]:
    """float64 (dq, dk, dv) of ``(out * grad_out).sum()`` under ``definition``: softmax
    attention chunk by chunk, or autograd through the approximation's own float64 definition
    (full checks only: the problem is small)."""
    if not definition.approximate:
        return reference_grads(q, k, v, grad_out, point.mask)
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    with torch.enable_grad():
        out = definition.float64(q64, k64, v64, point.mask)
        return torch.autograd.grad(out, (q64, k64, v64), grad_out.double())


def judge_rows(
    out: Tensor, rows: Tensor | None, ref: Tensor, naive: Tensor, dtype: torch.dtype
) -> dict:
    """Agreement columns of a full output ``out`` (B, H, n_q, D) at ``rows`` (None = all):
    judged against the naive same-dtype error of the same rows (k * naive + eps)."""
    picked = out if rows is None else out[..., rows.to(out.device), :]
    return output_agreement(picked, ref, dtype, naive=naive)
