"""Launches of the fused Triton kernels: one forward (one launch) and one backward (delta,
dK/dV, dQ: three launches), and the block sizes the autotuner chose.

Importing this module imports Triton (the kernel modules define their kernels at import):
:mod:`implementations._kernels.triton_attn` imports it only where Triton imports. A call does no
host synchronization (no ``.item()``, no loop over tiles).
"""

from __future__ import annotations

import torch
from torch import Tensor

from harness.masks import MaskSpec
from implementations._kernels import triton_bwd, triton_fwd
from implementations._kernels.triton_autotune import fwd_configs
from implementations._kernels.triton_plan import block_tile, ceil_div
from implementations._kernels.triton_tables import band_tables, block_d, block_tables, tune_key

LOG2E = 1.4426950408889634
CHOSEN: dict[tuple, dict] = {}  # autotuner key -> the config it picked (for executed pairs)


def forward_blocks(key: tuple) -> dict:
    """``BLOCK_M``/``BLOCK_N`` of the band forward for a :func:`tune_key`: the config the
    autotuner chose for it in this process, else the first config's."""
    return CHOSEN.get(key) or fwd_configs()[0].kwargs


def _precision(dtype: torch.dtype, device: torch.device) -> str | None:
    """``tl.dot`` precision: IEEE for fp32 inputs (no TF32 rounding), the default for 16-bit
    ones; "upcast" works around the interpreter's wrong bf16 ``tl.dot`` on CPU tensors."""
    if dtype == torch.float32:
        return "ieee"
    return "upcast" if device.type == "cpu" and dtype == torch.bfloat16 else None


def _constexprs(q: Tensor) -> dict:
    """The kernels' shared compile-time arguments D, BLOCK_D, PRECISION for q (B, H, n, D)."""
    d = q.shape[-1]
    return dict(D=d, BLOCK_D=block_d(d), PRECISION=_precision(q.dtype, q.device))


def _last_dim_unit(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _strides(*tensors: Tensor) -> tuple[int, ...]:
    """(batch, head, row) strides of each (B, H, N, D) tensor, in order."""
    return tuple(s for t in tensors for s in t.stride()[:3])


def _global_reach(mask: MaskSpec, n_q: int, n_k: int) -> int:
    """``hg`` of a block-sparse mask: 0 under causality, else beyond any j - p."""
    return 0 if mask.causal else 2 * (n_q + n_k) + 2


def attention_forward(
    q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float
) -> tuple[Tensor, Tensor]:
    """q: (B, H, n_q, D), k/v: (B, H, n_k, D), any strides -> out (B, H, n_q, D) and the base-2
    row log-sum-exp (B·H, n_q) float32 (+inf for rows with no kept key). One launch."""
    q, k, v = _last_dim_unit(q), _last_dim_unit(k), _last_dim_unit(v)
    b, h, n_q, d = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((b * h, n_q), dtype=torch.float32, device=q.device)
    if n_q == 0 or b * h == 0:
        return out, lse
    key = tune_key(mask, n_q, k.shape[2], d, q.dtype)
    launch = _band_forward if mask.block_size is None else _blocks_forward
    kernel = launch(q, k, v, out, lse, mask, (scale * LOG2E, key[1], key[0]))
    best = getattr(kernel, "best_config", None)
    if best is not None:
        CHOSEN[key] = dict(best.kwargs)
    return out, lse


def _band_forward(q, k, v, out, lse, mask: MaskSpec, tail: tuple):
    """Launch ``band_fwd`` (grid: row blocks, B·H, slots); returns the kernel launched.
    ``tail``: (scale·log2 e, n_bucket, MODE_KEY)."""
    b, h, n_q, _ = q.shape
    n_k = k.shape[2]
    plan, slots, _ = band_tables(mask, n_q, n_k, str(q.device))
    grid = lambda meta: (ceil_div(plan.max_rows, meta["BLOCK_M"]), b * h, len(plan.slots))
    sizes = (h, n_q, n_k, n_k - n_q, plan.g, plan.hg, min(plan.g, n_k))
    kernel = triton_fwd.band_fwd
    kernel[grid](q, k, v, out, lse, slots, *_strides(q, k, v, out), *sizes, *tail, **_constexprs(q))
    return kernel


def _blocks_forward(q, k, v, out, lse, mask: MaskSpec, tail: tuple):
    """Launch ``blocks_fwd`` (grid: CSR rows, B·H); returns the kernel launched."""
    b, h, n_q, _ = q.shape
    n_k = k.shape[2]
    bp = block_tables(mask, n_q, n_k, str(q.device))
    tables = (bp.q_pos, bp.starts, bp.mids, bp.ends, bp.cols, bp.order)
    sizes = (h, n_q, n_k, n_k - n_q, mask.block_size, _global_reach(mask, n_q, n_k))
    consts = dict(TILE=block_tile(mask.block_size), **_constexprs(q))
    kernel = triton_fwd.blocks_fwd
    kernel[(bp.q_pos.numel(), b * h)](
        q, k, v, out, lse, *tables, *_strides(q, k, v, out), *sizes, *tail, **consts
    )
    return kernel


def attention_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    dout: Tensor,
    mask: MaskSpec,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """FlashAttention-2 backward over the forward's iteration space: three launches (delta,
    dK/dV, dQ). Shapes as :func:`attention_forward`; returns (dq, dk, dv) in the inputs' dtype."""
    q, k, v, dout = (_last_dim_unit(t) for t in (q, k, v, dout))
    b, h, n_q, d = q.shape
    n_k = k.shape[2]
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    if b * h == 0 or n_q == 0 or n_k == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    delta = _delta(out, dout)
    key = tune_key(mask, n_q, n_k, d, q.dtype)
    tail = (scale * LOG2E, scale, key[1], key[0])
    launch = _band_backward if mask.block_size is None else _blocks_backward
    launch((q, k, v, dout), (dq, dk, dv), lse, delta, mask, tail)
    return dq, dk, dv


def _delta(out: Tensor, dout: Tensor) -> Tensor:
    """rowsum(dO ∘ O): (B·H, n_q) float32, one launch of ``delta_kernel``."""
    b, h, n_q, d = out.shape
    delta = torch.empty((b * h, n_q), dtype=torch.float32, device=out.device)
    triton_bwd.delta_kernel[(ceil_div(n_q, 64), b * h)](
        out, dout, delta, *_strides(out, dout), h, n_q, D=d, BLOCK_D=block_d(d), BLOCK=64
    )
    return delta


def _band_backward(head: tuple, grads: tuple, lse, delta, mask: MaskSpec, tail: tuple) -> None:
    """Launch ``band_dkdv`` then ``band_dq``. head: (q, k, v, dout); grads: (dq, dk, dv),
    written in place; tail: (scale·log2 e, scale, n_bucket, MODE_KEY)."""
    q, k = head[0], head[1]
    dq, dk, dv = grads
    b, h, n_q, _ = q.shape
    n_k = k.shape[2]
    plan, slots, kslots = band_tables(mask, n_q, n_k, str(q.device))
    sizes, common = (h, n_q, n_k, n_k - n_q), _constexprs(q)
    band_k = (plan.g, plan.hg, plan.big, plan.n_global_rows)
    grid = lambda m: (ceil_div(plan.max_keys, m["BLOCK_N"]), b * h, len(plan.key_slots))
    triton_bwd.band_dkdv[grid](
        *head, dk, dv, lse, delta, kslots, *_strides(*head, dk), *sizes, *band_k, *tail, **common
    )
    band_q = (plan.g, plan.hg, min(plan.g, n_k))
    grid = lambda m: (ceil_div(plan.max_rows, m["BLOCK_M"]), b * h, len(plan.slots))
    triton_bwd.band_dq[grid](
        *head, dq, lse, delta, slots, *_strides(*head, dq), *sizes, *band_q, *tail, **common
    )


def _blocks_backward(head: tuple, grads: tuple, lse, delta, mask: MaskSpec, tail: tuple) -> None:
    """Launch ``blocks_dkdv`` (transposed CSR lists) then ``blocks_dq``; arguments as
    :func:`_band_backward`."""
    q, k = head[0], head[1]
    dq, dk, dv = grads
    b, h, n_q, _ = q.shape
    n_k = k.shape[2]
    bp = block_tables(mask, n_q, n_k, str(q.device))
    sizes = (h, n_q, n_k, n_k - n_q, mask.block_size, _global_reach(mask, n_q, n_k))
    tile = dict(TILE=block_tile(mask.block_size), **_constexprs(q))
    t_tables = (bp.t_pos, bp.t_starts, bp.t_mids, bp.t_ends, bp.t_cols, bp.t_order)
    triton_bwd.blocks_dkdv[(bp.t_pos.numel(), b * h)](
        *head, dk, dv, lse, delta, *t_tables, *_strides(*head, dk), *sizes, *tail, **tile
    )
    tables = (bp.q_pos, bp.starts, bp.mids, bp.ends, bp.cols, bp.order)
    triton_bwd.blocks_dq[(bp.q_pos.numel(), b * h)](
        *head, dq, lse, delta, *tables, *_strides(*head, dq), *sizes, *tail, **tile
    )
