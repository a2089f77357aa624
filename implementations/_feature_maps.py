"""Attention through a positive feature map φ: the machinery ``linear`` and ``performer`` share.

    out_i = φ(q_i)ᵀ S_i / (φ(q_i)ᵀ z_i),  S_i = Σ_{j ∈ K(i)} φ(k_j) v_jᵀ,  z_i = Σ_{j ∈ K(i)} φ(k_j)

K(i) is every key, or, when causal, the keys ``j <= i + n_k - n_q`` (bottom-right, as
:mod:`harness.masks`); a query that keeps no key outputs zeros.

- Values get a column of ones, so ``[S | z]`` is one (F, Dv + 1) matrix (the *state*) and one
  product gives numerator and normaliser.
- Not causal: associativity, ``φ(Q) (φ(K)ᵀ [V | 1])``: time O(n·F·Dv), no n×n anything.
- Causal: the chunkwise-parallel form (flash-linear-attention's ``chunk`` algorithm) over
  chunks of C positions, all chunks at once: every chunk's ``U_c = φ(K_c)ᵀ [V | 1]_c`` in one
  batched product, the states before each chunk ``P_c = S_0 + Σ_{c' < c} U_c'`` as one
  cumulative sum, then ``φ(Q_c) P_c`` plus the masked C×C product inside each chunk, again one
  batched product each. No Python loop over chunks: the launches per call do not grow with n.
  Time O(n·(C + F)·Dv); the per-chunk states take (n/C)·F·(Dv + 1) elements per head (C
  times fewer than the n prefix states of the plain recurrence).
- Segments: features, ``[V | 1]``, the chunk states and the chunk products exist for one
  segment of positions at a time (whole chunks). The segment comes from memory, per device
  (:func:`segment_budget`): a GPU runs the whole call as one segment unless its workspace
  would exceed half the free memory; a CPU keeps 8 MiB of workspace (the allocator reuses such
  blocks; :data:`CPU_SEGMENT_BYTES`), 2 MiB when causal (the batched chunk products then work
  within a core's L2 cache; :data:`CPU_CAUSAL_SEGMENT_BYTES`). The ``segment_bytes`` parameter
  (:data:`SEGMENT`) sets the cap by hand; a cap below one chunk's workspace is refused
  (:func:`cap_reason`). Each extra segment adds a fixed number of launches.
- Grouped K/V: the G = H / H_kv query heads of one K/V head are folded into the row axis,
  (B·H_kv, n·G, F), row ``t·G + g`` at position t, so one state serves the whole group.
- Half-precision inputs run in float32: the state is a sum over the whole sequence.

:class:`FeatureState` is that state as an object: ``absorb`` (keys only), ``read`` (queries that
see exactly the absorbed keys) and ``advance`` (causal continuation) give every mask case, and the
recurrent decode step (``cache = "state"``) is ``advance`` with one token: one state update,
O(1) in the context.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from harness.spec import HALF_DTYPES, Param, Problem

CPU_SEGMENT_BYTES = 8 * 2**20
"""A CPU's segment, not causal: 8 MiB of workspace. Buffers this size are reused from the heap
call after call, where glibc maps blocks over its (at most 32 MiB) mmap threshold afresh on
every call and pays their page faults again: one segment for the whole call was ~30% slower at
n = 16k when this was chosen (B1 H8 D64 float32), 1.8-2x slower measured again with this code
(docs/linear_attention.md; 2 to 8 MiB within noise of each other)."""
CPU_CAUSAL_SEGMENT_BYTES = 2 * 2**20
"""A CPU's segment, causal: 2 MiB. Each batched product of the chunkwise form reads the whole
segment's features and chunk states; within a core's L2 (2 MiB on the Xeon measured) a call
at n = 16k (B1 H8 D64, one thread) took 130-140 ms (linear) and 350-460 ms (performer, one
chunk per segment), against 200-250 ms and 440-720 ms at 8 MiB (docs/linear_attention.md)."""
GPU_FREE_SHARE = 0.5
"""A GPU's segment: the whole call, unless its workspace would exceed this share of the free
device memory (the rest stays for the caller's tensors and the allocator's rounding)."""
CPU_SHORT_SCAN = 4
"""On a CPU the cumulative sum over at most this many chunks is that many in-place adds:
torch's CPU cumsum runs a scalar loop (float64 accumulation), ~8x slower than an add over
the same states (0.39 against 0.04 ms over 3 chunks of 8 heads' 256×65 states). Only a CPU's
cache-sized segments are this short; the number of ops stays bounded."""
REDUCE_ROWS = 1024
"""Keys per partial state of the non-causal reduction φ(K)ᵀ[V | 1] on a GPU. One batched
product over all n keys has B·H_kv small (F, Dv + 1) outputs and a reduction over n: a GEMM
library may run it on a few SMs, each walking all n keys (the suspect, not measured apart, in
the H100's 4.6 ms for ``linear`` at n = 64k, B1 H16 D64, where its bytes take ~2 ms). In blocks
it is B·H_kv·n/1024 products, summed after; their partial states take F·(Dv + 1) elements per
1024 keys."""
BLOCKED_REDUCTION_DEVICES = {"cuda"}
"""Where :data:`REDUCE_ROWS` applies: a CPU's GEMM parallelises the one long reduction."""
SEGMENT = Param(
    0,
    "workspace bytes per segment of positions (whole chunks); 0: the device's policy "
    "(on a CPU 8 MiB, 2 MiB causal; on a GPU one segment unless it exceeds half the free "
    "memory)",
    minimum=0,
)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the feature maps and the state run in: float32 for half inputs."""
    return torch.float32 if dtype in HALF_DTYPES else dtype


def check_inputs(q: Tensor, k: Tensor, v: Tensor) -> None:
    """Refuse q, k, v on different devices or in different dtypes, before any launch."""
    if len({q.device, k.device, v.device}) > 1 or len({q.dtype, k.dtype, v.dtype}) > 1:
        got = ", ".join(
            f"{name} {t.device} {str(t.dtype).removeprefix('torch.')}"
            for name, t in (("q", q), ("k", k), ("v", v))
        )
        raise ValueError(f"q, k and v must share one device and one dtype; got {got}")


def chunk_bytes(
    batch: int,
    heads: int,
    kv_heads: int,
    features: int,
    map_temps: int,
    value_dim: int,
    size: int,
    chunk: int,
    causal: bool,
) -> int:
    """The workspace of one chunk of C positions, the unit a segment is made of.

    Not causal: its query and key feature rows (F + ``map_temps`` elements each) and its
    ``[V | 1]`` rows, summed (the 8 MiB CPU segment was measured with this count). Causal: the
    largest phase of a chunk in :meth:`FeatureState.advance` — φ(K) and ``[V | 1]`` with the
    chunk's (F, Dv + 1) state per K/V head, beside its query rows (the feature map, the
    regrouped copy under grouped K/V, or φ(Q) with its products), or later φ(Q), products and
    C×C scores without the state.
    """
    e, row = value_dim + 1, features + map_temps
    if not causal:
        return batch * chunk * (heads * row + kv_heads * (row + e)) * size
    kv = kv_heads * chunk * (features + e)
    grouped = 2 * features if heads != kv_heads else 0
    queries = heads * chunk * max(row, features + e, grouped)
    peak = max(
        kv_heads * chunk * row,  # the key map
        kv + kv_heads * features * e + queries,
        kv + heads * chunk * (features + e + chunk),
    )
    return batch * peak * size


def segment_budget(device: torch.device | str, causal: bool) -> int | None:
    """The device's workspace per segment in bytes; None: no limit (one segment)."""
    dev = torch.device(device)
    if dev.type == "cpu":
        return CPU_CAUSAL_SEGMENT_BYTES if causal else CPU_SEGMENT_BYTES
    if dev.type == "cuda" and torch.cuda.is_available():
        if torch.cuda.is_current_stream_capturing():  # no device queries inside a capture
            return int(torch.cuda.get_device_properties(dev).total_memory * GPU_FREE_SHARE)
        return int(torch.cuda.mem_get_info(dev)[0] * GPU_FREE_SHARE)
    return None


def segment_positions(
    need: int, cap: int, device: torch.device | str, chunk: int, causal: bool
) -> int | None:
    """Positions per segment for a chunk workspace of ``need`` bytes: whole chunks within the
    cap (``cap`` > 0: the user's, at least one chunk; 0: :func:`segment_budget`, at least one
    chunk); None: no limit."""
    budget = cap or segment_budget(device, causal)
    if budget is None:
        return None
    return max(1, budget // need) * chunk


def cap_reason(cap: int, need: int, chunk: int) -> str | None:
    """Why a ``segment_bytes`` cap cannot run (None: it can): below one chunk's workspace."""
    if 0 < cap < need:
        return (
            f"segment_bytes = {cap:,} B is below one chunk's workspace, {need:,} B "
            f"(C = {chunk} positions)"
        )
    return None


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
    if v.dtype == dtype:
        return F.pad(v.reshape(b * h, n, dv), (0, 1), value=1.0)  # one op
    out = torch.empty(b * h, n, dv + 1, dtype=dtype, device=v.device)
    out[..., :dv] = v.reshape(b * h, n, dv)  # cast while copying
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


def chunk_scan(fk: Tensor, v1: Tensor, state: Tensor, chunk: int) -> Tensor:
    """The state before each of N whole chunks, with ``state`` advanced past all of them in
    place. fk (BH, N·C, F), v1 (BH, N·C, E), state (BH, F, E) -> P (BH, N, F, E),
    ``P_c = state + Σ_{c' < c} fk_c'ᵀ v1_c'``.

    One batched product writes every chunk's ``U`` one slot after its own into a buffer of
    BH·N + 1 slots, so head h's slots h·N .. h·N + N - 1 hold U of its chunks 0 .. N - 2 after
    slot h·N, which held the previous head's last U (set aside for the final state) and takes
    ``state``; one in-place cumulative sum per head then gives P without a second buffer (on a
    CPU, over at most :data:`CPU_SHORT_SCAN` chunks, as many adds).
    """
    bh, t, f = fk.shape
    e, n = v1.shape[-1], t // chunk
    slots = fk.new_empty(bh * n + 1, f, e)
    torch.bmm(fk.view(bh * n, chunk, f).transpose(1, 2), v1.view(bh * n, chunk, e), out=slots[1:])
    last = slots[n::n].clone()  # each head's last chunk's U: (BH, F, E)
    slots[: bh * n : n] = state
    scanned = slots[: bh * n].view(bh, n, f, e)
    if fk.device.type == "cpu" and n <= CPU_SHORT_SCAN:
        for c in range(1, n):  # a bounded few adds: see CPU_SHORT_SCAN
            scanned[:, c].add_(scanned[:, c - 1])
    else:
        scanned.cumsum_(1)
    torch.add(scanned[:, -1], last, out=state)
    return scanned


def chunk_step(
    fq: Tensor, fk: Tensor, v1: Tensor, state: Tensor, keep: Tensor, out: Tensor
) -> None:
    """One chunk of c <= C positions in place, the recurrent step: fq (BH, c·G, F), fk (BH, c,
    F), v1 (BH, c, E), keep (C·G, C) -> outputs written into out (BH, c·G, Dv); the c keys join
    ``state`` (BH, F, E). A decode step is this with c = 1."""
    c = fk.shape[1]
    scores = torch.bmm(fq, fk.transpose(1, 2)).mul_(keep[: fq.shape[1], :c])
    num = torch.bmm(scores, v1).baddbmm_(fq, state)  # inside the chunk + every earlier one
    torch.div(num[..., :-1], num[..., -1:], out=out)
    state.baddbmm_(fk.transpose(1, 2), v1)


def causal_autograd(
    fq: Tensor, fk: Tensor, v1: Tensor, state: Tensor, chunk: int, keep: Tensor
) -> tuple[Tensor, Tensor]:
    """The causal path out of place, for autograd: (outputs (BH, t·G, Dv), new state). The
    same chunkwise-parallel form; autograd keeps the per-chunk states for the backward pass."""
    bh, t, f = fk.shape
    e, n = v1.shape[-1], t // chunk
    parts = []
    if n:
        whole = n * chunk
        kc, vc = fk[:, :whole], v1[:, :whole]
        updates = torch.bmm(kc.reshape(bh * n, chunk, f).transpose(1, 2), vc.reshape(-1, chunk, e))
        updates = updates.view(bh, n, f, e)
        scanned = torch.cat([state[:, None], updates[:, :-1]], dim=1).cumsum(1)
        rows = fq[:, : whole * (fq.shape[1] // t)].reshape(bh * n, -1, f)
        scores = torch.bmm(rows, kc.reshape(bh * n, chunk, f).transpose(1, 2)) * keep
        num = torch.baddbmm(
            torch.bmm(rows, scanned.view(bh * n, f, e)), scores, vc.reshape(-1, chunk, e)
        )
        parts.append(normalise(num).reshape(bh, -1, e - 1))
        state = scanned[:, -1] + updates[:, -1]
    if t > n * chunk:
        s, g = n * chunk, fq.shape[1] // t
        qr, kr, vr = fq[:, s * g :], fk[:, s:], v1[:, s:]
        scores = torch.bmm(qr, kr.transpose(1, 2)) * keep[: qr.shape[1], : t - s]
        parts.append(normalise(torch.baddbmm(torch.bmm(scores, vr), qr, state)))
        state = torch.baddbmm(state, kr.transpose(1, 2), vr)
    return torch.cat(parts, dim=1), state


def block_states(fk: Tensor, v1: Tensor, rows: int) -> Tensor:
    """The keys' state in blocks of ``rows`` keys: fk (BH, N·rows, F), v1 (BH, N·rows, E) ->
    (BH, N, F, E), one batched product with BH·N outputs where one product over all N·rows
    keys would have BH (:data:`REDUCE_ROWS`)."""
    bh, t, f = fk.shape
    e, n = v1.shape[-1], t // rows
    blocks = torch.bmm(fk.view(bh * n, rows, f).transpose(1, 2), v1.view(bh * n, rows, e))
    return blocks.view(bh, n, f, e)


def split_blocks(start: int, end: int, rows: int) -> Iterator[tuple[int, int]]:
    """Positions start..end as whole blocks of ``rows``, then the rest (either may be absent)."""
    whole = start + (end - start) // rows * rows
    if whole > start:
        yield start, whole
    if end > whole:
        yield whole, end


def split_tail(start: int, end: int, chunk: int) -> Iterator[tuple[int, int]]:
    """A causal segment as pieces: its whole chunks, then a partial last chunk apart when there
    are two or more whole chunks (their features must be whole chunks to batch them)."""
    whole = (end - start) // chunk * chunk
    if whole < 2 * chunk or start + whole == end:
        yield start, end
    else:
        yield start, start + whole
        yield start + whole, end


def piece_lengths(length: int, segment: int | None, chunk: int) -> set[int]:
    """The lengths of the causal pieces of ``length`` positions in segments of ``segment``
    (None: one segment), each segment split by :func:`split_tail`: closed form in n."""
    if length <= 0:
        return set()
    seg = min(segment or length, length)
    ends = {seg} | ({length % seg} if length % seg else set())
    return {b - a for end in ends for a, b in split_tail(0, end, chunk)}


def state_dims(p: Problem, features: int) -> tuple:
    """``p``'s (batch, heads, kv_heads, features, value_dim, dtype, device): the first
    arguments of :class:`FeatureState` for a map of ``features`` features, values as wide as
    the head dim."""
    return p.batch, p.heads, p.n_kv_heads, features, p.head_dim, p.dtype, p.device


class FeatureState:
    """``[S | z]`` after the tokens absorbed so far: (B·H_kv, F, Dv + 1) in the compute dtype.

    Subclasses define the feature map: :meth:`query_features` and :meth:`key_features`
    ((B, H, t, D) -> (B, H, t, F) in the compute dtype; key features may rescale the state,
    as FAVOR+'s stabiliser does) and ``map_temps``, the map's own temporaries per row in
    elements. ``chunk`` is the causal chunk size C; ``segment_bytes`` the workspace cap per
    segment (0: the device's policy, :func:`segment_budget`).
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
        segment_bytes: int = 0,
    ):
        self.batch, self.heads, self.kv_heads, self.chunk = batch, heads, kv_heads, chunk
        self.features, self.value_dim = features, value_dim
        self.segment_bytes, self.device = int(segment_bytes), torch.device(device)
        self.dtype = compute_dtype(dtype)
        shape = (batch * kv_heads, features, value_dim + 1)
        self.matrix = torch.zeros(shape, dtype=self.dtype, device=device)

    def query_features(self, q: Tensor) -> Tensor:
        raise NotImplementedError

    def key_features(self, k: Tensor) -> Tensor:
        raise NotImplementedError

    def tensors(self) -> list[Tensor]:
        return [self.matrix]

    def chunk_bytes(self, causal: bool) -> int:
        """One chunk's workspace (:func:`chunk_bytes`) in this state's shapes."""
        return chunk_bytes(
            self.batch,
            self.heads,
            self.kv_heads,
            self.features,
            self.map_temps,
            self.value_dim,
            self.dtype.itemsize,
            self.chunk,
            causal,
        )

    def segments(self, length: int, causal: bool) -> Iterator[tuple[int, int]]:
        """(start, end) of each segment of ``length`` positions; refuses a cap below one
        chunk's workspace (:func:`cap_reason`)."""
        need = self.chunk_bytes(causal)
        reason = cap_reason(self.segment_bytes, need, self.chunk)
        if reason:
            raise ValueError(reason)
        seg = segment_positions(need, self.segment_bytes, self.device, self.chunk, causal)
        seg = seg or length
        for s in range(0, length, seg):
            yield s, min(s + seg, length)

    def absorb(self, k: Tensor, v: Tensor) -> None:
        """Add keys k/v (B, H_kv, t, D) that every later query sees: O(t·F·Dv)."""
        blocked = self.device.type in BLOCKED_REDUCTION_DEVICES
        for s, e in self.segments(k.shape[-2], causal=False):
            for a, b in split_blocks(s, e, REDUCE_ROWS) if blocked else [(s, e)]:
                fk = self.key_features(k[:, :, a:b]).flatten(0, 1)  # (BH_kv, rows, F)
                v1 = with_ones(v[:, :, a:b], self.dtype)
                if _needs_grad(fk, v1, self.matrix):
                    self.matrix = torch.baddbmm(self.matrix, fk.transpose(1, 2), v1)
                elif blocked and (b - a) % REDUCE_ROWS == 0:
                    self.matrix.add_(block_states(fk, v1, REDUCE_ROWS).sum(1))
                else:
                    self.matrix.baddbmm_(fk.transpose(1, 2), v1)
                del fk, v1  # one piece's buffers at a time: the workspace model counts on it

    def read(self, q: Tensor) -> Tensor:
        """Outputs of queries q (B, H, n, D) that see exactly the absorbed keys: (B, H, n, Dv)."""
        group = self.heads // self.kv_heads
        grad = _needs_grad(q, self.matrix)
        out = None if grad else self._folded_output(q)
        parts = []
        for s, e in self.segments(q.shape[-2], causal=False):
            fq = fold_heads(self.query_features(q[:, :, s:e]), self.kv_heads)
            num = torch.bmm(fq, self.matrix)
            del fq
            if grad:
                parts.append(normalise(num))
            else:
                torch.div(num[..., :-1], num[..., -1:], out=out[:, s * group : e * group])
            del num
        return self._outputs(torch.cat(parts, dim=1) if grad else out, q.dtype)

    def advance(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """The next t tokens, causal among themselves: q (B, H, t, D), k/v (B, H_kv, t, D)
        -> (B, H, t, Dv); their keys join the state."""
        check_inputs(q, k, v)
        group = self.heads // self.kv_heads
        grad = _needs_grad(q, k, v, self.matrix)
        out = None if grad else self._folded_output(q)
        keep = chunk_keep(min(self.chunk, k.shape[-2]), group, q.device, self.dtype)
        parts = []
        for s, e in self.segments(k.shape[-2], causal=True):
            for a, b in split_tail(s, e, self.chunk):
                qs, ks, vs = q[:, :, a:b], k[:, :, a:b], v[:, :, a:b]
                if grad:
                    fk = self.key_features(ks).flatten(0, 1)
                    v1 = with_ones(vs, self.dtype)
                    fq = fold_heads(self.query_features(qs), self.kv_heads)
                    part, self.matrix = causal_autograd(fq, fk, v1, self.matrix, self.chunk, keep)
                    parts.append(part)
                else:
                    self._advance_piece(qs, ks, vs, keep, out[:, a * group : b * group])
        return self._outputs(torch.cat(parts, dim=1) if grad else out, q.dtype)

    def _advance_piece(self, q: Tensor, k: Tensor, v: Tensor, keep: Tensor, out: Tensor) -> None:
        """A piece of :func:`split_tail` without autograd, into ``out`` (BH_kv, t·G, Dv): two
        or more whole chunks at once (:func:`chunk_scan`, then ``φ(Q_c) P_c`` plus the masked
        product inside each chunk, one batched product each), or one or
        two :func:`chunk_step` (a piece shorter than 2·C). Buffers are dropped as soon as they
        are used: the workspace model follows this order."""
        t, c, g = k.shape[-2], self.chunk, self.heads // self.kv_heads
        fk = self.key_features(k).flatten(0, 1)  # (BH_kv, t, F)
        v1 = with_ones(v, self.dtype)  # (BH_kv, t, Dv + 1)
        if t < 2 * c:
            fq = fold_heads(self.query_features(q), self.kv_heads)  # (BH_kv, t·G, F)
            for s in range(0, t, c):
                e = min(s + c, t)
                chunk_step(
                    fq[:, s * g : e * g],
                    fk[:, s:e],
                    v1[:, s:e],
                    self.matrix,
                    keep,
                    out[:, s * g : e * g],
                )
            return
        scanned = chunk_scan(fk, v1, self.matrix, c)  # (BH_kv, N, F, E), N = t / C
        bh, n, f, e = scanned.shape
        fq = fold_heads(self.query_features(q), self.kv_heads).view(bh * n, c * g, f)
        num = torch.bmm(fq, scanned.view(bh * n, f, e))  # φ(Q_c) P_c: every earlier chunk
        del scanned
        scores = torch.bmm(fq, fk.view(bh * n, c, f).transpose(1, 2)).mul_(keep)
        del fq, fk
        num.baddbmm_(scores, v1.view(bh * n, c, e))  # + the masked product inside the chunk
        del scores, v1
        num = num.view(bh, n, c * g, e)
        torch.div(num[..., :-1], num[..., -1:], out=out.unflatten(1, (n, c * g)))

    def _folded_output(self, q: Tensor) -> Tensor:
        """The outputs' buffer in the folded layout: (B·H_kv, n·G, Dv), compute dtype."""
        rows = q.shape[-2] * (self.heads // self.kv_heads)
        shape = (self.batch * self.kv_heads, rows, self.value_dim)
        return torch.empty(shape, dtype=self.dtype, device=q.device)

    def _outputs(self, out: Tensor, dtype: torch.dtype) -> Tensor:
        """(B·H_kv, n·G, Dv) in the compute dtype -> (B, H, n, Dv) in ``dtype``."""
        return unfold_heads(out, self.batch, self.heads).to(dtype)


def feature_state_attention(state: FeatureState, q: Tensor, k: Tensor, v: Tensor,
                            causal: bool) -> Tensor:
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
