"""Sparse families (local, dilated, longformer, bigbird, masked-dense) against the float64
reference: odd shapes, uneven and oversized windows, empty rows, gradients; hypothesis
properties of the mask; and checks that the band kernels really skip the masked work."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import registry
from harness.masks import MaskSpec, dense_mask, keep_pairs, kept_pairs
from harness.measure.device import profiler_peak_bytes
from harness.oracle.reference import reference_attention, reference_grads
from harness.spec import Problem
from implementations._kernels.tiles import window_plan
from tests.conftest import make_qkv

SHAPES = [(2, 3, 97, 97, 59), (1, 2, 33, 161, 59), (1, 2, 161, 33, 16)]  # (B, H, n_q, n_k, D)

WINDOW_SPECS = {  # id -> spec; every family below runs each spec its caps allow
    "causal-w6": MaskSpec(causal=True, window=(5, 0)),
    "uneven-3-7": MaskSpec(window=(3, 7)),
    "causal-uneven-9-4": MaskSpec(causal=True, window=(9, 4)),
    "wider-than-n": MaskSpec(window=(300, 200)),
    "left-unbounded": MaskSpec(window=(None, 2)),
    "dilated-causal": MaskSpec(causal=True, window=(4, 0), dilation=3),
    "dilated-uneven": MaskSpec(window=(2, 5), dilation=2),
    "global-causal": MaskSpec(causal=True, window=(6, 0), global_tokens=5),
    "global-dilated": MaskSpec(window=(3, 1), dilation=2, global_tokens=7),
}
BLOCK_SPECS = {
    "bb-causal": MaskSpec(causal=True, window=(1, 0), block_size=8, random_blocks=2, seed=3),
    "bb-global": MaskSpec(window=(1, 1), block_size=8, random_blocks=1, global_tokens=16),
    "bb-odd-block": MaskSpec(window=(2, 0), block_size=5),
    "bb-causal-global": MaskSpec(
        causal=True, window=(0, 0), block_size=16, global_tokens=16, random_blocks=3, seed=1
    ),
}
FAMILIES = {
    "local": WINDOW_SPECS,
    "dilated": WINDOW_SPECS,
    "longformer": WINDOW_SPECS,
    "bigbird": BLOCK_SPECS,
    "masked-dense": {**WINDOW_SPECS, **BLOCK_SPECS},
}


def supported(name: str, shape: tuple, mask: MaskSpec, backward: bool = False) -> bool:
    b, h, n_q, n_k, d = shape
    return not registry.get(name).not_supported(
        Problem(b, h, n_q, n_k, d, mask=mask, backward=backward)
    )


def cases(shapes=SHAPES):
    for name, specs in FAMILIES.items():
        for spec_id, mask in specs.items():
            for shape in shapes:
                if supported(name, shape, mask):
                    label = "x".join(map(str, shape))
                    yield pytest.param(name, mask, shape, id=f"{name}-{spec_id}-{label}")


@pytest.mark.parametrize("name,mask,shape", list(cases()))
def test_forward_matches_reference(name, mask, shape):
    q, k, v = make_qkv(*shape, seed=1)
    out = registry.get(name)(q, k, v, mask)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert torch.isfinite(out).all()
    torch.testing.assert_close(
        out.double(), reference_attention(q, k, v, mask), atol=2e-5, rtol=1e-4
    )


GRAD_CASES = [  # (implementation, spec id): each family's distinct code paths, not every spec
    ("local", "causal-uneven-9-4"),
    ("local", "wider-than-n"),
    ("dilated", "dilated-uneven"),
    ("longformer", "global-causal"),
    ("longformer", "global-dilated"),
    ("bigbird", "bb-causal"),
    ("bigbird", "bb-global"),
    ("masked-dense", "global-dilated"),
    ("masked-dense", "bb-causal"),
]


@pytest.mark.parametrize(
    "name,mask,shape",
    [
        pytest.param(name, FAMILIES[name][spec_id], shape, id=f"{name}-{spec_id}-{i}")
        for name, spec_id in GRAD_CASES
        for i, shape in enumerate(SHAPES[:2])
    ],
)
def test_gradients_match_reference(name, mask, shape):
    q, k, v = make_qkv(*shape, seed=2, requires_grad=True)
    out = registry.get(name)(q, k, v, mask)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    out.backward(grad_out)
    for got, want in zip(
        (q.grad, k.grad, v.grad), reference_grads(q, k, v, grad_out, mask), strict=True
    ):
        torch.testing.assert_close(got.double(), want, atol=5e-5, rtol=1e-4)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_empty_rows_are_zero_with_finite_grads(name):
    """n_q > n_k, causal: the first n_q - n_k queries keep no key -> zeros, never NaN."""
    mask = MaskSpec(causal=True, window=(2, 0)) if name != "bigbird" else BLOCK_SPECS["bb-causal"]
    q, k, v = make_qkv(1, 2, 40, 12, 8, seed=4, requires_grad=True)
    out = registry.get(name)(q, k, v, mask)
    assert not dense_mask(mask, 40, 12)[:28].any()
    assert torch.equal(out[..., :28, :], torch.zeros_like(out[..., :28, :]))
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_other_dtypes(dtype):
    mask = MaskSpec(causal=True, window=(7, 2), dilation=2, global_tokens=3)
    q, k, v = make_qkv(1, 2, 45, 45, 16, seed=5, dtype=dtype)
    out = registry.get("longformer")(q, k, v, mask)
    assert out.dtype == dtype
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-10
    torch.testing.assert_close(out.double(), reference_attention(q, k, v, mask), atol=tol, rtol=tol)


# ---- hypothesis: random specs and shapes ------------------------------------------------------

side = st.one_of(st.none(), st.integers(0, 12))


@st.composite
def window_specs(draw):
    return MaskSpec(
        causal=draw(st.booleans()),
        window=(draw(side), draw(side)),
        dilation=draw(st.integers(1, 3)),
        global_tokens=draw(st.integers(0, 6)),
    )


@st.composite
def block_specs(draw):
    b = draw(st.integers(1, 8))
    return MaskSpec(
        causal=draw(st.booleans()),
        window=(draw(side), draw(side)),
        block_size=b,
        random_blocks=draw(st.integers(0, 3)),
        global_tokens=b * draw(st.integers(0, 2)),
        seed=draw(st.integers(0, 9)),
    )


def any_spec():
    return st.one_of(window_specs(), block_specs())


def impl_for(mask: MaskSpec) -> str:
    return "bigbird" if mask.block_size is not None else "longformer"


@settings(max_examples=50, deadline=None)
@given(mask=any_spec(), n_q=st.integers(1, 40), n_k=st.integers(1, 40))
def test_keep_pairs_is_dense_mask(mask, n_q, n_k):
    """The plan builders' rule evaluator and harness.masks agree pair for pair."""
    p = (torch.arange(n_q) + n_k - n_q)[:, None]
    assert torch.equal(
        keep_pairs(mask, n_q, n_k, p, torch.arange(n_k)[None, :]), dense_mask(mask, n_q, n_k)
    )


@settings(max_examples=30, deadline=None)
@given(mask=any_spec(), n_q=st.integers(1, 40), n_k=st.integers(1, 40), seed=st.integers(0, 99))
def test_random_specs_match_reference(mask, n_q, n_k, seed):
    q, k, v = make_qkv(1, 2, n_q, n_k, 8, seed=seed)
    out = registry.get(impl_for(mask))(q, k, v, mask)
    torch.testing.assert_close(
        out.double(), reference_attention(q, k, v, mask), atol=2e-5, rtol=1e-4
    )


@settings(max_examples=20, deadline=None)
@given(mask=any_spec(), n_q=st.integers(1, 32), n_k=st.integers(1, 32), seed=st.integers(0, 99))
def test_keys_outside_the_pattern_have_no_influence(mask, n_q, n_k, seed):
    """Per query row: replacing every key/value that row does not keep leaves the row as is."""
    impl = registry.get(impl_for(mask))
    q, k, v = make_qkv(1, 2, n_q, n_k, 8, seed=seed)
    out = impl(q, k, v, mask)
    keep = dense_mask(mask, n_q, n_k)
    gen = torch.Generator().manual_seed(seed + 1)
    for row in torch.randint(0, n_q, (3,), generator=gen).tolist():
        drop = ~keep[row][:, None]
        k2 = torch.where(drop, 10 * torch.randn(k.shape, generator=gen), k)
        v2 = torch.where(drop, 10 * torch.randn(v.shape, generator=gen), v)
        torch.testing.assert_close(
            impl(q, k2, v2, mask)[..., row, :], out[..., row, :], atol=1e-6, rtol=1e-5
        )


@settings(max_examples=20, deadline=None)
@given(mask=any_spec(), n=st.integers(2, 40), cut=st.integers(1, 39), seed=st.integers(0, 99))
def test_future_tokens_do_not_change_the_past(mask, n, cut, seed):
    mask = MaskSpec(**{**mask.__dict__, "causal": True})
    cut = min(cut, n - 1)
    impl = registry.get(impl_for(mask))
    q, k, v = make_qkv(1, 2, n, n, 8, seed=seed)
    out = impl(q, k, v, mask)
    gen = torch.Generator().manual_seed(seed)
    q2, k2, v2 = (
        torch.cat([t[..., :cut, :], torch.randn(t[..., cut:, :].shape, generator=gen)], dim=2)
        for t in (q, k, v)
    )
    torch.testing.assert_close(
        impl(q2, k2, v2, mask)[..., :cut, :], out[..., :cut, :], atol=1e-6, rtol=1e-5
    )


# ---- efficiency: the work really is O(n·w) ------------------------------------------------------


@pytest.mark.parametrize(
    "name,mask,per_query",
    [
        ("local", MaskSpec(causal=True, window=(255, 0)), 64 + 255),
        ("dilated", MaskSpec(causal=True, window=(255, 0), dilation=4), 64 + 255),
        ("longformer", MaskSpec(causal=True, window=(255, 0), global_tokens=16), 64 + 255 + 2 * 16),
        (
            "bigbird",
            MaskSpec(causal=True, window=(1, 0), block_size=64, random_blocks=2, global_tokens=64),
            64 * 5,
        ),
    ],
)
def test_executed_pairs_are_o_n_w(name, mask, per_query):
    """Executed pairs cover the kept pairs and stay under a per-query bound at any n: the
    tile (64 rows + window; + g global keys and the g global rows for Longformer), the layout
    row's blocks for BigBird."""
    executed = registry.get(name).cost.executed_pairs
    assert executed(Problem(1, 1, 1000, 1000, 64, mask=mask)) >= kept_pairs(mask, 1000, 1000)
    for n in (4096, 16384):
        assert executed(Problem(1, 1, n, n, 64, mask=mask)) <= per_query * n


def test_dilation_costs_no_more_than_the_plain_window():
    plain = window_plan(MaskSpec(causal=True, window=(255, 0)), 8192, 8192).executed_pairs
    dilated = window_plan(
        MaskSpec(causal=True, window=(255, 0), dilation=8), 8192, 8192
    ).executed_pairs
    assert dilated <= 1.05 * plain


def test_local_peak_memory_is_far_below_the_score_matrix():
    """n = 4096, one head: scores would be 64 MiB; the band needs a few (64, 64 + w) tiles."""
    torch.set_num_threads(1)  # tiles then run on this thread, where the profiler sees them
    mask = MaskSpec(causal=True, window=(63, 0))
    fn = registry.get("local").prepare(Problem(1, 1, 4096, 4096, 32, mask=mask))
    q, k, v = make_qkv(1, 1, 4096, 4096, 32, seed=6)
    fn(q, k, v)
    peak = profiler_peak_bytes(lambda: fn(q, k, v))
    output = q.numel() * 4
    assert peak < output + 2 * 2**20, peak


@pytest.mark.parametrize("name", ["local", "longformer", "bigbird"])
def test_worker_threads_match_one_thread(name):
    """Tiles split over worker threads (the CPU default) give the single-thread results."""
    mask = (
        BLOCK_SPECS["bb-global"]
        if name == "bigbird"
        else MaskSpec(causal=True, window=(20, 3), global_tokens=4 * (name == "longformer"))
    )
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        q, k, v = make_qkv(2, 3, 300, 300, 16, seed=7, requires_grad=True)
        out = registry.get(name)(q, k, v, mask)
        out.backward(torch.ones_like(out))
        results.append((out, q.grad, k.grad, v.grad))
    for one, two in zip(*results, strict=True):
        torch.testing.assert_close(one, two, atol=1e-6, rtol=1e-5)
