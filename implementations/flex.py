"""``flex-local``, ``flex-dilated``, ``flex-blocksparse``: the same patterns via FlexAttention.

``torch.nn.attention.flex_attention`` only skips work when compiled: eager FlexAttention
materializes the n² scores. So :func:`_prepare` builds the block mask and the compiled call
outside the timed region; the first call's compilation (seconds) is the runner's ``first_call_s``.

The ``mask_mod`` is the code the kernel runs on every element of a partial block, so it must
cost what a hand-written one costs: :func:`mask_mod_for` specializes on the spec's numbers as
Python constants and emits only the clauses the spec uses (no modulo without dilation, a bit
mask instead of a modulo for power-of-two dilations, no global clause without global tokens, no
window side that is unbounded, the causal bound folded into the window's right side). A mask
mod that read its numbers from a captured int64 tensor and always evaluated every clause ran
25x slower on an H100 on the identical block layout. BigBird's layout lookup is the only tensor
a mask mod captures (global blocks folded into it).

Traps handled here:
- every distinct spec compiles its own kernel (the numbers are constants), and past dynamo's
  ``recompile_limit`` (8 by default) dynamo silently falls back to eager, i.e. back to O(n²).
  We raise the limits and make hitting them an error (``fail_on_recompile_limit_hit``): a
  point then fails loudly instead of running eager.
- ``create_block_mask`` evaluates the mask on the full n_q × n_k grid. We build the
  :class:`BlockMask` from block counts computed 128 rows at a time from
  :func:`harness.masks.mask_rows` instead (O(128·n) memory), which also gives the executed pairs.

FlexAttention has no CPU backward (torch 2.13): backward points on CPU say so and are skipped.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from functools import lru_cache

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, flex_attention, noop_mask

from harness.dtypes import FLOAT_DTYPES
from harness.masks import MaskSpec, block_layout, mask_rows
from harness.registry import register
from harness.spec import AttnFn, Capabilities, Cost, Problem

BLOCK = 128  # FlexAttention's default (query, key) block size
RECOMPILE_LIMIT = 1024  # distinct (spec, shape) kernels one process may compile
DTYPES = FLOAT_DTYPES - {torch.float64}  # no float64 kernels

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


def _availability() -> str | None:
    if not torch._dynamo.is_dynamo_supported():
        return "torch.compile (dynamo) is not supported on this Python"
    return None


def _reasons(p: Problem) -> list[str]:
    out = []
    if p.device_type == "cpu":
        if p.backward:
            out.append("FlexAttention has no backward on CPU")
        if shutil.which("g++") is None and shutil.which("c++") is None:
            out.append("no C++ compiler for inductor's CPU code")
        if p.dtype == torch.float16:
            out.append("FlexAttention on CPU supports float32/bfloat16, not float16")
    return out


def raise_recompile_limits(limit: int = RECOMPILE_LIMIT) -> None:
    """Past dynamo's recompile limit flex silently runs eager (O(n²)): lift the limits, and
    make reaching them an error rather than a silent fallback."""
    cfg = torch._dynamo.config
    for name in (
        "recompile_limit",
        "cache_size_limit",
        "accumulated_recompile_limit",
        "accumulated_cache_size_limit",
    ):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), limit))
    if hasattr(cfg, "fail_on_recompile_limit_hit"):
        cfg.fail_on_recompile_limit_hit = True


@lru_cache(maxsize=1)
def _compiled_flex():
    raise_recompile_limits()
    return torch.compile(flex_attention, dynamic=False)


@lru_cache(maxsize=256)
def mask_mod_for(spec: MaskSpec, n_q: int, n_k: int, device: str) -> MaskMod:
    """A FlexAttention ``mask_mod(b, h, q_idx, kv_idx) -> bool`` equal to ``dense_mask``,
    specialized on the spec's numbers (cached: the same key gives the same function, so a
    repeated point never recompiles)."""
    if spec.block_size is not None:
        return _layout_mod(spec, n_q, n_k, device)
    if spec.is_dense:
        return noop_mask
    return _window_mod(spec, n_k - n_q)


def _window_mod(spec: MaskSpec, off: int) -> MaskMod:
    """Window / dilation / global / causal with every number a Python constant. The branches
    on constants run while dynamo traces, so the kernel holds only the clauses taken."""
    d, g = spec.dilation, spec.global_tokens
    lo = None if spec.left is None else -spec.left * d  # rel >= lo
    hi = None if spec.right is None else spec.right * d  # rel <= hi
    causal_apart = spec.causal and g > 0  # global tokens sit between window and causality
    if spec.causal and not causal_apart:
        hi = 0 if hi is None else min(hi, 0)
    pow2 = d & (d - 1) == 0  # two's complement: rel & (d - 1) == rel mod d, negatives too

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        p = q_idx + off if off else q_idx  # absolute query position (bottom-right aligned)
        rel = kv_idx - p
        keep = None
        if lo is not None:
            keep = rel >= lo
        if hi is not None:
            keep = _and(keep, rel <= hi)
        if d > 1:
            keep = _and(keep, ((rel & (d - 1)) if pow2 else (rel % d)) == 0)
        if g and keep is not None:  # with nothing cut yet every pair is kept already
            keep = keep | (p < g) | (kv_idx < g)
        if causal_apart:
            keep = _and(keep, rel <= 0)
        return keep if keep is not None else rel == rel

    mask_mod.__name__ = _mod_name(spec, off)
    return mask_mod


def _and(a: Tensor | None, b: Tensor) -> Tensor:
    return b if a is None else a & b


def _mod_name(spec: MaskSpec, off: int) -> str:
    """``mask_causal_window_255_0_`` style: names the kernel in dynamo's and inductor's logs."""
    return re.sub(r"\W+", "_", f"mask_{spec.describe()}_off{off}")


def _layout_mod(spec: MaskSpec, n_q: int, n_k: int, device: str) -> MaskMod:
    """BigBird: one lookup in the flattened block layout, global blocks folded in (global
    tokens are whole blocks), causality apart; the block index is a shift when b is 2^k."""
    b, off, g_blocks = spec.block_size, n_k - n_q, spec.global_tokens // spec.block_size
    layout = block_layout(spec, n_q, n_k).clone()
    layout[:g_blocks] = True
    layout[:, :g_blocks] = True
    nb = layout.shape[0]
    flat = layout.flatten().to(device)
    shift = b.bit_length() - 1 if b & (b - 1) == 0 else None
    causal = spec.causal

    def mask_mod(bi: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        p = q_idx + off if off else q_idx
        qb, kb = (p >> shift, kv_idx >> shift) if shift is not None else (p // b, kv_idx // b)
        if off >= 0:
            return _causal(flat[qb * nb + kb], kv_idx, p, causal)
        # more queries than keys: queries before position 0 see nothing, unless global (row 0)
        keep = flat[qb.clamp(0, nb - 1) * nb + kb]
        return _causal(keep if g_blocks else keep & (p >= 0), kv_idx, p, causal)

    mask_mod.__name__ = _mod_name(spec, off)
    return mask_mod


def _causal(keep: Tensor, kv_idx: Tensor, p: Tensor, causal: bool) -> Tensor:
    return keep & (kv_idx <= p) if causal else keep


@lru_cache(maxsize=32)
def block_counts(spec: MaskSpec, n_q: int, n_k: int) -> tuple[Tensor, Tensor, int]:
    """Per (128-query block, 128-key block): ``any`` kept pair and ``full`` (all kept, block
    wholly inside the sequence), each bool (n_qb, n_kb); plus the executed pairs (every block
    with any kept pair, at its clipped size)."""
    n_qb, n_kb = -(-n_q // BLOCK), -(-n_k // BLOCK)
    any_ = torch.zeros(n_qb, n_kb, dtype=torch.bool)
    full = torch.zeros(n_qb, n_kb, dtype=torch.bool)
    pad = n_kb * BLOCK - n_k
    for qb in range(n_qb):
        rows = mask_rows(spec, n_q, n_k, qb * BLOCK, min((qb + 1) * BLOCK, n_q))
        blocks = torch.nn.functional.pad(rows, (0, pad)).view(rows.shape[0], n_kb, BLOCK)
        any_[qb] = blocks.any(-1).any(0)
        full[qb] = blocks.all(-1).all(0) & (rows.shape[0] == BLOCK)
    if pad:
        full[:, -1] = False
    widths = torch.full((n_kb,), BLOCK)
    widths[-1] = n_k - (n_kb - 1) * BLOCK
    heights = torch.full((n_qb,), BLOCK)
    heights[-1] = n_q - (n_qb - 1) * BLOCK
    executed = int((any_.long() * heights[:, None] * widths[None, :]).sum())
    return any_, full, executed


def _indices(blocks: Tensor, device: str) -> tuple[Tensor, Tensor]:
    """bool (n_qb, n_kb) -> kv_num_blocks (1, 1, n_qb), kv_indices (1, 1, n_qb, n_kb) int32,
    the selected key blocks first (stable order)."""
    num = blocks.sum(-1).to(torch.int32)
    order = torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return num[None, None].to(device), order[None, None].to(device)


def build_block_mask(spec: MaskSpec, n_q: int, n_k: int, device: str):
    """The FlexAttention BlockMask for ``spec``, without materializing the n_q × n_k mask."""
    any_, full, _ = block_counts(spec, n_q, n_k)
    kv_num, kv_idx = _indices(any_ & ~full, device)
    full_num, full_idx = _indices(full, device)
    return BlockMask.from_kv_blocks(
        kv_num,
        kv_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=BLOCK,
        mask_mod=mask_mod_for(spec, n_q, n_k, device),
        seq_lengths=(n_q, n_k),
    )


@lru_cache(maxsize=16)
def _cached_block_mask(spec: MaskSpec, n_q: int, n_k: int, device: str):
    return build_block_mask(spec, n_q, n_k, device)


def _prepare(problem: Problem) -> AttnFn:
    """Block mask and compiled handle, both outside the timed call."""
    block_mask = _cached_block_mask(problem.mask, problem.n_q, problem.n_k, problem.device)
    flex = _compiled_flex()
    return lambda q, k, v: flex(q, k, v, block_mask=block_mask)


def flex_pattern(
    q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float | None = None
) -> Tensor:
    """q: (B, H, n_q, D), k/v: (B, H, n_k, D) -> (B, H, n_q, D), compiled FlexAttention."""
    block_mask = _cached_block_mask(mask, q.shape[-2], k.shape[-2], str(q.device))
    return _compiled_flex()(q, k, v, block_mask=block_mask, scale=scale)


def _executed(p: Problem) -> int:
    return block_counts(p.mask, p.n_q, p.n_k)[2]


def _workspace(p: Problem) -> int:
    """Compiled flex keeps one (BLOCK, BLOCK) score tile per thread plus O(n) row state; the
    block mask's index tensors are O((n/128)²) int32."""
    n_qb, n_kb = -(-p.n_q // BLOCK), -(-p.n_k // BLOCK)
    return 4 * (4 * BLOCK * BLOCK * 16 + 4 * n_qb * n_kb + 2 * p.batch * p.heads * p.n_q)


_VARIANTS = {
    "flex-local": ({"causal", "window", "global"}, "sliding window (+ global tokens)"),
    "flex-dilated": ({"causal", "window", "dilation", "global"}, "dilated sliding window"),
    "flex-blocksparse": ({"causal", "window", "global", "block_sparse"}, "BigBird block layout"),
}

for _name, (_features, _what) in _VARIANTS.items():
    register(
        _name,
        family="flex",
        caps=Capabilities(dtypes=DTYPES, mask_features=_features),
        cost=Cost(
            time_exponent=1, memory_exponent=1, memory_model=_workspace, executed_pairs=_executed
        ),
        description=f"FlexAttention under torch.compile, 128x128 block skipping: {_what}",
        availability=_availability,
        extra_reasons=_reasons,
        prepare=_prepare,
    )(flex_pattern)
