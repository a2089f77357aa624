"""Verdicts that know the regime: work verdicts from the cost model, time verdicts only over
saturated rows, utilization on every verdict, JSON without NaN."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pandas as pd
import pytest

from harness.analysis import claims as cl
from harness.analysis import regime
from harness.analysis.verdicts import evaluate
from harness.cli import claims as claims_cli
from harness.results import RowWriter, json_safe, write_env
from harness.scenarios.interface import Point, cost_of

D_MODELS = (256, 512, 1024, 2048, 4096)


def env(peak: float, bandwidth: float = 1e15, run_id: str = "r") -> dict[str, dict]:
    cal = {"matmul_flops_per_s": peak, "mem_bandwidth_bytes_per_s": bandwidth, "dtype": "float32"}
    return {run_id: {"run_id": run_id, "calibration": cal}}


def mixer_flops(point: Point) -> float:
    return cost_of(point).work("mixer_time_s")


def lstm_rows(time_fn, run_id: str = "r") -> pd.DataFrame:
    """LSTM mixer rows over d_model (heads 8, n 1024) with mixer time time_fn(point)."""
    out = []
    for d in D_MODELS:
        point = Point.of("lstm", scenario="block", mixer="lstm", heads=8, head_dim=d // 8,
                      seq_len=1024)
        t = time_fn(point)
        out.append({**point.columns(), "d_model": d, "status": "ok", "run_id": run_id,
                    "mixer_time_s": t, "time_median_s": 2 * t,
                    "time_samples_s": [2 * t * f for f in (0.99, 1.0, 1.01, 1.0, 1.0)]})
    return pd.DataFrame(out)


LSTM_D2 = {"id": "lstm-d2", "impl": "lstm", "scenario": "block", "metric": "mixer_time_s",
           "over": "d_model", "hold": ["heads"], "expect_exponent": 2.0, "tolerance": 0.3}


def claim(**kw) -> cl.Claim:
    return cl.parse_claims({"claim": [{**LSTM_D2, **kw}]})[0]


def lstm_flops(d: int) -> float:
    return mixer_flops(Point.of("lstm", scenario="block", mixer="lstm", heads=8,
                                       head_dim=d // 8, seq_len=1024))


def test_flat_time_while_utilization_climbs_gets_no_time_verdict():
    rows = lstm_rows(lambda p: 0.036)  # latency-bound: flat although the work grows as d²
    peak = 100 * lstm_flops(D_MODELS[-1]) / 0.036  # every row under 1 % of the peak
    verdict = evaluate(claim(), rows, env(peak))
    assert verdict.verdict == "inconclusive"
    assert verdict.reason.startswith(
        "no time verdict: utilization changes with d_model (exponent 2"
    )
    assert "% of roofline)" in verdict.reason
    assert verdict.util_high <= 0.01 and verdict.regime == "rising"
    assert verdict.plateau_region is None
    assert verdict.utilization_exponent == pytest.approx(2.0, abs=0.01)
    assert verdict.work_verdict == "confirmed" and verdict.work_measured == pytest.approx(2.0)


def test_a_false_claim_over_steady_utilization_is_refuted_and_a_floor_withholds_it():
    rows = lstm_rows(lambda p: p_time(p, 0.05))  # time = work / (5 % of the peak): steady
    verdict = evaluate(claim(expect_exponent=1.0), rows, env(1e12))
    assert verdict.verdict == "refuted" and verdict.measured == pytest.approx(2.0, abs=0.01)
    assert verdict.regime == "plateau" and verdict.plateau_region == (256.0, 4096.0)
    assert verdict.util_low == pytest.approx(0.05) and verdict.util_high == pytest.approx(0.05)
    assert evaluate(claim(), rows, env(1e12)).verdict == "confirmed"
    # the optional floor: nothing at >= 50 % of the roofline, so no time verdict at all
    floored = evaluate(claim(expect_exponent=1.0, saturation=0.5), rows, env(1e12))
    assert floored.verdict == "inconclusive" and "saturation floor (50% of roofline)" in (
        floored.reason
    )


def p_time(point: Point, util: float, peak: float = 1e12) -> float:
    """The mixer time at ``util`` of ``peak`` (the roofline is the peak: bandwidth 1e15)."""
    return mixer_flops(point) / (util * peak)


def test_leading_points_where_utilization_still_rises_are_left_out_and_said():
    def time(p: Point) -> float:  # an overhead below d 1024, then the true d² growth
        return max(mixer_flops(p) / 1e12, 0.01)

    verdict = evaluate(claim(), lstm_rows(time), env(1.2e12))
    assert verdict.verdict == "confirmed" and verdict.measured == pytest.approx(2.0, abs=0.01)
    assert verdict.plateau_region[1] == 4096 and verdict.plateau_region[0] >= 1024
    assert "2 leading points left out: utilization rises there (exponent 1." in verdict.reason
    assert "utilization level over d_model" in verdict.reason
    assert verdict.util_low > 0.8 and abs(verdict.utilization_exponent) <= 0.15


@pytest.mark.parametrize(
    ("impl", "scenario", "over", "fields", "exponent"),
    [
        ("full", "attention", "seq_len", {"heads": 4, "head_dim": 32}, 2.0),
        ("lstm", "block", "seq_len", {"mixer": "lstm", "heads": 4, "head_dim": 64}, 1.0),
        ("conv", "block", "conv_kernel", {"mixer": "conv", "seq_len": 512}, 1.0),
        ("sdpa", "attention", "heads", {"seq_len": 512}, 0.0),
    ],
)
def test_work_verdicts_match_the_analytic_exponents_exactly(impl, scenario, over, fields,
                                                            exponent):
    values = {"seq_len": (256, 512, 1024, 2048), "conv_kernel": (3, 7, 15),
              "heads": (1, 2, 4, 8)}[over]
    rows = []
    for v in values:
        kw = {**fields, over: v}
        if over == "heads":
            kw["head_dim"] = 256 // v  # d_model 256 held
        point = Point.of(impl, scenario=scenario, **kw)
        rows.append({**point.columns(), "d_model": point.d_model, "status": "oom",
                     "run_id": "r"})  # failed on the device: the work is still known
    hold = ["d_model"] if over == "heads" else []
    c = cl.parse_claims({"claim": [{"id": "w", "impl": impl, "scenario": scenario,
                                    "metric": "mixer_time_s" if scenario == "block"
                                    else "time_median_s", "over": over, "hold": hold,
                                    "expect_exponent": exponent, "tolerance": 0.01,
                                    "concerns": "work"}]})[0]
    verdict = evaluate(c, pd.DataFrame(rows))
    assert verdict.aspect == "work" and verdict.verdict == "confirmed"
    assert verdict.measured == pytest.approx(exponent, abs=1e-9)
    assert verdict.ci_high - verdict.ci_low < 1e-9


def test_no_time_verdict_where_kernel_efficiency_varies_with_head_dim():
    rows = []
    for heads, tflops in ((4, 640.0), (8, 480.0), (16, 240.0), (32, 120.0)):
        point = Point.of("sdpa", heads=heads, head_dim=512 // heads, seq_len=4096, batch=4,
                      dtype="bfloat16")
        t = cost_of(point).useful_flops / (tflops * 1e12)
        rows.append({**point.columns(), "d_model": 512, "status": "ok", "run_id": "r",
                     "time_median_s": t})
    c = cl.parse_claims({"claim": [{"id": "mh", "impl": "sdpa", "scenario": "attention",
                                    "metric": "time_median_s", "over": "heads",
                                    "hold": ["d_model"], "expect_exponent": 0.0}]})[0]
    verdict = evaluate(c, pd.DataFrame(rows), env(1000e12))
    assert verdict.verdict == "inconclusive" and verdict.regime == "falling"
    assert verdict.reason.startswith("no time verdict: utilization changes with heads")
    assert "kernel efficiency varies with head_dim (120 TFLOP/s at head_dim 16" in verdict.reason
    assert "vs 640 at head_dim 128" in verdict.reason
    assert verdict.work_verdict == "confirmed" and verdict.work_measured == pytest.approx(0.0)


def test_utilization_of_rows_uses_the_roofline_and_thread_count():
    point = Point.of("full", seq_len=1024, heads=8, head_dim=64)
    row = {**point.columns(), "status": "ok", "run_id": "r", "time_median_s": 1.0, "threads": 1}
    flops = cost_of(point).executed_flops
    nbytes = cost_of(point).compulsory_bytes
    e = env(4 * flops)
    e["r"]["calibration"]["threads"] = 2  # a 1-thread row gets half the 2-thread peak
    got = regime.attach(pd.DataFrame([row]), e, "time_median_s")
    assert got["utilization"].iloc[0] == pytest.approx(0.5)
    slow = env(4 * flops, bandwidth=nbytes)  # roofline: (flops / nbytes) x nbytes/s = flops/s
    got = regime.attach(pd.DataFrame([row]), slow, "time_median_s")
    assert got["utilization"].iloc[0] == pytest.approx(1.0)
    assert np.isnan(regime.attach(pd.DataFrame([row]), {}, "time_median_s")["utilization"][0])


def test_json_output_has_null_for_missing_numbers(tmp_path, capsys):
    rows = lstm_rows(lambda p: 0.036)
    rows.loc[0, "mixer_time_s"] = np.nan  # a row without the metric
    rows["time_ci_low_s"] = np.nan
    writer = RowWriter(tmp_path / "run")
    for row in rows.to_dict("records"):
        writer.write(row)
    write_env(tmp_path / "run", env(1e20)["r"])
    claims_file = tmp_path / "claims.toml"
    claims_file.write_text(
        '[[claim]]\nid = "lstm-d2"\nimpl = "lstm"\nscenario = "block"\nmetric = "mixer_time_s"\n'
        'over = "d_model"\nhold = ["heads"]\nexpect_exponent = 2.0\n'
        '[[claim]]\nid = "none"\nimpl = "linformer"\nmetric = "time_median_s"\nover = "seq_len"\n'
        "expect_exponent = 1.0\n"
    )
    parser = argparse.ArgumentParser()
    claims_cli.add_cli(parser.add_subparsers())
    args = parser.parse_args(["claims", str(tmp_path / "run"), "--claims", str(claims_file),
                              "--json"])
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out[0]["reason"].startswith("no time verdict: utilization changes with d_model")
    assert out[0]["plateau_region"] is None and out[0]["utilization_exponent"] > 1.5
    assert len(out[0]["utilization_exponent_ci"]) == 2 and out[0]["regime"] == "rising"
    assert out[0]["groups"][0]["measured"] is None and out[0]["utilization"].startswith("util ")
    assert out[1]["measured"] is None and out[1]["util_low"] is None
    assert json_safe({"a": [np.float64("nan"), np.inf, 1.5]}) == {"a": [None, None, 1.5]}
    args = parser.parse_args(["claims", str(tmp_path / "run"), "--claims", str(claims_file)])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert "util " in text and "work: confirmed" in text


def test_claims_regime_keys_are_validated():
    with pytest.raises(cl.ClaimsError, match="saturation"):
        cl.parse_claims({"claim": [{**LSTM_D2, "saturation": 1.5}]})
    with pytest.raises(cl.ClaimsError, match="concerns"):
        cl.parse_claims({"claim": [{**LSTM_D2, "concerns": "speed"}]})
    assert claim().aspects == ("work", "device")
    mem = cl.parse_claims({"claim": [{"id": "m", "metric": "peak_mem_bytes", "over": "seq_len",
                                      "expect_exponent": 1.0}]})[0]
    assert mem.aspects == ("device",)
