"""The tile path (local, dilated, longformer, bigbird) beyond the generated matrix: random specs
of every feature against the float64 definition, mask properties (keys outside the pattern and
future tokens have no influence), rows without keys, and that the work and its predictions
really cost what the mask allows: O(n·w), Σ over documents, never O(n²), and predictions that
never visit the mask."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import masks, registry
from harness.masks import MaskError, MaskSpec, dense_mask, kept_pairs
from harness.measure.device import profiler_peak_bytes
from harness.oracle.reference import reference_attention
from harness.spec import Problem
from implementations._kernels.tiles import tile_plan as plan_module
from implementations._kernels.tiles.tile_plan import plan_shape, tile_plan
from implementations._kernels.tiles.tile_plan_band import band_tiles
from tests.conftest import make_qkv
from tests.harness.test_masks import specs_and_lengths


def impl_for(mask: MaskSpec) -> str:
    return "bigbird" if mask.block_size is not None else "longformer"


def tile_cases():
    """Specs the tile families run (BigBird: no prefix)."""
    return specs_and_lengths().filter(lambda c: not (c[0].block_size and c[0].prefix_len))


@settings(max_examples=60, deadline=None)
@given(case=tile_cases(), seed=st.integers(0, 99))
def test_random_specs_match_the_definition_in_float64(case, seed):
    mask, n_q, n_k = case
    q, k, v = make_qkv(1, 2, n_q, n_k, 8, dtype=torch.float64, seed=seed)
    out = registry.get(impl_for(mask))(q, k, v, mask)
    assert float((out - reference_attention(q, k, v, mask)).abs().max()) <= 1e-12


@settings(max_examples=60, deadline=None)
@given(case=tile_cases())
def test_predicted_shape_is_the_built_plan(case):
    """Executed pairs and the largest tile, predicted from the geometry alone, equal the plan
    that a run builds (biases and all)."""
    mask, n_q, n_k = case
    plan = tile_plan(mask, n_q, n_k, torch.float32, "cpu")
    shape = plan_shape(mask, n_q, n_k, "cpu")
    areas = [(t.r1 - t.r0) * t.n_cols for t in plan.tiles]
    assert shape.executed_pairs == plan.executed_pairs >= kept_pairs(mask, n_q, n_k)
    assert shape.max_area == max(areas, default=0)
    assert shape.max_cols == max((t.n_cols for t in plan.tiles), default=0)


@settings(max_examples=20, deadline=None)
@given(case=tile_cases(), seed=st.integers(0, 99))
def test_keys_outside_the_pattern_have_no_influence(case, seed):
    """Per query row: replacing every key/value that row does not keep leaves the row as is."""
    mask, n_q, n_k = case
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
@given(case=tile_cases(), cut=st.integers(1, 39), seed=st.integers(0, 99))
def test_future_tokens_do_not_change_the_past(case, cut, seed):
    mask, n, _ = case
    mask = MaskSpec(**{**mask.__dict__, "causal": True, "prefix_len": 0})
    try:
        mask.check_lengths(n, n)
    except MaskError:
        return  # global positions beyond n
    if n < 2:
        return
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


def _empty_row_cases():
    """Every exact implementation that declares causal masks over n_q > n_k (approximations
    define such rows by their own reference, which the matrix holds them to)."""
    for impl in registry.all_implementations():
        if "causal" in impl.caps.mask_features and impl.caps.unequal_lengths and not (
            impl.approximate
        ):
            yield pytest.param(impl.name, id=impl.name)


EMPTY_ROW_MASKS = (  # the first one an implementation runs
    MaskSpec(causal=True),
    MaskSpec(causal=True, window=(1, 0), block_size=8, random_blocks=2, seed=3),
)


@pytest.mark.parametrize("name", list(_empty_row_cases()))
def test_rows_without_keys_are_zero_with_finite_grads(name):
    """n_q > n_k, causal: the first n_q - n_k queries keep no key -> zeros, never NaN (and
    finite gradients where a backward runs)."""
    impl = registry.get(name)
    reasons = {m: impl.not_supported(Problem(1, 2, 40, 12, 8, mask=m)) for m in EMPTY_ROW_MASKS}
    runs = [m for m, why in reasons.items() if not why]
    if not runs:
        pytest.skip("; ".join(reasons[EMPTY_ROW_MASKS[0]]))
    mask = runs[0]
    backward = not impl.not_supported(Problem(1, 2, 40, 12, 8, mask=mask, backward=True))
    q, k, v = make_qkv(1, 2, 40, 12, 8, seed=4, requires_grad=backward)
    out = impl(q, k, v, mask)
    assert not dense_mask(mask, 40, 12)[:28].any()
    assert torch.equal(out[..., :28, :], torch.zeros_like(out[..., :28, :]))
    if backward:
        out.sum().backward()
        assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


# ---- efficiency: the work really is what the mask allows ---------------------------------------


@pytest.mark.parametrize(
    "name,mask,per_query",
    [
        ("local", MaskSpec(causal=True, window=(255, 0)), 64 + 255),
        ("dilated", MaskSpec(causal=True, window=(255, 0), dilation=4), 64 + 255),
        ("longformer", MaskSpec(causal=True, window=(255, 0), global_tokens=16), 64 + 255 + 16),
        ("local", MaskSpec(causal=True, window=(255, 0), prefix_len=64), 64 + 255 + 64),
        (
            "bigbird",
            MaskSpec(causal=True, window=(1, 0), block_size=64, random_blocks=2, global_tokens=64),
            64 * 5,
        ),
    ],
)
def test_executed_pairs_are_o_n_w(name, mask, per_query):
    """Executed pairs cover the kept pairs and stay under a per-query bound at any n: the
    tile (64 rows + window; + the global keys up to the tile's causal bound; + the prefix),
    the layout row's blocks for BigBird."""
    executed = registry.get(name).cost.executed_pairs
    assert executed(Problem(1, 1, 1000, 1000, 64, mask=mask)) >= kept_pairs(mask, 1000, 1000)
    for n in (4096, 16384, 10**6 if mask.block_size is None else 2**16):
        assert executed(Problem(1, 1, n, n, 64, mask=mask)) <= per_query * n


@pytest.mark.parametrize("name", ["local", "dilated", "longformer", "flash-tiled"])
@pytest.mark.parametrize("window", [None, (127, 0)])
def test_packed_documents_cost_the_documents_not_the_sequence(name, window):
    """Causal documents of l tokens packed into n: executed pairs grow with n·l, not n², and
    are those of the documents run one by one (equal documents: exactly n/l times one)."""
    impl = registry.get(name)
    if window and "window" not in impl.caps.mask_features:
        pytest.skip("no window")
    executed = impl.cost.executed_pairs
    one = executed(Problem(1, 1, 256, 256, 64, mask=MaskSpec(causal=True, window=window)))
    for n in (16384, 2**20):
        docs = MaskSpec(causal=True, window=window, documents=(256,) * (n // 256))
        assert executed(Problem(1, 1, n, n, 64, mask=docs)) == n // 256 * one
    assert one <= 256 * 256  # never more than the document's square
    uneven = MaskSpec(causal=True, window=window, documents=(100, 1, 300, 623))
    parts = sum(
        executed(Problem(1, 1, n, n, 64, mask=MaskSpec(causal=True, window=window)))
        for n in uneven.documents
    )
    assert executed(Problem(1, 1, 1024, 1024, 64, mask=uneven)) == parts


@pytest.mark.parametrize("name", ["local", "dilated", "longformer", "bigbird", "flash-tiled"])
def test_predictions_never_visit_the_mask(name, monkeypatch):
    """Memory and executed-pair predictions at n = 10^6 (no window: 10^12 kept pairs) build no
    mask and no bias: the rule's evaluator is never called, and the band geometry has one
    entry per 64-row tile."""

    def refuse(*args, **kwargs):
        raise AssertionError("a prediction evaluated the mask")

    for module in (masks, plan_module):
        monkeypatch.setattr(module, "keep_pairs", refuse, raising=False)
    monkeypatch.setattr(masks, "dense_mask", refuse)
    impl, n = registry.get(name), 10**6
    mask = (
        MaskSpec(causal=True, window=(1, 0), block_size=64, global_tokens=64)
        if name == "bigbird"
        else MaskSpec(causal=True, documents=(500, 999_500)) if name == "flash-tiled"
        else MaskSpec(causal=True, prefix_len=100, global_tokens=(5, 77)) if name == "longformer"
        else MaskSpec(causal=True)
    )
    if name == "bigbird":
        n = 2**16  # the BigBird layout is a dense (n/b)² table of blocks
    problem = Problem(1, 8, n, n, 64, mask=mask)
    assert impl.cost.memory_model(problem) > 0
    assert impl.cost.executed_pairs(problem) >= kept_pairs(mask, n, n)
    if name != "bigbird" and name != "flash-tiled":
        geometry = band_tiles(mask.without_documents(), n, n, 64)
        assert geometry.r.size <= n // 64 + 8 * (1 + len(mask.global_runs))


def test_dilation_costs_no_more_than_the_plain_window():
    plain = plan_shape(MaskSpec(causal=True, window=(255, 0)), 8192, 8192, "cpu")
    dilated = plan_shape(MaskSpec(causal=True, window=(255, 0), dilation=8), 8192, 8192, "cpu")
    assert dilated.executed_pairs <= 1.05 * plain.executed_pairs


def test_biases_cover_only_the_columns_that_drop_pairs():
    """Causal without a window: tiles of 64 rows over up to n keys, but the bias (shared by
    every tile) spans the diagonal block's last 63 columns (its first is kept by every row),
    not a (64, n) slab per tile."""
    plan = tile_plan(MaskSpec(causal=True), 4096, 4096, torch.float32, "cpu")
    biases = {id(t.bias): t.bias for t in plan.tiles if t.bias is not None}
    assert len(biases) == 1 and next(iter(biases.values())).shape == (64, 63)
    assert all(t.bias_at == t.n_cols - 63 for t in plan.tiles)


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


WORKER_MASKS = {
    "local": MaskSpec(causal=True, window=(20, 3), documents=(100, 1, 199)),
    "longformer": MaskSpec(causal=True, window=(20, 3), global_tokens=(0, 150), prefix_len=9),
    "bigbird": MaskSpec(window=(1, 1), block_size=8, random_blocks=1, global_tokens=16),
}


@pytest.mark.parametrize("name", list(WORKER_MASKS))
def test_worker_threads_match_one_thread(name):
    """Tiles split over worker threads (the CPU default) give the single-thread results."""
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        q, k, v = make_qkv(2, 3, 300, 300, 16, seed=7, requires_grad=True)
        out = registry.get(name)(q, k, v, WORKER_MASKS[name])
        out.backward(torch.ones_like(out))
        results.append((out, q.grad, k.grad, v.grad))
    for one, two in zip(*results, strict=True):
        torch.testing.assert_close(one, two, atol=1e-6, rtol=1e-5)
