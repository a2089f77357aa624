"""How a fused-kernel launch picks its config: autotuned, pinned to the class default
(``ATTNBENCH_AUTOTUNE=off``, what the tests run), forced (the kernel sweep); the watchers that
count a call's compiles and record launches to replay.

On CPU the kernels run in Triton's interpreter; the pinned GPU path is run there too, with the
GPU class's default tiles (an sm_90 class off a GPU).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

import triton

from harness.masks import MaskSpec
from harness.oracle.agreement import grad_agreement, output_agreement
from harness.oracle.reference import reference_attention, reference_grads
from implementations._kernels.triton import (
    aot_check,
    attention_launches,
    autotune,
    kernel_launch,
    masked_attention,
)
from implementations._kernels.triton.autotune import (
    TUNING_ENV,
    autotuning,
    class_configs,
    config_label,
)
from implementations._kernels.triton.plan_tables import tune_key
from tests.conftest import make_qkv

pytestmark = pytest.mark.cuda
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
WINDOW = MaskSpec(causal=True, window=(40, 0))
TUNED = {"band_fwd", "band_dq", "band_dkdv", "band_fwd_split", "blocks_fwd", "blocks_dq",
         "blocks_dkdv"}


def _capability() -> tuple[int, int]:
    return torch.cuda.get_device_capability() if DEVICE == "cuda" else (9, 0)


def _forward_backward(mask: MaskSpec, shape=(1, 2, 97, 97, 64), seed: int = 51):
    """Run one call forward and backward, watched; returns (launches, out, grads, inputs)."""
    launched: list[kernel_launch.Launch] = []
    q, k, v = (t.to(DEVICE).requires_grad_(True) for t in make_qkv(*shape, seed=seed))
    g = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1)).to(DEVICE)
    with kernel_launch.watching(launched.append):
        out = masked_attention.triton_attention(q, k, v, mask)
        grads = torch.autograd.grad(out, (q, k, v), g)
    return launched, out.detach(), grads, (q, k, v, g)


def _agree(out, grads, inputs, mask) -> None:
    q, k, v, g = inputs
    ref = reference_attention(q.detach(), k.detach(), v.detach(), mask)
    assert output_agreement(out, ref, torch.float32)["agree"]
    result = grad_agreement(grads, reference_grads(q, k, v, g, mask), torch.float32)
    assert result["grad_agree"], result


def test_the_switch_reads_the_environment(monkeypatch):
    monkeypatch.delenv(TUNING_ENV, raising=False)
    assert autotuning()
    for value, want in (("off", False), ("OFF", False), ("0", False), ("on", True), ("1", True)):
        monkeypatch.setenv(TUNING_ENV, value)
        assert autotuning() is want
    monkeypatch.setenv(TUNING_ENV, "sometimes")
    with pytest.raises(ValueError, match="use on or off"):
        autotuning()


def test_the_tests_pin_every_autotuned_kernel():
    """tests/conftest.py turns autotuning off: each autotuned kernel runs one config."""
    launched, *_ = _forward_backward(WINDOW)
    assert {r.name: r.how for r in launched} == {
        "band_fwd": "pinned", "delta_kernel": "fixed", "band_dkdv": "pinned", "band_dq": "pinned"}


def test_a_pinned_launch_runs_the_class_default_the_aot_check_compiles(monkeypatch):
    """Off a GPU too: the GPU path of the pin (the sm_90 class here), run in the interpreter
    with the class's default tiles, agrees with float64; each config is the one
    ``aot_kernels.py --ci`` compiles for that target."""
    monkeypatch.setattr(kernel_launch, "interpreted", lambda: False)
    launched, out, grads, inputs = _forward_backward(WINDOW)
    _agree(out, grads, inputs, WINDOW)
    capability = _capability()
    target = "sm_90" if capability[0] >= 9 else "sm_80"
    aot = {r.name: config_label(aot_check.configs(r, target)[0])
           for r in aot_check.record("band", 64) if r.name in TUNED}
    pinned = {r.name: config_label(r.config) for r in launched if r.how == "pinned"}
    assert pinned == {name: aot[name] for name in ("band_fwd", "band_dkdv", "band_dq")}
    assert pinned["band_fwd"] == config_label(class_configs("band_fwd", 64, capability)[0])


def test_the_measured_hopper_defaults_agree_where_the_band_has_an_unmasked_middle(monkeypatch):
    """The sm_90 D 64 defaults the H100 sweep chose (forward 64x64, dQ 128x32, dK/dV 64x64:
    ``autotune.MEASURED``), pinned and run in the interpreter at their own tiles on a
    window of 384 keys at n = 701, where every kernel walks masked edges and an unmasked
    middle: forward and gradients agree with float64."""
    if DEVICE == "cuda":
        pytest.skip("a GPU runs its own class's defaults in the other tests")
    monkeypatch.setattr(kernel_launch, "interpreted", lambda: False)
    mask = MaskSpec(causal=True, window=(383, 0))
    launched, out, grads, inputs = _forward_backward(mask, shape=(1, 1, 701, 701, 64), seed=59)
    _agree(out, grads, inputs, mask)
    pinned = {r.name: config_label(r.config) for r in launched if r.how == "pinned"}
    assert pinned == {name: autotune.MEASURED[name, "sm90-d64"].config
                      for name in ("band_fwd", "band_dq", "band_dkdv")}


def test_pinning_bounds_the_compiles_of_a_call():
    """Forward and backward of one mask: 4 kernel variants pinned (forward, delta, dK/dV, dQ),
    every config of each autotuned kernel's class when autotuning (sm_90, D 64)."""
    launched, *_ = _forward_backward(WINDOW)
    pinned = set().union(*(kernel_launch.compile_keys(r) for r in launched))
    assert len(pinned) == 4
    tuned = [dataclasses.replace(r, how="autotuned") if r.name in TUNED else r for r in launched]
    autotuned = set().union(*(kernel_launch.compile_keys(r) for r in tuned))
    want = 1 + sum(len(class_configs(n, 64, (9, 0))) for n in ("band_fwd", "band_dkdv", "band_dq"))
    assert len(autotuned) == want > 3 * len(pinned)


def test_a_forced_config_runs_and_is_not_taken_for_the_tuned_one():
    """The sweep's forced config (64x32, 4 warps: every class has it) runs as given and leaves
    the executed-pairs table (``CHOSEN``) as it was."""
    forced = triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=2)
    key = tune_key(WINDOW, 97, 97, 64, torch.float32)
    before = attention_launches.CHOSEN.get(key)
    with kernel_launch.forced({"band_fwd": forced}):
        launched, out, grads, inputs = _forward_backward(WINDOW, seed=53)
    _agree(out, grads, inputs, WINDOW)
    fwd = next(r for r in launched if r.name == "band_fwd")
    assert (fwd.how, fwd.config) == ("forced", forced)
    assert attention_launches.CHOSEN.get(key) == before


def test_a_recorded_launch_replays_with_another_config():
    """The sweep's replay: the forward launch rerun on its own tensors with another config
    rewrites the same output."""
    mask = MaskSpec(causal=True, window=(20, 0), global_tokens=(3,))
    launched: list[kernel_launch.Launch] = []
    q, k, v = (t.to(DEVICE) for t in make_qkv(1, 2, 70, 70, 59, seed=55))
    with kernel_launch.watching(launched.append):
        out = masked_attention.triton_attention(q, k, v, mask)
    fwd = next(r for r in launched if r.name == "band_fwd")
    written = fwd.args[3]
    assert written.data_ptr() == out.data_ptr()
    written.fill_(float("nan"))
    fwd.replay(triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=2))
    assert output_agreement(written, reference_attention(q, k, v, mask), torch.float32)["agree"]


@pytest.mark.autotunes
@pytest.mark.skipif(DEVICE == "cpu", reason="the interpreter has one config: nothing to tune")
def test_autotuning_on_times_every_config_of_the_class(monkeypatch):
    """The one test that autotunes (a GPU): the forward's first launch of a tuning key times
    every config of its class and keeps the fastest; the output agrees."""
    monkeypatch.setenv(TUNING_ENV, "on")
    mask = MaskSpec(causal=True, window=(255, 0))
    q, k, v = make_qkv(1, 4, 2048, 2048, 64, dtype=torch.bfloat16, seed=57)
    q, k, v = q.to(DEVICE), k.to(DEVICE), v.to(DEVICE)
    launched: list[kernel_launch.Launch] = []
    with kernel_launch.watching(launched.append):
        out = masked_attention.triton_attention(q, k, v, mask)
    assert output_agreement(out, reference_attention(q, k, v, mask), torch.bfloat16)["agree"]
    fwd = next(r for r in launched if r.name == "band_fwd")
    assert fwd.how == "autotuned"
    labels = {config_label(c) for c in class_configs("band_fwd", 64, _capability(), fwd.kwargs)}
    kernel = fwd.kernel
    assert {config_label(c) for c in kernel.configs_timings} == labels
    assert config_label(kernel.best_config) in labels
    key = tune_key(mask, 2048, 2048, 64, torch.bfloat16)
    assert attention_launches.CHOSEN[key] == kernel.best_config.kwargs
