"""The way in to the fused Nyströmformer (:mod:`.nystrom_kernels`): which calls take it, its
four launches, its workspace.

A candidate: ``fused`` = 1 forces it (refused, with the reason, where it cannot run); the
default (-1) and 0 keep the PyTorch path of :mod:`implementations.nystrom` until a GPU lease
measures the kernels beside it (:data:`AUTO`). Covered: forward calls without autograd on CUDA
(or CPU tensors under ``TRITON_INTERPRET=1``), fp32/fp16/bf16, D <= 256, m <= 64 landmarks
(:data:`MAX_LANDMARKS`: the pseudo-inverse holds m × m matrices in registers), Triton.
"""

from __future__ import annotations

import contextlib
import os

import torch
from torch import Tensor

from harness.spec import Param, Problem
from implementations._kernels.triton import fused_path
from implementations._kernels.triton.feature_attention import dot_precision

IMPORT_ERROR: str | None = None
"""Why the kernels failed to import (None: they imported)."""
try:  # the kernels import Triton, an optional dependency
    from implementations._kernels.triton import nystrom_kernels
    from implementations._kernels.triton.kernel_launch import launch
except Exception as exc:  # absent or broken: the PyTorch path still runs, the reason says why
    nystrom_kernels = None
    IMPORT_ERROR = fused_path.import_error(exc)

FUSED = Param(
    -1,
    "the path: -1 PyTorch (the fused kernels are a candidate until a GPU measures them); "
    "1 the fused Triton kernels, four launches (refused where they cannot run); 0 PyTorch",
    minimum=-1,
    maximum=1,
)
AUTO = False
"""Whether ``fused`` = -1 takes the kernels on CUDA: not until a lease measures them."""
MAX_LANDMARKS = 64
PROGRAMS = 1024  # the key pass's programs (splits × heads), as the feature-map key pass
BLOCK_N = 64  # keys per tile of the key pass, rows per tile of the landmark means
BLOCK_M = 64  # query rows per output program


def call_reasons(device_type: str, backward: bool, dtype: torch.dtype, head_dim: int,
                 landmarks: int) -> list[str]:
    """Why the fused kernels cannot run such a call (empty: they can)."""
    out = []
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if device_type != "cuda" and not (device_type == "cpu" and interpreted):
        out.append(f"the fused kernels run on CUDA, not {device_type}")
    if backward:
        out.append("the fused kernels are forward-only (no autograd)")
    if landmarks > MAX_LANDMARKS:
        out.append(f"the fused Nyström kernels take at most {MAX_LANDMARKS} landmarks, "
                   f"not {landmarks}")
    out += fused_path.shape_reasons(dtype, head_dim)
    reason = fused_path.unavailable_reason(IMPORT_ERROR)
    if reason:
        out.append(reason)
    return out


def _landmarks(p: Problem) -> int:
    return int(p.param("landmarks", 64))


def _reasons_of(p: Problem) -> list[str]:
    return call_reasons(p.device_type, p.backward, p.dtype, p.head_dim, _landmarks(p))


def path_reasons(p: Problem) -> list[str]:
    """The registry's extra reasons for a ``fused`` = 1 that cannot run."""
    if int(p.param("fused", FUSED.default)) != 1:
        return []
    return [f"fused = 1: {r}" for r in _reasons_of(p)]


def runs_fused(p: Problem) -> bool:
    """Whether a call of ``p`` takes the kernels: ``fused`` = 1 (or -1 with :data:`AUTO`)."""
    fused = int(p.param("fused", FUSED.default))
    return fused == 1 or (fused == -1 and AUTO and p.device_type == "cuda"
                          and not _reasons_of(p))


def takes_fused(fused: int, q: Tensor, k: Tensor, v: Tensor, landmarks: int) -> bool:
    """Whether this call runs the kernels; ``fused`` = 1 where they cannot: ValueError, one
    line."""
    if fused == 0 or (fused == -1 and not AUTO):
        return False
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    reasons = call_reasons(q.device.type, grad, q.dtype, q.shape[-1], landmarks)
    if fused == -1:
        return q.is_cuda and not reasons
    if reasons:
        raise ValueError(f"fused = 1: {'; '.join(reasons)}")
    return True


def splits(rows: int, n_k: int) -> tuple[int, int]:
    """(n_split, keys per split) of the key pass for B·H = ``rows``: about :data:`PROGRAMS`
    programs over whole BLOCK_N tiles, no split empty."""
    blocks = -(-n_k // BLOCK_N)
    want = max(1, min(blocks, -(-PROGRAMS // max(rows, 1))))
    per = -(-blocks // want) * BLOCK_N
    return -(-n_k // per), per


def workspace_bytes(p: Problem) -> int:
    """Peak bytes of a fused call beyond its inputs and output, exact: fp32 Q̃ and W (B·H, m,
    D), K̃ (B·H_kv, m, D), the key pass's partials (B·H, n_split, m, D + 2)."""
    m, bh = _landmarks(p), p.batch * p.heads
    if bh == 0 or p.n_q == 0:
        return 0
    n_split, _ = splits(bh, p.n_k)
    return 4 * m * (2 * bh * p.head_dim + p.batch * p.n_kv_heads * p.head_dim
                    + bh * n_split * (p.head_dim + 2))


def nystrom_path(q: Tensor, k: Tensor, v: Tensor, landmarks: int, pinv_iters: int,
                  scale: float) -> Tensor:
    """Nyströmformer in four launches. q: (B, H, n_q, D), k/v: (B, H_kv, n_k, D), H a
    multiple of H_kv, 1 <= m <= min(n_q, n_k) -> (B, H, n_q, D) in q's dtype."""
    if nystrom_kernels is None:
        raise RuntimeError(fused_path.unavailable_reason(IMPORT_ERROR))
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    b, h, n_q, d = q.shape
    h_kv, n_k, m = k.shape[1], k.shape[2], landmarks
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if b * h * n_q == 0:
        return out
    block_d = max(16, 1 << max(d - 1, 0).bit_length())
    block_l = max(16, 1 << max(m - 1, 0).bit_length())
    n_split, per = splits(b * h, n_k)
    f32 = dict(dtype=torch.float32, device=q.device)
    q_t = torch.empty(b * h, m, d, **f32)
    k_t = torch.empty(b * h_kv, m, d, **f32)
    part_o = torch.empty(b * h, n_split, m, d, **f32)
    part_m = torch.empty(b * h, n_split, m, **f32)
    part_l = torch.empty(b * h, n_split, m, **f32)
    w = torch.empty(b * h, m, d, **f32)
    precision = dot_precision(q)
    warps = 8 if block_d > 64 else 4
    # D = 256: 64-row output blocks spilled 368 B (sm_80); the key pass holds the 64 × 256
    # landmarks beside its tiles: 16 key rows and 64 value columns a program (32 rows and 128
    # columns spilled 104 B on sm_90, 16 warps 696 B)
    out_rows, block_v = (BLOCK_M, block_d) if block_d <= 128 else (32, 64)
    sizes = dict(D=d, BLOCK_D=block_d, num_stages=1)
    kern, group = nystrom_kernels, h // h_kv
    with torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext():
        launch("nys_landmarks", kern.nys_landmarks, (m, b * h),
               (q, k, q_t, k_t, *q.stride()[:3], *k.stride()[:3], h, group, n_q, n_k, m),
               dict(sizes, BLOCK_N=BLOCK_N, num_warps=4))
        launch("nys_key_pass", kern.nys_key_pass, (n_split, b * h, -(-d // block_v)),
               (q_t, k, v, part_o, part_m, part_l, *k.stride()[:3], *v.stride()[:3], h, group,
                n_k, per, m, scale),
               dict(sizes, BLOCK_L=block_l, BLOCK_N=BLOCK_N if block_d <= 128 else 16,
                    BLOCK_V=block_v, PRECISION=precision, num_warps=warps))
        launch("nys_pinv", kern.nys_pinv, (b * h,),
               (q_t, k_t, part_o, part_m, part_l, w, h, group, n_split, m, pinv_iters, scale),
               dict(sizes, BLOCK_L=block_l, PRECISION=precision, num_warps=8))
        launch("nys_output", kern.nys_output, (-(-n_q // out_rows), b * h),
               (q, k_t, w, out, *q.stride()[:3], *out.stride()[:3], h, group, n_q, m, scale),
               dict(sizes, BLOCK_L=block_l, BLOCK_M=out_rows, PRECISION=precision,
                    num_warps=warps))
    return out
