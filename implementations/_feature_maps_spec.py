"""What the feature-space attention of :mod:`implementations._feature_maps` is and costs, declared
once for ``linear``, ``performer`` and ``fla-linear``: its definition written out (the O(n²)
reference each one's ``reference`` evaluates with its own feature map) and one closed-form
formula per cost (FLOPs, executed FLOPs of the chunked causal path, recurrent-state bytes,
workspace). The tests hold the FLOPs to torch's FLOP counter and the workspace to the
profiler's measured peak."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from harness.masks import MaskSpec, keep_pairs
from harness.spec import Param, Problem
from implementations._feature_maps import (
    BLOCKED_REDUCTION_DEVICES,
    REDUCE_ROWS,
    SEGMENT,
    cap_reason,
    chunk_bytes,
    compute_dtype,
    piece_lengths,
    segment_positions,
    split_blocks,
)
from implementations._kernels.triton import feature_attention as fused

CHUNK = Param(
    64,
    "causal chunk size C: positions per masked C×C block between state updates "
    "(time O(n·(C + F)·D); no effect without causal)",
    minimum=1,
)
# how a call runs, not what it computes: the parameters ``linear`` and ``performer`` share
EXECUTION = {"chunk_size": CHUNK, "segment_bytes": SEGMENT, "fused": fused.FUSED}


def chunk_of(p: Problem) -> int:
    """``p``'s ``chunk_size`` (the default where the point names none)."""
    return int(p.param("chunk_size", CHUNK.default))


@dataclass(frozen=True)
class FeatureCosts:
    """The registry declarations of one feature-map method, from its feature count F and its
    map's temporaries: ``linear`` (F = D) and ``performer`` (FAVOR+, F = m, a running
    stabiliser per K/V head in its state)."""

    features: Callable[[Problem], int]  # F of a call
    map_temps: Callable[[Problem], int]  # elements per row beside F while a map runs
    favor: bool = False

    def workspace(self, p: Problem) -> int:
        """The memory model (:func:`method_workspace`)."""
        return method_workspace(p, self.features(p), chunk_of(p), self.map_temps(p), self.favor)

    def reasons(self, p: Problem) -> list[str]:
        """The extra reasons (:func:`method_reasons`)."""
        return method_reasons(p, self.features(p), chunk_of(p), self.map_temps(p), self.favor)

    def state_bytes(self, p: Problem) -> int:
        """The recurrent state's bytes (:func:`state_bytes`)."""
        return state_bytes(p, self.features(p), 1 if self.favor else 0)


def kernel_flops(p: Problem, features: int) -> int:
    """Forward matrix-product FLOPs of the feature-space attention (feature maps excluded):
    the keys' ``φ(K)ᵀ [V | 1]`` (2·n_k·F·(Dv + 1) per K/V head) and the queries' ``φ(Q) [S | z]``
    (2·F·(Dv + 1) per query row that keeps a key). The causal recurrence costs the same."""
    dv = p.head_dim
    rows = min(p.n_q, p.n_k) if p.mask.causal else p.n_q
    keys = 2 * p.batch * p.n_kv_heads * p.n_k * features * (dv + 1)
    return keys + 2 * p.batch * p.heads * rows * features * (dv + 1)


def chunked_extra_flops(p: Problem, features: int, chunk: int) -> int:
    """What the chunked causal path executes beyond :func:`kernel_flops`: per chunk of c
    positions the full c×c score block (half of it masked) and its product with ``[V | 1]``,
    2·c²·(F + Dv + 1) per query head — the price of running the recurrence as matrix products
    (about as much again as :func:`kernel_flops` at C = F = Dv = 64). 0 when not causal."""
    if not p.mask.causal:
        return 0
    t = min(p.n_q, p.n_k)
    c = min(chunk, max(t, 1))
    squares = (t // c) * c * c + (t % c) ** 2
    return 2 * p.batch * p.heads * squares * (features + p.head_dim + 1)


def state_bytes(p: Problem, features: int, extra_per_head: int = 0) -> int:
    """Bytes of the recurrent state ``[S | z]`` (B·H_kv, F, Dv + 1) in the compute dtype, plus
    ``extra_per_head`` elements per K/V head (FAVOR+'s running stabiliser)."""
    size = compute_dtype(p.dtype).itemsize
    return p.batch * p.n_kv_heads * (features * (p.head_dim + 1) + extra_per_head) * size


def kernel_workspace(
    p: Problem, features: int, chunk: int, map_temps: int = 0, segment_bytes: int = 0
) -> int:
    """Predicted peak bytes of one forward call beyond its inputs and output (closed form):
    the largest of the phases of :class:`FeatureState`'s code, in allocation order.

    The call runs in segments of positions (:func:`segment_positions`, the same rule as the
    code: ``segment_bytes`` or the device's policy), a causal segment in the pieces of
    :func:`split_tail`, keys absorbed on a GPU in blocks (:func:`split_blocks`, their partial
    states beside them). A feature map peaks at r·(F + ``map_temps``) elements per head; keys
    hold φ(K) and ``[V | 1]``; queries φ(Q) (and a regrouped copy under grouped K/V), then
    ``[numerator | normaliser]``. A causal piece of two or more whole chunks also holds the
    chunk states (r/C·F·(Dv + 1) per K/V head, one slot more) and then its C×C scores per query
    row; a shorter one one chunk's scores and products at a time. The outputs' buffer
    (B·H·n_q·Dv in the compute dtype) is the output itself for float32-like inputs without
    grouped K/V; otherwise it lives beside the regrouped or rounded output. The state
    (F·(Dv + 1) per K/V head) is live throughout.
    """
    c, size = compute_dtype(p.dtype).itemsize, p.dtype.itemsize
    bk, bq, dv, f = p.batch * p.n_kv_heads, p.batch * p.heads, p.head_dim, features
    e, grouped = dv + 1, p.heads != p.n_kv_heads
    out_bytes, state = bq * p.n_q * dv * size, bk * f * e

    def segment(causal: bool) -> int | None:
        need = chunk_bytes(p.batch, p.heads, p.n_kv_heads, f, map_temps, dv, c, chunk, causal)
        return segment_positions(need, segment_bytes, p.device, chunk, causal)

    def key_map(r: int) -> list[int]:
        return [bk * r * (f + map_temps), bk * r * (f + e)]

    def query_map(r: int, live: int) -> list[int]:
        return [live + bq * r * (f + map_temps), live + 2 * bq * r * f if grouped else 0]

    def piece(r: int) -> list[int]:
        kv, fq = bk * r * (f + e), bq * r * f
        if r < 2 * chunk:
            step = min(chunk, r)
            return [*key_map(r), *query_map(r, kv), kv + fq + bq * step * (step + e)]
        slots = (bk * (r // chunk) + 1) * f * e
        return [
            *key_map(r),
            kv + slots + bk * f * e,  # the chunk states and each head's last chunk's U
            *query_map(r, kv + slots),
            kv + slots + fq + bq * r * e,  # φ(Q_c) P_c
            kv + fq + bq * r * (e + chunk),  # the chunks' masked scores
        ]

    plain = segment(False)
    blocked = torch.device(p.device).type in BLOCKED_REDUCTION_DEVICES

    def absorb(keys: int) -> list[int]:  # non-causal segments of keys, split into blocks
        seg = min(plain or keys, keys)
        out = []
        for end in {seg} | ({keys % seg} if keys % seg else set()):
            for a, b in split_blocks(0, end, REDUCE_ROWS) if blocked else [(0, end)]:
                out += key_map(b - a)
                if blocked and (b - a) % REDUCE_ROWS == 0:  # the blocks' states and their sum
                    out.append(bk * (b - a) * (f + e) + bk * ((b - a) // REDUCE_ROWS + 1) * f * e)
        return out

    if not p.mask.causal:
        before = absorb(p.n_k)
        r = min(plain or p.n_q, p.n_q)
        during = [*query_map(r, 0), bq * r * (f + e)]
        rows, keep = p.n_q, 0
    else:
        rows = min(p.n_q, p.n_k)  # the query rows that keep a key advance; the rest are zeros
        before = absorb(p.n_k - rows) if p.n_k > rows else []
        step = min(chunk, max(rows, 1))
        keep = bq // bk * step * step  # the chunk mask, live while the rows advance
        during = [x for r in piece_lengths(rows, segment(True), chunk) for x in piece(r)]
    out_c = bq * rows * dv  # the folded outputs, compute dtype
    end = [out_c]
    if grouped:
        end.append(2 * out_c)  # the folded outputs and their regrouped copy
    if size != c:
        end.append((2 if grouped else 1) * out_c + bq * rows * dv * size // c)  # rounded
    peaks = [*before, *(keep + out_c + x for x in during), *(keep + x for x in end)]
    if rows < p.n_q:  # the rows, the zeros before them and both concatenated
        peaks.append(2 * out_bytes // c)
    return max((max(peaks) + state) * c - out_bytes, 0)


def kernel_chunk_bytes(p: Problem, features: int, chunk: int, map_temps: int = 0) -> int:
    """One chunk's workspace in the call's shapes (:func:`chunk_bytes`): what a
    ``segment_bytes`` cap must at least allow."""
    c = compute_dtype(p.dtype).itemsize
    return chunk_bytes(
        p.batch, p.heads, p.n_kv_heads, features, map_temps, p.head_dim, c, chunk, p.mask.causal
    )


def method_workspace(p: Problem, features: int, chunk: int, map_temps: int, favor: bool) -> int:
    """The registered memory model of ``linear`` (F = D) and ``performer`` (``favor``, F = m):
    the fused path's workspace where a call of ``p`` takes it (causal: the chunk kernel's),
    else the PyTorch path's (:func:`kernel_workspace`, chunks of ``chunk`` positions, the
    ``segment_bytes`` cap)."""
    m = features if favor else 0
    if fused.runs_fused(p, chunked=True, features=m):
        if p.mask.causal:
            return fused.chunk_workspace_bytes(p, m)
        return fused.feature_workspace_bytes(p, features, favor)
    cap = int(p.param("segment_bytes", SEGMENT.default))
    return kernel_workspace(p, features, chunk, map_temps, cap)


def method_reasons(p: Problem, features: int, chunk: int, map_temps: int, favor: bool
                   ) -> list[str]:
    """The registry's extra reasons of ``linear`` and ``performer``: a ``segment_bytes`` cap
    below one chunk's workspace, a forced fused path that cannot run."""
    need = kernel_chunk_bytes(p, features, chunk, map_temps)
    reason = cap_reason(int(p.param("segment_bytes", SEGMENT.default)), need, chunk)
    return ([reason] if reason else []) + fused.path_reasons(p, chunked=True,
                                                             features=features if favor else 0)


def repeat_heads(x: Tensor, heads: int) -> Tensor:
    """(B, H_kv, n, D) -> (B, heads, n, D): each K/V head shared by heads / H_kv query heads."""
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


def feature_definition(
    fq: Tensor, fk: Tensor, v: Tensor, mask: MaskSpec, rows: Tensor | None = None,
    eps: float = 0.0, chunk: int = 256,
) -> Tensor:
    """The definition written out, in the inputs' dtype: weights ``w_ij = φ(q_i)ᵀφ(k_j)`` on
    the kept pairs (:func:`harness.masks.keep_pairs`), ``out_i = Σ_j w_ij v_j / (Σ_j w_ij +
    eps)``, zeros for a row without keys. O(n_q·n_k) time, computed query chunk by query chunk
    (memory O(chunk·n_k)).

    fq (B, H, n_q, F), fk (B, H_kv, n_k, F), v (B, H_kv, n_k, Dv); ``rows`` (1-D long) limits
    the result to those query rows: (B, H, len(rows) or n_q, Dv).
    """
    n_q, n_k = fq.shape[-2], fk.shape[-2]
    fk, v = repeat_heads(fk, fq.shape[1]), repeat_heads(v, fq.shape[1])
    ids = torch.arange(n_q) if rows is None else rows.cpu().long()
    outs = []
    for s in range(0, len(ids), chunk):
        part = ids[s : s + chunk]
        weights = fq[..., part.to(fq.device), :] @ fk.transpose(-2, -1)  # (B, H, c, n_k)
        if not mask.is_dense:
            keep = keep_pairs(mask, n_q, n_k, part[:, None] + n_k - n_q, torch.arange(n_k)[None])
            weights = weights * keep.to(weights.device, weights.dtype)
        total = weights.sum(-1, keepdim=True)
        out = (weights @ v) / torch.where(total > 0, total + eps, torch.ones_like(total))
        outs.append(out)
    return torch.cat(outs, dim=-2)
