"""``nystrom``: Nyströmformer (Xiong et al. 2021), softmax attention through m landmarks.

    Q̃, K̃ = row-group means of Q, K (m landmarks each)
    out = softmax(s·Q K̃ᵀ) · Ã⁺ · (softmax(s·Q̃ Kᵀ) V),   Ã = softmax(s·Q̃ K̃ᵀ)  (m × m)

with Ã⁺ the paper's iterative Moore–Penrose approximation (Razavi et al. 2014):
Z₀ = Ãᵀ / (‖Ã‖₁‖Ã‖∞), Z ← ¼ Z (13I − ÃZ (15I − ÃZ (7I − ÃZ))), ``pinv_iters`` times (6, as
the paper). Time O(n·m·D + m³), memory O(n·m) per head; the products run right to left
(``Z (B̃ V)`` before the n×m factor), 2·m²·D instead of 2·n·m² FLOPs.

- Row groups: row j belongs to landmark ⌊j·m/n⌋, so the m row groups are contiguous and differ in
  length by at most one (the paper's equal row groups when m divides n; the official code pads
  instead). m must not exceed n_q or n_k: an empty row group has no mean.
- The pseudo-inverse's initial scaling uses each matrix's own norms (the paper's formula); the
  official code takes the maximum over the whole batch, which makes one sequence's output
  depend on the others in its batch.
- The official model's depthwise-convolution residual on V is a learned layer of the model, not
  part of the attention approximation, and is not included.
- Non-causal only (landmarks average over the whole sequence). Grouped K/V: the query heads of a
  K/V head are stacked along the rows (a view), so K/V are never repeated. Half-precision inputs
  run in float32 (the iteration is not stable in half precision).

The agreement check holds it to :func:`nystrom_reference` (its own definition, written with an
explicit averaging matrix, in float64); its distance from softmax attention is ``approx_err``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from harness.masks import MaskSpec
from harness.registry import register
from harness.spec import FLOAT_DTYPES, HALF_DTYPES, Capabilities, Cost, Param, Problem
from implementations._feature_maps import check_inputs
from implementations._kernels.triton import nystrom_path

LANDMARKS = Param(64, "landmarks m: row-group means of Q and K (m <= n)", minimum=1)
PINV_ITERS = Param(
    6, "iterations of the Moore–Penrose approximation of the m×m kernel", minimum=1, maximum=100
)


def landmark_means(x: Tensor, m: int) -> Tensor:
    """(…, n, D) -> (…, m, D): the mean of each of m contiguous row groups (row j in ⌊j·m/n⌋)."""
    n = x.shape[-2]
    if n % m == 0:
        return x.unflatten(-2, (m, n // m)).mean(-2)
    seg = torch.arange(n, device=x.device) * m // n
    sums = x.new_zeros(*x.shape[:-2], m, x.shape[-1]).index_add(-2, seg, x)
    # row group i holds rows ⌈i·n/m⌉ .. ⌈(i+1)·n/m⌉ - 1: counts without a host sync (bincount)
    bounds = (torch.arange(m + 1, device=x.device) * n + m - 1) // m
    return sums / (bounds[1:] - bounds[:-1]).to(x.dtype)[:, None]


def iterative_pinv(a: Tensor, iters: int) -> Tensor:
    """The iterative approximation of pinv(a) for a (…, m, m), each matrix on its own."""
    shape = a.shape
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    norm_1 = a.abs().sum(-2).amax(-1)  # largest column sum
    norm_inf = a.abs().sum(-1).amax(-1)  # largest row sum (1 for a softmax)
    z = a.transpose(-2, -1) / (norm_1 * norm_inf)[..., None, None]
    eye7, eye15, eye13 = 7 * eye, 15 * eye, 13 * eye  # once, not once per iteration
    m = a.shape[-1]
    a, z = a.reshape(-1, m, m), z.reshape(-1, m, m)  # views: batched products on 3-d
    for _ in range(iters):
        # five ops an iteration, not eight: each "cI − X·Y" and the final ¼·Z·T are one
        # baddbmm (the subtraction and scaling in the product's epilogue)
        az = torch.bmm(a, z)
        t = torch.baddbmm(eye15, az, eye7 - az, alpha=-1)
        t = torch.baddbmm(eye13, az, t, alpha=-1)
        z = torch.baddbmm(t, z, t, beta=0, alpha=0.25)  # beta = 0: the input is not read
    return z.reshape(shape)


def _scale(scale: float | None, head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim) if scale is None else scale


def nystrom_reference(q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec,
                      rows: Tensor | None = None, **params: object) -> Tensor:
    """The definition in the inputs' dtype (float64 inputs: the float64 reference), written
    out: ``landmarks`` as an explicit (m, n) averaging matrix times Q and K, K/V heads
    repeated, the three softmax kernels and ``pinv_iters`` iterations; ``rows`` limits the
    output rows. ``fused`` says how a call runs, not what it computes."""
    landmarks, pinv_iters = int(params["landmarks"]), int(params["pinv_iters"])
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = 1.0 / math.sqrt(q.shape[-1])  # the harness passes no scale: the default
    q_tilde = _averaging(q.shape[-2], landmarks, q) @ q
    k_tilde = _averaging(k.shape[-2], landmarks, k) @ k
    q_rows = q if rows is None else q[..., rows.to(q.device), :]
    f_tilde = torch.softmax(q_rows @ k_tilde.transpose(-2, -1) * s, dim=-1)
    a_tilde = torch.softmax(q_tilde @ k_tilde.transpose(-2, -1) * s, dim=-1)
    b_tilde = torch.softmax(q_tilde @ k.transpose(-2, -1) * s, dim=-1)
    return f_tilde @ iterative_pinv(a_tilde, pinv_iters) @ (b_tilde @ v)


def _averaging(n: int, m: int, like: Tensor) -> Tensor:
    """(m, n): row i averages the rows j with ⌊j·m/n⌋ = i."""
    seg = torch.arange(n) * m // n
    member = (seg[None, :] == torch.arange(m)[:, None]).to(like.dtype)
    return (member / member.sum(-1, keepdim=True)).to(like.device)


def _reasons(p: Problem) -> list[str]:
    m = int(p.param("landmarks", LANDMARKS.default))
    short = min(p.n_q, p.n_k)
    if m > short:
        return [f"landmarks m = {m} > sequence length {short}: a row group would be empty"]
    return nystrom_path.path_reasons(p)


def _flops(p: Problem) -> int:
    """Q K̃ᵀ and F̃·W (2·n_q·m·D each), Q̃ Kᵀ and B̃ V (2·m·n_k·D each), Q̃ K̃ᵀ and Z (B̃V)
    (2·m²·D each), and 4 m×m×m products per iteration (8·m³), per query head."""
    m, d = int(p.param("landmarks", LANDMARKS.default)), p.head_dim
    iters = int(p.param("pinv_iters", PINV_ITERS.default))
    per_head = 4 * p.n_q * m * d + 4 * m * p.n_k * d + 4 * m * m * d + 8 * iters * m**3
    return p.batch * p.heads * per_head


def _workspace(p: Problem) -> int:
    """Peak bytes beyond inputs and output, over the call's phases: an n-sized kernel's scores
    and softmax (2·m·n per head), then the queries' softmax beside the output; the m-sized
    landmark, kernel and iteration temporaries (K̃ per K/V head); for half inputs float32
    copies of q, k, v throughout and the float32 output while it is rounded. The fused path:
    :func:`.nystrom_path.workspace_bytes`."""
    if nystrom_path.runs_fused(p):
        return nystrom_path.workspace_bytes(p)
    m, d, bh = int(p.param("landmarks", LANDMARKS.default)), p.head_dim, p.batch * p.heads
    half = p.dtype in HALF_DTYPES
    c = 4 if half else p.dtype.itemsize
    out = bh * p.n_q * d * p.dtype.itemsize
    copies = (p.n_q * p.heads + 2 * p.n_k * p.n_kv_heads) * p.batch * d * c if half else 0
    bk = p.batch * p.n_kv_heads
    # Q̃, B̃V, W and Ã per query head, K̃ and s·K̃ per K/V head: live to the end
    small = (bh * (2 * m * m + 2 * m * d) + bk * 2 * m * d) * c
    phases = [
        bh * 6 * m * m * c,  # the iteration's temporaries
        2 * bh * m * p.n_k * c,  # softmax(Q̃ Kᵀ) and its scores
        2 * bh * p.n_q * m * c,  # softmax(Q K̃ᵀ) and its scores
        bh * p.n_q * (m + d) * c + (out if half else 0),  # F̃, the (float32) output, rounded
    ]
    return max(copies + small + max(phases) - out, 0)


@register(
    "nystrom",
    family="low-rank",
    caps=Capabilities(dtypes=FLOAT_DTYPES, mask_features=frozenset(), grouped_kv=True),
    cost=Cost(time_exponent=1, memory_exponent=1, memory_model=_workspace, flops=_flops),
    description="Nyströmformer: m row-group mean landmarks, iterative pseudo-inverse, O(n·m·D)",
    params={"landmarks": LANDMARKS, "pinv_iters": PINV_ITERS, "fused": nystrom_path.FUSED},
    extra_reasons=_reasons,
    reference=nystrom_reference,
)
def nystrom_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float | None = None,
    landmarks: int = 64, pinv_iters: int = 6, fused: int = -1,
) -> Tensor:
    """q: (B, H, n_q, D), k/v: (B, H_kv, n_k, D) -> (B, H, n_q, D). ``fused`` = 1: the four
    Triton launches of :mod:`implementations._kernels.triton.nystrom_kernels` (a candidate)."""
    check_inputs(q, k, v)
    if nystrom_path.takes_fused(int(fused), q, k, v, landmarks):
        return nystrom_path.nystrom_path(q, k, v, landmarks, pinv_iters, _scale(scale,
                                                                                  q.shape[-1]))
    b, h, n_q, d = q.shape
    kv = k.shape[1]
    c = torch.float32 if q.dtype in HALF_DTYPES else q.dtype
    s = _scale(scale, d)
    # (B, H_kv, G·n, D): the G query heads of a K/V head stacked along the rows (a view)
    qc, k, v = q.to(c), k.to(c), v.to(c)
    qs = qc.reshape(b, kv, -1, d)
    q_tilde = landmark_means(qc, landmarks).reshape(b, kv, -1, d)  # (B, H_kv, G·m, D)
    k_tilde = landmark_means(k, landmarks)  # (B, H_kv, m, D)
    q_tilde, k_tilde_s = q_tilde * s, k_tilde * s  # the scale on the m-row side: no n×m copy
    b_v = torch.softmax(q_tilde @ k.transpose(-2, -1), dim=-1) @ v  # (B, H_kv, G·m, D)
    a_tilde = torch.softmax(q_tilde @ k_tilde.transpose(-2, -1), dim=-1)
    a_tilde = a_tilde.view(b, h, landmarks, landmarks)
    w = iterative_pinv(a_tilde, pinv_iters) @ b_v.view(b, h, landmarks, -1)  # (B, H, m, D)
    f_tilde = torch.softmax(qs @ k_tilde_s.transpose(-2, -1), dim=-1)  # (B, H_kv, G·n, m)
    return (f_tilde.view(b, h, n_q, landmarks) @ w).to(q.dtype)
