"""``flashinfer``: FlashInfer's attention kernels (``flashinfer-python``, CUDA), the paged decode
kernels a serving engineer picks (SGLang's and vLLM's default backends on many GPUs).

The plain form, ``single_prefill_with_kv_cache``, runs one sequence at a time ("NHD": (N, H,
D)); causal is bottom-right aligned as in :mod:`harness.masks`. The paged form reads the pool
of :mod:`harness.paged` as it lies (FlashInfer's ``kv_layout="NHD"`` pages): one token a step
through ``BatchDecodeWithPagedKVCacheWrapper``, several through
``BatchPrefillWithPagedKVCacheWrapper`` (causal within the step). A wrapper is planned (its
page indices, last-page lengths and work partition, on the host) once per block table and
lengths, as an engine plans once per step for all layers, and the calls after it run the
kernel alone. Not run on this project's CPU machines (FlashInfer has no CPU path).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from harness.masks import MaskSpec
from harness.registry import TinyCall, register
from harness.spec import HALF_DTYPES, Capabilities, Cost, Paged

WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's documented default workspace
_PLANNED: dict[tuple, object] = {}  # (block table, lengths, shapes) -> a planned wrapper
_KEEP = 8


def _availability() -> str | None:
    """Why it cannot run here; on a CUDA machine its probe (one tiny call: the import and a
    kernel) decides."""
    if not torch.cuda.is_available():
        return "needs a CUDA GPU (FlashInfer has no CPU path); pip install flashinfer-python"
    return None


def _wrapper(q: Tensor, k_pages: Tensor, block_table: Tensor, context_lens: Tensor, scale):
    """A wrapper planned for this block table and these lengths (module docstring)."""
    import flashinfer

    batch, heads, q_len, d = q.shape
    page = k_pages.shape[1]
    lens = context_lens.long()
    counts = (lens + page - 1) // page  # (B,) pages per sequence
    indptr = torch.zeros(batch + 1, dtype=torch.int32, device=q.device)
    indptr[1:] = counts.cumsum(0)
    width = torch.arange(block_table.shape[1], device=q.device)
    indices = block_table[width.unsqueeze(0) < counts.unsqueeze(1)].int()  # row by row
    last = (lens - (counts - 1) * page).int()
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=q.device)
    common = dict(num_qo_heads=heads, num_kv_heads=k_pages.shape[2], head_dim=d,
                  page_size=page, sm_scale=scale, q_data_type=q.dtype)  # fmt: skip
    if q_len == 1:
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, kv_layout="NHD")
        wrapper.plan(indptr, indices, last, **common)
        return wrapper
    qo = torch.arange(0, (batch + 1) * q_len, q_len, dtype=torch.int32, device=q.device)
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, kv_layout="NHD")
    wrapper.plan(qo, indptr, indices, last, causal=True, **common)
    return wrapper


def flashinfer_paged(q: Tensor, k_pages: Tensor, v_pages: Tensor, block_table: Tensor,
                     context_lens: Tensor, scale: float | None = None) -> Tensor:  # fmt: skip
    """FlashInfer's paged decode (or, several tokens a step, paged prefill) over the pool:
    q (B, H, q_len, D) -> (B, H, q_len, D) (:data:`harness.spec.PagedFn`)."""
    batch, heads, q_len, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    key = (block_table.data_ptr(), block_table._version, context_lens.data_ptr(),
           context_lens._version, tuple(q.shape), tuple(k_pages.shape), q.dtype, scale)  # fmt: skip
    if key not in _PLANNED:
        if len(_PLANNED) >= _KEEP:
            _PLANNED.pop(next(iter(_PLANNED)))
        _PLANNED[key] = _wrapper(q, k_pages, block_table, context_lens, scale)
    rows = q.transpose(1, 2).reshape(batch * q_len, heads, d)  # (B·q_len, H, D)
    out = _PLANNED[key].run(rows if q_len > 1 else rows.view(batch, heads, d), (k_pages, v_pages))
    return out.reshape(batch, q_len, heads, d).transpose(1, 2)


@register(
    "flashinfer",
    family="flash",
    caps=Capabilities(
        devices={"cuda"},
        dtypes=HALF_DTYPES,
        mask_features={"causal"},
        grouped_kv=True,
        backward=False,
        max_head_dim=256,
    ),
    cost=Cost(time_exponent=2, memory_exponent=1),
    description="FlashInfer single_prefill_with_kv_cache; paged: its batch decode wrapper",
    availability=_availability,
    probe=TinyCall(),
    paged=Paged(flashinfer_paged),
)
def flashinfer_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: MaskSpec, scale: float | None = None
) -> Tensor:
    """q: (B, H, n_q, D), k/v: (B, H_kv, n_k, D) -> (B, H, n_q, D), one sequence at a time."""
    import flashinfer

    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    outs = [
        flashinfer.single_prefill_with_kv_cache(
            qi.transpose(0, 1), ki.transpose(0, 1), vi.transpose(0, 1),
            causal=mask.causal, sm_scale=scale, kv_layout="NHD",
        ).transpose(0, 1)
        for qi, ki, vi in zip(q, k, v, strict=True)
    ]  # fmt: skip
    return torch.stack(outs)
