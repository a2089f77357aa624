"""Direct calls check capabilities; availability comes from a real (probe) call."""

from __future__ import annotations

import pytest
import torch

from harness import registry
from harness.masks import MaskSpec
from harness.oracle.agreement import output_agreement
from harness.oracle.reference import naive_attention, reference_attention
from harness.registry import Implementation, NotSupportedError
from harness.spec import Capabilities, Cost
from tests.conftest import make_qkv

WINDOWED = MaskSpec(causal=True, window=(15, 0))


@pytest.mark.parametrize("name", ["sdpa", "sdpa-flash", "flash-tiled"])
def test_direct_call_with_an_unsupported_mask_raises_naming_the_feature(name):
    q, k, v = make_qkv(1, 2, 64, 64, 16, seed=1)
    with pytest.raises(NotSupportedError, match=rf"{name} .*mask features \['window'\]"):
        registry.get(name)(q, k, v, WINDOWED)
    assert issubclass(NotSupportedError, ValueError)


@pytest.mark.parametrize("name", ["sdpa", "sdpa-flash", "flash-tiled", "local"])
def test_supported_direct_calls_still_agree(name):
    mask = WINDOWED if name == "local" else MaskSpec(causal=True)
    q, k, v = make_qkv(1, 2, 97, 97, 59, seed=2)
    out = registry.get(name)(q, k, v, mask)
    ref = reference_attention(q, k, v, mask)
    assert output_agreement(out, ref, torch.float32, naive=naive_attention(q, k, v, mask))["agree"]


def test_internal_prepared_calls_do_not_go_through_the_check():
    # the runner checks support once per point, then times impl.prepare(problem): no re-check
    impl = registry.get("sdpa")
    q, k, v = make_qkv(1, 1, 8, 8, 8, seed=3)
    from harness.spec import Problem

    attn = impl.prepare(Problem(1, 1, 8, 8, 8, mask=MaskSpec(causal=True)))
    assert torch.equal(attn(q, k, v), impl.fn(q, k, v, MaskSpec(causal=True)))


def _scratch(calls: list, **caps) -> Implementation:
    def reasons(problem):
        calls.append(problem)
        return []

    return Implementation(
        name="scratch", family="test", caps=Capabilities(**caps), cost=Cost(2, 2),
        fn=lambda q, k, v, mask, scale=None: q, extra_reasons=reasons,
    )


def test_the_check_is_cached_per_problem():
    calls: list = []
    impl = _scratch(calls)
    q, k, v = make_qkv(1, 2, 16, 16, 8, seed=4)
    for _ in range(5):
        impl(q, k, v, MaskSpec(causal=True))
    assert len(calls) == 1
    impl(q[:, :, :8], k, v, MaskSpec(causal=True))  # a new shape is checked again
    assert len(calls) == 2


def test_backward_and_dtype_and_grouped_kv_are_checked():
    impl = _scratch([], backward=False, dtypes={torch.float32})
    q, k, v = make_qkv(1, 2, 16, 16, 8, seed=5, requires_grad=True)
    with pytest.raises(NotSupportedError, match="no backward pass"):
        impl(q, k, v)
    with torch.no_grad():
        impl(q, k, v)  # forward only: fine
        with pytest.raises(NotSupportedError, match="dtype float64"):
            impl(q.double(), k.double(), v.double())
        with pytest.raises(NotSupportedError, match="grouped"):
            impl(q, k[:, :1], v[:, :1])


def _probed(probe, devices=("cpu", "cuda")) -> Implementation:
    return Implementation(
        name=f"probed-{id(probe)}", family="test", caps=Capabilities(devices=set(devices)),
        cost=Cost(2, 2), fn=lambda q, k, v, mask, scale=None: q, probe=probe,
    )


def test_availability_comes_from_the_probe_and_is_cached():
    seen: list[str] = []

    def broken(device_type: str):
        seen.append(device_type)
        raise NotImplementedError(
            "No operator found for `memory_efficient_attention_forward` with inputs:\n  query"
        )

    impl = _probed(broken)
    reason = impl.unavailable_reason("cpu")
    assert reason == (
        "probe on cpu: NotImplementedError: No operator found for "
        "`memory_efficient_attention_forward` with inputs:"
    )
    assert impl.unavailable_reason("cpu") == reason and seen == ["cpu"]  # once per process
    q, k, v = make_qkv(1, 1, 8, 8, 8, seed=6)
    with pytest.raises(NotSupportedError, match="No operator found"):
        impl(q, k, v)
    from harness.spec import Problem

    assert impl.not_supported(Problem(1, 1, 8, 8, 8)) == [f"unavailable: {reason}"]


def test_a_working_probe_means_available():
    impl = _probed(lambda d: torch.ones(2, device=d))
    assert impl.unavailable_reason("cpu") is None


def test_cuda_only_backend_on_a_machine_without_cuda():
    impl = _probed(lambda d: torch.ones(2, device=d), devices=("cuda",))
    if torch.cuda.is_available():
        assert impl.unavailable_reason() is None
    else:
        assert "runs on cuda only" in impl.unavailable_reason()
        # asked for a CPU point, the capability check (device) says it, not availability
        assert impl.unavailable_reason("cpu") is None


def test_a_probe_that_meets_a_cuda_error_is_not_remembered(tmp_path, monkeypatch):
    """A CUDA error in a probe may be this process's poisoned context, not the backend: it is
    this process's answer, never the environment's (harness.probecache)."""
    from harness import probecache

    monkeypatch.setenv(probecache.CACHE_ENV, str(tmp_path))

    def poisoned(device_type: str):
        raise torch.AcceleratorError("CUDA error: device-side assert triggered")

    def broken(device_type: str):
        raise ImportError("no module named fla")

    sick, missing = _probed(poisoned), _probed(broken)
    assert "CUDA error" in sick.unavailable_reason("cpu")
    assert missing.unavailable_reason("cpu").startswith("probe on cpu: ImportError")
    assert probecache.recall(sick.name, "cpu") == (False, None)
    assert probecache.recall(missing.name, "cpu") == (True, missing.unavailable_reason("cpu"))


def test_a_points_calls_are_judged_together_and_the_probe_runs_once(tmp_path, monkeypatch):
    """``not_supported_each``: each call its own declared reasons and ``extra_reasons`` (asked
    only of a call the declarations accept); an unavailable implementation gives every call
    the one reason its probe gave, the probe run once for them all."""
    from harness import probecache
    from harness.spec import Problem

    monkeypatch.setenv(probecache.CACHE_ENV, str(tmp_path))
    asked: list[Problem] = []
    impl = _scratch(asked, mask_features={"causal"})
    causal, windowed = (Problem(1, 1, 8, 8, 8, mask=m) for m in (MaskSpec(causal=True), WINDOWED))
    assert impl.not_supported_each([windowed, causal]) == [
        impl.declared_reasons(windowed), []
    ]
    assert impl.declared_reasons(windowed) and asked == [causal]

    probes: list[str] = []

    def broken(device_type: str):
        probes.append(device_type)
        raise ImportError("no module named fused_ops")

    sick = _probed(broken)
    found = sick.not_supported_each([windowed, causal])
    assert found == [["unavailable: probe on cpu: ImportError: no module named fused_ops"]] * 2
    assert probes == ["cpu"]
    assert probecache.recall(sick.name, "cpu") == (True, found[0][0].removeprefix("unavailable: "))


def test_a_tiny_call_probe_is_one_call_of_the_implementation_itself(tmp_path, monkeypatch):
    """``probe=TinyCall()``: availability comes from calling the registered function on tiny
    causal inputs (float32 on a CPU); what it raises is the reason."""
    from harness import probecache

    monkeypatch.setenv(probecache.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_ORIGINS", dict(registry._ORIGINS))
    seen: list = []

    def core(q, k, v, mask, scale=None):
        seen.append((q.dtype, tuple(q.shape), mask))
        if q.dtype != torch.float64:
            raise RuntimeError("no kernel for this dtype")
        return q

    registry.register("tiny-probed", family="test", caps=Capabilities(), cost=Cost(2, 2),
                      probe=registry.TinyCall(cpu_dtype=torch.float16))(core)
    reason = registry.get("tiny-probed").unavailable_reason("cpu")
    assert reason == "probe on cpu: RuntimeError: no kernel for this dtype"
    assert seen == [(torch.float16, (1, 2, 16, 64), MaskSpec(causal=True))]
    assert registry.TinyCall(cpu_dtype=torch.float64).probe(core)("cpu").dtype == torch.float64
