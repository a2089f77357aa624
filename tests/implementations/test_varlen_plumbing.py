"""The packed-document code of the CUDA-only plug-ins (``flash-attn``'s varlen call, ``xformers``'
``BlockDiagonalMask``), run on CPU against stand-ins of the libraries' documented APIs.

The real kernels do not run on this project's CPU machines; what can be checked here is our
side of the call: the (B, H, N, D) -> end-to-end layout, the boundaries handed over (B
sequences of the given documents), and the way back. Each stand-in computes what its library
documents: attention within each sequence of ``cu_seqlens`` / each block of the block-diagonal
mask, causal per sequence (equal query and key lengths), in float64.
"""

from __future__ import annotations

import itertools
import math
import sys
import types

import pytest
import torch

from harness.masks import MaskSpec
from harness.oracle.reference import reference_attention
from implementations.flash_attn_pkg import flash_attn_attention
from implementations.xformers_fmha import xformers_attention
from tests.conftest import make_qkv

DOCS = (30, 1, 47, 19)


def _per_sequence(q, k, v, bounds, causal, scale, window=(-1, -1)):
    """q/k/v: (T, H, D) sequences end to end at ``bounds`` -> (T, H, D), each on its own."""
    out = torch.empty_like(q)
    groups = q.shape[1] // k.shape[1]  # grouped K/V heads, shared as flash-attn shares them
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    for a, b in itertools.pairwise(bounds):
        s = torch.einsum("qhd,khd->hqk", q[a:b].double(), k[a:b].double()) * scale
        i, j = torch.arange(b - a)[:, None], torch.arange(b - a)[None, :]
        keep = torch.ones(b - a, b - a, dtype=torch.bool)
        if causal:
            keep &= j <= i
        if window[0] >= 0:
            keep &= j >= i - window[0]
        if window[1] >= 0:
            keep &= j <= i + window[1]
        p = torch.softmax(s.masked_fill(~keep, float("-inf")), -1).nan_to_num(0.0)
        out[a:b] = torch.einsum("hqk,khd->qhd", p, v[a:b].double()).to(q.dtype)
    return out


def _fake_flash_attn(calls: list) -> types.ModuleType:
    module = types.ModuleType("flash_attn")

    def flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=0.0,
                               softmax_scale=None, causal=False, window_size=(-1, -1)):
        assert cu_q.dtype == torch.int32 and torch.equal(cu_q, cu_k)
        bounds = cu_q.tolist()
        assert max_q == max_k == max(b - a for a, b in itertools.pairwise(bounds))
        calls.append(bounds)
        return _per_sequence(q, k, v, bounds, causal, softmax_scale, window_size)

    module.flash_attn_varlen_func = flash_attn_varlen_func
    module.flash_attn_func = None  # the packed path must not use it
    return module


def _fake_xformers(calls: list) -> dict[str, types.ModuleType]:
    xformers, ops = types.ModuleType("xformers"), types.ModuleType("xformers.ops")
    fmha, attn_bias = types.ModuleType("xformers.ops.fmha"), types.ModuleType("attn_bias")

    class BlockDiagonalMask:
        causal = False

        def __init__(self, seqlens):
            self.bounds = [0, *torch.tensor(seqlens).cumsum(0).tolist()]

        @classmethod
        def from_seqlens(cls, q_seqlen, kv_seqlen=None):
            assert kv_seqlen is None or list(kv_seqlen) == list(q_seqlen)
            return cls(q_seqlen)

        def make_causal(self):
            self.causal = True
            return self

    def memory_efficient_attention(q, k, v, attn_bias=None, scale=None):
        assert q.shape[0] == 1  # packed: one row of every sequence
        calls.append(attn_bias.bounds)
        out = _per_sequence(q[0], k[0], v[0], attn_bias.bounds, attn_bias.causal, scale)
        return out[None]

    attn_bias.BlockDiagonalMask = BlockDiagonalMask
    fmha.attn_bias = attn_bias
    ops.fmha, ops.memory_efficient_attention = fmha, memory_efficient_attention
    xformers.ops = ops
    return {"xformers": xformers, "xformers.ops": ops, "xformers.ops.fmha": fmha,
            "xformers.ops.fmha.attn_bias": attn_bias}


@pytest.mark.parametrize("kv_heads", [3, 1])
@pytest.mark.parametrize("mask", [MaskSpec(causal=True, documents=DOCS),
                                  MaskSpec(causal=True, window=(5, 0), documents=DOCS),
                                  MaskSpec(documents=DOCS)], ids=lambda m: m.describe())
def test_flash_attn_varlen_call(monkeypatch, mask, kv_heads):
    calls: list = []
    monkeypatch.setitem(sys.modules, "flash_attn", _fake_flash_attn(calls))
    q, k, v = make_qkv(2, 3, 97, 97, 16, kv_heads=kv_heads, seed=3)
    out = flash_attn_attention(q, k, v, mask)
    assert calls == [[0, 30, 31, 78, 97, 127, 128, 175, 194]]  # 2 sequences of 4 documents
    ref = reference_attention(q, k, v, mask)
    assert float((out.double() - ref).abs().max()) < 1e-5


@pytest.mark.parametrize("mask", [MaskSpec(causal=True, documents=DOCS), MaskSpec(documents=DOCS)],
                         ids=lambda m: m.describe())
def test_xformers_block_diagonal_call(monkeypatch, mask):
    calls: list = []
    for name, module in _fake_xformers(calls).items():
        monkeypatch.setitem(sys.modules, name, module)
    q, k, v = make_qkv(2, 3, 97, 97, 16, seed=4)
    out = xformers_attention(q, k, v, mask, scale=1 / math.sqrt(16))
    assert calls == [[0, 30, 31, 78, 97, 127, 128, 175, 194]]
    ref = reference_attention(q, k, v, mask)
    assert float((out.double() - ref).abs().max()) < 1e-5
