"""Autotuning configurations of the fused attention kernels (one small list per kernel).

Under ``TRITON_INTERPRET=1`` (CPU tests) a single small configuration runs: the interpreter's
time goes into every extra config, and small tiles exercise more block edges on small inputs
(tests swap in GPU-sized tiles with ``triton_launch.interpreter_tiles``). The autotuner's key is
``(n_bucket, q_bucket, BLOCK_D, MODE_KEY)`` plus the tensors' dtypes (Triton adds those), so
each (length bucket, query-rows bucket, head dim, mask mode, dtype) is tuned once per process.

Every config listed here compiles spill-free for sm_90 and sm_80 at D = 64 and 128 in bf16
(checked ahead of time by ``benchmarks/aot_kernels.py`` and, for the first of each list, by
the CPU test suite); the first config of each list is the one assumed before autotuning.
"""

from __future__ import annotations

import os

import triton


def interpreted() -> bool:
    """Whether Triton kernels run in the NumPy interpreter (set before the kernels import)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


INTERPRET_BLOCK_M = 32
INTERPRET_BLOCK_N = 16

# (BLOCK_M, BLOCK_N, warps, stages) of each kernel, the default first
FWD_SHAPES = [
    (128, 64, 8, 3),
    (128, 64, 4, 3),
    (128, 128, 8, 2),
    (64, 64, 4, 3),
    (64, 64, 4, 4),
    (128, 32, 4, 4),
    (64, 32, 4, 2),
]
DQ_SHAPES = [(128, 64, 8, 2), (64, 64, 4, 3), (128, 32, 4, 3), (64, 32, 4, 2), (32, 32, 4, 2)]
DKDV_SHAPES = [(64, 128, 8, 2), (32, 128, 4, 3), (64, 64, 4, 3), (32, 64, 4, 2), (16, 32, 4, 2)]
DECODE_SHAPES = [(64, 4, 2), (128, 4, 2), (64, 4, 3), (128, 8, 2)]  # (BLOCK_N, warps, stages)


def _configs(shapes: list[tuple[int, int, int, int]]) -> list[triton.Config]:
    return [
        triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
        for m, n, w, s in shapes
    ]


def fwd_configs(blocks: bool = True) -> list[triton.Config]:
    """Forward configs: BLOCK_M query rows x BLOCK_N keys, H100-sized choices after the
    FlashAttention-2 forward: 128x64 or 64x64 tiles, 4-8 warps, 2-4 stages. ``blocks=False``:
    the block-list kernels, whose tile is the layout block (the pipeline only is tuned)."""
    if interpreted():
        kw = {"BLOCK_M": INTERPRET_BLOCK_M, "BLOCK_N": INTERPRET_BLOCK_N} if blocks else {}
        return [triton.Config(kw, num_warps=4, num_stages=1)]
    if not blocks:
        return [triton.Config({}, num_warps=w, num_stages=s) for w in (4, 8) for s in (2, 3)]
    return _configs(FWD_SHAPES)


def bwd_configs() -> list[triton.Config]:
    """dK/dV configs: BLOCK_N keys per program (held in registers) x BLOCK_M query rows per
    step, as FlashAttention-2's backward (128 keys x 32-64 rows)."""
    if interpreted():
        kw = {"BLOCK_M": INTERPRET_BLOCK_N, "BLOCK_N": INTERPRET_BLOCK_M}
        return [triton.Config(kw, num_warps=4, num_stages=1)]
    return _configs(DKDV_SHAPES)


def dq_configs() -> list[triton.Config]:
    """dQ configs: BLOCK_M query rows per program x BLOCK_N keys per step."""
    if interpreted():
        return fwd_configs()
    return _configs(DQ_SHAPES)


def decode_configs() -> list[triton.Config]:
    """Split-KV decode configs: BLOCK_N keys per step (the rows are the few decode rows)."""
    if interpreted():
        return [triton.Config({"BLOCK_N": INTERPRET_BLOCK_N}, num_warps=4, num_stages=1)]
    return [
        triton.Config({"BLOCK_N": n}, num_warps=w, num_stages=s) for n, w, s in DECODE_SHAPES
    ]
