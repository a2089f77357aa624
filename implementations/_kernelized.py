"""Attention through a positive feature map φ: the machinery ``linear`` and ``performer`` share.

    out_i = φ(q_i)ᵀ S_i / (φ(q_i)ᵀ z_i),  S_i = Σ_{j ∈ K(i)} φ(k_j) v_jᵀ,  z_i = Σ_{j ∈ K(i)} φ(k_j)

K(i) is every key, or, when causal, the keys ``j <= i + n_k - n_q`` (bottom-right, as
:mod:`harness.masks`); a query that keeps no key outputs zeros.

- Values get a column of ones, so ``[S | z]`` is one (F, Dv + 1) matrix (the *state*) and one
  product gives numerator and normaliser.
- Not causal: associativity, ``φ(Q) (φ(K)ᵀ [V | 1])``: time O(n·F·Dv), no n×n anything.
- Causal: chunk by chunk, C positions at a time: a masked C×C quadratic inside the chunk plus the
  running state of every earlier chunk; then the chunk's keys join the state. Time
  O(n·(C + F)·Dv); memory O(n·(F + Dv) + C² + F·Dv) per head: the n prefix states (n, F, Dv)
  of the recurrence are never formed.
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

from harness.dtypes import HALF_DTYPES
from harness.masks import MaskSpec, keep_pairs
from harness.spec import Problem


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
    fq: Tensor, fk: Tensor, v1: Tensor, state: Tensor, chunk: int, group: int
) -> tuple[Tensor, Tensor]:
    """Causal attention continuing ``state``: fq (BH, t·G, F) query rows at the t positions of
    fk (BH, t, F) / v1 (BH, t, Dv + 1), all after the keys in state (BH, F, Dv + 1).

    Returns (outputs (BH, t·G, Dv), the state after the t keys). Without autograd the state is
    updated in place and each chunk's ``[numerator | normaliser]`` is written straight into its
    slot of one chunk-major buffer; with autograd both are built out of place (autograd then
    keeps each chunk's state: O(n/C·F·Dv)).
    """
    if _needs_grad(fq, fk, v1, state):
        return _causal_chunks_autograd(fq, fk, v1, state, chunk, group)
    t, bh, dv1 = fk.shape[1], fk.shape[0], v1.shape[-1]
    chunk = min(chunk, t)
    keep = chunk_keep(chunk, group, fq.device, fq.dtype)
    slots = fq.new_empty(-(-t // chunk), bh, chunk * group, dv1)  # (chunks, BH, C·G, Dv + 1)
    for i, s in enumerate(range(0, t, chunk)):
        e = min(s + chunk, t)
        qc, kc, vc = fq[:, s * group : e * group], fk[:, s:e], v1[:, s:e]
        scores = torch.bmm(qc, kc.transpose(1, 2)).mul_(keep[: (e - s) * group, : e - s])
        slot = slots[i, :, : (e - s) * group]
        torch.bmm(scores, vc, out=slot)  # inside the chunk
        slot.baddbmm_(qc, state)  # every earlier chunk
        state.baddbmm_(kc.transpose(1, 2), vc)
    out = fq.new_empty(bh, slots.shape[0], chunk * group, dv1 - 1)
    torch.div(slots[..., :-1].transpose(0, 1), slots[..., -1:].transpose(0, 1), out=out)
    return out.view(bh, -1, dv1 - 1)[:, : t * group], state


def _causal_chunks_autograd(
    fq: Tensor, fk: Tensor, v1: Tensor, state: Tensor, chunk: int, group: int
) -> tuple[Tensor, Tensor]:
    """:func:`causal_chunks` out of place, for autograd."""
    t = fk.shape[1]
    keep = chunk_keep(min(chunk, t), group, fq.device, fq.dtype)
    parts = []
    for s in range(0, t, chunk):
        e = min(s + chunk, t)
        qc, kc, vc = fq[:, s * group : e * group], fk[:, s:e], v1[:, s:e]
        scores = torch.bmm(qc, kc.transpose(1, 2)) * keep[: (e - s) * group, : e - s]
        parts.append(torch.baddbmm(torch.bmm(scores, vc), qc, state))
        state = torch.baddbmm(state, kc.transpose(1, 2), vc)
    return normalise(torch.cat(parts, dim=1)), state


class KernelState:
    """``[S | z]`` after the tokens absorbed so far: (B·H_kv, F, Dv + 1) in the compute dtype.

    Subclasses define the feature map: :meth:`query_features` and :meth:`key_features`
    ((B, H, t, D) -> (B, H, t, F) in the compute dtype; key features may rescale the state,
    as FAVOR+'s stabiliser does). ``chunk`` is the causal chunk size C.
    """

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
        self.dtype = compute_dtype(dtype)
        shape = (batch * kv_heads, features, value_dim + 1)
        self.matrix = torch.zeros(shape, dtype=self.dtype, device=device)

    def query_features(self, q: Tensor) -> Tensor:
        raise NotImplementedError

    def key_features(self, k: Tensor) -> Tensor:
        raise NotImplementedError

    def tensors(self) -> list[Tensor]:
        return [self.matrix]

    def absorb(self, k: Tensor, v: Tensor) -> None:
        """Add keys k/v (B, H_kv, t, D) that every later query sees: O(t·F·Dv)."""
        fk = self.key_features(k).flatten(0, 1)  # (BH_kv, t, F)
        v1 = with_ones(v, self.dtype)
        if _needs_grad(fk, v1, self.matrix):
            self.matrix = torch.baddbmm(self.matrix, fk.transpose(1, 2), v1)
        else:
            self.matrix.baddbmm_(fk.transpose(1, 2), v1)

    def read(self, q: Tensor) -> Tensor:
        """Outputs of queries q (B, H, n, D) that see exactly the absorbed keys: (B, H, n, Dv)."""
        num = torch.bmm(fold_heads(self.query_features(q), self.kv_heads), self.matrix)
        out = normalise(num)
        del num  # each temporary is freed as soon as the next exists: the workspace model
        return self._outputs(out, q.dtype)

    def advance(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """The next t tokens, causal among themselves: q (B, H, t, D), k/v (B, H_kv, t, D)
        -> (B, H, t, Dv); their keys join the state."""
        fk = self.key_features(k).flatten(0, 1)
        fq = fold_heads(self.query_features(q), self.kv_heads)
        group = self.heads // self.kv_heads
        out, self.matrix = causal_chunks(
            fq, fk, with_ones(v, self.dtype), self.matrix, self.chunk, group
        )
        del fq, fk
        return self._outputs(out, q.dtype)

    def _outputs(self, out: Tensor, dtype: torch.dtype) -> Tensor:
        """(B·H_kv, n·G, Dv) in the compute dtype -> (B, H, n, Dv) in ``dtype``."""
        return unfold_heads(out, self.batch, self.heads).to(dtype)


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


def repeat_heads(x: Tensor, heads: int) -> Tensor:
    """(B, H_kv, n, D) -> (B, heads, n, D): each K/V head shared by heads / H_kv query heads."""
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


def feature_definition(
    fq: Tensor,
    fk: Tensor,
    v: Tensor,
    mask: MaskSpec,
    rows: Tensor | None = None,
    eps: float = 0.0,
    chunk: int = 256,
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


# --- cost: one formula per quantity, shared by every feature map -------------------------------


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


def kernel_workspace(p: Problem, features: int, chunk: int, map_temps: int = 0) -> int:
    """Predicted peak bytes of one forward call beyond its inputs and output (closed form):
    the largest of the phases of :class:`KernelState`'s code, in allocation order.

    A feature map over r rows peaks at r·(F + ``map_temps``) elements (its own temporaries).
    Not causal: the keys' phase (φ(K), ``[V | 1]``), then the queries' (φ(Q), its regrouped copy
    under grouped K/V, ``[numerator | normaliser]``, the outputs). Causal over t positions:
    φ(K), φ(Q) and ``[V | 1]`` stay live while the chunk-major ``[numerator | normaliser]``
    (padded to whole chunks), one chunk's scores and the outputs are made. Half inputs add the
    float32 outputs before rounding. The state (F·(Dv + 1) per K/V head) is live throughout.
    """
    c, size = compute_dtype(p.dtype).itemsize, p.dtype.itemsize
    bk, bq, dv, f = p.batch * p.n_kv_heads, p.batch * p.heads, p.head_dim, features
    grouped = p.heads != p.n_kv_heads
    out_bytes = bq * p.n_q * dv * size
    tail = [2 * bq * p.n_q * dv] if grouped else []  # the outputs regrouped
    if p.dtype != compute_dtype(p.dtype):
        # float32 outputs (and their regrouped copy) live while they are rounded
        tail.append((2 if grouped else 1) * bq * p.n_q * dv + out_bytes // c)
    if not p.mask.causal:
        keys, queries = bk * p.n_k, bq * p.n_q
        phases = [
            keys * (f + map_temps),
            keys * (f + dv + 1),
            queries * (f + map_temps),
            2 * queries * f if grouped else 0,  # φ(Q) and its regrouped copy
            queries * (f + dv + 1),
            queries * (2 * dv + 1),
        ]
    else:
        t = min(p.n_q, p.n_k)
        prefix, step = bk * (p.n_k - t), min(chunk, max(t, 1))
        padded = -(-t // step) * step
        fk, fq, v1 = bk * t * f, bq * t * f, bk * t * (dv + 1)
        loop = fk + fq + v1 + bq * padded * (dv + 1)
        phases = [
            prefix * (f + dv + 1 + map_temps),
            fk + map_temps * bk * t,
            fk + bq * t * (f + map_temps),
            fk + 2 * fq if grouped else 0,
            loop + bq * step * step,
            loop + bq * padded * dv,
            2 * bq * padded * dv,
        ]
    state = bk * f * (dv + 1)
    peak = max(phases + tail) + state
    return max(peak * c - out_bytes, 0)
