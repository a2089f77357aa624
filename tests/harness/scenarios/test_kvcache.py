"""The caches themselves: in-place static buffers, the rolling ring's slots and masks, GQA."""

from __future__ import annotations

import pytest
import torch

from harness.masks import MaskSpec
from harness.model.transformer import BlockConfig, build_block
from harness.oracle.reference import reference_attention, repeat_kv
from harness.scenarios.decode.caches import (
    FullCache,
    RollingCache,
    cache_nbytes,
)
from harness.scenarios.decode.stack import DecoderStack
from harness.scenarios.decode.step_graph import StaticStep
from harness.scenarios.interface import Point, cost_of


def _kv(batch: int, kv_heads: int, n: int, head_dim: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, kv_heads, n, head_dim)
    return torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)


def _ref_stack(
    kv_heads: int | None,
    cache: str,
    mask: MaskSpec,
    capacity: int,
    layers: int = 2,
    dtype: torch.dtype = torch.float64,
):
    """A two-layer (float64) stack with the float64 reference core."""
    cfg = BlockConfig(heads=4, head_dim=6, kv_heads=kv_heads, causal=True, max_len=capacity)
    blocks = [build_block(cfg, i, "cpu", dtype).eval() for i in range(layers)]
    return DecoderStack(blocks, reference_attention, mask, cache, 2, capacity)


def test_full_cache_writes_in_place_and_returns_views():
    cache = FullCache(2, 3, 20, 8, MaskSpec(causal=True), torch.float32, "cpu")
    ptr = cache.k.data_ptr()
    k, v = _kv(2, 3, 7, 8, seed=0)
    keys, values, mask = cache.update(0, k, v)
    assert mask == MaskSpec(causal=True) and keys.shape == (2, 3, 7, 8)
    k1, v1 = _kv(2, 3, 1, 8, seed=1)
    keys, values, mask = cache.update(7, k1, v1)
    assert keys.shape == (2, 3, 8, 8) and mask == MaskSpec()  # one query sees every key
    assert keys.data_ptr() == ptr == cache.k.data_ptr()  # a view of the static buffer, no copy
    assert torch.equal(keys, torch.cat([k, k1], dim=2))
    assert torch.equal(values, torch.cat([v, v1], dim=2))
    with pytest.raises(ValueError, match="capacity"):
        cache.update(20, k1, v1)


def test_a_step_over_a_full_cache_keeps_the_window_only():
    assert FullCache.step_call(7, MaskSpec(causal=True)) == (1, 8, MaskSpec())
    windowed = MaskSpec(causal=True, window=(4, 0))
    assert FullCache.step_call(7, windowed) == (1, 8, windowed)


@pytest.mark.parametrize("window", [1, 5, 8])
def test_rolling_ring_holds_exactly_the_last_window_positions(window):
    n = 3 * window + 2  # wraps around the ring more than twice
    k_all, v_all = _kv(1, 2, n, 4, seed=window)
    cache = RollingCache(1, 2, window, 4, torch.float32, "cpu")
    for pos in range(n):
        keys, values, mask = cache.update(
            pos, k_all[:, :, pos : pos + 1], v_all[:, :, pos : pos + 1]
        )
        held = list(range(max(0, pos - window + 1), pos + 1))
        assert keys.shape[2] == len(held) and mask == MaskSpec()
        for p in held:  # position p lives in slot p % window
            assert torch.equal(keys[:, :, p % window], k_all[:, :, p])
            assert torch.equal(values[:, :, p % window], v_all[:, :, p])


@pytest.mark.parametrize("n, window", [(3, 5), (5, 5), (13, 5)])
def test_rolling_step_equals_sliding_window_attention(n, window):
    """Attention over the unordered ring == the sliding-window mask over the whole sequence,
    before the ring fills, exactly full, and after wrapping (prefill then single steps)."""
    total = n + 2 * window
    gen = torch.Generator().manual_seed(n)
    q = torch.randn(1, 4, total, 8, generator=gen)
    k, v = _kv(1, 2, total, 8, seed=n + 1)
    spec = MaskSpec(causal=True, window=(window - 1, 0))
    cache = RollingCache(1, 2, window, 8, torch.float32, "cpu")
    keys, values, mask = cache.update(0, k[:, :, :n], v[:, :, :n])
    got = reference_attention(q[:, :, :n], keys, values, mask)
    assert torch.allclose(got, reference_attention(q[:, :, :n], k[:, :, :n], v[:, :, :n], spec))
    for pos in range(n, total):
        keys, values, mask = cache.update(pos, k[:, :, pos : pos + 1], v[:, :, pos : pos + 1])
        got = reference_attention(q[:, :, pos : pos + 1], keys, values, mask)
        want = reference_attention(
            q[:, :, pos : pos + 1], k[:, :, : pos + 1], v[:, :, : pos + 1], spec
        )
        assert torch.allclose(got, want, atol=1e-12, rtol=0)


def test_rolling_cache_rejects_a_second_prefill_chunk_and_overflow():
    cache = RollingCache(1, 1, 4, 2, torch.float32, "cpu")
    k, v = _kv(1, 1, 3, 2, seed=0)
    with pytest.raises(ValueError, match="prefill at position 0"):
        cache.update(2, k, v)
    short = RollingCache(1, 1, 8, 2, torch.float32, "cpu", capacity=3)
    assert short.k.shape[2] == 3  # sized for what the generation can use
    with pytest.raises(ValueError, match="capacity"):
        short.update(3, k[:, :, :1], v[:, :, :1])


@pytest.mark.parametrize(
    "cache, mask",
    [
        ("full", MaskSpec(causal=True)),
        ("full", MaskSpec(causal=True, window=(6, 0))),
        ("rolling", MaskSpec(causal=True, window=(6, 0))),
        ("none", MaskSpec(causal=True)),
    ],
)
@pytest.mark.parametrize("kv_heads", [1, 2, None])
def test_stack_steps_equal_recomputation(cache, mask, kv_heads):
    """Several steps deep, odd sizes, MQA/GQA/MHA: every cached step == the full recompute."""
    n, steps = 11, 9  # the rolling window of 7 wraps during the steps
    stack = _ref_stack(kv_heads, cache, mask, n + steps)
    x = torch.randn(
        2, n + steps, 24, generator=torch.Generator().manual_seed(3), dtype=torch.float64
    )
    with torch.no_grad():
        prefill = stack.prefill(x[:, :n])
        outs = [stack.step(x[:, t : t + 1], t) for t in range(n, n + steps)]
        full = stack.forward(x)
    assert torch.allclose(prefill, full[:, :n], atol=1e-12, rtol=0)
    assert torch.allclose(torch.cat(outs, dim=1), full[:, n:], atol=1e-12, rtol=0)


def test_gqa_cache_matches_repeated_kv_heads():
    """A cache holding H_kv heads gives the same attention as repeating K/V to H heads."""
    k, v = _kv(1, 2, 9, 8, seed=5)
    q = torch.randn(1, 6, 1, 8, generator=torch.Generator().manual_seed(6))
    cache = FullCache(1, 2, 9, 8, MaskSpec(causal=True), torch.float32, "cpu")
    cache.update(0, k[:, :, :8], v[:, :, :8])
    keys, values, mask = cache.update(8, k[:, :, 8:], v[:, :, 8:])
    grouped = reference_attention(q, keys, values, mask)
    repeated = reference_attention(q, repeat_kv(k, 6), repeat_kv(v, 6), MaskSpec(causal=True))
    assert keys.shape[1] == 2  # the cache keeps only the K/V heads
    assert torch.allclose(grouped, repeated, atol=1e-12, rtol=0)


@pytest.mark.parametrize(
    "cache, kv_heads, window, slots",
    [
        ("full", None, None, 37 + 5),
        ("full", 1, None, 42),
        ("rolling", 2, 16, 16),
        ("rolling", None, 64, 42),
        ("none", None, None, 0),
    ],
)
def test_measured_cache_bytes_equal_the_analytic_formula(cache, kv_heads, window, slots):
    point = Point.of(
        impl="full",
        scenario="decode",
        seq_len=37,
        gen_tokens=5,
        heads=4,
        kv_heads=kv_heads,
        head_dim=6,
        layers=3,
        batch=2,
        causal=True,
        cache=cache,
        window_left=None if window is None else window - 1,
    )
    stack = _ref_stack(kv_heads, cache, point.mask, 42, layers=3, dtype=torch.float32)
    measured = cache_nbytes(stack.new_caches())
    assert measured == cost_of(point).cache_bytes == 2 * 3 * 2 * (kv_heads or 4) * slots * 6 * 4


@pytest.mark.parametrize(
    "cache, mask, pos, n",
    [
        ("full", MaskSpec(causal=True), "rope", 11),
        ("full", MaskSpec(causal=True, window=(4, 0)), "learned", 11),
        ("none", MaskSpec(causal=True), "sinusoidal", 11),
        ("rolling", MaskSpec(causal=True, window=(4, 0)), "rope", 3),  # ring not yet full
        ("rolling", MaskSpec(causal=True, window=(4, 0)), "rope", 11),
    ],
)
def test_static_step_equals_the_dynamic_step(cache, mask, pos, n):
    """The graph-safe step (position in a device tensor, caches written with index_copy_)
    computes what the eager step computes, and leaves the same caches behind."""
    cfg = BlockConfig(heads=3, head_dim=6, kv_heads=1, causal=True, max_len=20, pos=pos)
    blocks = [build_block(cfg, i, "cpu", torch.float64).eval() for i in range(2)]
    stacks = [DecoderStack(blocks, reference_attention, mask, cache, 2, 20) for _ in range(2)]
    x = torch.randn(2, n + 1, 18, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    with torch.no_grad():
        for s in stacks:
            s.prefill(x[:, :n])
        eager = stacks[0].step(x[:, n:], n)
        static = StaticStep(stacks[1], x[:, n:], n)()
    torch.testing.assert_close(static, eager, rtol=0, atol=1e-12)
    for a, b in zip(stacks[0].caches, stacks[1].caches, strict=True):
        assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v)


def test_one_static_rolling_step_serves_every_position_once_the_ring_is_full():
    """A full ring always holds ``window`` keys: moving the device-side position alone (what
    a replayed CUDA graph sees) reproduces consecutive eager steps."""
    mask = MaskSpec(causal=True, window=(3, 0))
    cfg = BlockConfig(heads=2, head_dim=8, causal=True, max_len=30)
    blocks = [build_block(cfg, i, "cpu", torch.float64).eval() for i in range(2)]
    eager, static = (
        DecoderStack(blocks, reference_attention, mask, "rolling", 1, 30) for _ in range(2)
    )
    x = torch.randn(1, 14, 16, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    with torch.no_grad():
        eager.prefill(x[:, :8])
        static.prefill(x[:, :8])
        step = StaticStep(static, x[:, 8:9], 8)
        for t in range(8, 14):
            step.x.copy_(x[:, t : t + 1])
            step.index.fill_(t)
            torch.testing.assert_close(step(), eager.step(x[:, t : t + 1], t), rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "cache, mask, kv_heads",
    [
        ("full", MaskSpec(causal=True), None),
        ("full", MaskSpec(causal=True), 1),  # grouped K/V heads
        ("rolling", MaskSpec(causal=True, window=(4, 0)), None),
        ("rolling", MaskSpec(causal=True, window=(4, 0)), 1),
        ("none", MaskSpec(causal=True), None),
    ],
)
def test_a_captured_step_keeps_the_buffers_its_graph_reads_alive(fake_capture, cache, mask,
                                                                  kv_heads):
    """The CUDA-graph decode crash of 2026-11-26 (``index_copy_(): index out of bounds`` on an
    H100): the replay closure held the graph but not the StaticStep, so the position tensor
    and the token buffer were freed when the launch returned and their memory was reused.
    The general launch (:func:`harness.measure.graphs.launch`) must keep every buffer of
    :meth:`StaticStep.buffers` as long as the launched call lives."""
    import gc
    import weakref

    from harness.measure import graphs
    from harness.scenarios.decode import step_graph

    held: list[weakref.ref] = []

    class Tracked(step_graph.StaticStep):
        def __init__(self, *args):
            super().__init__(*args)
            held.extend(weakref.ref(t) for t in (self.x, self.index))

    stack = _ref_stack(kv_heads, cache, mask, capacity=16)
    x = torch.randn(2, 12, 24, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    with torch.no_grad():
        stack.prefill(x[:, :11])
    token = x[:, 11:12]
    launched = graphs.launch(lambda: stack.step(token, 11), "cuda-graph",
                             capturable=lambda: Tracked(stack, token, 11))
    assert launched.mode == "cuda-graph" and launched.reason is None
    gc.collect()
    assert held and all(ref() is not None for ref in held), "a buffer of the graph was freed"
    assert launched.run().shape == (2, 1, 24)
    del launched
    gc.collect()
    assert all(ref() is None for ref in held)  # and nothing else holds them


def _tensors_of(fn) -> list[torch.Tensor]:
    """The tensors a closure (or a StaticStep) reads: its cells' tensors and buffers."""
    if hasattr(fn, "buffers"):
        return list(fn.buffers())
    cells = [c.cell_contents for c in (fn.__closure__ or ())]
    return [t for t in cells if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize(
    "fields",
    [
        {"impl": "sdpa", "scenario": "attention", "causal": True},
        {"impl": "sdpa", "scenario": "attention+backward"},
        {"impl": "sdpa", "scenario": "decode", "causal": True, "layers": 1, "gen_tokens": 2},
    ],
    ids=["attention", "attention+backward", "decode"],
)
def test_every_scenario_s_captured_call_keeps_its_buffers_alive(fake_capture, monkeypatch,
                                                              fields):
    """``[measure] cuda_graph`` through the runner's path (:func:`launch_case`) for any
    scenario: once the Case is gone, the launched call alone keeps every tensor the captured
    call reads (the inputs built outside the timed call, decode's static step), and replays
    give what the eager call gives."""
    import gc
    import weakref

    from harness.measure.device import CpuDevice
    from harness.scenarios.case import CaseOptions, launch_case
    from harness.scenarios.decode import step_graph
    from harness.scenarios.interface import scenario_of

    held: list[weakref.ref] = []
    real = step_graph.StaticStep

    def recording(*args):  # decode's static step: the tensors the graph reads
        step = real(*args)
        held.extend(weakref.ref(t) for t in _tensors_of(step))
        return step

    monkeypatch.setattr(step_graph, "StaticStep", recording)
    point = Point.of(seq_len=23, heads=2, head_dim=6, batch=1, **fields)
    case = scenario_of(point).build_case(point, CpuDevice(), CaseOptions("none"))
    eager = case.run
    if point.scenario != "decode":  # the timed closure is captured: its inputs
        held.extend(weakref.ref(t) for t in _tensors_of(eager))
    launched = launch_case(case, True, "cuda")
    assert launched.mode == "cuda-graph" and case.columns["cuda_graph"] == "cuda-graph"
    if point.scenario == "decode":
        assert case.columns["decode_graph"] == "cuda-graph"
    expected = eager()
    del case, eager
    gc.collect()
    assert held and all(ref() is not None for ref in held), "a buffer of the graph was freed"
    out = launched.run()
    for got, want in zip(out if isinstance(out, tuple) else (out,),
                         expected if isinstance(expected, tuple) else (expected,), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
