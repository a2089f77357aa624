"""``performer``: FAVOR+ (Choromanski et al. 2021, "Rethinking Attention with Performers").

Positive orthogonal random features estimate the softmax kernel ``exp(s·qᵀk)`` (s the softmax
scale, 1/√D by default): with x' = √s·x and W (m, D),

    φ(x) = exp(W x' − |x'|²/2 − c) / √m,   E[φ(q)ᵀφ(k)] ∝ exp(s·qᵀk)

and attention is the feature-space attention of :mod:`implementations._feature_maps` with F = m:
O(n·m·D) time, O(n·(m + D)) memory; causal runs through the same chunked prefix machinery and
the same recurrent state as ``linear``.

- W: ⌈m/D⌉ blocks of D orthonormal rows (QR of a Gaussian matrix), the last block cut to
  m mod D rows, each row rescaled to the length of an independent D-dimensional Gaussian vector
  (the paper's orthogonal random features). Drawn in float64 on the CPU from ``mask.seed``, the
  same for every head, device and dtype.
- The stabiliser c (the official implementation's ``numerator_denominator_stabilizer``): for a
  query, the largest of its m logits; for keys, the largest logit over all keys and features of
  a (batch, K/V head). Each is a per-row or per-head constant, so it cancels exactly between
  numerator and normaliser; it only keeps exp() in range. The recurrent state keeps a running
  key maximum and rescales ``[S | z]`` when it grows, so decoding never needs future keys.
- The stabiliser under the chunkwise-parallel causal form: the key features of a segment are
  made once, under one shift per (batch, K/V head) — the segment's largest key logit, or the
  running maximum when that is larger. Every chunk's ``φ(K_c)ᵀ [V | 1]`` and so every
  cumulative state ``P_c`` carries the same factor exp(−c), which cancels between each query's
  numerator and normaliser: the cumulative sum only adds terms of one scale, and the result is
  the reference's function exactly (in exact arithmetic). A later segment first rescales the
  carried state by exp(c_old − c_new) <= 1. With one segment (a GPU's default) the shift is the
  largest logit over all keys, as in the reference. The
  official code's additive 1e-6 is not used: with it the output would depend on the stabiliser
  (a prefix's key maximum is not the sequence's), and the causal and recurrent forms would
  compute different functions.

- The fused path (non-causal forward calls on CUDA, ``fused``; :mod:`implementations._kernels.
  triton.feature_kernels`): each program of the key pass shifts its logits by its own running
  maximum per feature m_{s,f}; the combine weights each partial state by exp(m_{s,f} − M), M
  the head's largest key logit, which gives the global-key-maximum stabiliser above exactly
  (in exact arithmetic), every exponent <= 0. The causal chunk kernel (``fused`` = 1, m <= 256;
  :mod:`implementations._kernels.triton.linear_chunk`) makes its prefix states under the same
  M and each chunk's key features under M too: the features never reach HBM.

The agreement check holds it to :func:`performer_reference` (its own definition with the same
W, in float64); its distance from exact softmax attention is the measured ``approx_err``.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
from torch import Tensor

from harness.masks import MaskSpec
from harness.registry import problem_of, register
from harness.spec import FLOAT_DTYPES, Capabilities, Cost, Param, Problem, Recurrence
from implementations._feature_maps import (
    FeatureState,
    check_inputs,
    compute_dtype,
    feature_state_attention,
    state_dims,
)
from implementations._feature_maps_spec import (
    EXECUTION,
    FeatureCosts,
    feature_definition,
    kernel_flops,
)
from implementations._kernels.triton.feature_attention import (
    chunk_attention,
    feature_attention,
    split_weights,
    takes_fused,
)

FEATURES = Param(256, "random features m of the FAVOR+ estimator (error ~ m^-1/2)", minimum=1)


@lru_cache(maxsize=32)
def orthogonal_features(features: int, head_dim: int, seed: int) -> Tensor:
    """W (m, D) float64 on the CPU: blocks of D orthonormal rows scaled to Gaussian lengths."""
    gen = torch.Generator().manual_seed(seed)
    blocks = []
    for _ in range(-(-features // head_dim)):
        gaussian = torch.randn(head_dim, head_dim, generator=gen, dtype=torch.float64)
        blocks.append(torch.linalg.qr(gaussian).Q.T)  # rows orthonormal
    lengths = torch.randn(features, head_dim, generator=gen, dtype=torch.float64).norm(dim=1)
    return torch.cat(blocks)[:features] * lengths[:, None]


@lru_cache(maxsize=32)
def device_features(
    features: int, head_dim: int, seed: int, scale: float, device: torch.device, dtype: torch.dtype
) -> Tensor:
    """√scale·W (m, D) on ``device`` in ``dtype``, made once: a call on a GPU then makes no host
    copy, and x' = √scale·x is never formed (W x' = (√scale·W) x). At most 32 kept (m·D
    elements each: 64 KiB at m = 256, D = 64)."""
    w = orthogonal_features(features, head_dim, seed) * math.sqrt(scale)
    return w.to(device=device, dtype=dtype)


@lru_cache(maxsize=32)
def fused_features(
    features: int, head_dim: int, seed: int, scale: float, device: torch.device
) -> Tensor:
    """√scale·W as the fused kernels take it (:func:`split_weights`): (2, m, D) fp32, made once
    per device (2·m·D floats: 128 KiB at m = 256, D = 64)."""
    w = orthogonal_features(features, head_dim, seed) * math.sqrt(scale)
    return split_weights(w.float()).to(device)


def favor_logits(x: Tensor, w: Tensor, scale: float) -> Tensor:
    """W x' − |x'|²/2 with x' = √scale·x: (…, n, D) -> (…, n, m), in x's dtype."""
    x = x * math.sqrt(scale)
    logits = x @ w.T
    return logits.sub_((x * x).sum(-1, keepdim=True) / 2)


def _scale(scale: float | None, head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim) if scale is None else scale


class PerformerState(FeatureState):
    """FAVOR+'s recurrent state: ``[S | z]`` (B·H_kv, m, Dv + 1) and the running key-logit
    maximum (B·H_kv, 1, 1) the key features are scaled by."""

    def __init__(
        self,
        problem: Problem,
        features: int = 256,
        chunk_size: int = 64,
        scale: float | None = None,
        segment_bytes: int = 0,
        fused: int = -1,
    ):
        """``fused`` is accepted with the call's parameters: a recurrent state runs PyTorch."""
        p = problem
        super().__init__(*state_dims(p, features), chunk_size, segment_bytes)
        self.scale = _scale(scale, p.head_dim)
        self.w = device_features(
            features, p.head_dim, p.mask.seed, self.scale, self.device, self.dtype
        )
        self.map_temps = _map_temps(p)
        self.log_root_m = 0.5 * math.log(features)
        self.shift = torch.full((p.batch * p.n_kv_heads, 1, 1), -math.inf, device=p.device)
        self.shift = self.shift.to(self.dtype)

    def tensors(self) -> list[Tensor]:
        return [self.matrix, self.shift]

    def query_features(self, q: Tensor) -> Tensor:
        """exp(W x' − max_j (W x')_j) / √m: the definition's −|x'|²/2 is a per-row constant, as
        the row's stabiliser is, so it cancels with it (and in the output's ratio) unformed."""
        logits = q.to(self.dtype) @ self.w.T  # (B, H, t, m)
        row_max = logits.detach().amax(-1, keepdim=True)
        return logits.sub_(row_max.add_(self.log_root_m)).exp_()

    def key_features(self, k: Tensor) -> Tensor:
        """Key features under the running maximum; the state is rescaled first when the new
        keys raise it (exp(old − new) <= 1: nothing overflows)."""
        k = k.to(self.dtype)
        norms = (k * k).sum(-1, keepdim=True)  # |x'|²/2 = norms·scale/2
        logits = (k @ self.w.T).sub_(norms, alpha=self.scale / 2)  # (B, H_kv, t, m)
        del norms
        block_max = logits.detach().amax(dim=(-2, -1)).view(-1, 1, 1)
        shift = torch.maximum(self.shift, block_max)
        # exp(-inf) = 0 rescales the empty state (zeros) to zeros: no host-side check needed
        rescale = torch.exp(self.shift - shift)
        if self.matrix.requires_grad or logits.requires_grad:
            self.matrix = self.matrix * rescale
        else:
            self.matrix.mul_(rescale)
        self.shift = shift
        return logits.sub_(shift.view(*logits.shape[:2], 1, 1) + self.log_root_m).exp_()


def performer_reference(q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec,
                        rows: Tensor | None = None, **params: object) -> Tensor:
    """The definition in the inputs' dtype (float64 inputs: the float64 reference), O(n²): the
    same W (``features`` of them) and stabilisers, weights φ(q_i)ᵀφ(k_j) over the kept pairs,
    normalised; ``rows`` limits the output to those rows. The other parameters
    (``chunk_size``, ``segment_bytes``, ``fused``) say how a call runs, not what it computes."""
    features = int(params["features"])
    w = orthogonal_features(features, q.shape[-1], mask.seed).to(q.device, q.dtype)
    s = 1.0 / math.sqrt(q.shape[-1])  # the harness passes no scale: the default
    lq, lk = favor_logits(q, w, s), favor_logits(k, w, s)
    fq = torch.exp(lq - lq.amax(-1, keepdim=True)) / math.sqrt(features)
    fk = torch.exp(lk - lk.amax(dim=(-2, -1), keepdim=True)) / math.sqrt(features)
    return feature_definition(fq, fk, v, mask, rows)


def _map_temps(p: Problem) -> int:
    """Beside the m logits of a row while features are made: its norm or maximum (1), and for
    half inputs the float32 copy of the row (D)."""
    return 1 + (p.head_dim if p.dtype != compute_dtype(p.dtype) else 0)


def _m(p: Problem) -> int:
    return int(p.param("features", FEATURES.default))


COSTS = FeatureCosts(features=_m, map_temps=_map_temps, favor=True)


def _flops(p: Problem) -> int:
    """Feature maps (2·m·D per query and per key row) plus the feature-space attention."""
    m = _m(p)
    maps = 2 * m * p.head_dim * p.batch * (p.heads * p.n_q + p.n_kv_heads * p.n_k)
    return maps + kernel_flops(p, m)


@register(
    "performer",
    family="linear",
    caps=Capabilities(dtypes=FLOAT_DTYPES, mask_features={"causal"}, grouped_kv=True),
    cost=Cost(
        time_exponent=1,
        memory_exponent=1,
        memory_model=COSTS.workspace,
        flops=_flops,
        io_bytes=lambda p: _m(p) * p.head_dim * compute_dtype(p.dtype).itemsize,  # W
    ),
    description="Performer FAVOR+, positive orthogonal random features: O(n·m·D)",
    params={"features": FEATURES, **EXECUTION},
    extra_reasons=COSTS.reasons,
    reference=performer_reference,
    recurrence=Recurrence(new_state=PerformerState, state_bytes=COSTS.state_bytes),
)
def performer_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float | None = None,
    features: int = 256, chunk_size: int = 64, segment_bytes: int = 0, fused: int = -1,
) -> Tensor:
    """q: (B, H, n_q, D), k/v: (B, H_kv, n_k, D) -> (B, H, n_q, D). Non-causal forward calls
    on CUDA run the fused Triton kernels (``fused``: :data:`FUSED`; ``fused`` = 1 also causal
    ones, the chunk kernel, m <= 256), the rest the PyTorch path."""
    check_inputs(q, k, v)
    if takes_fused(int(fused), q, k, v, mask.causal, chunked=True, features=features):
        s = _scale(scale, q.shape[-1])
        w = fused_features(features, q.shape[-1], mask.seed, s, q.device)
        if mask.causal:
            return chunk_attention(q, k, v, w, s)
        return feature_attention(q, k, v, w, s, combine=int(fused) == 2)
    state = PerformerState(problem_of(q, k, v, mask), features, chunk_size, scale, segment_bytes)
    return feature_state_attention(state, q, k, v, mask.causal)
