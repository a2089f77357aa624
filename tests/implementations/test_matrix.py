"""The correctness matrix, generated from what every registered implementation declares.

Every implementation x every dtype in its ``Capabilities`` x every mask of the catalog below
whose features it declares x odd and unequal shapes, on fresh random inputs, against the
float64 definition under the harness's agreement rule (an approximation of softmax attention
against the float64 evaluation of its own ``reference``). A plug-in that registers falls into
the matrix without a line here; a declared case that cannot run on this machine is skipped
with the implementation's own reason (a CUDA-only backend, FlexAttention's missing CPU float16).

Implementations whose every distinct mask compiles its own kernel (FlexAttention: 10-30 s a
compile on CPU) run the fewest catalog masks that still cover each declared feature, one shape.
"""

from __future__ import annotations

import zlib

import pytest
import torch

from harness import registry
from harness.masks import MaskError, MaskSpec
from harness.oracle.agreement import grad_agreement, output_agreement
from harness.oracle.reference import naive_attention, reference_attention, reference_grads
from harness.registry import Implementation
from harness.spec import Problem
from tests.conftest import make_qkv

SHAPES = [  # (B, H, n_q, n_k, D): odd, unequal, and one that splits into equal documents
    (2, 3, 97, 97, 59),
    (1, 2, 33, 161, 59),
    (1, 2, 161, 33, 16),
    (1, 3, 96, 96, 59),
]
COMPILED_FAMILIES = {"flex"}  # each distinct mask is a kernel compile
FLOAT64_N = 129  # every implementation that declares float64 is within 1e-10 here
FLOAT64_ATOL = 1e-10
# capabilities only plug-in features use: every path declaring one runs them in
# test_plugin_features.py (Flex compiled: the mask feature tests)
PLUGIN_ONLY = {"predicate"}


def _documents(n: int) -> tuple[int, ...]:
    """Unequal odd documents summing to n, one of length 1: (n//3 + 1, 1, 19, rest...)."""
    first = n // 3 + 1
    rest = n - first - 1 - 19
    return (first, 1, 19, rest) if rest > 0 else (n,)


def catalog(n_q: int, n_k: int) -> dict[str, MaskSpec]:
    """The masks of the matrix for these lengths (each one checked against them)."""
    g_last = (0, 1, n_k // 2, n_k - 1)
    b = 8
    first_last = (*range(b), *range((n_k - 1) // b * b, n_k))  # HF BigBird: first, last block
    specs = {
        "dense": MaskSpec(),
        "causal": MaskSpec(causal=True),
        "window": MaskSpec(window=(5, 3)),
        "causal-window": MaskSpec(causal=True, window=(9, 0)),
        "dilation": MaskSpec(causal=True, window=(4, 2), dilation=3),
        "global": MaskSpec(causal=True, window=(6, 0), global_tokens=5),
        "global-positions": MaskSpec(window=(3, 1), dilation=2, global_tokens=g_last),
        "prefix": MaskSpec(causal=True, prefix_len=min(20, n_k)),
        "prefix-window-global": MaskSpec(
            causal=True, window=(7, 0), prefix_len=min(12, n_k), global_tokens=(3, n_k - 2)
        ),
        "block-sparse": MaskSpec(causal=True, window=(1, 0), block_size=b, random_blocks=2, seed=3),
        "bigbird-first-last": MaskSpec(
            window=(1, 1), block_size=b, random_blocks=1, global_tokens=first_last
        ),
    }
    if n_q == n_k:
        docs = _documents(n_k)
        equal = (n_k // 4,) * 4 if n_k % 4 == 0 else docs
        specs |= {
            "documents": MaskSpec(documents=docs),
            "documents-causal": MaskSpec(causal=True, documents=docs),
            "documents-equal": MaskSpec(causal=True, documents=equal),
            "documents-window-prefix": MaskSpec(
                causal=True, window=(5, 0), prefix_len=4, documents=docs
            ),
            "documents-dilated-global": MaskSpec(
                window=(2, 2), dilation=2, global_tokens=1, documents=equal
            ),
            "documents-global-positions": MaskSpec(
                causal=True, window=(3, 0), global_tokens=(0, 7), documents=docs
            ),
        }
    return {name: spec for name, spec in specs.items() if _fits(spec, n_q, n_k)}


def _fits(spec: MaskSpec, n_q: int, n_k: int) -> bool:
    try:
        spec.check_lengths(n_q, n_k)
    except MaskError:
        return False
    return True


def _supported_masks(impl: Implementation, shape: tuple) -> dict[str, MaskSpec]:
    _, _, n_q, n_k, _ = shape
    if n_q != n_k and not impl.caps.unequal_lengths:
        return {}
    return {k: m for k, m in catalog(n_q, n_k).items() if m.features <= impl.caps.mask_features}


def _cover(masks: dict[str, MaskSpec], wanted: set[str]) -> dict[str, MaskSpec]:
    """Few masks (greedy) that together use every feature of ``wanted`` that any mask uses."""
    left = wanted & set().union(*(m.features for m in masks.values())) if masks else set()
    chosen: dict[str, MaskSpec] = {}
    while left:
        name = max(masks, key=lambda k: (len(masks[k].features & left), k))
        chosen[name] = masks[name]
        left -= masks[name].features
    return chosen


def cases():
    """(implementation, shape, mask, dtype) for the whole matrix: float32 on every shape a mask
    fits, each other dtype on one of those shapes per mask, in turn."""
    for impl in registry.all_implementations():
        if impl.family in COMPILED_FAMILIES:
            yield from _compiled_cases(impl)
            continue
        shapes_of: dict[str, list[tuple]] = {}
        for shape in SHAPES:
            for mask_id in _supported_masks(impl, shape):
                shapes_of.setdefault(mask_id, []).append(shape)
        for i, (mask_id, shapes) in enumerate(shapes_of.items()):
            for j, dtype in enumerate(sorted(impl.caps.dtypes, key=str)):
                chosen = shapes if dtype == torch.float32 else [shapes[(i + j) % len(shapes)]]
                for shape in chosen:
                    mask = catalog(*shape[2:4])[mask_id]
                    yield _case(impl, shape, mask_id, mask, dtype)


def _compiled_cases(impl: Implementation):
    """Each distinct mask is a kernel compile: the fewest masks that cover every declared
    feature (on unequal lengths first, then on a square for documents), in float32; each
    other dtype once, on the first of them."""
    chosen, left = [], set(impl.caps.mask_features)
    for shape in (SHAPES[1], SHAPES[0]):
        for mask_id, mask in _cover(_supported_masks(impl, shape), set(left)).items():
            chosen.append((shape, mask_id, mask))
            left -= mask.features
    for i, (shape, mask_id, mask) in enumerate(chosen):
        for dtype in sorted(impl.caps.dtypes, key=str):
            if dtype == torch.float32 or i == 0:
                yield _case(impl, shape, mask_id, mask, dtype)


def _case(impl: Implementation, shape: tuple, mask_id: str, mask: MaskSpec, dtype: torch.dtype):
    label = f"{impl.name}-{mask_id}-{'x'.join(map(str, shape))}-{dtype}".replace("torch.", "")
    return pytest.param(impl.name, shape, mask, dtype, id=label)


CASES = list(cases())


def _skip_unless_runnable(impl: Implementation, problem: Problem) -> None:
    reasons = impl.not_supported(problem)
    if reasons:
        assert all(isinstance(r, str) and r for r in reasons)
        pytest.skip("; ".join(reasons))


def _definition(impl: Implementation, q, k, v, mask: MaskSpec, dtype: torch.dtype):
    """(float64 reference, the same definition evaluated naively in ``dtype``)."""
    if impl.approximate:
        params = impl.param_values()
        ref = impl.define(q.double(), k.double(), v.double(), mask, **params)
        return ref, impl.define(q, k, v, mask, **params)
    return reference_attention(q, k, v, mask), naive_attention(q, k, v, mask)


@pytest.mark.parametrize("name,shape,mask,dtype", CASES)
def test_output_matches_the_definition(name, shape, mask, dtype):
    impl = registry.get(name)
    b, h, n_q, n_k, d = shape
    _skip_unless_runnable(impl, Problem(b, h, n_q, n_k, d, dtype=dtype, mask=mask))
    seed = zlib.crc32(f"{name}{shape}".encode()) % 1000  # fresh per case, the same every run
    q, k, v = make_qkv(b, h, n_q, n_k, d, dtype=dtype, seed=seed)
    out = impl(q, k, v, mask)
    assert out.shape == q.shape and out.dtype == dtype
    ref, naive = _definition(impl, q, k, v, mask, dtype)
    if dtype == torch.float64:
        err = float((out - ref).abs().max())
        assert err <= FLOAT64_ATOL, f"float64 output {err:.3g} off the definition"
    else:
        result = output_agreement(out, ref, dtype, naive=naive)
        assert result["agree"], result


GRAD_CASES = [c for c in CASES if c.values[3] == torch.float32 and c.values[1] == SHAPES[0]]


@pytest.mark.parametrize("name,shape,mask,dtype", GRAD_CASES)
def test_gradients_match_the_definition(name, shape, mask, dtype):
    impl = registry.get(name)
    b, h, n_q, n_k, d = shape
    _skip_unless_runnable(impl, Problem(b, h, n_q, n_k, d, dtype=dtype, mask=mask, backward=True))
    q, k, v = make_qkv(b, h, n_q, n_k, d, seed=7, requires_grad=True)
    out = impl(q, k, v, mask)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(8))
    grads = torch.autograd.grad(out, (q, k, v), g)
    if impl.approximate:
        q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
        ref_out = impl.define(q64, k64, v64, mask, **impl.param_values())
        want = torch.autograd.grad(ref_out, (q64, k64, v64), g.double())
    else:
        want = reference_grads(q, k, v, g, mask)
    result = grad_agreement(grads, want, torch.float32)
    assert result["grad_agree"], result


def _float64_cases():
    for impl in registry.all_implementations():
        if torch.float64 in impl.caps.dtypes:
            shape = (1, 2, FLOAT64_N, FLOAT64_N, 59)
            for mask_id, mask in _supported_masks(impl, shape).items():
                yield pytest.param(impl.name, mask, id=f"{impl.name}-{mask_id}")


@pytest.mark.parametrize("name,mask", list(_float64_cases()))
def test_declared_float64_is_computed_in_float64(name, mask):
    """n = 129: one more than a power of two, so tiled paths have a ragged last block."""
    impl = registry.get(name)
    n = FLOAT64_N
    _skip_unless_runnable(impl, Problem(1, 2, n, n, 59, dtype=torch.float64, mask=mask))
    q, k, v = make_qkv(1, 2, n, n, 59, dtype=torch.float64, seed=11)
    ref = (
        impl.define(q, k, v, mask, **impl.param_values())
        if impl.approximate
        else reference_attention(q, k, v, mask)
    )
    err = float((impl(q, k, v, mask) - ref).abs().max())
    assert err <= FLOAT64_ATOL, f"{name} float64 is {err:.3g} off its definition"


def _grouped_cases():
    for impl in registry.all_implementations():
        if impl.caps.grouped_kv:
            for mask_id in ("causal", "documents-causal"):
                mask = catalog(97, 97).get(mask_id)
                if mask is not None and mask.features <= impl.caps.mask_features:
                    yield pytest.param(impl.name, mask, id=f"{impl.name}-{mask_id}")


@pytest.mark.parametrize("name,mask", list(_grouped_cases()))
def test_grouped_kv_where_declared(name, mask):
    impl = registry.get(name)
    _skip_unless_runnable(impl, Problem(1, 6, 97, 97, 16, mask=mask, kv_heads=2))
    q, k, v = make_qkv(1, 6, 97, 97, 16, kv_heads=2, seed=14)
    ref, naive = _definition(impl, q, k, v, mask, torch.float32)
    result = output_agreement(impl(q, k, v, mask), ref, torch.float32, naive=naive)
    assert result["agree"], result


def test_the_matrix_covers_every_declared_feature_and_dtype():
    """Each implementation meets each of its declared mask features and dtypes somewhere in
    the matrix (a catalog without some feature would silently leave it untested)."""
    for impl in registry.all_implementations():
        mine = [c.values for c in CASES if c.values[0] == impl.name]
        features = set().union(*(mask.features for _, _, mask, _ in mine))
        assert impl.caps.mask_features - PLUGIN_ONLY <= features | {"dense"}, impl.name
        assert {dtype for *_, dtype in mine} == set(impl.caps.dtypes), impl.name


def test_a_wrong_kernel_is_caught():
    """The matrix can fail: a kernel that ignores causality disagrees with the definition."""
    q, k, v = make_qkv(1, 2, 30, 30, 8, seed=15)
    mask = MaskSpec(causal=True)
    out = registry.get("sdpa")(q, k, v, MaskSpec(causal=False))
    result = output_agreement(
        out, reference_attention(q, k, v, mask), torch.float32, naive=naive_attention(q, k, v, mask)
    )
    assert not result["agree"]
