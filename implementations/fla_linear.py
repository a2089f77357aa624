"""``fla-linear``: flash-linear-attention's chunked Triton kernels (``fla.ops.linear_attn``), CUDA.

What it computes, exactly: φ = elu + 1 applied here (torch), then
``chunk_linear_attn(φ(q), φ(k), v, scale=1.0, normalize=True)``, which is

    out_i = φ(q_i)ᵀ S_i / (φ(q_i)ᵀ z_i + 1e-10),
    S_i = Σ_{j <= i} φ(k_j) v_jᵀ,  z_i = Σ_{j <= i} φ(k_j)

— ``linear``'s causal definition plus fla's 1e-10 in the normaliser (its ``scale`` multiplies
numerator and normaliser alike, so 1.0 loses nothing). The kernels are causal only, take
n_q = n_k and one K/V head per query head; they run the chunk-parallel form (64-row chunks,
per-chunk states kept for the output pass) with float32 accumulation over half-precision
inputs. float32 inputs are not declared: the kernels' ``tl.dot`` defaults to TF32 products,
whose error (~1e-3) is far above a float32 naive computation's.

Availability comes from one real call on the GPU (a wheel that imports but whose kernels do not
build or run for this GPU fails it). Under ``TRITON_INTERPRET=1`` on a CPU the kernels do not
run (fla 0.6.0, Triton 3.9): their loop indices call ``.to(tl.int64)``, which compiled Triton
allows and the interpreter's Python integers lack, and their autotuners benchmark through a GPU
driver; the CPU tests say so and skip. The agreement check holds it to
:func:`fla_reference` (the definition above in float64).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from harness.masks import MaskSpec
from harness.registry import register, tiny_qkv
from harness.spec import HALF_DTYPES, Capabilities, Cost, Problem
from implementations.linear_attention import elu_definition, elu_flops
from implementations.linear_attention import no_scale as _no_scale

FLA_EPS = 1e-10  # fla.ops.linear_attn.utils: denominator + 1e-10
FLA_CHUNK = 64  # rows per chunk of fla's chunk kernels


def _availability() -> str | None:
    if not torch.cuda.is_available():
        return (
            "needs a CUDA GPU (flash-linear-attention's Triton kernels; they do not run under "
            "TRITON_INTERPRET=1); install with the `gpu` extra"
        )
    return None


def _probe(device_type: str) -> Tensor:
    """One tiny real call: the import, the kernels' compilation and a launch on this GPU."""
    return fla_linear_attention(*tiny_qkv(device_type, torch.float16), MaskSpec(causal=True))


def _reasons(p: Problem) -> list[str]:
    if not p.mask.causal:
        return ["fla's chunk_linear_attn is causal only (its chunk recurrence runs forward)"]
    return []


def fla_reference(q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, rows: Tensor | None = None
                  ) -> Tensor:
    """fla's definition in the inputs' dtype: ``linear``'s with 1e-10 added to the normaliser."""
    return elu_definition(q, k, v, mask, rows, eps=FLA_EPS)


def _workspace(p: Problem) -> int:
    """From fla's code (not measured here: no GPU): φ(q), φ(k) and fla's contiguous copies of
    the (B, N, H, D) views, the per-chunk states (B, H, ⌈n/64⌉, D, D) in float32, the
    unnormalised output, the running key sums and the normaliser."""
    bh, n, d, size = p.batch * p.heads, p.n_q, p.head_dim, p.dtype.itemsize
    states = bh * -(-n // FLA_CHUNK) * d * d * 4
    return bh * n * d * size * 6 + bh * n * size + states


@register(
    "fla-linear",
    family="linear",
    caps=Capabilities(
        devices={"cuda"},
        dtypes=HALF_DTYPES,
        mask_features={"causal"},
        unequal_lengths=False,
        max_head_dim=256,
    ),
    cost=Cost(time_exponent=1, memory_exponent=1, memory_model=_workspace, flops=elu_flops),
    description="flash-linear-attention chunk_linear_attn (Triton, CUDA), φ = elu + 1, causal",
    availability=_availability,
    probe=_probe,
    extra_reasons=_reasons,
    reference=fla_reference,
)
def fla_linear_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float | None = None
) -> Tensor:
    """q, k, v: (B, H, N, D) -> (B, H, N, D), causal."""
    from fla.ops.linear_attn import chunk_linear_attn

    _no_scale(scale)
    fq, fk = (F.elu(x).add_(1.0).transpose(1, 2) for x in (q, k))  # (B, N, H, D)
    out, _ = chunk_linear_attn(fq, fk, v.transpose(1, 2), scale=1.0, normalize=True)
    return out.transpose(1, 2)
