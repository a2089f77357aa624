"""Attention through a positive feature map φ: the machinery ``linear`` and ``performer`` share.

    out_i = φ(q_i)ᵀ S_i / (φ(q_i)ᵀ z_i),  S_i = Σ_{j ∈ K(i)} φ(k_j) v_jᵀ,  z_i = Σ_{j ∈ K(i)} φ(k_j)

K(i) is every key, or, when causal, the keys ``j <= i + n_k - n_q`` (bottom-right, as
:mod:`harness.masks`); a query that keeps no key outputs zeros.

- Values get a column of ones, so ``[S | z]`` is one (F, Dv + 1) matrix (the *state*) and one
  product gives numerator and normaliser.
- Not causal: associativity, ``φ(Q) (φ(K)ᵀ [V | 1])``: time O(n·F·Dv), no n×n anything.
- Causal: chunk by chunk, C positions at a time: a masked C×C quadratic inside the chunk plus the
  running state of every earlier chunk; then the chunk's keys join the state. Time
  O(n·(C + F)·Dv); the n prefix states (n, F, Dv) of the recurrence are never formed.
- Memory: features, ``[V | 1]`` and the chunk loop's inputs exist for one segment of positions
  at a time (:data:`SEGMENT_BYTES`), so beyond the output the workspace is O(segment + C² +
  F·Dv) per head, constant in n.
- Grouped K/V: the G = H / H_kv query heads of one K/V head are folded into the row axis,
  (B·H_kv, n·G, F), row ``t·G + g`` at position t, so one state serves the whole group.
- Half-precision inputs run in float32: the state is a sum over the whole sequence.

:class:`KernelState` is that state as an object: ``absorb`` (keys only), ``read`` (queries that
see exactly the absorbed keys) and ``advance`` (causal continuation) give every mask case, and the
recurrent decode step (``cache = "state"``) is ``advance`` with one token: O(1) in the context.
"""

from __future__ import annotations

import torch
from torch import Tensor

from harness.spec import HALF_DTYPES


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the feature maps and the state run in: float32 for half inputs."""
    return torch.float32 if dtype in HALF_DTYPES else dtype


def fold_heads(x: Tensor, kv_heads: int) -> Tensor:
    """(B, H, n, F) -> (B·H_kv, n·G, F), G = H / H_kv: row ``t·G + g`` is the group's query
    head g at position t."""
    b, h, n, f = x.shape
    g = h // kv_heads
    if g == 1:
        return x.reshape(b * h, n, f)
    return x.view(b, kv_heads, g, n, f).transpose(2, 3).reshape(b * kv_heads, n * g, f)


def unfold_heads(x: Tensor, batch: int, heads: int) -> Tensor:
    """The inverse of :func:`fold_heads`: (B·H_kv, n·G, Dv) -> (B, H, n, Dv)."""
    bk, rows, dv = x.shape
    kv = bk // batch
    g = heads // kv
    if g == 1:
        return x.reshape(batch, heads, rows, dv)
    return x.view(batch, kv, rows // g, g, dv).transpose(2, 3).reshape(batch, heads, -1, dv)


def with_ones(v: Tensor, dtype: torch.dtype) -> Tensor:
    """(B, H_kv, n, Dv) -> (B·H_kv, n, Dv + 1) in ``dtype``: the values and a column of ones."""
    b, h, n, dv = v.shape
    out = torch.empty(b * h, n, dv + 1, dtype=dtype, device=v.device)
    out[..., :dv] = v.reshape(b * h, n, dv)
    out[..., dv] = 1.0
    return out


def normalise(num: Tensor) -> Tensor:
    """(…, Dv + 1) ``[numerator | normaliser]`` -> (…, Dv) outputs."""
    return num[..., :-1] / num[..., -1:]


def _needs_grad(*tensors: Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def chunk_keep(chunk: int, group: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """The causal mask inside one chunk as 0/1 weights: (C·G, C), row r (position r // G)
    keeps key b when b <= r // G."""
    rows = torch.arange(chunk * group, device=device) // group
    return (torch.arange(chunk, device=device)[None, :] <= rows[:, None]).to(dtype)


def causal_chunks(
    fq: Tensor, fk: Tensor, v1: Tensor, state: Tensor, chunk: int, group: int, out: Tensor
) -> None:
    """Causal attention continuing ``state``: fq (BH, t·G, F) query rows at the t positions of
    fk (BH, t, F) / v1 (BH, t, Dv + 1), all after the keys in state (BH, F, Dv + 1).

    Writes the outputs into ``out`` (BH, t·G, Dv) chunk by chunk and adds the t keys to
    ``state``, both in place (no autograd: see :func:`causal_chunks_autograd`).
    """
    t = fk.shape[1]
    keep = chunk_keep(min(chunk, t), group, fq.device, fq.dtype)
    for s in range(0, t, chunk):
        e = min(s + chunk, t)
        qc, kc, vc = fq[:, s * group : e * group], fk[:, s:e], v1[:, s:e]
        scores = torch.bmm(qc, kc.transpose(1, 2)).mul_(keep[: (e - s) * group, : e - s])
        part = torch.bmm(scores, vc).baddbmm_(qc, state)  # inside the chunk + every earlier one
        torch.div(part[..., :-1], part[..., -1:], out=out[:, s * group : e * group])
        state.baddbmm_(kc.transpose(1, 2), vc)


def causal_chunks_autograd(
    fq: Tensor, fk: Tensor, v1: Tensor, state: Tensor, chunk: int, group: int
) -> tuple[Tensor, Tensor]:
    """:func:`causal_chunks` out of place, for autograd: (outputs (BH, t·G, Dv), new state).
    Autograd keeps each chunk's state: O(n/C·F·Dv) for the backward pass."""
    t = fk.shape[1]
    keep = chunk_keep(min(chunk, t), group, fq.device, fq.dtype)
    parts = []
    for s in range(0, t, chunk):
        e = min(s + chunk, t)
        qc, kc, vc = fq[:, s * group : e * group], fk[:, s:e], v1[:, s:e]
        scores = torch.bmm(qc, kc.transpose(1, 2)) * keep[: (e - s) * group, : e - s]
        parts.append(normalise(torch.baddbmm(torch.bmm(scores, vc), qc, state)))
        state = torch.baddbmm(state, kc.transpose(1, 2), vc)
    return torch.cat(parts, dim=1), state


SEGMENT_BYTES = 8 * 2**20
"""Feature-map work per segment of positions. The feature maps, ``[V | 1]`` and the chunk
loop's inputs exist for one segment at a time: workspace O(segment), not O(n), and buffers
this size are reused from the heap call after call instead of being mapped afresh (glibc maps
blocks over 32 MiB anew each time: page faults cost ~30% of the time at n = 16k)."""


class KernelState:
    """``[S | z]`` after the tokens absorbed so far: (B·H_kv, F, Dv + 1) in the compute dtype.

    Subclasses define the feature map: :meth:`query_features` and :meth:`key_features`
    ((B, H, t, D) -> (B, H, t, F) in the compute dtype; key features may rescale the state,
    as FAVOR+'s stabiliser does) and ``map_temps``, the map's own temporaries per row in
    elements. ``chunk`` is the causal chunk size C. Every method walks its tokens in segments
    of :meth:`segment_len` positions.
    """

    map_temps = 0

    def __init__(
        self,
        batch: int,
        heads: int,
        kv_heads: int,
        features: int,
        value_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        chunk: int,
    ):
        self.batch, self.heads, self.kv_heads, self.chunk = batch, heads, kv_heads, chunk
        self.features, self.value_dim = features, value_dim
        self.dtype = compute_dtype(dtype)
        shape = (batch * kv_heads, features, value_dim + 1)
        self.matrix = torch.zeros(shape, dtype=self.dtype, device=device)

    def query_features(self, q: Tensor) -> Tensor:
        raise NotImplementedError

    def key_features(self, k: Tensor) -> Tensor:
        raise NotImplementedError

    def tensors(self) -> list[Tensor]:
        return [self.matrix]

    def segment_len(self) -> int:
        """Positions per segment: :data:`SEGMENT_BYTES` of features, a whole number of chunks."""
        return segment_len(
            self.batch,
            self.heads,
            self.kv_heads,
            self.features + self.map_temps,
            self.value_dim,
            self.dtype.itemsize,
            self.chunk,
        )

    def absorb(self, k: Tensor, v: Tensor) -> None:
        """Add keys k/v (B, H_kv, t, D) that every later query sees: O(t·F·Dv)."""
        seg = self.segment_len()
        for s in range(0, k.shape[-2], seg):
            fk = self.key_features(k[:, :, s : s + seg]).flatten(0, 1)  # (BH_kv, seg, F)
            v1 = with_ones(v[:, :, s : s + seg], self.dtype)
            if _needs_grad(fk, v1, self.matrix):
                self.matrix = torch.baddbmm(self.matrix, fk.transpose(1, 2), v1)
            else:
                self.matrix.baddbmm_(fk.transpose(1, 2), v1)
            del fk, v1  # one segment's buffers at a time: the workspace model counts on it

    def read(self, q: Tensor) -> Tensor:
        """Outputs of queries q (B, H, n, D) that see exactly the absorbed keys: (B, H, n, Dv)."""
        seg, group = self.segment_len(), self.heads // self.kv_heads
        grad = _needs_grad(q, self.matrix)
        out = None if grad else self._folded_output(q)
        parts = []
        for s in range(0, q.shape[-2], seg):
            fq = fold_heads(self.query_features(q[:, :, s : s + seg]), self.kv_heads)
            num = torch.bmm(fq, self.matrix)
            del fq
            if grad:
                parts.append(normalise(num))
            else:
                e = min(s + seg, q.shape[-2])
                torch.div(num[..., :-1], num[..., -1:], out=out[:, s * group : e * group])
            del num
        return self._outputs(torch.cat(parts, dim=1) if grad else out, q.dtype)

    def advance(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """The next t tokens, causal among themselves: q (B, H, t, D), k/v (B, H_kv, t, D)
        -> (B, H, t, Dv); their keys join the state."""
        seg, group = self.segment_len(), self.heads // self.kv_heads
        grad = _needs_grad(q, k, v, self.matrix)
        out = None if grad else self._folded_output(q)
        parts = []
        for s in range(0, k.shape[-2], seg):
            fk = self.key_features(k[:, :, s : s + seg]).flatten(0, 1)
            fq = fold_heads(self.query_features(q[:, :, s : s + seg]), self.kv_heads)
            v1 = with_ones(v[:, :, s : s + seg], self.dtype)
            if grad:
                part, self.matrix = causal_chunks_autograd(
                    fq, fk, v1, self.matrix, self.chunk, group
                )
                parts.append(part)
            else:
                rows = out[:, s * group : (s + fk.shape[1]) * group]
                causal_chunks(fq, fk, v1, self.matrix, self.chunk, group, rows)
            del fk, fq, v1
        return self._outputs(torch.cat(parts, dim=1) if grad else out, q.dtype)

    def _folded_output(self, q: Tensor) -> Tensor:
        """The outputs' buffer in the folded layout: (B·H_kv, n·G, Dv), compute dtype."""
        rows = q.shape[-2] * (self.heads // self.kv_heads)
        shape = (self.batch * self.kv_heads, rows, self.value_dim)
        return torch.empty(shape, dtype=self.dtype, device=q.device)

    def _outputs(self, out: Tensor, dtype: torch.dtype) -> Tensor:
        """(B·H_kv, n·G, Dv) in the compute dtype -> (B, H, n, Dv) in ``dtype``."""
        return unfold_heads(out, self.batch, self.heads).to(dtype)


def segment_len(
    batch: int, heads: int, kv_heads: int, row_elems: int, value_dim: int, size: int, chunk: int
) -> int:
    """Positions per segment: the query and key feature rows (``row_elems`` each, with the
    map's temporaries) and ``[V | 1]`` of one position take ``per`` bytes; a segment takes
    :data:`SEGMENT_BYTES` of them, rounded down to whole chunks (at least one chunk)."""
    per = batch * (heads * row_elems + kv_heads * (row_elems + value_dim + 1)) * size
    return max(chunk, SEGMENT_BYTES // per // chunk * chunk)


def kernel_attention(state: KernelState, q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
    """q: (B, H, n_q, D), k/v: (B, H_kv, n_k, Dv) -> (B, H, n_q, Dv) through a fresh ``state``.

    Not causal: absorb every key, read every query. Causal (bottom-right): the first
    ``n_k - n_q`` keys precede every query (absorbed); with ``n_q > n_k`` the first
    ``n_q - n_k`` queries keep no key (zeros); the rest advance together.
    """
    if not causal:
        state.absorb(k, v)
        return state.read(q)
    n_q, n_k = q.shape[-2], k.shape[-2]
    if n_k > n_q:
        state.absorb(k[:, :, : n_k - n_q], v[:, :, : n_k - n_q])
        k, v = k[:, :, n_k - n_q :], v[:, :, n_k - n_q :]
    if n_q <= n_k:
        return state.advance(q, k, v)
    rows = state.advance(q[:, :, n_q - n_k :], k, v)
    empty = rows.new_zeros(*rows.shape[:2], n_q - n_k, rows.shape[-1])
    return torch.cat([empty, rows], dim=2)
