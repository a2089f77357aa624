"""A mask that reduces to a simpler one (:func:`harness.masks.reduced`) costs what the simpler one
costs on every path: a causal decode-shaped call (one query, grouped K/V) dispatches the same
ATen ops and allocates the same peak as the plain call, and no path copies K/V across heads.

Deterministic: ops are recorded by a dispatch mode and memory by the CPU allocator's events
(:func:`harness.measure.device.profiler_peak_bytes`), never by a clock.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from harness import registry
from harness.masks import MaskSpec
from harness.measure.device import profiler_peak_bytes
from harness.spec import Capabilities, Cost, Problem
from tests.conftest import make_qkv

B, H, D, N = 2, 8, 64, 1024


def _ops(call) -> Counter:
    """How many times each ATen op is dispatched by ``call()`` (torch.profiler's CPU events: a
    dispatch mode would also see them, but not through ``CausalBias``'s tensor subclass)."""
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    return Counter(e.name for e in prof.events() if e.name.startswith("aten::"))


def _kv_heads(impl: registry.Implementation) -> int:
    return H // 4 if impl.caps.grouped_kv else H


def _decode_cases() -> list[str]:
    """Every implementation that runs both calls here."""
    out = []
    for impl in registry.all_implementations():
        problems = [
            Problem(B, H, 1, N, D, mask=MaskSpec(causal=c), kv_heads=_kv_heads(impl))
            for c in (False, True)
        ]
        if "cpu" in impl.caps.devices and not any(impl.not_supported_each(problems)):
            out.append(impl.name)
    return out


@pytest.mark.parametrize("name", _decode_cases())
def test_a_causal_decode_call_costs_what_the_plain_call_costs(name):
    """One query at the newest position keeps every key under causal: the prepared call (what
    the runner times) dispatches the same ops and allocates the same peak as the plain call
    (grouped K/V where declared). Before masks were reduced, ``sdpa`` repeated K/V across heads
    and took the lower-right bias path: 11x the time and 512 MiB at n = 4096, B = 4, 32/8
    heads, D = 128."""
    impl = registry.get(name)
    kv = _kv_heads(impl)
    q, k, v = make_qkv(B, H, 1, N, D, kv_heads=kv, seed=1)
    causal, plain = (
        impl.prepare(Problem(B, H, 1, N, D, mask=MaskSpec(causal=c), kv_heads=kv))
        for c in (True, False)
    )
    with torch.no_grad():
        plain(q, k, v), causal(q, k, v)  # caches, compilation, lazy imports: not counted
        assert _ops(lambda: causal(q, k, v)) == _ops(lambda: plain(q, k, v))
        kv_bytes = k.numel() * k.element_size()
        extra = profiler_peak_bytes(lambda: causal(q, k, v)) - profiler_peak_bytes(
            lambda: plain(q, k, v)
        )
        assert extra <= kv_bytes // 16


@pytest.mark.parametrize("name", ["sdpa", "sdpa-flash"])
@pytest.mark.parametrize("n_q", [1, 7, N])
def test_sdpa_never_copies_grouped_kv(name, n_q):
    """Grouped K/V go to SDPA with ``enable_gqa``: no repeat of K/V across heads at any query
    count (one, a few under the lower-right causal mask, all of them); the peak is that of the
    same call on K/V repeated beforehand (the kernel's own buffers, at any thread count), not
    that plus a copy of the repeated K/V."""
    impl, groups = registry.get(name), 4
    q, k, v = make_qkv(B, H, n_q, N, D, kv_heads=H // groups, seed=2)
    k_rep, v_rep = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    mask = MaskSpec(causal=True)
    call = lambda: impl(q, k, v, mask)
    with torch.no_grad():
        call(), impl(q, k_rep, v_rep, mask)
        ops = _ops(call)
        assert not {"aten::repeat_interleave", "aten::repeat", "aten::expand_copy"} & set(ops)
        repeated = 2 * k_rep.numel() * k_rep.element_size()
        own = profiler_peak_bytes(lambda: impl(q, k_rep, v_rep, mask))
        assert profiler_peak_bytes(call) <= own + repeated // 8


def test_every_path_is_handed_the_reduced_mask(monkeypatch):
    """The registry reduces the mask once, for a direct call and for a prepared one, after the
    capability check made on the mask as given."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    seen: list[MaskSpec] = []

    caps = Capabilities(mask_features={"causal", "window"})

    @registry.register("mask-recorder", family="test", caps=caps, cost=Cost(2, 2))
    def recorder(q, k, v, mask, scale=None):
        seen.append(mask)
        return torch.zeros_like(q)

    impl = registry.get("mask-recorder")
    q, k, v = make_qkv(1, 2, 1, 9, 8)
    impl(q, k, v, MaskSpec(causal=True, window=(8, 0)))
    impl(q, k, v, MaskSpec(causal=True, window=(3, 0)))
    problem = Problem(1, 2, 1, 9, 8, mask=MaskSpec(causal=True))
    impl.prepare(problem)(q, k, v)
    assert seen == [MaskSpec(), MaskSpec(causal=True, window=(3, 0)), MaskSpec()]
    with pytest.raises(registry.NotSupportedError, match="prefix"):  # not declared: refused,
        impl(q, k, v, MaskSpec(causal=True, prefix_len=2))  # though it reduces to the plain mask


@pytest.mark.parametrize("bias_takes_gqa", [True, False])
@pytest.mark.parametrize("n_q", [1, 13, 97, 120])
def test_sdpa_grouped_causal_is_the_definition(monkeypatch, bias_takes_gqa, n_q):
    """Grouped K/V under bottom-right causal, float64 at odd sizes, on both ways to the kernel:
    torch's CausalBias with ``enable_gqa``, or the bool mask where a torch's bias lacks it."""
    from harness.oracle.reference import reference_attention
    from implementations import sdpa

    monkeypatch.setattr(sdpa, "_bias_takes_gqa", lambda: bias_takes_gqa)
    q, k, v = make_qkv(2, 8, n_q, 97, 59, kv_heads=2, dtype=torch.float64, seed=3)
    mask = MaskSpec(causal=True)
    want = reference_attention(q, k, v, mask)
    torch.testing.assert_close(registry.get("sdpa")(q, k, v, mask), want, rtol=0, atol=1e-12)
