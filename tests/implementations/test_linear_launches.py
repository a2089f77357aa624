"""Launches per call of the linear-complexity attentions, counted as ATen ops on the CPU (each
op is one kernel launch or fewer on a GPU): with one segment (a GPU's default) the count does
not depend on n, causal or not; with a small ``segment_bytes`` it grows by a fixed number of
ops per segment and nothing else. Also: segments change no output (performer's stabiliser
included), a cap below one chunk's workspace and mixed q/k/v devices or dtypes are refused
before any op runs."""

from __future__ import annotations

import pytest
import torch

from harness import registry
from harness.masks import MaskSpec
from harness.measure.dispatch import OpCount
from harness.registry import NotSupportedError
from harness.spec import Problem
from implementations import _feature_maps
from tests.conftest import make_qkv, prepared_peak_beyond_output

ONE_SEGMENT = 2**40  # bytes: every length here fits one segment, as on a GPU
CASES = [
    ("linear", False),
    ("linear", True),
    ("performer", False),
    ("performer", True),
    ("linformer", False),
    ("nystrom", False),
]


def segment_params(name: str, segment_bytes: int) -> dict:
    return {"segment_bytes": segment_bytes} if "segment_bytes" in registry.get(name).params else {}


def ops_of_one_call(name: str, n: int, causal: bool, **params) -> int:
    """ATen ops of one call at B1 H8 D64 float32 (after a first call that fills the caches)."""
    q, k, v = make_qkv(1, 8, n, n, 64, seed=n)
    impl, mask = registry.get(name), MaskSpec(causal=causal)
    with torch.no_grad():
        impl(q, k, v, mask, **params)
        with OpCount() as count:
            impl(q, k, v, mask, **params)
    return count.ops


IDS = [f"{n}-{'causal' if c else 'full'}" for n, c in CASES]


@pytest.mark.parametrize("name,causal", CASES, ids=IDS)
def test_ops_per_call_do_not_grow_with_n(name, causal):
    """Before the chunkwise-parallel form: linear 26 -> 302 ops (causal 267 -> 4155) and
    performer 217 -> 3397 (461 -> 7301) from n = 1024 to 16384, a Python loop over 8 MiB
    segments and, causal, over chunks."""
    params = segment_params(name, ONE_SEGMENT)
    short, long = (
        ops_of_one_call(name, 1024, causal, **params),
        ops_of_one_call(name, 16384, causal, **params),
    )
    assert short == long, (short, long)


@pytest.mark.parametrize("name", ["linear", "performer"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_small_segments_add_a_fixed_number_of_ops_per_segment(name, causal):
    """segment_bytes = four chunks' workspace: n = 1024, 2048, 4096 run in 4, 8, 16 segments;
    the ops grow by the same amount per segment, so ops = fixed + per_segment × segments."""
    problem = Problem(1, 8, 1024, 1024, 64, mask=MaskSpec(causal=causal))
    state = registry.get(name).new_state(problem)
    cap = 4 * state.chunk_bytes(causal)
    counts = [ops_of_one_call(name, n, causal, segment_bytes=cap) for n in (1024, 2048, 4096)]
    segments = [n // (4 * state.chunk) for n in (1024, 2048, 4096)]
    assert segments == [4, 8, 16]
    per_segment = (counts[1] - counts[0]) / (segments[1] - segments[0])
    assert per_segment > 0 and counts[0] - per_segment * segments[0] >= 0, counts
    assert counts[2] == counts[0] + per_segment * (segments[2] - segments[0]), counts


@pytest.mark.parametrize("name", ["linear", "performer"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n", [97, 640, 1000])
def test_segments_change_no_output(name, causal, n):
    """Several segments (some with a partial last chunk, performer's key stabiliser moving from
    segment to segment) give the one-segment output, and both the float64 definition."""
    q, k, v = make_qkv(1, 4, n, n, 24, kv_heads=2, dtype=torch.float64, seed=n)
    impl, mask = registry.get(name), MaskSpec(causal=causal, seed=3)
    params = {"chunk_size": 16, **({"features": 32} if name == "performer" else {})}
    problem = Problem(
        1,
        4,
        n,
        n,
        24,
        dtype=torch.float64,
        mask=mask,
        kv_heads=2,
        params=tuple(sorted(params.items())),
    )
    chunk = impl.new_state(problem).chunk_bytes(causal)
    one = impl(q, k, v, mask, segment_bytes=ONE_SEGMENT, **params)
    for chunks in (1, 3):
        several = impl(q, k, v, mask, segment_bytes=chunks * chunk, **params)
        torch.testing.assert_close(several, one, rtol=1e-12, atol=1e-12)
    ref = impl.define(q, k, v, mask, **params)
    torch.testing.assert_close(one, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["linear", "performer"])
def test_a_cap_below_one_chunk_is_refused_in_one_line(name):
    q, k, v = make_qkv(1, 8, 256, 256, 64, seed=5)
    impl, mask = registry.get(name), MaskSpec(causal=True)
    need = impl.new_state(Problem(1, 8, 256, 256, 64, mask=mask)).chunk_bytes(True)
    with pytest.raises(NotSupportedError) as err:
        impl(q, k, v, mask, segment_bytes=need - 1)
    text = str(err.value)
    assert "\n" not in text
    assert f"segment_bytes = {need - 1:,} B" in text and f"{need:,} B" in text, text
    state = impl.new_state(
        Problem(1, 8, 256, 256, 64, mask=mask, params=(("segment_bytes", need - 1),))
    )
    with pytest.raises(ValueError, match="below one chunk's workspace"):
        state.advance(q, k, v)


@pytest.mark.parametrize("name", ["linear", "performer", "linformer", "nystrom"])
@pytest.mark.parametrize("odd", ["device", "dtype"])
def test_mixed_devices_or_dtypes_are_refused_before_any_op(name, odd):
    q, k, v = make_qkv(1, 2, 300, 300, 16, seed=6)
    k = k.to("meta") if odd == "device" else k.double()
    with OpCount() as count, pytest.raises(ValueError, match="one device and one dtype") as err:
        registry.get(name)(q, k, v, MaskSpec())
    assert count.ops == 0
    text = str(err.value)
    assert "\n" not in text and ("k meta" if odd == "device" else "k cpu float64") in text, text


@pytest.fixture
def blocked_on_cpu(monkeypatch):
    """The GPU's blocked key reduction (``_feature_maps.REDUCE_ROWS``) on this CPU."""
    monkeypatch.setattr(_feature_maps, "BLOCKED_REDUCTION_DEVICES", {"cpu", "cuda"})


@pytest.mark.parametrize("name", ["linear", "performer"])
def test_the_blocked_key_reduction_keeps_ops_and_outputs(blocked_on_cpu, name):
    """Keys in blocks of 1024: the same ops at n = 1024 and 16384 (one segment); the output of
    n = 2500 (two blocks and a rest, causal with a longer key prefix too) is the unblocked one."""
    full = MaskSpec()
    assert ops_of_one_call(name, 1024, False, segment_bytes=ONE_SEGMENT) == ops_of_one_call(
        name, 16384, False, segment_bytes=ONE_SEGMENT
    )
    impl = registry.get(name)
    params = {"features": 32} if name == "performer" else {}
    for n_q, mask in ((2500, full), (300, MaskSpec(causal=True))):
        q, k, v = make_qkv(1, 4, n_q, 2500, 16, kv_heads=2, dtype=torch.float64, seed=n_q)
        blocked = impl(q, k, v, mask, segment_bytes=ONE_SEGMENT, **params)
        torch.testing.assert_close(
            blocked, impl.define(q, k, v, mask, **params), rtol=1e-10, atol=1e-12
        )


@pytest.mark.parametrize("name", ["linear", "performer"])
@pytest.mark.parametrize("n_q,n_k,causal", [(3072, 3072, False), (1000, 2500, True)])
def test_the_memory_model_follows_the_blocked_reduction(blocked_on_cpu, name, n_q, n_k, causal):
    q, k, v = make_qkv(1, 8, n_q, n_k, 64, seed=n_q)
    problem = Problem(1, 8, n_q, n_k, 64, mask=MaskSpec(causal=causal),
                      params=(("segment_bytes", ONE_SEGMENT),))
    measured = prepared_peak_beyond_output(name, problem, q, k, v)
    assert abs(measured - registry.get(name).cost.memory_model(problem)) <= 64, measured
