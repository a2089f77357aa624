"""The fused Triton kernels against the float64 reference, every iteration space and mask
feature, odd sizes, n_q != n_k, fp32 and bf16, forward and gradients.

Without CUDA the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, set in
``tests/conftest.py``); with CUDA the same tests run the compiled kernels on the GPU.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")

from harness import registry
from harness.masks import MaskSpec, kept_pairs
from harness.oracle.agreement import grad_agreement, output_agreement
from harness.oracle.reference import reference_attention, reference_grads
from harness.spec import Problem
from implementations._kernels import triton_attn, triton_fwd
from implementations._kernels.triton_plan import band_executed_pairs, band_plan
from tests.conftest import make_qkv

# on a GPU these run the compiled kernels: part of the GPU proof (``pytest -m cuda``); on CPU
# they run in the interpreter as part of the ordinary suite
pytestmark = pytest.mark.cuda
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

SPECS = {  # id -> mask: each of the kernels' iteration spaces and every mask feature
    "full": MaskSpec(),
    "causal": MaskSpec(causal=True),
    "causal-w16": MaskSpec(causal=True, window=(15, 0)),
    "window-7-3": MaskSpec(window=(7, 3)),
    "causal-wide-40-0": MaskSpec(causal=True, window=(40, 0)),  # interior blocks unmasked
    "dilated-2": MaskSpec(causal=True, window=(6, 0), dilation=2),
    "dilated-3-uneven": MaskSpec(window=(4, 2), dilation=3),
    "longformer-causal": MaskSpec(causal=True, window=(8, 0), global_tokens=5),
    "longformer-dilated": MaskSpec(window=(3, 1), dilation=2, global_tokens=5),
    "bigbird-causal": MaskSpec(
        causal=True, window=(1, 0), block_size=16, random_blocks=2, global_tokens=16, seed=3
    ),
    "bigbird-32": MaskSpec(window=(1, 1), block_size=32, random_blocks=1, seed=1),
}
SHAPES = {
    "97": (2, 3, 97, 97, 59),
    "q33-k130": (1, 2, 33, 130, 64),
    "q130-k45": (1, 2, 130, 45, 64),
}


def _check(out, q, k, v, mask, dtype):
    result = output_agreement(out, reference_attention(q, k, v, mask), dtype)
    assert result["agree"], result


def test_runs_in_the_interpreter_without_cuda():
    if DEVICE == "cpu":
        assert os.environ.get("TRITON_INTERPRET") == "1"
        assert type(triton_fwd.band_fwd.fn).__name__ == "InterpretedFunction"


@pytest.mark.parametrize("shape_id", list(SHAPES))
@pytest.mark.parametrize("spec_id", list(SPECS))
def test_forward_fp32(spec_id, shape_id):
    mask, shape = SPECS[spec_id], SHAPES[shape_id]
    q, k, v = (t.to(DEVICE) for t in make_qkv(*shape, seed=7))
    out = triton_attn.triton_attention(q, k, v, mask)
    assert out.shape == q.shape and out.dtype == q.dtype
    _check(out, q, k, v, mask, torch.float32)


@pytest.mark.parametrize(
    "spec_id", ["causal", "causal-w16", "dilated-2", "longformer-causal", "bigbird-causal"]
)
def test_forward_bf16(spec_id):
    mask = SPECS[spec_id]
    q, k, v = (t.to(DEVICE) for t in make_qkv(2, 3, 97, 97, 64, dtype=torch.bfloat16, seed=8))
    _check(triton_attn.triton_attention(q, k, v, mask), q, k, v, mask, torch.bfloat16)


GRAD_CASES = [  # (spec id, shape): each backward iteration space, uneven lengths both ways
    ("full", (1, 2, 45, 70, 59)),
    ("causal", (1, 2, 70, 45, 64)),
    ("causal-wide-40-0", (1, 2, 97, 97, 59)),
    ("window-7-3", (1, 2, 45, 70, 59)),
    ("dilated-3-uneven", (1, 2, 70, 70, 64)),
    ("longformer-causal", (1, 2, 70, 45, 59)),
    ("longformer-dilated", (1, 2, 45, 70, 64)),
    ("bigbird-causal", (1, 2, 70, 70, 59)),
    ("bigbird-32", (1, 2, 45, 70, 64)),
]


@pytest.mark.parametrize(
    "spec_id,shape", [pytest.param(s, sh, id=f"{s}-{sh[2]}x{sh[3]}") for s, sh in GRAD_CASES]
)
def test_gradients_fp32(spec_id, shape):
    mask = SPECS[spec_id]
    q, k, v = (t.to(DEVICE).requires_grad_(True) for t in make_qkv(*shape, seed=10))
    g = torch.randn(q.shape, generator=torch.Generator().manual_seed(11)).to(DEVICE)
    grads = torch.autograd.grad(triton_attn.triton_attention(q, k, v, mask), (q, k, v), g)
    result = grad_agreement(grads, reference_grads(q, k, v, g, mask), torch.float32)
    assert result["grad_agree"], result


def test_gradients_bf16_dilated_longformer():
    mask = MaskSpec(causal=True, window=(9, 0), dilation=2, global_tokens=3)
    q, k, v = (
        t.to(DEVICE).requires_grad_(True)
        for t in make_qkv(1, 2, 64, 64, 64, dtype=torch.bfloat16, seed=12)
    )
    g = torch.randn(q.shape, generator=torch.Generator().manual_seed(13)).to(DEVICE, q.dtype)
    grads = torch.autograd.grad(triton_attn.triton_attention(q, k, v, mask), (q, k, v), g)
    result = grad_agreement(grads, reference_grads(q, k, v, g, mask), torch.bfloat16)
    assert result["grad_agree"], result


def test_strided_inputs_and_empty_rows():
    """(B, N, H, D) memory seen as (B, H, N, D) views; n_q > n_k causal leaves the first
    rows with no key: zeros, never NaN."""
    mask = MaskSpec(causal=True, window=(5, 0), dilation=2)
    q, k, v = (
        t.to(DEVICE).transpose(1, 2).contiguous().transpose(1, 2)
        for t in make_qkv(1, 2, 70, 30, 59, seed=9)
    )
    out = triton_attn.triton_attention(q, k, v, mask)
    assert torch.equal(out[..., :40, :], torch.zeros_like(out[..., :40, :]))
    _check(out, q, k, v, mask, torch.float32)


def test_executed_pairs_are_block_granular_and_o_n_w():
    """Causal window of 256 keys: the kernel's lanes are at least the kept pairs and, with
    128x64 blocks, at most (128 + 256 + 2·64) keys per row: O(n·w), not O(n²)."""
    mask, n = MaskSpec(causal=True, window=(255, 0)), 8192
    executed = band_executed_pairs(band_plan(mask, n, n), 128, 64)
    assert kept_pairs(mask, n, n) <= executed <= n * (128 + 256 + 128)
    dilated = MaskSpec(causal=True, window=(255, 0), dilation=2)
    assert band_executed_pairs(band_plan(dilated, n, n), 128, 64) <= executed * 1.05


def test_dispatch_cpu_keeps_the_tile_path():
    assert not triton_attn.use_triton("cpu", torch.float32, 64)
    assert not triton_attn.use_triton("cuda", torch.float64, 64)
    problem = Problem(1, 2, 64, 64, 16, mask=MaskSpec(causal=True, window=(3, 0)))
    assert registry.get("local").not_supported(problem) == []
