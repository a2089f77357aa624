"""The float64 oracle itself: chunking, row selection, empty rows, gradients."""

from __future__ import annotations

import math

import torch

from harness.masks import MaskSpec, dense_mask
from harness.oracle.reference import naive_attention, reference_attention, reference_grads
from tests.conftest import make_qkv


def dense_softmax(q, k, v, mask: MaskSpec):
    """Unchunked textbook attention in float64 (what the chunked oracle must equal)."""
    q, k, v = q.double(), k.double(), v.double()
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~dense_mask(mask, q.shape[-2], k.shape[-2]), float("-inf"))
    return torch.softmax(s, -1).nan_to_num(0.0) @ v


def test_chunked_equals_unchunked():
    q, k, v = make_qkv(2, 3, 97, 97, 59, seed=1)
    spec = MaskSpec(causal=True, window=(20, 0))
    expected = dense_softmax(q, k, v, spec)
    assert torch.allclose(reference_attention(q, k, v, spec, chunk=13), expected, atol=1e-12)


def test_rows_select_the_same_values():
    q, k, v = make_qkv(1, 2, 50, 70, 16, seed=2)
    rows = torch.tensor([0, 7, 49])
    full = reference_attention(q, k, v, MaskSpec(causal=True))
    picked = reference_attention(q, k, v, MaskSpec(causal=True), rows=rows)
    assert torch.allclose(picked, full[..., rows, :], atol=1e-12, rtol=0)


def test_rows_without_keys_are_zero_not_nan():
    q, k, v = make_qkv(1, 1, 6, 3, 8, seed=3)
    out = reference_attention(q, k, v, MaskSpec(causal=True))
    assert not out.isnan().any()
    assert out[..., :3, :].abs().max() == 0 and out[..., 3:, :].abs().min() > 0


def test_output_rows_are_convex_combinations_of_v():
    q, k, v = make_qkv(1, 2, 40, 40, 8, seed=4)
    out = reference_attention(q, k, v, MaskSpec(causal=True))
    assert (out <= v.double().amax(-2, keepdim=True) + 1e-12).all()
    assert (out >= v.double().amin(-2, keepdim=True) - 1e-12).all()


def test_grouped_kv_repeats_heads():
    q, k, v = make_qkv(1, 4, 9, 9, 8, kv_heads=2, seed=5)
    expected = dense_softmax(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), MaskSpec())
    assert torch.allclose(reference_attention(q, k, v), expected, atol=1e-12)


def test_chunked_grads_equal_autograd_of_the_dense_formula():
    q, k, v = make_qkv(1, 2, 33, 45, 12, dtype=torch.float64, seed=6, requires_grad=True)
    spec = MaskSpec(causal=True, window=(9, 2))
    g = torch.randn(q.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    expected = torch.autograd.grad(dense_softmax(q, k, v, spec), (q, k, v), g)
    got = reference_grads(q, k, v, g, spec, chunk=8)
    for a, b in zip(got, expected, strict=True):
        assert torch.allclose(a, b, atol=1e-12)


def test_naive_same_dtype_error_is_small_but_nonzero_in_half():
    q, k, v = make_qkv(1, 2, 64, 64, 32, dtype=torch.bfloat16, seed=8)
    err = (naive_attention(q, k, v).double() - reference_attention(q, k, v)).abs().max()
    assert 0 < err < 5e-2


def test_packed_documents_equal_each_document_on_its_own():
    """Rule 5: the oracle over packed documents is the oracle over each document alone (with
    every rule counted from the document's start: windows, globals, prefix)."""
    docs = (30, 1, 47, 19)
    packed = MaskSpec(causal=True, window=(5, 0), global_tokens=(0, 3), prefix_len=4,
                      documents=docs)
    alone = MaskSpec(causal=True, window=(5, 0), global_tokens=(0, 3), prefix_len=4)
    q, k, v = make_qkv(1, 2, 97, 97, 16, seed=9)
    out, start = reference_attention(q, k, v, packed), 0
    for n in docs:
        part = (slice(None), slice(None), slice(start, start + n))
        expected = reference_attention(q[part], k[part], v[part], alone)
        assert torch.allclose(out[part], expected, atol=1e-12, rtol=0)
        start += n


def test_the_oracle_is_the_naive_computation_on_float64_copies():
    """Every argument reaches the float64 computation in its place; gradients reach the
    float32 inputs."""
    q, k, v = make_qkv(1, 2, 33, 41, 9, seed=9, requires_grad=True)
    rows, mask = torch.tensor([0, 5, 32]), MaskSpec(causal=True, window=(6, 2))
    out = reference_attention(q, k, v, mask, 0.3, rows, 7)
    q64, k64, v64 = q.double(), k.double(), v.double()
    assert out.dtype == torch.float64 and out.shape == (1, 2, 3, 9)
    assert torch.equal(out, naive_attention(q64, k64, v64, mask, 0.3, rows, 7))
    assert not torch.equal(out, naive_attention(q64, k64, v64, mask, None, rows))  # scale used
    out.sum().backward()
    assert q.grad.dtype == torch.float32 and q.grad.abs().sum() > 0
