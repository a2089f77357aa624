"""Every registered implementation against the float64 reference, parametrized from the
registry's declared capabilities: odd shapes, causal and not, n_q != n_k, grads, dtypes."""

from __future__ import annotations

import pytest
import torch

from harness import registry
from harness.masks import MaskSpec
from harness.oracle.agreement import grad_agreement, output_agreement, tolerance
from harness.oracle.reference import reference_attention, reference_grads
from harness.spec import Problem
from tests.conftest import CORE_IMPLEMENTATIONS, make_qkv

SHAPES = [(2, 3, 97, 97, 59), (1, 2, 33, 161, 59), (1, 2, 161, 33, 16)]


def runnable(name: str, problem: Problem) -> bool:
    return not registry.get(name).not_supported(problem)


def cases():
    for name in CORE_IMPLEMENTATIONS:
        for shape in SHAPES:
            for causal in (False, True):
                yield pytest.param(
                    name,
                    shape,
                    causal,
                    id=f"{name}-{'x'.join(map(str, shape))}-{'causal' if causal else 'full'}",
                )


@pytest.mark.parametrize("name,shape,causal", list(cases()))
def test_forward_matches_reference(name, shape, causal):
    b, h, n_q, n_k, d = shape
    mask = MaskSpec(causal=causal)
    problem = Problem(b, h, n_q, n_k, d, mask=mask)
    impl = registry.get(name)
    if not runnable(name, problem):
        reasons = impl.not_supported(problem)
        assert reasons and all(isinstance(r, str) and r for r in reasons)
        pytest.skip("; ".join(reasons))
    q, k, v = make_qkv(b, h, n_q, n_k, d, seed=hash(shape) % 1000)
    out = impl(q, k, v, mask)
    result = output_agreement(out, reference_attention(q, k, v, mask), torch.float32)
    assert result["agree"], result


@pytest.mark.parametrize("name", ["full", "sdpa", "sdpa-math", "sdpa-flash", "flash-tiled"])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_matches_reference(name, causal):
    mask = MaskSpec(causal=causal)
    q, k, v = make_qkv(2, 3, 45, 97, 59, seed=11, requires_grad=True)
    g = torch.randn(q.shape, generator=torch.Generator().manual_seed(12))
    grads = torch.autograd.grad(registry.get(name)(q, k, v, mask), (q, k, v), g)
    result = grad_agreement(grads, reference_grads(q, k, v, g, mask), torch.float32)
    assert result["grad_agree"], result


@pytest.mark.parametrize("name", ["full", "sdpa", "sdpa-flash", "flash-tiled"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_within_the_dtype_tolerance(name, dtype):
    mask = MaskSpec(causal=True)
    if not runnable(name, Problem(1, 2, 97, 97, 59, dtype=dtype, mask=mask)):
        pytest.skip("dtype not supported")
    q, k, v = make_qkv(1, 2, 97, 97, 59, dtype=dtype, seed=13)
    result = output_agreement(
        registry.get(name)(q, k, v, mask), reference_attention(q, k, v, mask), dtype
    )
    assert result["agree"], (result, tolerance(dtype))


def test_grouped_kv_where_declared():
    q, k, v = make_qkv(1, 6, 40, 40, 16, kv_heads=2, seed=14)
    ref = reference_attention(q, k, v, MaskSpec(causal=True))
    for impl in registry.all_implementations():
        problem = Problem(1, 6, 40, 40, 16, mask=MaskSpec(causal=True), kv_heads=2)
        if impl.caps.grouped_kv and not impl.not_supported(problem):
            out = impl(q, k, v, MaskSpec(causal=True))
            # an approximation is held to its own definition (test_linear covers its GQA)
            own = (
                impl.reference(q.double(), k.double(), v.double(), MaskSpec(causal=True))
                if impl.approximate
                else ref
            )
            assert output_agreement(out, own, torch.float32)["agree"], impl.name


def test_a_wrong_kernel_is_caught():
    q, k, v = make_qkv(1, 2, 30, 30, 8, seed=15)
    out = registry.get("sdpa")(q, k, v, MaskSpec(causal=False))  # ignores causality
    assert not output_agreement(
        out, reference_attention(q, k, v, MaskSpec(causal=True)), torch.float32
    )["agree"]
