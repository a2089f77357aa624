"""What a fused Triton path covers: one description for both entry points.

The two ways in, one per family, share these limits: :mod:`.masked_attention` (exact softmax
attention under a band or block mask: ``flash-tiled``, ``local``, ``dilated``, ``longformer``,
``bigbird``) and :mod:`.feature_attention` (feature-map attention: ``linear``, ``performer``).
Each adds its own rules (mask features, causal calls, autograd) on top; the dtypes, the head
dims and why Triton cannot run are said here once.
"""

from __future__ import annotations

import importlib.util

import torch

from harness.spec import FLOAT_DTYPES

DTYPES = FLOAT_DTYPES - {torch.float64}  # the kernels have no float64 path
MAX_HEAD_DIM = 256  # one tile row of head dims; larger D keeps the PyTorch (tile) path


def covers(dtype: torch.dtype, head_dim: int) -> bool:
    """Whether the kernels cover this dtype and head dim (float64 and D > 256 do not)."""
    return dtype in DTYPES and head_dim <= MAX_HEAD_DIM


def shape_reasons(dtype: torch.dtype, head_dim: int) -> list[str]:
    """Why the kernels do not cover this dtype and head dim (empty: they do)."""
    out = []
    if dtype not in DTYPES:
        out.append(f"the fused kernels cover fp32/fp16/bf16, not {str(dtype)[6:]}")
    if head_dim > MAX_HEAD_DIM:
        out.append(f"the fused kernels cover D <= {MAX_HEAD_DIM}, not {head_dim}")
    return out


def import_error(exc: Exception) -> str:
    """The reason an entry point keeps when its kernels fail to import."""
    return f"the Triton kernels failed to import: {type(exc).__name__}: {exc}"


def unavailable_reason(error: str | None) -> str | None:
    """Why a family's kernels cannot run on this machine, given the error its entry point kept
    while importing them (None: they imported, the kernels can run)."""
    if error is None:
        return None
    return "triton not installed" if importlib.util.find_spec("triton") is None else error
