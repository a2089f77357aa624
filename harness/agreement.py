"""Numerical agreement with the float64 reference: the one tolerance table and the comparisons.

A result agrees when ``|out - ref| <= atol + rtol * |ref|`` everywhere (``torch.allclose``
semantics) and it has no NaN/inf. Gradients are judged by relative Frobenius error. The error
of a naive same-dtype implementation is recorded beside it for scale (FlashAttention's tests
ask an optimized kernel to be within ~2x of that).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    grad_rel: float  # relative Frobenius error allowed for dq, dk, dv


# One table for the whole harness (tests use it too). fp16/bf16 bounds follow their unit
# roundoff (2^-11, 2^-8) times a small growth factor for the softmax-weighted sums.
TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float64: Tolerance(atol=1e-9, rtol=1e-9, grad_rel=1e-9),
    torch.float32: Tolerance(atol=1e-4, rtol=1e-4, grad_rel=1e-4),
    torch.float16: Tolerance(atol=5e-3, rtol=5e-3, grad_rel=1e-2),
    torch.bfloat16: Tolerance(atol=3e-2, rtol=3e-2, grad_rel=5e-2),
}


def tolerance(dtype: torch.dtype) -> Tolerance:
    return TOLERANCES[dtype]


def rel_frobenius(out: Tensor, ref: Tensor) -> float:
    """||out - ref||_F / ||ref||_F in float64 (0 when both are zero)."""
    diff = torch.linalg.vector_norm((out.double() - ref.double()).flatten())
    norm = torch.linalg.vector_norm(ref.double().flatten())
    return float(diff / norm) if norm > 0 else float(diff)


def compare(out: Tensor, ref: Tensor, dtype: torch.dtype) -> dict:
    """Agreement columns for one output against its float64 reference (same shape)."""
    tol = tolerance(dtype)
    out64, ref64 = out.double(), ref.double()
    finite = bool(torch.isfinite(out64).all())
    err = (out64 - ref64).abs()
    max_abs = float(err.max()) if err.numel() else 0.0
    within = bool((err <= tol.atol + tol.rtol * ref64.abs()).all()) if finite else False
    return {
        "max_abs_err": max_abs if finite else None,
        "rel_err": rel_frobenius(out64, ref64) if finite else None,
        "tolerance": tol.atol,
        "agree": within,
        "nonfinite": not finite,
    }


def compare_grads(
    grads: tuple[Tensor, ...], ref_grads: tuple[Tensor, ...], dtype: torch.dtype
) -> dict:
    """Worst relative Frobenius error over (dq, dk, dv) and whether it is within tolerance."""
    rel = max(rel_frobenius(g, r) for g, r in zip(grads, ref_grads, strict=True))
    max_abs = max(
        float((g.double() - r).abs().max()) for g, r in zip(grads, ref_grads, strict=True)
    )
    finite = all(bool(torch.isfinite(g).all()) for g in grads)
    return {
        "grad_max_abs_err": max_abs if finite else None,
        "grad_rel_err": rel if finite else None,
        "grad_agree": finite and rel <= tolerance(dtype).grad_rel,
    }
