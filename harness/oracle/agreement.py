"""Numerical agreement with the float64 reference: the one tolerance table and the comparisons.

The attention rule is FlashAttention's test rule. An output agrees when, against the float64
reference on the same inputs and mask, both its max abs error and its relative (Frobenius)
error are within a multiple of the same error of a naive implementation in the same dtype
(:func:`harness.oracle.reference.naive_attention`) plus ``ε``: ``k_abs × naive + ε`` for the max
abs error, ``k × naive + ε`` for the relative error, with ``k``, ``k_abs`` and ``ε`` from the
table below (ε: one ulp of the dtype, at the largest reference value for
the absolute error). NaN/inf never agrees. A fixed ``atol``/``rtol`` cannot be the
gate: attention outputs shrink as n grows (a row averages many values), so at n = 16k an
output scaled by 0.5 sits inside any atol that bf16 rounding needs at n = 1k.

Callers without a naive same-dtype computation (whole transformer blocks, decode stacks, whose
outputs do not shrink with n) use the fixed ``atol + rtol·|ref|`` rule; each row says which rule
judged it in ``agree_rule``. Gradients are judged by relative Frobenius error.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Tolerance:
    """Per-dtype bounds.

    Naive-relative rule: ``max_abs <= k_abs·naive_max_abs + eps·max|ref|`` and
    ``rel <= k·naive_rel + eps``. ``k`` = 2 is FlashAttention's factor. The max abs error is an
    extreme-value statistic: two correct computations that only sum in different orders
    (PyTorch's MATH backend scales q and k separately; a chunked prefix sum against the
    straightforward definition) differ in it by up to ~4x at n ~ 100 (measured 3.9x and 3.2x
    over a few hundred seeded float32 cases), while their Frobenius errors, averaged over every
    element, stay within 2x. So ``k_abs`` = 4: the bugs the rule exists for (a causal
    off-by-one, a dropped tile, a wrong scale) are orders of magnitude beyond either bound.
    ``eps`` is the dtype's machine epsilon (one ulp at 1): the absolute ε is one ulp of the
    largest reference value, FlashAttention's ``fwd_atol`` idea. It covers outputs rounded one
    ulp differently from the naive ones where the naive error is itself tiny (small problems, a
    max over few elements); every bug error is far above it.
    ``atol``/``rtol``: the fixed rule for callers without a naive computation.
    ``grad_rel``: relative Frobenius error allowed for dq, dk, dv.
    """

    atol: float
    rtol: float
    grad_rel: float
    eps: float
    k: float = 2.0
    k_abs: float = 4.0


# One table for the whole harness (tests use it too). fp16/bf16 fixed bounds follow their unit
# roundoff (2^-11, 2^-8) times a small growth factor for the softmax-weighted sums; eps is
# torch.finfo(dtype).eps.
TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float64: Tolerance(atol=1e-9, rtol=1e-9, grad_rel=1e-9, eps=2.0**-52),
    torch.float32: Tolerance(atol=1e-4, rtol=1e-4, grad_rel=1e-4, eps=2.0**-23),
    torch.float16: Tolerance(atol=5e-3, rtol=5e-3, grad_rel=1e-2, eps=2.0**-10),
    torch.bfloat16: Tolerance(atol=3e-2, rtol=3e-2, grad_rel=5e-2, eps=2.0**-7),
}


def tolerance(dtype: torch.dtype) -> Tolerance:
    return TOLERANCES[dtype]


def rel_frobenius(out: Tensor, ref: Tensor) -> float:
    """||out - ref||_F / ||ref||_F in float64 (0 when both are zero)."""
    diff = torch.linalg.vector_norm((out.double() - ref.double()).flatten())
    norm = torch.linalg.vector_norm(ref.double().flatten())
    return float(diff / norm) if norm > 0 else float(diff)


def errors(out: Tensor, ref: Tensor) -> tuple[float | None, float | None]:
    """(max abs error, relative Frobenius error) of ``out`` against ``ref``; None if non-finite."""
    out64, ref64 = out.double(), ref.double()
    if not bool(torch.isfinite(out64).all()):
        return None, None
    max_abs = float((out64 - ref64).abs().max()) if out64.numel() else 0.0
    return max_abs, rel_frobenius(out64, ref64)


def output_agreement(
    out: Tensor, ref: Tensor, dtype: torch.dtype, naive: Tensor | None = None
) -> dict:
    """Agreement columns for one output against its float64 reference (same shape).

    With ``naive`` (the same rows computed naively in ``dtype``): the naive-relative rule on
    both errors. Without: the fixed ``atol + rtol·|ref|`` rule of the table.
    """
    naive_abs, naive_rel = errors(naive, ref) if naive is not None else (None, None)
    if naive_abs is not None and naive_rel is not None:
        scale = float(ref.abs().max()) if ref.numel() else 0.0
        return judge(errors(out, ref), (naive_abs, naive_rel), dtype, scale)
    # no naive error scale (none given, or the naive computation overflowed): the fixed rule
    tol = tolerance(dtype)
    max_abs, rel = errors(out, ref)
    finite = max_abs is not None
    err = (out.double() - ref.double()).abs()
    within = finite and bool((err <= tol.atol + tol.rtol * ref.double().abs()).all())
    return {
        "max_abs_err": max_abs,
        "rel_err": rel,
        "tolerance": tol.atol,
        "agree": within,
        "agree_rule": f"allclose(atol={tol.atol:g}, rtol={tol.rtol:g})"
        + ("" if naive is None else " (naive output not finite)"),
        "nonfinite": not finite,
    }


def judge(
    err: tuple[float | None, float | None],
    naive: tuple[float, float],
    dtype: torch.dtype,
    ref_scale: float,
) -> dict:
    """The naive-relative rule on precomputed errors (pure; ``None`` errors mean NaN/inf).

    ``err`` and ``naive`` are (max abs error, relative Frobenius error) against float64;
    ``ref_scale`` is max|ref| (the absolute ε is one ulp there).
    """
    tol = tolerance(dtype)
    max_abs, rel = err
    naive_abs, naive_rel = naive
    bound_abs = tol.k_abs * naive_abs + tol.eps * ref_scale
    bound_rel = tol.k * naive_rel + tol.eps
    finite = max_abs is not None and rel is not None
    failed = []
    if finite and max_abs > bound_abs:
        failed.append(f"max_abs_err {max_abs:.3g} beyond tolerance {bound_abs:.3g}")
    if finite and rel > bound_rel:
        failed.append(f"rel_err {rel:.3g} beyond tolerance {bound_rel:.3g}")
    out = {
        "max_abs_err": max_abs,
        "rel_err": rel,
        "naive_err": naive_abs,
        "naive_rel_err": naive_rel,
        "tolerance": bound_abs,
        "rel_tolerance": bound_rel,
        "agree": finite and not failed,
        "agree_rule": f"max_abs <= {tol.k_abs:g}*naive + eps*max|ref|, "
        f"rel <= {tol.k:g}*naive + eps (eps {tol.eps:.3g})",
        "nonfinite": not finite,
    }
    if failed:
        out["mismatch_reason"] = "; ".join(failed) + " (naive-relative rule)"
    return out


def grad_agreement(
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
