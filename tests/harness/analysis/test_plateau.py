"""The plateau rule on synthetic series: a time verdict only where utilization is level along
the claim's axis. Series shaped like the H100 figures the rule was written from (FA2 at 30-42 %
of roofline, eager attention steady at 5.1-7.2 %, a KV-cache step rising 5x from 0.6 %, LSTM and
conv layers latency-bound) and like the 2-core CPU (eager attention falling from 72 % to 36 %),
judged with the shipped claims of suites/claims.toml."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harness.analysis import claims as cl
from harness.analysis import regime
from harness.analysis.verdicts import evaluate
from harness.scenarios.interface import Point

H100 = {"h100": {"run_id": "h100", "calibration": {
    "matmul_flops_per_s": 767e12, "mem_bandwidth_bytes_per_s": 3.35e12, "dtype": "bfloat16"}}}
CPU = {"cpu": {"run_id": "cpu", "calibration": {
    "matmul_flops_per_s": 1.75e11, "mem_bandwidth_bytes_per_s": 3.6e10, "dtype": "float32"}}}
SHIPPED = {c.id: c for c in cl.load_claims(cl.DEFAULT_CLAIMS)}
HALF_OCTAVES = [int(1024 * 2 ** (i / 2)) for i in range(9)]  # 1k..16k


def timed_rows(points, utils, envs, *, metric="time_median_s", noise=0.02, seed=0):
    """Rows of ``points`` whose ``metric`` is the time at which each point's FLOPs run at
    ``utils`` of its roofline bound (regime's own bound), with per-call samples."""
    run = next(iter(envs))
    base = pd.DataFrame([
        {**p.columns(), "d_model": p.d_model, "status": "ok", "run_id": run, metric: 1.0}
        for p in points
    ])
    bound = regime.attach(base, envs, metric)
    times = bound["work_flops"] / (np.asarray(utils, float) * bound["bound_flops_per_s"])
    rng = np.random.default_rng(seed)
    rows = []
    for row, t in zip(base.to_dict("records"), times, strict=True):
        samples = list(t * np.exp(rng.normal(0, noise, 15)))
        row[metric] = float(np.median(samples))
        if metric == "time_median_s":
            row["time_samples_s"] = samples
        rows.append(row)
    return pd.DataFrame(rows)


def attention(impl, ns, dtype="bfloat16", **kw):
    return [Point.of(impl, seq_len=n, batch=4, heads=16, head_dim=128, dtype=dtype, device="cuda",
                  **kw) for n in ns]


# --- the synthetic targets ---------------------------------------------------------


def test_exponent_2_at_a_steady_5_percent_is_confirmed():
    rows = timed_rows(attention("full", HALF_OCTAVES), [0.05] * 9, H100)
    verdict = evaluate(SHIPPED["attention-time-n2"], rows, H100)
    assert verdict.verdict == "confirmed" and verdict.regime == "plateau"
    assert verdict.plateau_region == (1024, 16384)
    assert verdict.util_low == pytest.approx(0.05, rel=0.1)
    assert abs(verdict.utilization_exponent) < 0.05
    assert verdict.ci_low <= 2.0 <= verdict.ci_high


def test_utilization_climbing_10x_is_not_judged():
    utils = np.geomspace(0.003, 0.03, 9)  # a device filling up: time exponent 2 - 0.83
    rows = timed_rows(attention("full", HALF_OCTAVES), utils, H100)
    verdict = evaluate(SHIPPED["attention-time-n2"], rows, H100)
    assert verdict.verdict == "inconclusive" and verdict.regime == "rising"
    assert verdict.reason.startswith(
        "no time verdict: utilization changes with seq_len (exponent 0.83 ["
    )
    assert "0.3–3% of roofline)" in verdict.reason
    assert verdict.measured is None or np.isnan(verdict.measured)
    assert verdict.work_verdict == "confirmed"  # the algorithm is still judged, on its work


PROFILES = {
    "steady": lambda n, r: np.full(n, r.uniform(0.02, 0.6)),
    "climbing": lambda n, r: np.geomspace(r.uniform(0.002, 0.01), r.uniform(0.05, 0.4), n),
    "falling": lambda n, r: np.geomspace(r.uniform(0.5, 0.8), r.uniform(0.1, 0.3), n),
    "levels-off": lambda n, r: np.minimum(np.geomspace(0.02, 2.0, n), r.uniform(0.3, 0.6)),
    "hump": lambda n, r: 0.4 * np.exp(-((np.arange(n) - n / 2) ** 2) / r.uniform(2, 6)) + 0.01,
}


def test_forty_noisy_series_never_confirm_a_wrong_exponent():
    """40 seeded series (every profile, 2-8 % noise per call): the true exponent is the work's,
    2; claims of 1, 1.5, 2.5 and 3 are never confirmed, and the right one is confirmed on the
    level series (the rule is not merely silent)."""
    confirmed_right = {name: 0 for name in PROFILES}
    for seed in range(40):
        rng = np.random.default_rng(seed)
        name = list(PROFILES)[seed % len(PROFILES)]
        utils = PROFILES[name](9, rng)
        rows = timed_rows(attention("full", HALF_OCTAVES), utils, H100,
                          noise=rng.uniform(0.02, 0.08), seed=seed)
        for claimed in (1.0, 1.5, 2.5, 3.0):
            wrong = cl.Claim(id="w", metric="time_median_s", over="seq_len", impl="full",
                             expect_exponent=claimed, tolerance=0.2, concerns="device")
            assert evaluate(wrong, rows, H100).verdict != "confirmed", (seed, name, claimed)
        right = evaluate(SHIPPED["attention-time-n2"], rows, H100)
        confirmed_right[name] += right.verdict == "confirmed"
        if name in ("climbing", "falling"):
            assert right.verdict == "inconclusive" and right.plateau_region is None, (seed, name)
    assert confirmed_right["steady"] >= 6 and confirmed_right["levels-off"] >= 6


# --- series shaped like the H100 rows of the claims-gpu suites -----------------------------


def test_fa2_at_30_to_42_percent_gets_a_confirmed_time_verdict():
    utils = [0.30, 0.38, 0.42, 0.36, 0.40, 0.41, 0.37, 0.40, 0.39]  # FA2 at full speed
    rows = timed_rows(attention("sdpa-flash", HALF_OCTAVES), utils, H100, seed=3)
    verdict = evaluate(SHIPPED["flash-time-n2"], rows, H100)
    assert verdict.verdict == "confirmed" and verdict.regime == "plateau"
    assert verdict.util_low >= 0.29 and verdict.util_high <= 0.43
    assert verdict.plateau_region[1] == 16384


def test_eager_at_5_to_7_percent_steady_gets_a_confirmed_time_verdict():
    """Eager attention's 8 H100 points (local slopes as measured: 2.02 [1.89, 2.15])."""
    slopes = np.array([2.23, 1.92, 2.40, 1.76, 1.90, 2.52, 1.17])
    ns = HALF_OCTAVES[:8]
    times = np.exp(np.concatenate([[0.0], np.cumsum(slopes * np.log(2) / 2)]))
    utils = (np.asarray(ns, float) ** 2 / times)
    utils = 0.051 + (utils - utils.min()) / (utils.max() - utils.min()) * (0.072 - 0.051)
    rows = timed_rows(attention("full", ns), utils, H100, noise=0.01, seed=4)
    verdict = evaluate(SHIPPED["attention-time-n2"], rows, H100)
    assert verdict.verdict == "confirmed", verdict.reason
    assert verdict.util_low == pytest.approx(0.051, abs=0.002)
    assert verdict.util_high == pytest.approx(0.072, abs=0.002)


def test_a_kv_cache_step_rising_5x_gets_no_time_verdict_and_is_not_refuted():
    points = [Point.of("sdpa", scenario="decode", cache="full", seq_len=n, heads=32, head_dim=128,
                    layers=2, dtype="bfloat16", device="cuda")
              for n in (1024, 2048, 4096, 8192, 16384, 32768)]
    utils = np.geomspace(0.006, 0.03, len(points))  # launch-bound: utilization rises 5x
    rows = timed_rows(points, utils, H100, seed=5)
    verdict = evaluate(SHIPPED["kv-cache-step-n1"], rows, H100)
    assert verdict.verdict == "inconclusive" and verdict.regime == "rising"
    assert verdict.reason.startswith("no time verdict: utilization changes with seq_len")
    assert "; 0.6–3" in verdict.reason and "% of roofline)" in verdict.reason


@pytest.mark.parametrize(
    ("claim_id", "over", "values"),
    [("layer-recurrent-d2", "d_model", (256, 512, 1024, 2048, 4096)),
     ("layer-conv-k1", "conv_kernel", (3, 7, 15, 31))],
)
def test_latency_bound_lstm_and_conv_get_no_time_verdict(claim_id, over, values):
    mixer = "lstm" if claim_id.startswith("layer-recurrent") else "conv"
    points = []
    for v in values:
        kw = {"d_model": v} if over == "d_model" else {over: v}
        d_model = kw.pop("d_model", 1024)
        points.append(Point.of(mixer, scenario="block", mixer=mixer, seq_len=1024, heads=8,
                            head_dim=d_model // 8, dtype="bfloat16", device="cuda", **kw))
    utils = np.geomspace(0.0013, 0.027, len(points))  # 0.13-2.7 % and rising
    rows = timed_rows(points, utils, H100, metric="mixer_time_s", seed=6)
    verdict = evaluate(SHIPPED[claim_id], rows, H100)
    assert verdict.verdict == "inconclusive" and verdict.verdict != "refuted"
    assert verdict.reason.startswith(f"no time verdict: utilization changes with {over}")
    assert verdict.work_verdict == "confirmed"


def test_memory_claims_are_not_gated_by_the_plateau():
    points = attention("full", (512, 1024, 2048, 4096), dtype="float32")
    rows = timed_rows(points, np.geomspace(0.01, 0.5, 4), H100)  # utilization all over
    rows["peak_mem_bytes"] = [4.0 * 16 * 4 * n * n + 1e6 for n in rows["seq_len"]]
    verdict = evaluate(SHIPPED["full-memory-n2"], rows, H100)
    assert verdict.verdict == "confirmed" and verdict.plateau_region is None


# --- the 2-core CPU: eager attention falls from 72 % to 36 % of its roofline -------------


CPU_NS = [512, 768, 1024, 1536, 2048, 3072, 4096, 8192]


def cpu_rows(utils, seed=7):
    points = [Point.of("full", seq_len=n, heads=8, head_dim=64) for n in CPU_NS]
    return timed_rows(points, utils, CPU, noise=0.03, seed=seed)


def test_falling_steeply_to_the_end_gets_no_time_verdict():
    rows = cpu_rows(np.geomspace(0.72, 0.36, len(CPU_NS)))
    verdict = evaluate(SHIPPED["attention-time-n2"], rows, CPU)
    assert verdict.verdict == "inconclusive" and verdict.regime == "falling"
    assert "36–72% of roofline" in verdict.reason


def test_falling_then_levelling_off_is_judged_where_it_is_level():
    utils = [0.72, 0.66, 0.58, 0.47, 0.40, 0.37, 0.36, 0.36]
    verdict = evaluate(SHIPPED["attention-time-n2"], cpu_rows(utils), CPU)
    assert verdict.regime == "plateau" and verdict.plateau_region[1] == 8192
    assert verdict.plateau_region[0] >= 1536  # the steep fall (72 -> 58 %) is left out
    assert "leading points left out: utilization falls there" in verdict.reason
    assert verdict.verdict != "refuted"


# --- the search itself ----------------------------------------------------------------------


def test_a_rise_then_fall_does_not_average_out_to_level():
    x = np.array(HALF_OCTAVES, float)
    hump = np.array([0.05, 0.1, 0.2, 0.4, 0.5, 0.4, 0.2, 0.1, 0.05])
    plateau = regime.find_plateau(x, hump)
    assert not plateau.found  # the fit over all of it is flat, but no region of it is level
    flat = regime.find_plateau(x, np.full(9, 0.3))
    assert flat.found and flat.start == 0 and flat.exponent == pytest.approx(0.0, abs=1e-9)
    step = regime.find_plateau(x, np.r_[np.geomspace(0.01, 0.2, 4), np.full(5, 0.3)])
    assert step.start == 4 and step.lead_exponent > 0.5
    floored = regime.find_plateau(x, np.full(9, 0.3), floor=0.5)
    assert not floored.found


def test_points_that_keep_their_own_state_do_not_cut_a_level_series(monkeypatch):
    """A flat series whose points sit a few per cent apart, each tight over its passes (the
    ragged paged step along the skew, 2-core CPU, run of 2026-11-29 22:40: a point keeps its
    state through every pass): the scatter between neighbours joins each window's errors, so
    the level region is the whole axis. With that scatter left out, four close points
    (29056..42784) look like a fall of -0.43 and the plateau loses its first four points."""
    x = np.array([16384, 20272, 24552, 29056, 33680, 38304, 42784, 47096, 51176], float)  # B·max
    util = np.array([1.0, 1.141, 0.979, 1.05, 0.977, 0.961, 0.877, 0.967, 0.975])
    errors = np.full(9, 0.02)  # each point's error of log time over its passes
    plateau = regime.find_plateau(x, util, sigma=errors)
    assert plateau.found and plateau.start == 0 and abs(plateau.exponent) < 0.15
    assert regime.point_scatter(x, util) > 0.003  # a few per cent between neighbours
    monkeypatch.setattr(regime, "point_scatter", lambda *a: 0.0)
    assert regime.find_plateau(x, util, sigma=errors).start == 4


def test_the_scatter_between_points_is_zero_on_a_smooth_series_and_known_on_planted_noise():
    """On an exact power law τ² is 0 (a straight line in log-log); on 400 points with 10 %
    noise planted between them and 2 % errors declared, it finds about 0.1² of excess; a knee
    (a rise, then level) is trend, not scatter."""
    x = np.geomspace(1, 100, 400)
    assert regime.point_scatter(x, 3 * x**1.5) == pytest.approx(0.0, abs=1e-12)
    rng = np.random.default_rng(0)
    noisy = 3 * x**1.5 * np.exp(rng.normal(0, 0.1, 400) + rng.normal(0, 0.02, 400))
    assert regime.point_scatter(x, noisy, np.full(400, 0.02)) == pytest.approx(0.01, rel=0.2)
    knee = np.array(HALF_OCTAVES, float)
    assert regime.point_scatter(knee, np.minimum(knee, 4096.0)) == 0.0
