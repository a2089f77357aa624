"""The way in to the fused non-causal feature-map attention (:mod:`.feature_kernels`): which
calls take it, its launches, its workspace.

``linear`` (φ = elu + 1) and ``performer`` (FAVOR+) run it on CUDA for non-causal forward
calls without autograd; everything else (CPU, causal, autograd, the recurrent decode state,
float64, D > 256) keeps the PyTorch path of :mod:`implementations._feature_maps`. The choice is
the method parameter ``fused`` (:data:`FUSED`): -1 (the default) decides by that rule, 1
forces the kernels (refused, with the reason, where they cannot run), 0 forces PyTorch.

A call is three launches, whatever n: the keys' partial states, their combine, the outputs
(:func:`feature_attention`); no host synchronization; ``fused`` = 2 makes it two, the key
pass combining its own partial states (a candidate). Causal calls of both maps have the
chunkwise kernel (:func:`chunk_attention`, :mod:`.linear_chunk`: the partial states, their
prefix, the chunks; FAVOR+ with m <= :data:`CHUNK_FEATURES`), a candidate that ``fused`` = 1
forces (:data:`AUTO_CAUSAL`). Block sizes are pinned (:func:`tiles`, :func:`chunk_tiles`,
:data:`FAVOR_CHUNK`), chosen from ``benchmarks/aot_kernels.py --workloads feature-linear
feature-performer feature-linear-causal feature-performer-causal feature-linear-combine
feature-performer-combine`` (registers, spills and shared memory on sm_80 and sm_90; FAVOR+'s
chunk kernel still spills 8 bytes on sm_80, none on sm_90).
Triton is optional: without it this module imports and
:func:`feature_reasons` says why the kernels cannot run (the limits both fused
families share are in :mod:`.fused_path`).
"""

from __future__ import annotations

import contextlib
import os

import torch
from torch import Tensor

from harness.spec import Param, Problem
from implementations._kernels.triton import fused_path

IMPORT_ERROR: str | None = None
"""Why the kernels failed to import (None: they imported); :func:`.fused_path.unavailable_reason`
reads it."""
try:  # the kernels import Triton, an optional dependency
    from implementations._kernels.triton import feature_kernels, linear_chunk
    from implementations._kernels.triton.kernel_launch import launch
except Exception as exc:  # absent or broken: the PyTorch path still runs, the reason says why
    feature_kernels = linear_chunk = None
    IMPORT_ERROR = fused_path.import_error(exc)

FUSED = Param(
    -1,
    "the path: -1 the fused Triton kernels for non-causal forward calls on CUDA without "
    "autograd, PyTorch otherwise; 1 the fused kernels (the causal chunk kernel too; "
    "refused where they cannot run); 2 as 1, the non-causal key pass combining its own "
    "partial states (two launches; a candidate); 0 PyTorch",
    minimum=-1,
    maximum=2,
)
AUTO_CAUSAL = False
"""Whether ``fused`` = -1 takes the causal chunk kernel (:func:`chunk_attention`) on CUDA. No:
it is a candidate until a GPU lease measures it beside fla-linear and the PyTorch path
(the claims of ``claims-linear-gpu-fla.toml``); a default changes only on a lease's numbers."""
CHUNK_FEATURES = 256
"""The most random features the causal chunk kernel takes: a program holds a chunk's whole
feature rows (C × m for the queries and the keys) and its m × BLOCK_V state in registers."""
FAVOR_CHUNK = dict(BLOCK_C=16, BLOCK_V=16, BLOCK_K=16, num_warps=8)
"""FAVOR+'s causal chunk tiles (:func:`chunk_tiles`): 16 positions, 16 value columns, x·W'ᵀ
made 16 columns of x at a time, 8 warps, BLOCK_D at least 32. ``benchmarks/aot_kernels.py
--workloads feature-performer-causal`` (m = 256, bf16, 2026-11-28): 236-238 registers and no
spill on sm_90 at D 16-256; on sm_80 255 registers and 8 bytes spilled at D 16 and 64-256.
Rejected (spill bytes sm_90 / sm_80 at D 64): the whole row of x and W' at once 176 / 12152;
32 value columns 240 / 528 (4 warps), 0 / 136 (8 warps); 4 warps with 16 columns 112 / 296;
16 warps 464 / 560 (the register cap halves); 32 columns of x at a time 8 / 24; D = 16 with
BLOCK_D 16 2312 / 6120."""
PROGRAMS = 1024
"""Programs the key pass aims at (splits × K/V heads × feature blocks): enough to fill a GPU
of ~130 SMs several times over, few enough that the partial states (F·(D + 2) floats per
split) stay a few per cent of the bytes of q, k and v at long n. A function of the shapes
only, so the workspace formula needs no device."""


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def call_reasons(device_type: str, causal: bool, backward: bool, dtype: torch.dtype,
                 head_dim: int, chunked: bool = False, features: int = 0) -> list[str]:
    """Why the fused kernels cannot run such a call (empty: they can): CUDA (or CPU tensors
    under ``TRITON_INTERPRET=1``), no autograd, fp32/fp16/bf16, D <= 256, Triton; causal
    only where the map has the chunk kernel (``chunked``), which holds a query's whole feature
    row in registers: FAVOR+'s ``features`` m <= :data:`CHUNK_FEATURES`.
    The one rule: a Problem's (:func:`feature_reasons`) and a direct call's
    (:func:`takes_fused`)."""
    out = []
    if device_type != "cuda" and not (device_type == "cpu" and _interpreted()):
        out.append(f"the fused kernels run on CUDA, not {device_type}")
    if causal and not chunked:
        out.append("the fused kernels cover non-causal calls")
    if causal and chunked and features > CHUNK_FEATURES:
        out.append(f"the causal chunk kernel holds at most {CHUNK_FEATURES} random features, "
                   f"not {features}")
    if backward:
        out.append("the fused kernels are forward-only (no autograd)")
    out += fused_path.shape_reasons(dtype, head_dim)
    reason = fused_path.unavailable_reason(IMPORT_ERROR)
    if reason:
        out.append(reason)
    return out


def feature_reasons(p: Problem, chunked: bool = False, features: int = 0) -> list[str]:
    """:func:`call_reasons` of a Problem."""
    return call_reasons(p.device_type, p.mask.causal, p.backward, p.dtype, p.head_dim, chunked,
                        features)


def path_reasons(p: Problem, chunked: bool = False, features: int = 0) -> list[str]:
    """The registry's extra reasons for ``fused``: a forced fused path that cannot run."""
    fused = int(p.param("fused", FUSED.default))
    if fused < 1:
        return []
    return [f"fused = {fused}: {r}" for r in feature_reasons(p, chunked, features)]


def runs_fused(p: Problem, chunked: bool = False, features: int = 0) -> bool:
    """Whether a call of ``p`` takes the fused path: ``fused`` = 1, or -1 on CUDA where the
    kernels can run it and the call is not causal (the causal chunk kernel is a candidate,
    forced with ``fused`` = 1, until a GPU's numbers choose it: :data:`AUTO_CAUSAL`)."""
    fused = int(p.param("fused", FUSED.default))
    if fused >= 1:
        return True
    return (fused == -1 and p.device_type == "cuda" and (AUTO_CAUSAL or not p.mask.causal)
            and not feature_reasons(p, chunked, features))


def tiles(head_dim: int, favor: bool) -> dict[str, int]:
    """The pinned block sizes: BLOCK_D (D to a power of two >= 16), BLOCK_F (features per
    program), BLOCK_N (key rows per tile), BLOCK_M (query rows per program) and warps.

    Registers: a key program holds its BLOCK_F × BLOCK_D accumulator, a BLOCK_N × BLOCK_D
    V tile and a BLOCK_N × BLOCK_F feature tile in fp32 (FAVOR+: also K and its logits); an
    output program a BLOCK_M × BLOCK_D accumulator and a BLOCK_M × BLOCK_F feature tile. At
    D <= 64: 64-row tiles and 64 features (each tile 32 registers a thread at 4 warps); wider
    heads halve the rows and the feature block, so each tile stays at or under 64 (FAVOR+'s
    output at D = 128 spilled on sm_80 with 64 rows: 32). D = 256: 32-row tiles of 256
    columns are 64 registers each at 4 warps and spilled: 8 warps; FAVOR+ there still spilled
    with 32 rows (K, V and logits tiles beside the accumulator): 16. ``state_stages``: the key
    pass's pipeline stages; φ = elu + 1 at D = 32 spilled 16 bytes on sm_90 with two (80
    registers), none with one (88)."""
    block_d = max(16, 1 << max(head_dim - 1, 0).bit_length())
    wide, rows = block_d > 64, 16 if favor and block_d > 128 else 32
    return dict(BLOCK_D=block_d, BLOCK_F=32 if wide else 64 if favor else block_d,
                BLOCK_N=rows if wide else 64,
                BLOCK_M=rows if block_d > 128 or (wide and favor) else 64,
                num_warps=8 if block_d > 128 else 4,
                state_stages=1 if block_d == 32 and not favor else 2)


def key_splits(kv_rows: int, n_k: int, features: int, t: dict[str, int]) -> tuple[int, int]:
    """(n_split, keys per split) of the key pass for B·H_kv = ``kv_rows``: about
    :data:`PROGRAMS` programs, each over whole BLOCK_N tiles, no split empty."""
    blocks = -(-n_k // t["BLOCK_N"])
    f_blocks = -(-features // t["BLOCK_F"])
    want = max(1, min(blocks, -(-PROGRAMS // max(kv_rows * f_blocks, 1))))
    per = -(-blocks // want) * t["BLOCK_N"]
    return -(-n_k // per), per


def feature_workspace_bytes(p: Problem, features: int, favor: bool) -> int:
    """Peak bytes of a fused call beyond its inputs and output, exact (fp32 buffers, all live
    together at the combine): the partial states (B·H_kv, n_split, F, D) and sums (B·H_kv,
    n_split, F), FAVOR+'s partial maxima (as many), and the combined state and sums."""
    kv = p.batch * p.n_kv_heads
    if kv == 0 or p.n_k == 0:
        return 0
    n_split, _ = key_splits(kv, p.n_k, features, tiles(p.head_dim, favor))
    per_split = features * (p.head_dim + 1 + int(favor))
    return 4 * kv * (n_split * per_split + features * (p.head_dim + 1))


def split_weights(w: Tensor) -> Tensor:
    """W' (m, D) -> (2, m, D) fp32: W' rounded to bf16 (exact in TF32) and the rest, so two
    TF32 products with an input that TF32 holds exactly give x·W'ᵀ to ~2^-19."""
    w = w.float()
    high = w.bfloat16().float()
    return torch.stack([high, w - high]).contiguous()


def partial_states(kv: int, n_split: int, features: int, d: int, favor: bool,
                   device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """The key pass's outputs, fp32, uninitialised: states (kv, n_split, F, D), sums (kv,
    n_split, F) and FAVOR+'s maxima (as the sums; φ = elu + 1: the sums again, unread)."""
    f32 = dict(dtype=torch.float32, device=device)
    part_s = torch.empty(kv, n_split, features, d, **f32)
    part_z = torch.empty(kv, n_split, features, **f32)
    return part_s, part_z, torch.empty(kv, n_split, features, **f32) if favor else part_z


def dot_precision(q: Tensor) -> str:
    """The products' ``input_precision`` for inputs like q: IEEE in the interpreter; on a GPU
    "tf32x3" (about fp32's accuracy) for fp32 inputs, TF32 for 16-bit ones (exact in TF32)."""
    if q.device.type == "cpu":
        return "ieee"
    return "tf32x3" if q.dtype == torch.float32 else "tf32"


def _unit_stride(*xs: Tensor) -> tuple[Tensor, ...]:
    """The inputs with unit column stride (the kernels' loads assume it), after checking the
    kernels imported (RuntimeError with the reason otherwise)."""
    if feature_kernels is None:
        raise RuntimeError(fused_path.unavailable_reason(IMPORT_ERROR))
    return tuple(x if x.stride(-1) == 1 else x.contiguous() for x in xs)


def _on_device(t: Tensor):
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def counters(device: torch.device, size: int) -> Tensor:
    """The key pass's per-(head, feature block) counters for ``combine`` (int32, zero between
    calls: the program that combines sets its counter back), one buffer per device and
    stream, grown as needed; made outside any call's workspace after the first. On the
    ``meta`` device (the AOT check's recording) a fresh one each call: kept, a data-less
    tensor would be read by whoever checks the counters next."""
    if device.type == "meta":
        return torch.zeros(max(size, 1024), dtype=torch.int32, device=device)
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream)
    have = _COUNTERS.get(key)
    if have is None or have.numel() < size:
        have = _COUNTERS[key] = torch.zeros(max(size, 1024), dtype=torch.int32, device=device)
    return have


_COUNTERS: dict[tuple[str, int], Tensor] = {}


def feature_attention(q: Tensor, k: Tensor, v: Tensor, w: Tensor | None = None,
                      scale: float = 0.0, combine: bool = False) -> Tensor:
    """Non-causal feature-map attention in three launches. q: (B, H, n_q, D), k/v: (B, H_kv,
    n_k, D), H a multiple of H_kv -> (B, H, n_q, D) in q's dtype. ``w`` None: φ = elu + 1;
    else FAVOR+ with W' = √scale·W as (2, m, D) fp32 (:func:`split_weights`) and softmax scale
    ``scale`` (the keys' −scale·|k|²/2). ``combine``: two launches, the key pass combining its
    own partial states (``fused`` = 2, a candidate; :func:`.feature_kernels.feature_state`'s
    ``COMBINE``). CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``."""
    q, k, v = _unit_stride(q, k, v)
    b, h, n_q, d = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    favor = w is not None
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if b * h * n_q == 0:
        return out
    if n_k == 0:
        return out.zero_()  # no key: zeros, as the reference
    features = w.shape[1] if favor else d
    t = tiles(d, favor)
    n_split, per = key_splits(b * h_kv, n_k, features, t)
    f32 = dict(dtype=torch.float32, device=q.device)
    part_s, part_z, part_m = partial_states(b * h_kv, n_split, features, d, favor, q.device)
    state = torch.empty(b * h_kv, features, d, **f32)
    sums = torch.empty(b * h_kv, features, **f32)
    w = w.contiguous() if favor else part_z  # unread without FAVOR+
    f_blocks = -(-features // t["BLOCK_F"])
    precision = dot_precision(q)
    common = dict(D=d, BLOCK_D=t["BLOCK_D"], BLOCK_F=t["BLOCK_F"],
                  MAP=int(favor), num_warps=t["num_warps"])
    kern = feature_kernels
    with _on_device(q):
        count = counters(q.device, b * h_kv * f_blocks) if combine else part_z
        launch("feature_state", kern.feature_state, (n_split, b * h_kv, f_blocks),
               (k, v, w, part_s, part_z, part_m, *k.stride()[:3], *v.stride()[:3], h_kv, n_k,
                per, features, scale / 2, state, sums, count),
               dict(common, BLOCK_N=t["BLOCK_N"], PRECISION=precision,
                    num_stages=t["state_stages"], COMBINE=combine))
        if not combine:
            launch("feature_combine", kern.feature_combine, (b * h_kv, f_blocks),
                   (part_s, part_z, part_m, state, sums, n_split, features),
                   dict(common, num_stages=1))
        launch("feature_output", kern.feature_output, (-(-n_q // t["BLOCK_M"]), b * h),
               (q, w, state, sums, out, *q.stride()[:3], *out.stride()[:3], h, h // h_kv, n_q,
                features),
               dict(common, BLOCK_M=t["BLOCK_M"], PRECISION=precision, num_stages=2))
    return out


def chunk_tiles(head_dim: int, features: int = 0) -> dict[str, int]:
    """The causal chunk kernel's pinned tiles (:mod:`.linear_chunk`): BLOCK_D (D to a power of
    two >= 16), BLOCK_C (positions per chunk: the chunk size C), BLOCK_V (value columns per
    program) and warps; the key pass (``feature_state``) keeps :func:`tiles`.

    Registers: a program holds its BLOCK_D × BLOCK_V state, the chunk's φ(Q) and φ(K) (BLOCK_C ×
    BLOCK_D), V and the output (BLOCK_C × BLOCK_V) and the C × C products, all fp32, and the
    compiled kernel needs ~150 registers a thread beyond them (the 32 × 32 tiles of D = 32 took
    166-180). Chosen from ``benchmarks/aot_kernels.py --workloads feature-linear-causal``'s
    registers and spills on sm_80 and sm_90 (bf16), the largest tiles without a spill: D <= 32:
    32 positions, 4 warps (166-180 registers); D = 64: 32 positions, 8 warps (198 sm_90, 248
    sm_80; 64 positions spilled at 4 and 8 warps); D = 128: 16 positions, 64 value columns, 8
    warps (198/240; 32 positions spilled); D = 256: 16 positions, 16 value columns, 8 warps
    (254/255; 32 value columns spilled, 16 warps too). One stage: two took about as many
    registers in the sweep and buffer the next tiles in shared memory; their speed is
    unmeasured.

    FAVOR+ (``features`` m > 0): BLOCK_F, m to a power of two >= 16, features in registers
    beside the state (BLOCK_F × BLOCK_V) and W' loaded per chunk; see :data:`FAVOR_CHUNK`."""
    block_d = max(16, 1 << max(head_dim - 1, 0).bit_length())
    if features:
        block_f = max(16, 1 << max(features - 1, 0).bit_length())
        return dict(FAVOR_CHUNK, BLOCK_D=max(block_d, 32), BLOCK_F=block_f)
    if block_d <= 32:
        return dict(BLOCK_D=block_d, BLOCK_C=32, BLOCK_V=block_d, num_warps=4)
    if block_d == 64:
        return dict(BLOCK_D=64, BLOCK_C=32, BLOCK_V=64, num_warps=8)
    if block_d == 128:
        return dict(BLOCK_D=128, BLOCK_C=16, BLOCK_V=64, num_warps=8)
    return dict(BLOCK_D=block_d, BLOCK_C=16, BLOCK_V=16, num_warps=8)


def chunk_workspace_bytes(p: Problem, features: int = 0) -> int:
    """Peak bytes of a fused causal call beyond its inputs and output, exact: the states before
    each split (B·H_kv, n_split, F, D) and their sums (B·H_kv, n_split, F), fp32 (the prefix
    is made in place); FAVOR+ (``features`` m > 0, F = m) also the splits' maxima (as the
    sums) and the heads' largest key logits (B·H_kv)."""
    kv = p.batch * p.n_kv_heads
    if kv == 0 or p.n_k == 0 or p.n_q == 0:
        return 0
    favor = features > 0
    f = features if favor else p.head_dim
    n_split, _ = key_splits(kv, p.n_k, f, tiles(p.head_dim, favor))
    return 4 * kv * (n_split * f * (p.head_dim + 1 + favor) + favor)


def chunk_attention(q: Tensor, k: Tensor, v: Tensor, w: Tensor | None = None,
                    scale: float = 0.0) -> Tensor:
    """Causal feature-map attention in three launches (:mod:`.linear_chunk`): the splits' key
    states, their exclusive prefix, the chunkwise outputs. q: (B, H, n_q, D), k/v: (B, H_kv,
    n_k, D), H a multiple of H_kv -> (B, H, n_q, D) in q's dtype, bottom-right (query i keeps
    keys j <= i + n_k - n_q; one that keeps none: zeros). ``w`` None: φ = elu + 1; else FAVOR+
    with W' as (2, m, D) fp32 (:func:`split_weights`, m <= :data:`CHUNK_FEATURES`) and softmax
    scale ``scale``, as :func:`feature_attention`. CUDA tensors, or CPU tensors under
    ``TRITON_INTERPRET=1``."""
    q, k, v = _unit_stride(q, k, v)
    b, h, n_q, d = q.shape
    h_kv, n = k.shape[1], k.shape[2]
    favor = w is not None
    features = w.shape[1] if favor else d
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if b * h * n_q == 0:
        return out
    off = n - n_q  # bottom-right: query i keeps keys j <= i + off
    if off < 0:  # the first -off queries keep no key: zeros, as the reference
        out[:, :, :-off].zero_()
        if n == 0:
            return out
    t, c = tiles(d, favor), chunk_tiles(d, features if favor else 0)
    n_split, per = key_splits(b * h_kv, n, features, t)
    part_s, part_z, part_m = partial_states(b * h_kv, n_split, features, d, favor, q.device)
    top = torch.empty(b * h_kv, dtype=torch.float32, device=q.device) if favor else part_z
    w = w.contiguous() if favor else part_z  # unread without FAVOR+
    f_blocks = -(-features // t["BLOCK_F"])
    precision = dot_precision(q)
    common = dict(D=d, BLOCK_D=t["BLOCK_D"], MAP=int(favor), num_warps=t["num_warps"])
    with _on_device(q):
        launch("feature_state", feature_kernels.feature_state, (n_split, b * h_kv, f_blocks),
               (k, v, w, part_s, part_z, part_m, *k.stride()[:3], *v.stride()[:3], h_kv, n,
                per, features, scale / 2, part_z, part_z, part_z),  # no combine: S, Z unread
               dict(common, BLOCK_F=t["BLOCK_F"], BLOCK_N=t["BLOCK_N"],
                    PRECISION=precision, num_stages=t["state_stages"]))
        launch("feature_scan", linear_chunk.feature_scan, (b * h_kv, f_blocks),
               (part_s, part_z, part_m, top, n_split, features),
               dict(common, BLOCK_F=t["BLOCK_F"], num_stages=1))
        launch("feature_chunk", linear_chunk.feature_chunk,
               (n_split, b * h, -(-d // c["BLOCK_V"])),
               (q, k, v, w, part_s, part_z, top, out, *q.stride()[:3], *k.stride()[:3],
                *v.stride()[:3], *out.stride()[:3], h, h // h_kv, n, off, per, features,
                scale / 2),
               dict(D=d, BLOCK_D=c["BLOCK_D"], BLOCK_F=c.get("BLOCK_F", c["BLOCK_D"]),
                    BLOCK_V=c["BLOCK_V"], BLOCK_C=c["BLOCK_C"], BLOCK_K=c.get("BLOCK_K", 16),
                    MAP=int(favor),
                    PRECISION=precision, num_warps=c["num_warps"], num_stages=1))
    return out


def takes_fused(fused: int, q: Tensor, k: Tensor, v: Tensor, causal: bool,
                chunked: bool = False, features: int = 0) -> bool:
    """Whether this call runs the fused kernels (``fused`` as :data:`FUSED`; ``chunked``: the
    map has the causal chunk kernel; ``features``: FAVOR+'s m); ``fused`` = 1 where they
    cannot run is refused in one line (ValueError)."""
    if fused == 0:
        return False
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    reasons = call_reasons(q.device.type, causal, grad, q.dtype, q.shape[-1], chunked, features)
    if fused == -1:
        return q.is_cuda and (AUTO_CAUSAL or not causal) and not reasons
    if reasons:
        raise ValueError(f"fused = {fused}: {'; '.join(reasons)}")
    return True
