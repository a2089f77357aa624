"""Cost formulas against hand counts and against the modules they describe."""

from __future__ import annotations

import pytest
import torch

from harness import registry
from harness.cost.components import attention_pairs, ffn_hidden
from harness.execute.runner import run_point
from harness.measure import calibrate
from harness.measure.device import get_device
from harness.measure.timing import Measurement, TimingConfig
from harness.model.transformer import BlockConfig, build_block
from harness.scenarios.attention.attention_case import bandwidth_columns
from harness.scenarios.block.mixers import flop_crossover, mixer_factory
from harness.scenarios.decode.decode_case import make_stack
from harness.scenarios.interface import Point, cost_of, scenario_of
from harness.sweep.suite import MeasureConfig


def tiny(**kw) -> Point:
    return Point.of(**{"impl": "full", "batch": 1, "heads": 1, "head_dim": 1, **kw})


def useful(point: Point) -> float:
    return cost_of(point).useful_flops


@pytest.mark.parametrize(
    ("fields", "pairs"),
    [
        ({"seq_len": 4}, 16),  # dense: n²
        ({"seq_len": 4, "causal": True}, 10),  # 1+2+3+4, not 16/2
        ({"seq_len": 4, "causal": True, "window_left": 1, "window_right": 0}, 7),  # 1+2+2+2
        ({"seq_len": 4, "q_len": 2, "causal": True}, 7),  # bottom-right: 3 + 4
        ({"seq_len": 5, "window_left": 1, "window_right": 1}, 13),  # 2+3+3+3+2
    ],
)
def test_attention_flops_count_exact_kept_pairs(fields, pairs):
    point = tiny(**fields)
    assert attention_pairs(scenario_of(point).problem(point)) == pairs
    assert useful(point) == 4 * pairs


def test_flops_scale_with_batch_heads_head_dim_and_backward():
    point = Point("full", batch=2, heads=3, head_dim=5, seq_len=7)
    assert useful(point) == 4 * 2 * 3 * 5 * 49
    backward = Point("full", scenario="attention+backward", batch=2, heads=3, head_dim=5, seq_len=7)
    assert useful(backward) == pytest.approx(3.5 * 4 * 2 * 3 * 5 * 49)
    gqa = Point("full", batch=2, heads=4, kv_heads=1, head_dim=5, seq_len=7)
    assert useful(gqa) == 4 * 2 * 4 * 5 * 49  # K/V sharing saves memory, not FLOPs


def test_block_flops_per_mixer_by_hand():
    # d = 8, n = 3, gelu FFN hidden 32: 2·(8·32 + 32·8) = 1024 FLOPs per token
    lstm = Point.of("lstm", "block", heads=2, head_dim=4, seq_len=3)
    assert useful(lstm) == 3 * (16 * 64 + 1024)
    conv = Point.of("conv", "block", heads=2, head_dim=4, seq_len=3, conv_kernel=5)
    assert useful(conv) == 3 * (2 * 5 * 64 + 1024)
    attn = Point("sdpa", scenario="block", heads=2, head_dim=4, seq_len=3)
    core = 4 * 2 * 4 * 9
    assert useful(attn) == 3 * (2 * 8 * 32 + 1024) + core
    back = Point("sdpa", scenario="block+backward", heads=2, head_dim=4, seq_len=3)
    assert useful(back) == pytest.approx(3 * 3 * (512 + 1024) + 3.5 * core)


@pytest.mark.parametrize("mixer", ["attention", "lstm", "conv"])
@pytest.mark.parametrize("ffn", ["gelu", "swiglu"])
def test_weight_bytes_match_the_real_block(mixer, ffn):
    point = Point.of(
        "sdpa" if mixer == "attention" else mixer,
        "block",
        heads=4,
        head_dim=8,
        kv_heads=2,
        ffn=ffn,
        pos="learned",
        seq_len=16,
    )
    cfg = BlockConfig(heads=4, head_dim=8, kv_heads=2, ffn=ffn, pos="learned", max_len=16)
    block = build_block(cfg, seed=0, device="cpu", dtype=torch.float32,
                        mixer=mixer_factory(mixer, conv_kernel=3))
    params = sum(p.numel() for p in block.parameters())
    assert cost_of(point).weight_bytes == 4 * params
    assert ffn_hidden(32, ffn) == cfg.ffn_hidden


@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_decode_weight_bytes_match_its_real_blocks(pos):
    """Decode counts one block's weights with the block scenario's formula
    (components.block_params): a position table of seq_len + gen_tokens rows when learned."""
    point = Point.of("sdpa", "decode", heads=4, head_dim=8, kv_heads=2, ffn="swiglu", pos=pos,
                     seq_len=16, gen_tokens=3, causal=True)
    blocks = make_stack(point, registry.get("sdpa")).blocks
    params = sum(p.numel() for p in blocks[0].parameters())
    assert cost_of(point).weight_bytes == 4 * params
    assert len(blocks) == point.settings.layers


def test_flop_crossover_of_attention_and_recurrence():
    assert flop_crossover(512, "lstm") == 4 * 512  # 4·n·d = 16·d²
    assert flop_crossover(512, "lstm", projections=True) == 2 * 512
    assert flop_crossover(512, "lstm", causal=True) == 8 * 512
    assert flop_crossover(512, "conv", kernel=3) == pytest.approx(1.5 * 512)
    assert flop_crossover(512, "conv", kernel=3, projections=True) == 0.0


def test_decode_step_flops_and_cache_bytes():
    def step(cache: str) -> Point:
        return Point.of("sdpa", "decode", heads=2, head_dim=4, seq_len=10, gen_tokens=1,
                        layers=3, cache=cache, causal=True)

    point, none = step("full"), step("none")
    per_token = 2 * 8 * 32 + 1024  # projections + FFN for one token
    assert useful(point) == 3 * (per_token + 4 * 2 * 4 * 11)  # attends to 10 + itself
    assert cost_of(none).executed_flops > 5 * useful(none)
    assert cost_of(point).cache_bytes == 2 * 3 * 1 * 2 * 11 * 4 * 4
    rolling = Point.of(
        "sdpa",
        "decode",
        heads=2,
        head_dim=4,
        seq_len=100,
        layers=1,
        cache="rolling",
        window_left=15,
        window_right=0,
        causal=True,
    )
    assert cost_of(rolling).cache_bytes == 2 * 1 * 1 * 2 * 16 * 4 * 4
    assert cost_of(none).cache_bytes == 0


def test_peak_memory_prediction_of_eager_and_flash_attention():
    mib = 2**20
    full = Point("full", heads=8, head_dim=64, seq_len=1024)
    # q, k, v and out: 2 MiB each; scores + probabilities 2·8·1024²·4 B = 64 MiB
    assert cost_of(full).call_bytes == 2 * mib + 64 * mib
    assert cost_of(full).peak_bytes == 8 * mib + 64 * mib
    flash = Point("sdpa-flash", heads=8, head_dim=64, seq_len=1024)
    assert cost_of(flash).call_bytes == 2 * mib
    assert cost_of(Point("full", seq_len=2048)).call_bytes > 3.9 * cost_of(full).call_bytes
    assert cost_of(full).compulsory_bytes == 8 * mib


@pytest.mark.parametrize("scenario", ["block", "block+backward", "decode"])
def test_every_scenario_has_positive_models(scenario):
    point = Point.of("sdpa", scenario=scenario, causal=scenario == "decode", seq_len=256)
    assert useful(point) > 0
    assert cost_of(point).peak_bytes > cost_of(point).call_bytes > 0
    assert cost_of(point).compulsory_bytes > 0


def test_calibration_measures_positive_rates_and_picks_the_dtype_peak():
    from harness.measure import calibrate

    rates = calibrate.matmul_rates("cpu", "float32", n=128, budget_s=0.05)
    assert len(rates) >= 3 and all(r > 0 for r in rates)
    assert calibrate.measure_bandwidth("cpu", nbytes=4 * 2**20, budget_s=0.05) > 0
    cal = {"matmul_flops_per_s": 1.0, "matmul_flops_per_s_by_dtype": {"float16": 8.0}}
    assert calibrate.peak_for(cal, "float16") == 8.0
    assert calibrate.peak_for(cal, "float32") == 1.0
    assert calibrate.peak_for(None) is None
    assert calibrate.peak_for({**cal, "matmul_flops_per_s_best": 2.0}, "float32") == 2.0


def test_attention_compulsory_bytes_by_hand():
    """B2, 4 query heads over 2 K/V heads, 97 queries over 130 keys, D 59, bf16 (2 bytes):
    q and out 2·4·97·59·2 = 91,568 B each, k and v 2·2·130·59·2 = 61,360 B each, the fp32 row
    lse 2·4·97·4 = 3,104 B. Forward: q, k, v read, out written. Forward + backward: the forward,
    lse written, q, k, v, out, dout and lse read, dq, dk, dv written."""
    shape = dict(batch=2, heads=4, kv_heads=2, q_len=97, seq_len=130, head_dim=59,
                 dtype="bfloat16", causal=True)
    forward = Point.of("sdpa", **shape)
    assert cost_of(forward).compulsory_bytes == 91568 + 2 * 61360 + 91568
    backward = Point.of("sdpa", scenario="attention+backward", **shape)
    qkv = 91568 + 2 * 61360
    want = (qkv + 91568) + 3104 + (qkv + 2 * 91568 + 3104) + qkv
    assert cost_of(backward).compulsory_bytes == want


def test_bw_fraction_of_a_row_from_a_fake_measurement(monkeypatch):
    """bytes / median seconds / the run's calibrated bandwidth, and the source named."""
    monkeypatch.setitem(calibrate._THIS_RUN, "cpu", {"mem_bandwidth_bytes_per_s": 4e9})
    fake = Measurement(samples=(0.003, 0.002, 0.001), calls_per_sample=1, first_call_s=0.01)
    cols = bandwidth_columns(6e6, fake, get_device("cpu"))
    assert cols == {"bw_fraction": pytest.approx(6e6 / 0.002 / 4e9),
                    "bw_source": "env.json calibration"}
    assert bandwidth_columns(6e6, None, get_device("cpu")) == {}


def test_attention_rows_carry_compulsory_bytes_and_bw_fraction(monkeypatch):
    """Through the runner on CPU: the row's bw_fraction is its compulsory bytes over its
    median time and the calibrated bandwidth."""
    monkeypatch.setitem(calibrate._THIS_RUN, "cpu", {"mem_bandwidth_bytes_per_s": 2e9})
    point = Point.of("sdpa", heads=2, head_dim=16, seq_len=97, causal=True)
    config = MeasureConfig(timing=TimingConfig(budget_s=0.02, min_samples=3))
    row = run_point(point, config, get_device("cpu"))
    assert row["status"] == "ok", row.get("reason")
    assert row["compulsory_bytes"] == 4 * 2 * 97 * 16 * 4  # q, k, v, out in fp32
    assert row["bw_fraction"] == pytest.approx(row["compulsory_bytes"] / row["time_median_s"] / 2e9)
    assert row["bw_source"] == "env.json calibration"
