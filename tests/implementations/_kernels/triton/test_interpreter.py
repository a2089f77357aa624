"""Triton's interpreter without its idle work (:mod:`.interpreter`): the same bits as Triton's
own interpreter (its helper patches, overflow checks, dtype table, block types, tensor shapes,
type checks and broadcasts), every helper of the band kernels, a reduction's combine function
and the feature-map kernels (FAVOR+'s causal chunks: broadcasts of every kind) run."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from harness import registry
from harness.masks import MaskSpec
from implementations._kernels.triton import interpreter, masked_attention
from tests.conftest import make_qkv

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's (CPU)")


def _call() -> tuple[torch.Tensor, ...]:
    """A forward and backward through every clause (globals, dilation, documents, a prefix),
    grouped K/V heads."""
    mask = MaskSpec(causal=True, window=(5, 0), dilation=2, prefix_len=6, global_tokens=(1,),
                    documents=(10, 14))
    q, k, v = (t.requires_grad_(True) for t in make_qkv(1, 2, 24, 24, 16, kv_heads=1, seed=71))
    out = masked_attention.triton_attention(q, k, v, mask)
    g = torch.randn(q.shape, generator=torch.Generator().manual_seed(72))
    return (out.detach(), *torch.autograd.grad(out, (q, k, v), g))


def _features() -> tuple[torch.Tensor, ...]:
    """FAVOR+ through the causal chunk kernels (its features made in them), grouped K/V."""
    q, k, v = make_qkv(1, 2, 24, 24, 16, kv_heads=1, seed=73)
    with torch.no_grad():
        return (registry.get("performer")(q, k, v, MaskSpec(causal=True, seed=3), features=20,
                                          fused=1),)


def _tritons_own(monkeypatch) -> None:
    """Put back what :func:`interpreter.lighten` replaced (for this test)."""
    from triton.runtime import interpreter as triton_interpreter

    own = interpreter.TRITONS_OWN
    monkeypatch.setattr(triton_interpreter.GridExecutor, "__call__", own["grid"])
    monkeypatch.setattr(triton_interpreter.InterpretedFunction, "__call__", own["helper"])
    monkeypatch.setattr(triton_interpreter.interpreter_builder, "options", own["options"])
    monkeypatch.setattr(triton_interpreter, "_get_np_dtype", own["np_dtype"])
    monkeypatch.setattr(interpreter.tl.block_type, "__init__", own["block_type"])
    monkeypatch.setattr(interpreter.tl.tensor, "__init__", own["tensor"])
    semantic = triton_interpreter.interpreter_semantic
    monkeypatch.setattr(semantic, "broadcast_impl_value", own["broadcast"])
    monkeypatch.setattr(semantic, "binary_op_type_checking_impl", own["binary_checks"])
    monkeypatch.setattr(triton_interpreter, "_patch_attr", own["patch_attr"])


def test_the_light_interpreter_computes_tritons_bits(monkeypatch):
    from triton.runtime import interpreter as triton_interpreter

    assert interpreter.lighten()  # applied when the kernels imported (TRITON_INTERPRET=1)
    assert not triton_interpreter.interpreter_builder.options.sanitize_overflow
    light = _call()
    _tritons_own(monkeypatch)
    tritons = _call()
    assert all(torch.equal(a, b) for a, b in zip(light, tritons, strict=True))


def test_the_light_interpreter_computes_tritons_bits_in_the_feature_kernels(monkeypatch):
    assert interpreter.lighten()
    light = _features()
    _tritons_own(monkeypatch)
    tritons = _features()
    assert all(torch.equal(a, b) for a, b in zip(light, tritons, strict=True))
