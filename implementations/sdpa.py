"""PyTorch ``scaled_dot_product_attention``: default dispatch and each backend pinned.

The mask arrives reduced (:func:`harness.masks.reduced`): a causal call of one query is a plain
call here. Causal with ``n_q == n_k`` uses ``is_causal=True`` (fused kernels); with ``n_q != n_k``
it uses ``causal_lower_right`` so the alignment matches :mod:`harness.masks` (plain
``is_causal`` is top-left there). Grouped K/V (``kv_heads < heads``) is passed as it is, with
``enable_gqa=True``: no backend call here copies K/V across heads (the MATH backend repeats them
itself, which its memory model counts). Backends that cannot run a problem say why before it
runs; the pinned backends' availability comes from one tiny real call per device type (a
backend compiled out of this torch build, or without a kernel for this GPU, fails that call).
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass, field
from functools import cache

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from harness.masks import MaskSpec, dense_mask
from harness.paged import check_layout, gather_padded, key_mask
from harness.registry import TinyCall, register
from harness.spec import HALF_DTYPES, Capabilities, Cost, Paged, Problem

# We handle n_q > n_k ourselves (empty rows -> zeros), so this warning is noise.
warnings.filterwarnings("ignore", message="Lower right causal bias will produce NaNs")


def _sdpa(q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float | None) -> Tensor:
    """q: (B, H, n_q, D), k/v: (B, H_kv, n_k, D) -> (B, H, n_q, D)."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    gqa = k.shape[1] != q.shape[1]
    if not mask.causal:
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=gqa)
    if n_q == n_k:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=_lower_right(n_q, n_k, q.device, gqa), scale=scale, enable_gqa=gqa
    )
    # queries above the first key (n_q > n_k) keep no key: zeros, as the mask semantics say
    return out.nan_to_num(0.0) if n_q > n_k else out


def _lower_right(n_q: int, n_k: int, device: torch.device, gqa: bool):
    """The bottom-right causal mask of n_q queries over n_k keys: torch's ``CausalBias`` (fused
    on CUDA, a materialized (n_q, n_k) bool mask on CPU), or that bool mask itself where this
    torch's ``CausalBias`` does not pass ``enable_gqa`` on (it takes it since torch 2.5.1)."""
    # imported here: torch.nn.attention.bias pulls in torch._dynamo (3.8 s of `attnbench list`
    # on the H100 of 2026-11-26), which listing and most runs never use
    from torch.nn.attention.bias import causal_lower_right

    if gqa and not _bias_takes_gqa():
        return dense_mask(MaskSpec(causal=True), n_q, n_k, device)
    return causal_lower_right(n_q, n_k)


@cache
def _bias_takes_gqa() -> bool:
    """Whether this torch's ``CausalBias`` passes ``enable_gqa`` on to its kernels."""
    from torch.nn.attention.bias import CausalBias

    return "enable_gqa" in inspect.signature(CausalBias._dispatch).parameters


def _pinned(backend: SDPBackend):
    def run(q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float | None = None) -> Tensor:
        with sdpa_kernel(backend):
            return _sdpa(q, k, v, mask, scale)

    run.__name__ = f"sdpa_{backend.name.lower()}"
    run.__doc__ = f"SDPA pinned to {backend.name}. q: (B, H, n_q, D) -> (B, H, n_q, D)."
    return run


def _cuda_fused_reasons(name: str, max_head_dim: int):
    """Shape rules of the fused CUDA kernels, stated before a point runs."""

    def reasons(p: Problem) -> list[str]:
        out = []
        if p.device_type == "cuda":
            if p.dtype not in HALF_DTYPES:
                out.append(f"{name} on CUDA needs float16/bfloat16, got {p.dtype}")
            if p.head_dim > max_head_dim or p.head_dim % 8:
                out.append(f"{name} on CUDA needs head_dim <= {max_head_dim} and a multiple of 8")
        return out

    return reasons


def _default(q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float | None = None) -> Tensor:
    """SDPA with PyTorch's own backend choice. q: (B, H, n_q, D) -> (B, H, n_q, D)."""
    return _sdpa(q, k, v, mask, scale)


def _math_workspace(p: Problem) -> int:
    """MATH's workspace: the fp32 scores and their softmax (B, H, n_q, n_k), q and k scaled by
    √scale (copies in the inputs' dtype) and, when K/V are grouped, K/V repeated across heads
    (it expands them itself)."""
    size = p.dtype.itemsize
    scores = 2 * p.batch * p.heads * p.n_q * p.n_k * 4
    scaled = p.batch * p.heads * (p.n_q + p.n_k) * p.head_dim * size
    repeated = 2 * p.batch * p.heads * p.n_k * p.head_dim * size
    return scores + scaled + (repeated if p.n_kv_heads != p.heads else 0)


_CAUSAL = frozenset({"causal"})
FUSED_COST = Cost(time_exponent=2, memory_exponent=1)  # exact, without the n x n scores


def _caps(**only: object) -> Capabilities:
    """What every SDPA entry runs (causal, grouped K/V), with ``only``'s devices or dtypes."""
    return Capabilities(mask_features=_CAUSAL, grouped_kv=True, **only)


@dataclass(frozen=True)
class Pinned:
    """One SDPA backend registered as ``name``, pinned with ``sdpa_kernel``.

    ``only``: the Capabilities fields it narrows (devices, dtypes); ``fused_head_dim``: the
    head-dim limit of its fused CUDA kernel (with the half-precision rule), None for none;
    ``probe``: whether its availability comes from a tiny real call."""

    name: str
    backend: SDPBackend
    description: str
    cost: Cost = FUSED_COST
    only: dict = field(default_factory=dict)
    fused_head_dim: int | None = None
    probe: bool = True

    def register(self) -> None:
        fused = self.fused_head_dim
        register(
            self.name,
            family="sdpa",
            caps=_caps(**self.only),
            cost=self.cost,
            description=self.description,
            extra_reasons=None if fused is None else _cuda_fused_reasons(self.backend.name, fused),
            probe=TinyCall() if self.probe else None,
        )(_pinned(self.backend))


def sdpa_padded(
    q: Tensor,
    k_pages: Tensor,
    v_pages: Tensor,
    block_table: Tensor,
    context_lens: Tensor,
    scale: float | None = None,
) -> Tensor:
    """SDPA on the padded batch, what a user writes first over a paged cache: every sequence's
    pages gathered to the longest table's slots, (B, H_kv, max_pages·page, D), a boolean mask
    hiding the padding (and the step's future). q (B, H, q_len, D) -> (B, H, q_len, D)."""
    check_layout(q, k_pages, v_pages, block_table, context_lens)
    n_keys = block_table.shape[1] * k_pages.shape[1]
    k, v = gather_padded(k_pages, block_table, n_keys), gather_padded(v_pages, block_table, n_keys)
    mask = key_mask(context_lens, q.shape[2], n_keys)  # (B, 1, q_len, n_keys)
    gqa = k.shape[1] != q.shape[1]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)


register(
    "sdpa",
    family="sdpa",
    caps=_caps(),
    cost=FUSED_COST,
    description="F.scaled_dot_product_attention, PyTorch's backend choice",
    paged=Paged(sdpa_padded, padded=True, layouts=("NHD", "HND")),
)(_default)

PINNED = (
    Pinned(
        "sdpa-math",
        SDPBackend.MATH,
        "SDPA MATH backend (materializes scores in fp32)",
        cost=Cost(time_exponent=2, memory_exponent=2, memory_model=lambda p: _math_workspace(p)),
        probe=False,
    ),
    Pinned(
        "sdpa-flash",
        SDPBackend.FLASH_ATTENTION,
        "SDPA FLASH_ATTENTION backend (CPU flash kernel or CUDA FlashAttention-2)",
        fused_head_dim=256,
    ),
    Pinned(
        "sdpa-efficient",
        SDPBackend.EFFICIENT_ATTENTION,
        "SDPA EFFICIENT_ATTENTION backend (xformers/CUTLASS kernel; CUDA only)",
        only={"devices": {"cuda"}},
    ),
    Pinned(
        "sdpa-cudnn",
        SDPBackend.CUDNN_ATTENTION,
        "SDPA CUDNN_ATTENTION backend (cuDNN fused attention; CUDA only)",
        only={"devices": {"cuda"}, "dtypes": HALF_DTYPES},
        fused_head_dim=128,
    ),
)
for _backend in PINNED:
    _backend.register()
