"""The decode scenario: cached steps agree with recomputation through the registry cores, the
check can fail, support reasons, the runner's row, and the cost formulas."""

from __future__ import annotations

import pytest
import torch

from harness import registry
from harness.distributed.shard import CALL_OVERHEAD_S, predicted_seconds
from harness.execute.runner import run_point
from harness.measure.device import get_device
from harness.measure.timing import TimingConfig
from harness.scenarios.case import CaseOptions, launch_case, launch_mode
from harness.scenarios.decode import decode_case as dec
from harness.scenarios.decode.caches import FullCache
from harness.scenarios.decode.decode_cost import step_problem, stepwise
from harness.scenarios.interface import Point, cost_of, scenario_of
from harness.sweep.suite import MeasureConfig

CPU = get_device("cpu", False)


def _point(
    impl: str = "sdpa", cache: str = "full", n: int = 37, window: int | None = None, **kw
) -> Point:
    """Odd sizes: 3 heads of 10 dims, a 37-token context, 6 steps deep."""
    base = dict(
        impl=impl,
        scenario="decode",
        seq_len=n,
        heads=3,
        head_dim=10,
        layers=2,
        gen_tokens=6,
        causal=True,
        cache=cache,
        batch=2,
        window_left=None if window is None else window - 1,
        window_right=None if window is None else 0,
    )
    return Point.of(**{**base, **kw})


def build_case(point: Point, check: str = "auto", graph: str = "auto"):
    """The decode Case with ``decode_graph = graph``, launched as the runner launches it."""
    case = scenario_of(point).build_case(point, CPU, CaseOptions(check, {"decode_graph": graph}))
    launch_case(case, None, CPU.kind)
    return case


def step_bytes(point: Point) -> int:
    return cost_of(point).step_bytes


def _check(point: Point, mode: str = "auto") -> dict:
    case = build_case(point, mode)
    case.run()
    return case.check()


CASES = [
    ("sdpa", "none", None),
    ("sdpa", "full", None),
    ("sdpa", "rolling", 8),
    ("full", "full", 16),
    ("full", "none", 16),
    ("full", "rolling", 16),
    ("flash-tiled", "full", None),
    ("flash-tiled", "rolling", 8),
    ("local", "rolling", 16),
]


@pytest.mark.parametrize("impl, cache, window", CASES)
def test_cached_steps_agree_with_float64_recomputation(impl, cache, window):
    # cores without window masks prefill a rolling cache token by token: a shorter context
    n = 19 if cache == "rolling" and "window" not in registry.get(impl).caps.mask_features else 37
    result = _check(_point(impl, cache, n=n, window=window))
    assert result["agree"] is True, result
    assert result["check"] == "float64" and result["max_abs_err"] < 1e-4
    # a core without window masks cannot recompute a sliding-window model in one call
    if window is None or "window" in registry.get(impl).caps.mask_features:
        assert result["recompute_max_abs_err"] < 1e-4 and result["naive_err"] < 1e-4
    else:
        assert "recompute_max_abs_err" not in result
    assert result["timed_step_max_abs_err"] == 0.0  # the timed step is step 0 of the check


@pytest.mark.parametrize("kv_heads", [1, 3])
@pytest.mark.parametrize("cache, window", [("full", None), ("rolling", 8)])
def test_grouped_kv_heads(kv_heads, cache, window):
    point = _point("sdpa", cache, n=19, window=window, heads=6, kv_heads=kv_heads)
    assert _check(point)["agree"] is True


@pytest.mark.parametrize("n", [5, 13, 16, 40])
def test_rolling_before_during_and_after_the_window_fills(n):
    """A 16-key window: context shorter than, crossing, equal to and past the window."""
    point = _point("full", "rolling", n=n, window=16, gen_tokens=7, dtype="float64")
    result = _check(point)
    assert result["agree"] is True and result["max_abs_err"] < 1e-10


@pytest.mark.parametrize("pos, norm", [("learned", "post"), ("sinusoidal", "pre")])
def test_absolute_position_encodings(pos, norm):
    assert _check(_point("sdpa", "full", pos=pos, norm=norm))["agree"] is True


def test_long_context_checks_against_same_dtype_recomputation():
    result = _check(_point("sdpa", "full"), mode="rows")
    assert result["agree"] is True and result["check"] == "recompute"
    assert "naive_err" not in result
    windowed = _check(_point("sdpa", "rolling", n=19, window=8), mode="rows")
    assert windowed["check"] == "float64"  # sdpa cannot recompute a windowed model


def test_a_broken_cache_is_a_mismatch(monkeypatch):
    """A cache that drops the newest key must fail the check (the check can fail)."""
    update = FullCache.update

    def forgetful(self, pos, k, v):
        keys, values, mask = update(self, pos, k, v)
        return (
            (keys[:, :, :-1], values[:, :, :-1], mask) if k.shape[2] == 1 else (keys, values, mask)
        )

    monkeypatch.setattr(FullCache, "update", forgetful)
    assert _check(_point("sdpa", "full"))["agree"] is False


@pytest.mark.parametrize("cache, window", [("full", None), ("rolling", 16), ("none", None)])
def test_the_timed_step_repeats_without_growing_the_cache(cache, window):
    """Many timed calls redo one step: same output, same cache bytes, before and after the
    re-prefill that measures prefill_s."""
    case = build_case(_point("full", cache, window=window), "none")
    first = case.run()
    before = case.extra(None, None)
    again = [case.run() for _ in range(5)]
    after = case.extra(None, None)
    assert all(torch.equal(first, out) for out in again)
    assert before["cache_bytes"] == after["cache_bytes"] == before["cache_bytes_analytic"]
    assert before["cache_alloc_bytes"] == before["cache_bytes"]


@pytest.mark.parametrize(
    "point, reason",
    [
        (_point(causal=False), "decode is causal"),
        (_point(cache="rolling"), "needs a causal sliding window"),
        (_point("flash-tiled", kv_heads=1), "grouped/multi-query"),
        (_point("sdpa", "full", window=16), "window"),
        (_point("full", dilation=2, window=8), "not ['dilation']"),
    ],
)
def test_unsupported_points_say_why(point, reason):
    reasons = scenario_of(point).support(point)
    assert any(reason in r for r in reasons), reasons
    with pytest.raises(ValueError, match="decode: "):
        build_case(point, "none")


def test_rolling_prefill_is_stepwise_only_without_window_support():
    assert stepwise(_point("sdpa", "rolling", window=8), registry.get("sdpa"))
    assert not stepwise(_point("full", "rolling", window=8), registry.get("full"))


def test_a_stepwise_prefill_is_priced_per_token_and_layer():
    """Its token steps are setup calls (three prefills in a first pass, one in a later one),
    so the planner sees a rolling sdpa point as the minutes it takes, not its step's FLOPs."""
    rolling = _point("sdpa", "rolling", window=8)
    n, layers = rolling.seq_len, rolling.settings.layers
    assert cost_of(rolling).setup_calls() == 3 * n * layers
    assert cost_of(rolling).setup_calls(first=False) == n * layers
    assert cost_of(_point("full", "rolling", window=8)).setup_calls() == 0
    assert cost_of(_point("sdpa", "full")).setup_calls() == 0
    stepwise_s = predicted_seconds(rolling, budget_s=0.05)
    parallel_s = predicted_seconds(_point("full", "rolling", window=8), budget_s=0.05)
    assert stepwise_s - parallel_s >= 3 * n * layers * CALL_OVERHEAD_S["cpu"] * 0.99


def test_step_problems():
    assert step_problem(_point(cache="full")).n_k == 38
    assert step_problem(_point(cache="full")).n_q == 1
    assert step_problem(_point(cache="rolling", window=16)).n_k == 16
    assert step_problem(_point(cache="none")).n_q == 38


def test_runner_row_has_the_decode_columns():
    config = MeasureConfig(timing=TimingConfig(budget_s=0.05, min_samples=3, warmup_calls=1))
    row = run_point(_point("full", "rolling", window=16), config, CPU)
    assert row["status"] == "ok", row.get("reason")
    assert row["cache_bytes"] == row["cache_bytes_analytic"] == 2 * 2 * 2 * 3 * 16 * 10 * 4
    assert row["prefill_s"] > 0 and row["tokens_per_s"] == pytest.approx(2 / row["time_median_s"])
    assert row["check"] == "float64" and row["agree"] is True


def test_flops_per_token_linear_with_a_cache_quadratic_without():
    def core(n: int, cache: str, executed: bool) -> float:
        cost = cost_of(_point(cache=cache, n=n))
        return cost.executed_flops if executed else cost.useful_flops

    per_key = 4 * 2 * 3 * 10 * 2  # 4·B·H·D per key, two layers
    assert core(101, "full", False) - core(100, "full", False) == per_key
    growth = [core(n + 1, "none", True) - core(n, "none", True) for n in (100, 200)]
    assert growth[1] > growth[0]  # the recomputed step's cost grows faster than linearly
    assert core(100, "none", False) == core(100, "full", False)  # useful work is the same


def test_predicted_peak_covers_the_cache_and_grows_with_context():
    small, big = _point(n=100), _point(n=1000)
    assert cost_of(big).peak_bytes > cost_of(small).peak_bytes
    rolling = _point("full", "rolling", n=1000, window=16)
    assert cost_of(rolling).peak_bytes > cost_of(rolling).cache_bytes > 0


@pytest.mark.parametrize("requested", ["cuda-graph", "compile"])
def test_graph_modes_on_cpu_fall_back_to_eager_and_say_why(requested):
    case = build_case(_point(), "none", graph=requested)
    assert case.columns["decode_graph"] == "none"
    assert case.columns["decode_graph_reason"] == "unavailable: CUDA graphs need a CUDA device"


def test_auto_graph_mode_is_eager_on_cpu_and_a_cuda_graph_on_cuda():
    """decode_graph = auto follows [measure] cuda_graph; unset, decode's default: a graph on
    CUDA, eager (without a reason) on a CPU. decode_graph itself wins over cuda_graph."""
    default = dec.step_graph.DEFAULT_LAUNCH
    assert launch_mode("auto", None, default, "cpu") == ("none", None)
    assert launch_mode("auto", None, default, "cuda") == ("cuda-graph", None)
    assert launch_mode("auto", False, default, "cuda") == ("none", None)
    assert launch_mode("compile", None, default, "cuda") == ("compile", None)
    assert launch_mode("cuda-graph", False, default, "cuda") == ("cuda-graph", None)
    no_cuda = "unavailable: CUDA graphs need a CUDA device"
    assert launch_mode("auto", True, default, "cpu") == ("none", no_cuda)
    with pytest.raises(ValueError, match="launch"):
        launch_mode("graph", None, default, "cuda")


def test_step_bytes_count_weights_and_the_kv_read_and_written():
    """One more context token adds exactly one K/V row per layer to read; a full rolling ring
    reads a constant number; the cost model's compulsory bytes are the same figure."""
    kv_row = 2 * 2 * 3 * 10 * 4  # K and V of one position: 2 · B · H_kv · D · 4 bytes
    grow = step_bytes(_point(n=101)) - step_bytes(_point(n=100))
    assert grow == 2 * kv_row  # two layers
    rolling = [step_bytes(_point("full", "rolling", n=n, window=16)) for n in (40, 90)]
    assert rolling[0] == rolling[1]
    d, hidden, size = 30, 120, 4  # gelu FFN 4·d, RoPE: no position table
    weights = (2 * d * d + 2 * d * d + 4 * d) + (d * hidden + hidden + hidden * d + d) + 4 * d
    point = _point(n=100)
    expected = 2 * (weights * size + kv_row * (101 + 1)) + 2 * (2 * d * size)
    assert step_bytes(point) == expected
    assert cost_of(point).compulsory_bytes == expected


def test_runner_row_names_the_launch_and_the_bandwidth_fraction():
    config = MeasureConfig(
        timing=TimingConfig(budget_s=0.05, min_samples=3, warmup_calls=1),
        options=(("decode_graph", "cuda-graph"),),
    )
    row = run_point(_point(n=200), config, CPU)
    assert row["status"] == "ok", row.get("reason")
    assert row["decode_graph"] == "none" and "unavailable" in row["decode_graph_reason"]
    assert row["step_bytes"] == step_bytes(_point(n=200))
    # a measured fraction of the measured bandwidth: positive and physically at most ~1
    assert 0 < row["bw_fraction"] < 2 and row["bw_source"]


def test_suite_measure_decode_graph_is_validated():
    from harness.errors import SuiteError
    from harness.sweep.suite import parse_suite

    doc = {"name": "d", "scenario": "decode", "implementations": ["sdpa"]}
    doc["fixed"] = {"causal": True}
    chosen = parse_suite({**doc, "measure": {"decode_graph": "compile"}}).measure
    assert chosen.options == (("decode_graph", "compile"),)
    assert parse_suite(doc).measure.options == ()
    both = parse_suite({**doc, "measure": {"decode_graph": "none", "cuda_graph": True}}).measure
    assert both.cuda_graph is True and both.options == (("decode_graph", "none"),)
    with pytest.raises(SuiteError, match="decode_graph"):
        parse_suite({**doc, "measure": {"decode_graph": "graphs"}})
    # decode's own option, not a general one: an attention suite is told whose it is
    attention = {**doc, "scenario": "attention", "measure": {"decode_graph": "none"}}
    with pytest.raises(SuiteError, match="an option of decode suites"):
        parse_suite(attention)
