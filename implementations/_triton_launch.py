"""Launches of the fused Triton kernels: index tables per (spec, n_q, n_k, device), autotuner
keys, and one forward (one launch) and one backward (delta, dK/dV, dQ: three launches).

Triton and the kernel modules are imported inside the functions, so importing this module
needs no Triton. A call does no host synchronization (no ``.item()``, no loop over tiles).
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor

from harness.masks import MaskSpec
from implementations._triton_plan import band_plan, block_plan, block_tile

LOG2E = 1.4426950408889634
CHOSEN: dict[tuple, dict] = {}  # autotuner key -> the config it picked (for executed pairs)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def mode_key(mask: MaskSpec) -> int:
    """Autotuning bucket of the mask's iteration space."""
    if mask.block_size is not None:
        return 5
    if mask.global_tokens:
        return 4
    if mask.dilation > 1:
        return 3
    if mask.window not in (None, (None, None)):
        return 2
    return int(mask.causal)


@lru_cache(maxsize=64)
def band_tables(mask: MaskSpec, n_q: int, n_k: int, device: str):
    plan = band_plan(mask, n_q, n_k)
    as_t = lambda rows: torch.tensor(rows, dtype=torch.int32, device=device).reshape(-1)
    return plan, as_t(plan.slots), as_t(plan.key_slots)


@lru_cache(maxsize=32)
def block_tables(mask: MaskSpec, n_q: int, n_k: int, device: str):
    assert mask.block_size is not None
    return block_plan(mask, n_q, n_k, block_tile(mask.block_size)).to(device)


def _block_d(head_dim: int) -> int:
    return max(16, triton_next_pow2(head_dim))


def triton_next_pow2(x: int) -> int:
    return 1 << max(x - 1, 0).bit_length()


def _precision(dtype: torch.dtype, device: torch.device) -> str | None:
    """``tl.dot`` precision: IEEE for fp32 inputs (no TF32 rounding), the default for 16-bit
    ones; "upcast" works around the interpreter's wrong bf16 ``tl.dot`` on CPU tensors."""
    if dtype == torch.float32:
        return "ieee"
    return "upcast" if device.type == "cpu" and dtype == torch.bfloat16 else None


def _last_dim_unit(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def tune_key(mask: MaskSpec, n_q: int, n_k: int, head_dim: int, dtype: torch.dtype) -> tuple:
    return (mode_key(mask), triton_next_pow2(max(n_q, n_k)), _block_d(head_dim), dtype)


def attention_forward(
    q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float
) -> tuple[Tensor, Tensor]:
    """q: (B, H, n_q, D), k/v: (B, H, n_k, D), any strides -> out (B, H, n_q, D) and the base-2
    row log-sum-exp (B·H, n_q) float32 (+inf for rows with no kept key). One launch."""
    from implementations import _triton_fwd as kern

    q, k, v = _last_dim_unit(q), _last_dim_unit(k), _last_dim_unit(v)
    b, h, n_q, d = q.shape
    n_k = k.shape[2]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((b * h, n_q), dtype=torch.float32, device=q.device)
    if n_q == 0 or b * h == 0:
        return out, lse
    key = tune_key(mask, n_q, n_k, d, q.dtype)
    common = dict(D=d, BLOCK_D=_block_d(d), PRECISION=_precision(q.dtype, q.device))
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3])
    hg_big = 2 * (n_q + n_k) + 2
    if mask.block_size is None:
        plan, slots, _ = band_tables(mask, n_q, n_k, str(q.device))
        grid = lambda meta: (_cdiv(plan.max_rows, meta["BLOCK_M"]), b * h, len(plan.slots))
        kernel = kern.band_fwd
        kernel[grid](
            q,
            k,
            v,
            out,
            lse,
            slots,
            *strides,
            h,
            n_q,
            n_k,
            n_k - n_q,
            plan.g,
            plan.hg,
            min(plan.g, n_k),
            scale * LOG2E,
            key[1],
            key[0],
            **common,
        )
    else:
        bp = block_tables(mask, n_q, n_k, str(q.device))
        kernel = kern.blocks_fwd
        kernel[(bp.q_pos.numel(), b * h)](
            q,
            k,
            v,
            out,
            lse,
            bp.q_pos,
            bp.starts,
            bp.mids,
            bp.ends,
            bp.cols,
            bp.order,
            *strides,
            h,
            n_q,
            n_k,
            n_k - n_q,
            mask.block_size,
            0 if mask.causal else hg_big,
            scale * LOG2E,
            key[1],
            key[0],
            TILE=block_tile(mask.block_size),
            **common,
        )
    best = getattr(kernel, "best_config", None)
    if best is not None:
        CHOSEN[key] = dict(best.kwargs)
    return out, lse


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
    from implementations import _triton_bwd as kern

    q, k, v, dout = (_last_dim_unit(t) for t in (q, k, v, dout))
    b, h, n_q, d = q.shape
    n_k = k.shape[2]
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    if b * h == 0 or n_q == 0 or n_k == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    key = tune_key(mask, n_q, n_k, d, q.dtype)
    common = dict(D=d, BLOCK_D=_block_d(d), PRECISION=_precision(q.dtype, q.device))
    delta = torch.empty((b * h, n_q), dtype=torch.float32, device=q.device)
    kern.delta_kernel[(_cdiv(n_q, 64), b * h)](
        out,
        dout,
        delta,
        *out.stride()[:3],
        *dout.stride()[:3],
        h,
        n_q,
        D=d,
        BLOCK_D=common["BLOCK_D"],
        BLOCK=64,
    )
    head = (q, k, v, dout)
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *dout.stride()[:3])
    tail = (h, n_q, n_k, n_k - n_q)
    sc = (scale * LOG2E, scale, key[1], key[0])
    if mask.block_size is None:
        plan, slots, kslots = band_tables(mask, n_q, n_k, str(q.device))
        grid = lambda m: (_cdiv(plan.max_keys, m["BLOCK_N"]), b * h, len(plan.key_slots))
        kern.band_dkdv[grid](
            *head,
            dk,
            dv,
            lse,
            delta,
            kslots,
            *strides,
            *dk.stride()[:3],
            *tail,
            plan.g,
            plan.hg,
            plan.big,
            plan.n_global_rows,
            *sc,
            **common,
        )
        grid = lambda m: (_cdiv(plan.max_rows, m["BLOCK_M"]), b * h, len(plan.slots))
        kern.band_dq[grid](
            *head,
            dq,
            lse,
            delta,
            slots,
            *strides,
            *dq.stride()[:3],
            *tail,
            plan.g,
            plan.hg,
            min(plan.g, n_k),
            *sc,
            **common,
        )
    else:
        bp = block_tables(mask, n_q, n_k, str(q.device))
        hg = 0 if mask.causal else 2 * (n_q + n_k) + 2
        tile = dict(TILE=block_tile(mask.block_size), **common)
        t_tables = (bp.t_pos, bp.t_starts, bp.t_mids, bp.t_ends, bp.t_cols, bp.t_order)
        kern.blocks_dkdv[(bp.t_pos.numel(), b * h)](
            *head,
            dk,
            dv,
            lse,
            delta,
            *t_tables,
            *strides,
            *dk.stride()[:3],
            *tail,
            mask.block_size,
            hg,
            *sc,
            **tile,
        )
        tables = (bp.q_pos, bp.starts, bp.mids, bp.ends, bp.cols, bp.order)
        kern.blocks_dq[(bp.q_pos.numel(), b * h)](
            *head,
            dq,
            lse,
            delta,
            *tables,
            *strides,
            *dq.stride()[:3],
            *tail,
            mask.block_size,
            hg,
            *sc,
            **tile,
        )
    return dq, dk, dv
