"""The way in to the CPU tile path: exact masked attention over a tile plan
(:class:`~.tile_plan.Plan`), forward and backward. The implementations build the plan with
:func:`device_plan` (a run) or :func:`plan_shape` (predictions), both re-exported here from
:mod:`.tile_plan`, and call :func:`tile_attention` and :func:`plan_workspace_bytes`.

Each tile is one batched GEMM pair over all (batch, head) slices: scores
``(BH, rows, cols) = Q_rows K_colsᵀ·scale + bias``, a softmax, then ``P V_cols``. A tile holds
every key its rows keep, so one softmax per tile is exact (no online rescaling needed) and only
``rows × cols`` scores exist at a time: memory O(tile), time O(executed pairs).

Backward recomputes each tile's probabilities from the saved per-row log-sum-exp (as
FlashAttention does) and scatters dK, dV into the tile's key ranges, so it too touches only the
executed pairs and keeps O(n) extra state.

On CPU the tiles are split over worker threads (:mod:`.tile_pool`).
Allocations made there are invisible to torch.profiler's CPU memory events (its state is per
thread): a measured peak misses about one tile's scores per worker, a constant (~1.3 MiB for
B=1, H=8, w=256) that does not change the memory exponent; ``plan_workspace_bytes`` includes it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from harness.spec import Problem, itemsize
from implementations._kernels.saved_lse import LseOps, attention_with_lse
from implementations._kernels.tiles.tile_plan import Plan, PlanShape, Tile
from implementations._kernels.tiles.tile_plan import device_plan as device_plan  # the way in
from implementations._kernels.tiles.tile_plan import plan_shape as plan_shape  # the way in
from implementations._kernels.tiles.tile_pool import map_tiles


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Softmax/gradient precision: float32, or float64 for float64 inputs."""
    return torch.promote_types(dtype, torch.float32)


def _gather(x3: Tensor, keys: tuple[tuple[int, int], ...]) -> Tensor:
    """(BH, n_k, D) -> (BH, n_cols, D): a view for one range, a copy for several."""
    if len(keys) == 1:
        a, b = keys[0]
        return x3[:, a:b]
    return torch.cat([x3[:, a:b] for a, b in keys], dim=1)


def _scores(q_t: Tensor, k_t: Tensor, tile: Tile, scale: float, buf: Tensor | None) -> Tensor:
    """(BH, rows, D) x (BH, cols, D) -> (BH, rows, cols) = QKᵀ·scale + bias, one GEMM (the bias
    fused into it when it spans every column, else added to its columns after).

    ``buf`` is reused between equal-shaped tiles: writing into a warm buffer measured ~10%
    faster than allocating a fresh ~1 MiB one per tile.
    """
    kt = k_t.transpose(1, 2)
    shape = (q_t.shape[0], q_t.shape[1], k_t.shape[1])
    out = buf if buf is not None and buf.shape == shape else None
    # .to: a no-op except in a low-precision backward (float32 there)
    bias = None if tile.bias is None else tile.bias.to(q_t.dtype)
    if bias is not None and bias.shape[-1] == shape[-1]:
        if out is None:
            return torch.baddbmm(bias, q_t, kt, alpha=scale)
        return torch.baddbmm(bias, q_t, kt, alpha=scale, out=out)
    if out is None:
        s = torch.bmm(q_t, kt).mul_(scale)
    else:
        s = torch.baddbmm(out, q_t, kt, beta=0.0, alpha=scale, out=out)
    if bias is not None:
        s[:, :, tile.bias_at : tile.bias_at + bias.shape[-1]] += bias
    return s


def tile_forward(
    q3: Tensor, k3: Tensor, v3: Tensor, plan: Plan, scale: float, want_lse: bool
) -> tuple[Tensor, Tensor | None]:
    """q3: (BH, n_q, D), k3/v3: (BH, n_k, D) in plan order -> out (BH, n_q, D) and, if asked,
    the row log-sum-exp (BH, n_q) float32 (+inf on rows in no tile)."""
    acc = _acc_dtype(q3.dtype)
    # rows in no tile keep no key: zeros; skip the fill when tiles cover every row
    out = torch.empty_like(q3) if plan.covers_all_rows else torch.zeros_like(q3)
    lse = torch.full(q3.shape[:2], math.inf, dtype=acc, device=q3.device) if want_lse else None

    def work(tiles: Sequence[Tile]) -> None:  # tiles own disjoint rows: no write conflicts
        buf = None
        for tile in tiles:
            q_t = q3[:, tile.r0 : tile.r1]
            s = buf = _scores(q_t, _gather(k3, tile.keys), tile, scale, buf)
            if lse is not None:
                lse[:, tile.r0 : tile.r1] = torch.logsumexp(s.to(acc), dim=-1)
            p = torch.softmax(s, dim=-1, dtype=acc).to(v3.dtype)
            out[:, tile.r0 : tile.r1] = torch.bmm(p, _gather(v3, tile.keys))

    map_tiles(plan.tiles, work, q3.device)
    return out, lse


def _scatter_add(dst: Tensor, keys: tuple[tuple[int, int], ...], src: Tensor) -> None:
    """Add src (BH, n_cols, D) into dst (BH, n_k, D) at the tile's key ranges."""
    c = 0
    for a, b in keys:
        dst[:, a:b] += src[:, c : c + b - a]
        c += b - a


def tile_backward(
    q3: Tensor,
    k3: Tensor,
    v3: Tensor,
    out3: Tensor,
    lse: Tensor,
    dout3: Tensor,
    plan: Plan,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients (dq, dk, dv) in float32 (float64 for float64), shapes as q3, k3, v3."""
    acc = _acc_dtype(q3.dtype)
    qf, kf, vf, dof = q3.to(acc), k3.to(acc), v3.to(acc), dout3.to(acc)
    dq = torch.zeros_like(qf)
    delta = (dof * out3.to(acc)).sum(-1)  # (BH, n_q): rowsum(dO ∘ O)

    def work(tiles: Sequence[Tile]) -> tuple[Tensor, Tensor]:
        # Key ranges of neighbouring tiles overlap: each chunk sums dK, dV into its own buffers.
        dk, dv = torch.zeros_like(kf), torch.zeros_like(vf)
        for tile in tiles:
            rows = slice(tile.r0, tile.r1)
            q_t, do_t = qf[:, rows], dof[:, rows]
            k_t, v_t = _gather(kf, tile.keys), _gather(vf, tile.keys)
            s = _scores(q_t, k_t, tile, scale, None)
            p = s.sub_(lse[:, rows, None]).exp_()  # (BH, rows, cols); masked pairs -> exactly 0
            _scatter_add(dv, tile.keys, torch.bmm(p.transpose(1, 2), do_t))
            ds = torch.bmm(do_t, v_t.transpose(1, 2)).sub_(delta[:, rows, None]).mul_(p)
            dq[:, rows] = torch.bmm(ds, k_t).mul_(scale)
            _scatter_add(dk, tile.keys, torch.bmm(ds.transpose(1, 2), q_t).mul_(scale))
        return dk, dv

    parts = map_tiles(plan.tiles, work, q3.device)
    if not parts:
        return dq, torch.zeros_like(kf), torch.zeros_like(vf)
    dk, dv = parts[0]
    for dk_part, dv_part in parts[1:]:
        dk += dk_part
        dv += dv_part
    return dq, dk, dv


TILE_OPS = LseOps(tile_forward, tile_backward)  # the tiles' calls for the shared autograd


def tile_attention(
    q: Tensor, k: Tensor, v: Tensor, plan: Plan, scale: float | None = None
) -> Tensor:
    """q: (B, H, n_q, D), k/v: (B, H, n_k, D) -> (B, H, n_q, D), exact masked attention.

    Folds equal documents into the batch (``plan.fold``: a view), regroups rows/keys into plan
    order (dilation classes: one gathering copy each), flattens (B, H) into one batch
    dimension for the GEMMs, and undoes all of it on the way out; autograd flows through.
    """
    b, h, n_q, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if plan.fold > 1:  # (B, H, m·l, D) -> (B, H·m, l, D): each document one batch slice
        q, k, v = (x.reshape(b, h * plan.fold, plan.n_q, x.shape[-1]) for x in (q, k, v))
    if plan.q_order is not None:
        q = q.index_select(2, plan.q_order)
        k, v = k.index_select(2, plan.k_order), v.index_select(2, plan.k_order)
    q3 = q.reshape(-1, plan.n_q, d).contiguous()  # (BH, n_q, D)
    k3 = k.reshape(-1, plan.n_k, d).contiguous()  # (BH, n_k, D)
    v3 = v.reshape(-1, plan.n_k, v.shape[-1]).contiguous()
    out = attention_with_lse(q3, k3, v3, plan, scale, TILE_OPS).view(*q.shape[:3], v.shape[-1])
    if plan.q_order is not None:  # back to row order: a differentiable scatter
        out = torch.empty_like(out).index_copy(2, plan.q_order, out)
    return out.reshape(b, h, n_q, v.shape[-1])


def plan_workspace_bytes(shape: PlanShape, problem: Problem) -> int:
    """Predicted peak extra bytes: per worker thread the largest tile's scores and
    probabilities (more copies in backward) and a tile's concatenated K/V, over every
    (batch, head) slice (and folded document); the regrouped copies of q/k/v/out (dilation);
    O(n) row state; float32 gradients, dK/dV per worker."""
    bh, dim = problem.batch * problem.heads, problem.head_dim
    elem = itemsize(problem.dtype)
    workers = torch.get_num_threads() if problem.device_type == "cpu" else 1
    slices = bh * shape.fold
    per_tile = shape.max_area * 4 * (5 if problem.backward else 3) + 2 * shape.max_cols * dim * elem
    tile = workers * slices * per_tile
    rows = bh * shape.n_q * 4
    permuted = bh * 2 * (shape.n_q + shape.n_k) * dim * elem if shape.permuted else 0
    grads = 0
    if problem.backward:
        grads = bh * (4 * shape.n_q + (2 + 2 * workers) * shape.n_k) * dim * 4
    return tile + rows + permuted + grads
