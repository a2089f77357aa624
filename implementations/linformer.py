"""``linformer``: Linformer (Wang et al. 2020), keys and values projected along the sequence.

    out = softmax(s · Q (E K)ᵀ) (F V),   E, F: (k, n_k)

so attention runs over k projected rows instead of n_k keys: O(n·k·D) time, O(k·D) extra
memory per head beyond the projections. E and F stand for the learned projections of a trained
model; here they are seeded random Johnson–Lindenstrauss projections (entries N(0, 1/k), as in
the paper's Theorem 1), one pair per call shared by every batch and head (the paper's head-wise
sharing), drawn in float32 on the CPU from ``mask.seed`` so every device and dtype sees the same
values. They are compulsory bytes (``io_bytes``): 2·k·n_k elements read per call. They are
made once per (k, n_k, seed, device, dtype) and kept on the device (:func:`cached_projections`),
so a direct call makes no host work and no copy after its first; the runner's ``prepare``
takes them from the same cache, outside the timed call.

A projection mixes all positions, so there is no causal Linformer (it declares no ``causal``),
and ``k > n_k`` would project the keys *up*: more work than exact attention for a worse answer,
refused with a reason. The scores run through SDPA (its fused CPU/CUDA kernels, grouped K/V
native); the projections run in float32 for half-precision inputs on the CPU.

The agreement check holds it to :func:`linformer_reference` (its own definition with the same
E and F, in float64); its distance from exact softmax attention is the measured ``approx_err``.
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import Tensor

from harness.masks import MaskSpec
from harness.registry import register
from harness.spec import FLOAT_DTYPES, HALF_DTYPES, AttnFn, Capabilities, Cost, Param, Problem
from implementations._feature_maps import check_inputs

PROJECTED = Param(256, "rows k that keys and values are projected to (k <= n_k)", minimum=1)


def projection_dtype(dtype: torch.dtype, device: str) -> torch.dtype:
    """The dtype E and F multiply in: float32 for half inputs on the CPU (no fast half GEMM
    there), the input dtype elsewhere (CUDA half GEMMs accumulate in float32)."""
    return torch.float32 if dtype in HALF_DTYPES and device == "cpu" else dtype


def projections(
    projected_len: int, n_k: int, seed: int, device: torch.device | str, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """E, F: (k, n_k) with N(0, 1/k) entries from ``seed`` (float32 on the CPU, then moved)."""
    gen = torch.Generator().manual_seed(seed)
    e, f = (torch.randn(projected_len, n_k, generator=gen) for _ in range(2))
    std = 1.0 / math.sqrt(projected_len)
    return e.mul_(std).to(device, dtype), f.mul_(std).to(device, dtype)


PROJECTION_CACHE_BYTES = 256 * 2**20
"""The projections kept between calls, least recently used first out, newest always kept.
256 MiB holds every pair of an octave sweep n = 256..64k at k = 256 in float32 (255.5 MiB; the
64k pair alone is 128 MiB), so a sweep's direct calls draw each pair once, and stays small
beside a GPU's memory; an entry over the bound alone is still kept (its call needs it)."""
_PROJECTIONS: OrderedDict[tuple, tuple[Tensor, Tensor]] = OrderedDict()


def cached_projections(
    projected_len: int, n_k: int, seed: int, device: torch.device | str, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """:func:`projections`, made once per (k, n_k, seed, device, dtype) and kept on the device
    within :data:`PROJECTION_CACHE_BYTES`."""
    key = (projected_len, n_k, seed, torch.device(device), dtype)
    pair = _PROJECTIONS.get(key)
    if pair is not None:
        _PROJECTIONS.move_to_end(key)
        return pair
    pair = _PROJECTIONS[key] = projections(projected_len, n_k, seed, device, dtype)
    while len(_PROJECTIONS) > 1 and _cached_bytes() > PROJECTION_CACHE_BYTES:
        _PROJECTIONS.popitem(last=False)
    return pair


def _cached_bytes() -> int:
    return sum(2 * e.numel() * e.element_size() for e, _ in _PROJECTIONS.values())


def project(q: Tensor, k: Tensor, v: Tensor, e: Tensor, f: Tensor, scale: float | None) -> Tensor:
    """q: (B, H, n_q, D), k/v: (B, H_kv, n_k, D), e/f: (k, n_k) -> (B, H, n_q, D)."""
    pk = (e @ k.to(e.dtype)).to(q.dtype)  # (B, H_kv, k, D): a batched GEMM, no copy of E
    pv = (f @ v.to(f.dtype)).to(q.dtype)
    gqa = k.shape[1] != q.shape[1]
    return F.scaled_dot_product_attention(q, pk, pv, scale=scale, enable_gqa=gqa)


def linformer_reference(q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec,
                        rows: Tensor | None = None, **params: object) -> Tensor:
    """The definition in the inputs' dtype (float64 inputs: the float64 reference): the same
    E and F (``projected_len`` rows), ``softmax(s·Q (EK)ᵀ) (FV)`` written out; ``rows`` limits
    it to those query rows."""
    e, f = projections(int(params["projected_len"]), k.shape[-2], mask.seed, q.device, q.dtype)
    group = q.shape[1] // k.shape[1]
    pk = (e @ k).repeat_interleave(group, dim=1)  # (B, H, k, D)
    pv = (f @ v).repeat_interleave(group, dim=1)
    q = q if rows is None else q[..., rows.to(q.device), :]
    s = 1.0 / math.sqrt(q.shape[-1])  # the harness passes no scale: the default
    return torch.softmax(q @ pk.transpose(-2, -1) * s, dim=-1) @ pv


def _k(p: Problem) -> int:
    return int(p.param("projected_len", PROJECTED.default))


def _reasons(p: Problem) -> list[str]:
    if _k(p) > p.n_k:
        return [
            f"projected_len k = {_k(p)} > n_k = {p.n_k}: Linformer projects the keys down to "
            "k rows; projecting them up costs more than exact attention"
        ]
    return []


def _prepare(p: Problem) -> AttnFn:
    """E and F on the device (from the cache), outside the timed call."""
    dtype = projection_dtype(p.dtype, p.device_type)
    e, f = cached_projections(_k(p), p.n_k, p.mask.seed, p.device, dtype)
    return lambda q, k, v: project(q, k, v, e, f, None)


def _flops(p: Problem) -> int:
    """E K and F V (2·k·n_k·D each per K/V head) plus attention over k rows (4·n_q·k·D per
    query head)."""
    k, d = _k(p), p.head_dim
    return 4 * p.batch * p.n_kv_heads * k * p.n_k * d + 4 * p.batch * p.heads * p.n_q * k * d


def cpu_sdpa_packs(dtype: torch.dtype) -> bool:
    """Whether SDPA's CPU flash kernel takes its oneDNN (brgemm) path for ``dtype``, which
    copies K and V into a packed layout: where oneDNN may run AMX for the dtype (bfloat16:
    AMX tiles; float16: AMX-FP16), as torch's cpuinfo flags report, oneDNN is enabled, and
    ``ONEDNN_MAX_CPU_ISA`` (or ``DNNL_MAX_CPU_ISA``) does not cap it below AMX. An Intel Xeon
    with AVX512-bf16 but without AMX takes the plain path (measured by capping this AMX
    machine at ``AVX512_CORE_BF16``: exactly the figures of a Xeon without AMX)."""
    if dtype not in HALF_DTYPES or not torch.backends.mkldnn.is_available():
        return False
    if not torch.backends.mkldnn.enabled:
        return False
    flag = "_is_amx_tile_supported" if dtype == torch.bfloat16 else "_is_amx_fp16_supported"
    if not getattr(torch.cpu, flag, lambda: False)():
        return False
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "ALL"
    cap = cap.upper()
    needed = "AMX" if dtype == torch.bfloat16 else "AMX_FP16"
    return cap in ("ALL", "DEFAULT") or needed in cap


def sdpa_buffers(p: Problem, n_kv: int) -> int:
    """SDPA's own workspace over ``n_kv`` keys: the log-sum-exp per query row (float32) and,
    on the CPU, its flash kernel's per-thread blocks (q_split rows × (min(n_kv, 512) scores +
    D accumulators + 2 statistics) in float32; for half inputs also a half copy of the scores
    per thread), as measured with torch 2.13 at 1 and 2 threads. Where the kernel packs
    (:func:`cpu_sdpa_packs`, and n_q, n_kv >= 64) it also holds one half copy of K (head dim
    rounded up to even) and of V and per thread a min(n_kv, 512) × D half block (plus, for an
    odd D, a q_split × (D + 1) half block of queries)."""
    lse = p.batch * p.heads * p.n_q * 4
    if p.device_type != "cpu":
        return lse
    q_split = min(256 if p.n_q >= 768 else 64 if p.n_q >= 192 else 32, p.n_q)
    kv, d = min(n_kv, 512), p.head_dim
    block = q_split * (kv + d + 2) * 4
    copies = 0
    if p.dtype in HALF_DTYPES:
        block += q_split * kv * 2
    if cpu_sdpa_packs(p.dtype) and p.n_q >= 64 and n_kv >= 64:
        even = d + d % 2
        copies = p.batch * p.n_kv_heads * n_kv * (even + d) * 2
        block += kv * d * 2 + (q_split * even * 2 if d % 2 else 0)
    return lse + copies + torch.get_num_threads() * block


def _workspace(p: Problem) -> int:
    """Peak bytes beyond inputs and output: the projected K and V (k·D per K/V head each) with
    SDPA's buffers beside the output; for half inputs on the CPU, first a float32 copy of K
    (then V) with its float32 projection beside the already rounded other one."""
    kd = p.batch * p.n_kv_heads * _k(p) * p.head_dim
    size = p.dtype.itemsize
    out = p.batch * p.heads * p.n_q * p.head_dim * size
    final = 2 * kd * size + sdpa_buffers(p, _k(p)) + out
    cast = 0
    if projection_dtype(p.dtype, p.device_type) != p.dtype:
        cast = p.batch * p.n_kv_heads * p.n_k * p.head_dim * 4 + kd * (4 + size)
    return max(final, cast) - out


@register(
    "linformer",
    family="low-rank",
    caps=Capabilities(dtypes=FLOAT_DTYPES, mask_features=frozenset(), grouped_kv=True),
    cost=Cost(
        time_exponent=1,
        memory_exponent=1,
        memory_model=_workspace,
        flops=_flops,
        io_bytes=lambda p: 2 * _k(p) * p.n_k * projection_dtype(p.dtype, p.device_type).itemsize,
    ),
    description="Linformer: K and V projected along the sequence to k rows, O(n·k·D)",
    params={"projected_len": PROJECTED},
    extra_reasons=_reasons,
    prepare=_prepare,
    reference=linformer_reference,
)
def linformer_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float | None = None,
    projected_len: int = 256,
) -> Tensor:
    """q: (B, H, n_q, D), k/v: (B, H_kv, n_k, D) -> (B, H, n_q, D); E and F from the device
    cache (:func:`cached_projections`): drawn on the first call of a shape only."""
    check_inputs(q, k, v)
    dtype = projection_dtype(q.dtype, q.device.type)
    e, f = cached_projections(projected_len, k.shape[-2], mask.seed, q.device, dtype)
    return project(q, k, v, e, f, scale)
