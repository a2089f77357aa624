"""The way in to the fused Triton attention kernels: dispatch rule, autograd, executed pairs.

``triton_attention(q, k, v, mask)`` is exact masked attention for any band mask (full, causal,
window, dilation, global tokens as a count or at named positions, a bidirectional prefix,
packed documents, a predicate feature's ``@triton.jit`` predicate) or BigBird layout (global
blocks as a count or at named blocks), one kernel launch per forward call (two for a decode
step of up to 16 query rows: split-KV and combine),
K/V heads shared by groups of query heads (grouped-query attention). The
implementations (``local``, ``dilated``, ``longformer``, ``bigbird``, ``flash-tiled``) call it on
CUDA; on CPU they keep the tile path, and tests call it on CPU tensors under
``TRITON_INTERPRET=1``. Triton is optional: without it (or with a Triton that fails to import)
this module still imports, the launches are absent and :func:`.fused_path.unavailable_reason`
says why (the limits both fused families share are in :mod:`.fused_path`).

Below it (this folder): the launches in :mod:`.attention_launches`, the kernels in :mod:`.forward`,
:mod:`.backward`, :mod:`.backward_blocks` and :mod:`.decode_split_kv` (building blocks in
:mod:`.primitives`), the plan in :mod:`.band_plan`, :mod:`.blocklist_plan` and :mod:`.plan_tables`
(its device tables and the autotuner's keys).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from harness.masks import MaskSpec, check_fits
from harness.spec import Problem
from implementations._kernels.saved_lse import LseOps, attention_with_lse
from implementations._kernels.triton import fused_path
from implementations._kernels.triton.band_plan import (
    band_executed_pairs,
    band_plan,
    fused_band_reasons,
)
from implementations._kernels.triton.blocklist_plan import block_executed_pairs, block_reasons
from implementations._kernels.triton.plan_tables import (
    band_tables,
    block_tables,
    device_key,
    is_decode,
    split_count,
    triton_next_pow2,
    tune_key,
)

IMPORT_ERROR: str | None = None
"""Why the launches failed to import (None: they imported); :func:`.fused_path.unavailable_reason`
reads it."""
try:  # the launches import Triton, an optional dependency
    from implementations._kernels.triton import attention_launches
except Exception as exc:  # absent or broken: the tile paths still run, the reason says why
    launches = None
    IMPORT_ERROR = fused_path.import_error(exc)


def supports(dtype: torch.dtype, head_dim: int) -> bool:
    """Covered (:func:`.fused_path.covers`) and Triton importable."""
    available = fused_path.unavailable_reason(IMPORT_ERROR) is None
    return fused_path.covers(dtype, head_dim) and available


def use_triton(device: str | torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """The dispatch rule of the implementations: CUDA tensors the kernels cover."""
    return torch.device(device).type == "cuda" and supports(dtype, head_dim)


def executed_pairs(mask: MaskSpec, n_q: int, n_k: int, head_dim: int, dtype: torch.dtype) -> int:
    """Pairs the forward kernel computes per (batch, head) at its block granularity: the block
    sizes the autotuner chose for this shape in this process, else the first config's (the
    decode kernel: its rows padded, keys in its BLOCK_N). O(number of blocks)."""
    if mask.block_size is not None:
        return block_executed_pairs(mask, n_q, n_k)
    plan = band_plan(mask, n_q, n_k)
    cfg = attention_launches.forward_blocks(tune_key(mask, n_q, n_k, head_dim, dtype), plan.flags)
    if is_decode(n_q):
        return band_executed_pairs(plan, triton_next_pow2(plan.max_rows), cfg["BLOCK_N"])
    return band_executed_pairs(plan, cfg["BLOCK_M"], cfg["BLOCK_N"])


def prepare_tables(problem: Problem) -> None:
    """Build and cache the problem's index tables on its device (outside any timed call)."""
    mask, n_q, n_k = problem.mask, problem.n_q, problem.n_k
    tables = band_tables if mask.block_size is None else block_tables
    tables(mask, n_q, n_k, device_key(problem.device))


# every mask feature the fused kernels run; block_size with a prefix they refuse (masked_reasons)
FUSED_FEATURES = frozenset(
    {"causal", "window", "dilation", "global", "global_positions", "block_sparse", "documents",
     "prefix"}
)


def masked_reasons(problem: Problem) -> list[str]:
    """Extra reasons of a family with a fused CUDA path: none on CPU (tile path); on CUDA a
    missing Triton, and the feature combination the kernels do not cover (a prefix with
    block_size; documents with block_size is no valid mask). float64 and
    D > 256 keep the tile path
    there. K/V heads must divide the query heads."""
    if problem.device_type != "cuda" or not fused_path.covers(problem.dtype, problem.head_dim):
        return []
    reason = fused_path.unavailable_reason(IMPORT_ERROR)
    if reason:
        return [f"unavailable: {reason}"]
    mask = problem.mask
    out = block_reasons(mask) if mask.block_size is not None else fused_band_reasons(mask)
    if problem.heads % problem.n_kv_heads:
        out.append(f"heads={problem.heads} is not a multiple of kv_heads={problem.n_kv_heads}")
    return out


def masked_workspace_bytes(problem: Problem) -> int:
    """Extra memory of a fused call: the fp32 row log-sum-exp (and in backward the fp32 row
    delta; grads are written in place, grouped K/V heads summed in the kernel); a decode call
    (n_q <= 16, band masks) adds its chunks' partial states, fp32 (splits, B·H, n_q, D + 2).
    Closed form."""
    rows = problem.batch * problem.heads * problem.n_q * 4
    total = rows * (2 if problem.backward else 1)
    if problem.mask.block_size is None and is_decode(problem.n_q) and not fused_band_reasons(
        problem.mask
    ):
        plan = band_plan(problem.mask, problem.n_q, problem.n_k)
        keys = max((s[5] - s[4] for s in plan.slots), default=0)
        device = device_key(problem.device) if problem.device_type == "cuda" else "cpu"
        splits = split_count(problem.batch * problem.n_kv_heads, len(plan.slots), keys, device)
        total += rows * splits * (problem.head_dim + 2)
    return total


def _forward(q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float,
             want_lse: bool) -> tuple[Tensor, Tensor]:
    del want_lse  # the kernel writes the lse either way
    return attention_launches.attention_forward(q, k, v, mask, scale)


def _backward(q, k, v, out, lse, dout, mask: MaskSpec, scale: float):
    return attention_launches.attention_backward(q, k, v, out, lse, dout, mask, scale)


# the kernels' calls for the shared autograd (late-bound: launches may be absent)
TRITON_OPS = LseOps(_forward, _backward)


def triton_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float | None = None
) -> Tensor:
    """Exact masked attention in fused Triton kernels (forward and backward).

    q: (B, H, n_q, D), k/v: (B, H_kv, n_k, D) with H a multiple of H_kv and D <= 256, dtype
    fp32/fp16/bf16 -> (B, H, n_q, D).
    CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``."""
    if not fused_path.covers(q.dtype, q.shape[-1]):
        raise ValueError(f"triton kernels cover fp32/fp16/bf16 and D <= {fused_path.MAX_HEAD_DIM}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads ({q.shape[1]}) must be a multiple of K/V heads "
                         f"({k.shape[1]})")
    # documents must tile the sequence; a contradictory mask is refused before any launch
    check_fits(mask, q.shape[-2], k.shape[-2])
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return attention_with_lse(q, k, v, mask, scale, TRITON_OPS)
