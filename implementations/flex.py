"""``flex-local``, ``flex-dilated``, ``flex-blocksparse``: the same patterns via FlexAttention.

``torch.nn.attention.flex_attention`` only skips work when compiled: eager FlexAttention
materializes the n² scores. So :func:`_prepare` builds the block mask and the compiled call
outside the timed region; the first call's compilation (seconds) is the runner's ``first_call_s``.

Two traps handled here:
- dynamo recompiles for every new shape and, past ``recompile_limit`` (8 by default), silently
  falls back to eager, i.e. back to O(n²). We raise the limits before compiling.
- ``create_block_mask`` evaluates the mask on the full n_q × n_k grid. We build the
  :class:`BlockMask` from block counts computed 128 rows at a time from
  :func:`harness.masks.mask_rows` instead (O(128·n) memory), which also gives the executed pairs.

The mask functions read the MaskSpec's numbers from a captured tensor rather than Python
constants, so specs that differ only in numbers share one compiled kernel.
FlexAttention has no CPU backward (torch 2.13): backward points on CPU say so and are skipped.
"""

from __future__ import annotations

import shutil
from functools import lru_cache

import torch
from torch import Tensor

from harness.masks import MaskSpec, block_layout, mask_rows
from harness.registry import register
from harness.spec import AttnFn, Capabilities, Cost, Problem

BLOCK = 128  # FlexAttention's default (query, key) block size
_UNBOUNDED = 1 << 40


def _availability() -> str | None:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError as exc:
        return f"torch {torch.__version__} has no FlexAttention: {exc}"
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


def _raise_recompile_limits(limit: int = 512) -> None:
    """Past dynamo's recompile limit flex silently runs eager (O(n²)): lift it."""
    cfg = torch._dynamo.config
    for name in (
        "recompile_limit",
        "cache_size_limit",
        "accumulated_recompile_limit",
        "accumulated_cache_size_limit",
    ):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), limit))


@lru_cache(maxsize=1)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    _raise_recompile_limits()
    return torch.compile(flex_attention, dynamic=False)


def mask_mod_for(spec: MaskSpec, n_q: int, n_k: int, device: str):
    """A FlexAttention ``mask_mod(b, h, q_idx, kv_idx) -> bool`` equal to ``dense_mask``."""

    def side(s: int | None) -> int:
        return _UNBOUNDED if s is None else s

    off = n_k - n_q
    if spec.block_size is None:
        params = torch.tensor(
            [
                off,
                side(spec.left),
                side(spec.right),
                spec.dilation,
                spec.global_tokens,
                int(spec.causal),
            ],
            device=device,
        )

        def window_mod(b, h, q_idx, kv_idx):
            p = q_idx + params[0]
            rel = kv_idx - p
            d = params[3]
            keep = (rel >= -params[1] * d) & (rel <= params[2] * d) & (torch.remainder(rel, d) == 0)
            keep = keep | (((p < params[4]) | (kv_idx < params[4])) & (params[4] > 0))
            return keep & ((rel <= 0) | (params[5] == 0))

        return window_mod
    layout = block_layout(spec, n_q, n_k).to(device)
    params = torch.tensor(
        [off, spec.block_size, layout.shape[0], spec.global_tokens, int(spec.causal)], device=device
    )

    def block_mod(b, h, q_idx, kv_idx):
        p = q_idx + params[0]
        qb = torch.div(p, params[1], rounding_mode="floor")
        inside = (qb >= 0) & (qb < params[2])
        keep = layout[qb.clamp(0, layout.shape[0] - 1), kv_idx // params[1]] & inside
        keep = keep | (((p < params[3]) | (kv_idx < params[3])) & (params[3] > 0))
        return keep & ((kv_idx <= p) | (params[4] == 0))

    return block_mod


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
    from torch.nn.attention.flex_attention import BlockMask

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
        caps=Capabilities(
            dtypes={torch.float32, torch.bfloat16, torch.float16}, mask_features=_features
        ),
        cost=Cost(
            time_exponent=1, memory_exponent=1, memory_model=_workspace, executed_pairs=_executed
        ),
        description=f"FlexAttention under torch.compile, 128x128 block skipping: {_what}",
        availability=_availability,
        extra_reasons=_reasons,
        prepare=_prepare,
    )(flex_pattern)
