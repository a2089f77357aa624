"""Launches of the fused Triton kernels: one forward (one launch; split-KV decode: two) and one
backward (delta, dK/dV, dQ: three launches), and the block sizes the autotuner chose. Each
launch goes through :func:`.kernel_launch.launch` (autotuned, pinned or forced config; watchers).

Importing this module imports Triton (the kernel modules define their kernels at import):
:mod:`.masked_attention` (the way in) imports it only where Triton imports. A call does no host
synchronization (no ``.item()``, no loop over tiles), and launches with the tensors' CUDA device
current (Triton launches on the current device). K/V may have fewer heads than Q
(grouped-query attention): query head h reads K/V head ``h // (H / H_kv)``.
"""

from __future__ import annotations

import contextlib

import torch
import triton
from torch import Tensor

from harness.masks import MaskSpec
from implementations._kernels.triton import backward, backward_blocks, decode_split_kv, forward
from implementations._kernels.triton.autotune import configs_for, current_capability, tma_key
from implementations._kernels.triton.band_plan import ceil_div
from implementations._kernels.triton.blocklist_plan import block_tile
from implementations._kernels.triton.kernel_launch import Launch, launch
from implementations._kernels.triton.plan_tables import (
    band_tables,
    block_d,
    block_tables,
    decode_tiles,
    is_decode,
    split_count,
    tune_key,
)

LOG2E = 1.4426950408889634
CHOSEN: dict[tuple, dict] = {}  # tuning key -> the config autotuned or pinned (executed pairs)
AUTOTUNED = (  # every autotuned kernel: (module, name)
    (forward, "band_fwd"), (forward, "blocks_fwd"), (decode_split_kv, "band_fwd_split"),
    (backward, "band_dq"), (backward, "band_dkdv"), (backward_blocks, "blocks_dq"),
    (backward_blocks, "blocks_dkdv"),
)


def forward_blocks(key: tuple, flags: dict[str, bool]) -> dict:
    """``BLOCK_M``/``BLOCK_N`` of the band forward (``BLOCK_N`` of the decode kernel) for a
    :func:`tune_key` and the plan's mask clauses (``BandPlan.flags``): the config the autotuner
    chose for it in this process, else the default config of the current GPU's class."""
    kernel = "band_fwd_split" if is_decode(key[2]) else "band_fwd"
    return CHOSEN.get(key) or configs_for(kernel, key[3], current_capability(), flags)[0].kwargs


@contextlib.contextmanager
def interpreter_tiles(block_m: int, block_n: int):
    """Run the kernels with (block_m, block_n) tiles (dK/dV: block_n rows x block_m keys) for
    the duration: tests check the interpreter at GPU tile sizes."""
    saved = {}
    for module, name in AUTOTUNED:
        kernel = getattr(module, name)
        saved[name] = kernel.configs
        tiles = {"BLOCK_M": block_n, "BLOCK_N": block_m} if name == "band_dkdv" else (
            {"BLOCK_N": block_n} if name == "band_fwd_split" else
            {"BLOCK_M": block_m, "BLOCK_N": block_n} if name.startswith("band") else {})
        kernel.configs = [triton.Config(tiles, num_warps=4, num_stages=1)]
    try:
        yield
    finally:
        for module, name in AUTOTUNED:
            getattr(module, name).configs = saved[name]


def _precision(dtype: torch.dtype, device: torch.device) -> str | None:
    """``tl.dot`` precision: IEEE for fp32 inputs (no TF32 rounding), the default for 16-bit
    ones; "upcast" works around the interpreter's wrong bf16 ``tl.dot`` on CPU tensors."""
    if dtype == torch.float32:
        return "ieee"
    return "upcast" if device.type == "cpu" and dtype == torch.bfloat16 else None


def _constexprs(q: Tensor) -> dict:
    """The kernels' shared compile-time arguments for q (B, H, n, D); FMA fusion on, which
    the exponent's multiply-add needs (Triton's default for it is changing)."""
    d = q.shape[-1]
    return dict(D=d, BLOCK_D=block_d(d), PRECISION=_precision(q.dtype, q.device),
                enable_fp_fusion=True)


def _last_dim_unit(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _strides(*tensors: Tensor) -> tuple[int, ...]:
    """(batch, head, row) strides of each (B, H, N, D) tensor, in order."""
    return tuple(s for t in tensors for s in t.stride()[:3])


def _on_device(t: Tensor):
    """The tensor's CUDA device made current (a no-op elsewhere)."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def attention_forward(
    q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float
) -> tuple[Tensor, Tensor]:
    """q: (B, H, n_q, D), k/v: (B, H_kv, n_k, D), any strides -> out (B, H, n_q, D) and the
    base-2 row log-sum-exp (B·H, n_q) float32 (+inf for rows with no kept key)."""
    q, k, v = _last_dim_unit(q), _last_dim_unit(k), _last_dim_unit(v)
    b, h, n_q, d = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((b * h, n_q), dtype=torch.float32, device=q.device)
    if n_q == 0 or b * h == 0:
        return out, lse
    key = tune_key(mask, n_q, k.shape[2], d, q.dtype)
    if mask.block_size is not None:
        launch_fn = _blocks_forward
    else:
        launch_fn = _decode_forward if is_decode(n_q) else _band_forward
    with _on_device(q):
        ran = launch_fn(q, k, v, out, lse, mask, (scale * LOG2E, key[1], key[2], key[0]))
    if ran.how in ("autotuned", "pinned") and ran.config is not None:
        CHOSEN[key] = dict(ran.config.kwargs)
    return out, lse


def _band_args(q: Tensor, k: Tensor, mask: MaskSpec):
    """(tables, sizes, constexprs) shared by the band kernels: sizes are
    (H, GROUP, n_q, n_k, off, hg, P, GB)."""
    h, n_q = q.shape[1], q.shape[2]
    n_k = k.shape[2]
    tables = band_tables(mask, n_q, n_k, q.device)
    plan = tables.plan
    sizes = (h, h // k.shape[1], n_q, n_k, n_k - n_q, plan.hg, plan.prefix, plan.gbase)
    return tables, sizes, {**_constexprs(q), **plan.flags}


def _band_forward(q, k, v, out, lse, mask: MaskSpec, tail: tuple) -> Launch:
    """Launch ``band_fwd`` (grid: row blocks, B·H, slots). ``tail``: (scale·log2 e, n_bucket,
    q_bucket, MASK_KEY)."""
    tables, sizes, consts = _band_args(q, k, mask)
    plan = tables.plan
    grid = lambda m: (ceil_div(plan.max_rows, m["BLOCK_M"]), q.shape[0] * q.shape[1],
                      len(plan.slots))
    tail = (*tail[:3], tma_key(tail[3], dict(Q=q, K=k, V=v, Out=out)))  # TMA tunes apart
    args = (q, k, v, out, lse, tables.slots, *tables.pointers, *_strides(q, k, v, out), *sizes,
            *tail)
    return launch("band_fwd", forward.band_fwd, grid, args, consts)


def _decode_forward(q, k, v, out, lse, mask: MaskSpec, tail: tuple) -> Launch:
    """Launch ``band_fwd_split`` (grid: chunks, B·H_kv, slots) then ``split_combine``; returns
    the first."""
    tables, sizes, consts = _band_args(q, k, mask)
    plan = tables.plan
    b, h, n_q, d = q.shape
    h_kv, group = k.shape[1], sizes[1]
    rows, block_m = decode_tiles(plan.max_rows, group)
    keys = max(s[5] - s[4] for s in plan.slots)
    n_split = split_count(b * h_kv, len(plan.slots), keys, str(q.device))
    part_o = torch.empty((n_split, b * h, n_q, d), dtype=torch.float32, device=q.device)
    part_ml = torch.empty((n_split, b * h, n_q, 2), dtype=torch.float32, device=q.device)
    split = launch(
        "band_fwd_split", decode_split_kv.band_fwd_split, (n_split, b * h_kv, len(plan.slots)),
        (q, k, v, part_o, part_ml, tables.slots, *tables.pointers, *_strides(q, k, v), *sizes,
         tail[0], n_split, *tail[1:]), dict(ROWS=rows, BLOCK_M=block_m, **consts),
    )
    launch("split_combine", decode_split_kv.split_combine, (ceil_div(n_q, 16), b * h),
           (part_o, part_ml, out, lse, *_strides(out), h, n_q, n_split),
           dict(D=d, BLOCK_D=block_d(d), BLOCK=16, enable_fp_fusion=True))
    return split


def _blocks_forward(q, k, v, out, lse, mask: MaskSpec, tail: tuple) -> Launch:
    """Launch ``blocks_fwd`` (grid: CSR rows, B·H)."""
    b, h, n_q, _ = q.shape
    n_k = k.shape[2]
    bp = block_tables(mask, n_q, n_k, q.device)
    tables = (bp.q_pos, bp.starts, bp.mids, bp.ends, bp.cols, bp.order)
    sizes = (h, h // k.shape[1], n_q, n_k, n_k - n_q, mask.block_size, _global_reach(mask))
    consts = dict(TILE=block_tile(mask.block_size), **_constexprs(q))
    return launch("blocks_fwd", forward.blocks_fwd, (bp.q_pos.numel(), b * h),
                  (q, k, v, out, lse, *tables, *_strides(q, k, v, out), *sizes, *tail), consts)


def _global_reach(mask: MaskSpec) -> int:
    """``hg`` of a block-sparse mask: 0 under causality, else beyond any j - p."""
    return 0 if mask.causal else 1 << 30


def attention_backward(
    q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor,
    mask: MaskSpec, scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """FlashAttention-2 backward over the forward's iteration space: three launches (delta,
    dK/dV, dQ). Shapes as :func:`attention_forward`; returns (dq, dk, dv) in the inputs' dtype
    (dk, dv with K/V's heads: grouped query heads summed)."""
    q, k, v, dout = (_last_dim_unit(t) for t in (q, k, v, dout))
    b, h, n_q, d = q.shape
    n_k = k.shape[2]
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    if b * h == 0 or n_q == 0 or n_k == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    key = tune_key(mask, n_q, n_k, d, q.dtype)
    tail = (scale * LOG2E, scale, key[1], key[2], key[0])
    launch = _band_backward if mask.block_size is None else _blocks_backward
    with _on_device(q):
        delta = _delta(out, dout)
        launch((q, k, v, dout), (dq, dk, dv), lse, delta, mask, tail)
    return dq, dk, dv


def _delta(out: Tensor, dout: Tensor) -> Tensor:
    """rowsum(dO ∘ O): (B·H, n_q) float32, one launch of ``delta_kernel``."""
    b, h, n_q, d = out.shape
    delta = torch.empty((b * h, n_q), dtype=torch.float32, device=out.device)
    launch("delta_kernel", backward.delta_kernel, (ceil_div(n_q, 64), b * h),
           (out, dout, delta, *_strides(out, dout), h, n_q),
           dict(D=d, BLOCK_D=block_d(d), BLOCK=64, enable_fp_fusion=True))
    return delta


def _band_backward(head: tuple, grads: tuple, lse, delta, mask: MaskSpec, tail: tuple) -> None:
    """Launch ``band_dkdv`` then ``band_dq``. head: (q, k, v, dout); grads: (dq, dk, dv),
    written in place; tail: (scale·log2 e, scale, n_bucket, q_bucket, MASK_KEY)."""
    q, k = head[0], head[1]
    dq, dk, _ = grads
    tables, sizes, consts = _band_args(q, k, mask)
    plan, b = tables.plan, q.shape[0]
    grid = lambda m: (ceil_div(plan.max_keys, m["BLOCK_N"]), b * k.shape[1], len(plan.key_slots))
    launch("band_dkdv", backward.band_dkdv, grid,
           (*head, *grads[1:], lse, delta, tables.key_slots, *tables.key_pointers,
            *_strides(*head, dk), *sizes, *tail), consts)
    grid = lambda m: (ceil_div(plan.max_rows, m["BLOCK_M"]), b * q.shape[1], len(plan.slots))
    launch("band_dq", backward.band_dq, grid,
           (*head, dq, lse, delta, tables.slots, *tables.pointers, *_strides(*head, dq), *sizes,
            *tail), consts)


def _blocks_backward(head: tuple, grads: tuple, lse, delta, mask: MaskSpec, tail: tuple) -> None:
    """Launch ``blocks_dkdv`` (transposed CSR lists) then ``blocks_dq``; arguments as
    :func:`_band_backward`."""
    q, k = head[0], head[1]
    dq, dk, _ = grads
    b, h, n_q, _ = q.shape
    n_k = k.shape[2]
    bp = block_tables(mask, n_q, n_k, q.device)
    sizes = (h, h // k.shape[1], n_q, n_k, n_k - n_q, mask.block_size, _global_reach(mask))
    tile = dict(TILE=block_tile(mask.block_size), **_constexprs(q))
    t_tables = (bp.t_pos, bp.t_starts, bp.t_mids, bp.t_ends, bp.t_cols, bp.t_order)
    launch("blocks_dkdv", backward_blocks.blocks_dkdv, (bp.t_pos.numel(), b * k.shape[1]),
           (*head, *grads[1:], lse, delta, *t_tables, *_strides(*head, dk), *sizes, *tail), tile)
    tables = (bp.q_pos, bp.starts, bp.mids, bp.ends, bp.cols, bp.order)
    launch("blocks_dq", backward_blocks.blocks_dq, (bp.q_pos.numel(), b * h),
           (*head, dq, lse, delta, *tables, *_strides(*head, dq), *sizes, *tail), tile)
