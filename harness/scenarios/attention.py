"""``attention`` and ``attention+backward``: the core op on (B, H, N, D) tensors."""

from __future__ import annotations

import torch
from torch import Tensor

from harness.oracle.agreement import grad_agreement, output_agreement
from harness.oracle.reference import naive_attention, reference_attention, reference_grads
from harness.scenarios.base import Case, CheckPlan, sample_rows
from harness.spec import AttnFn


def make_inputs(point, device: str, requires_grad: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """Fresh seeded N(0, 1) inputs: q (B, H, n_q, D), k/v (B, H_kv, n_k, D)."""
    gen = torch.Generator(device=device).manual_seed(point.seed + 1)
    kv_heads = point.kv_heads or point.heads
    shapes = [
        (point.batch, point.heads, point.n_q, point.head_dim),
        (point.batch, kv_heads, point.seq_len, point.head_dim),
        (point.batch, kv_heads, point.seq_len, point.head_dim),
    ]
    return tuple(
        torch.randn(s, generator=gen, device=device, dtype=point.torch_dtype).requires_grad_(
            requires_grad
        )
        for s in shapes
    )


def build(point, impl, device, plan: CheckPlan) -> Case:
    """Time ``impl`` on fresh inputs; forward under no_grad, or forward+backward via autograd."""
    problem = point.problem()
    attn: AttnFn = impl.prepare(problem)
    q, k, v = make_inputs(point, point.device, requires_grad=point.backward)
    if point.backward:
        gen = torch.Generator(device=point.device).manual_seed(point.seed + 2)
        grad_out = torch.randn(q.shape, generator=gen, device=point.device, dtype=q.dtype)

        def run() -> tuple[Tensor, ...]:
            return torch.autograd.grad(attn(q, k, v), (q, k, v), grad_out)
    else:
        grad_out = None

        def run() -> Tensor:
            with torch.no_grad():
                return attn(q, k, v)

    def check() -> dict:
        return check_attention(attn, q, k, v, grad_out, point, plan)

    return Case(
        run=run, tokens=point.batch * point.n_q, check=check, columns={"check": plan.describe()}
    )


def check_attention(
    attn: AttnFn, q: Tensor, k: Tensor, v: Tensor, grad_out: Tensor | None, point, plan: CheckPlan
) -> dict:
    """Agreement columns of one prepared call against the float64 reference (same mask)."""
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
        result.update(
            grad_agreement(grads, reference_grads(q, k, v, grad_out, point.mask), point.torch_dtype)
        )
        result["agree"] = result["agree"] and result["grad_agree"]
    return result


def checked_rows(
    q: Tensor, k: Tensor, v: Tensor, point, plan: CheckPlan
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
