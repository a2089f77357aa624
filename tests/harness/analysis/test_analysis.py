"""Exponent fits recover known exponents from synthetic noisy data, within their intervals."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harness.analysis.fits import fit_exponent, fit_exponents, local_slopes
from harness.analysis.frames import column, covarying, matches
from harness.analysis.powerfit import asymptotic_start, local_slopes_xy
from harness.scenarios.interface import Point

X = np.array([256, 512, 1024, 2048, 4096, 8192], dtype=float)


def noisy_samples(x, p, *, scale=1e-9, noise=0.05, m=25, seed=0, overhead=0.0):
    """Per point m per-call times: (overhead + scale·x^p) with log-normal noise."""
    rng = np.random.default_rng(seed)
    return [list((overhead + scale * xi**p) * np.exp(rng.normal(0, noise, m))) for xi in x]


def rows(points, metric_fn, samples_fn=None, status="ok"):
    """Result rows (dicts) for Points: point columns, status and metrics from the callables."""
    out = []
    for point in points:
        row = {**point.columns(), "status": status, "time_median_s": metric_fn(point)}
        if samples_fn is not None:
            row["time_samples_s"] = samples_fn(point)
        out.append(row)
    return out


@pytest.mark.parametrize("p", [0.5, 1.0, 2.0, 3.0])
def test_fit_recovers_exponent_from_noisy_samples(p):
    samples = noisy_samples(X, p, seed=int(p * 10))
    y = [float(np.median(s)) for s in samples]
    fit = fit_exponent(X, y, samples)
    assert fit.ci_low <= p <= fit.ci_high
    assert fit.ci_high - fit.ci_low < 0.15
    assert abs(fit.exponent - p) < 0.05
    assert fit.bootstrap == "samples+residuals"


def test_intervals_cover_the_true_exponent_about_95_percent_of_the_time():
    covered = 0
    for seed in range(40):
        samples = noisy_samples(X, 1.5, noise=0.2, m=15, seed=seed)
        fit = fit_exponent(X, [np.median(s) for s in samples], samples, n_boot=400, seed=seed)
        covered += fit.ci_low <= 1.5 <= fit.ci_high
    assert covered >= 34  # >= 85 % of 40; a too-narrow interval fails this


def test_residual_bootstrap_widens_with_lack_of_fit():
    straight = fit_exponent(X, 2e-9 * X**2)
    rng = np.random.default_rng(3)
    bumpy = fit_exponent(X, 2e-9 * X**2 * np.exp(rng.normal(0, 0.2, X.size)))
    assert straight.bootstrap == "residuals"
    assert straight.ci_high - straight.ci_low < 1e-6
    assert bumpy.ci_high - bumpy.ci_low > 0.05
    assert bumpy.ci_low <= 2.0 <= bumpy.ci_high


def test_asymptotic_region_drops_the_overhead_regime():
    y = 1e-3 + 1e-9 * X**2  # a constant overhead dominates the first points
    slopes = local_slopes_xy(X, y)
    assert slopes[0] < 0.5 and slopes[-1] > 1.8
    fit = fit_exponent(X, y)
    assert fit.x_lo > X[0] and fit.x_hi == X[-1]
    assert fit.n_points < X.size and fit.n_total == X.size
    assert asymptotic_start(X, 1e-9 * X**2) == 0  # a clean power law keeps every point


def test_power_plus_constant_model_removes_a_fixed_overhead():
    y = 1_000_000 + 2_048 * X  # bytes: fixed workspace + O(n)
    plain = fit_exponent(X, y)
    modelled = fit_exponent(X, y, model="power+const")
    assert plain.exponent < 0.9
    assert modelled.ci_low <= 1.0 <= modelled.ci_high
    assert abs(modelled.offset - 1_000_000) / 1_000_000 < 0.01


def test_power_plus_constant_with_noise_covers_the_truth():
    samples = noisy_samples(X, 2.0, noise=0.05, overhead=2e-3, seed=7)
    fit = fit_exponent(X, [np.median(s) for s in samples], samples, model="power+const")
    assert fit.ci_low <= 2.0 <= fit.ci_high
    assert fit.ci_high - fit.ci_low < 0.3


def test_too_few_points_give_no_interval():
    fit = fit_exponent([512, 1024], [1.0, 4.0])
    assert fit.exponent == pytest.approx(2.0)
    assert not fit.ok and np.isnan(fit.ci_low)
    assert not fit_exponent([512, 1024, 2048], [1, 2, 4.0], model="power+const").ok


def test_fit_is_deterministic_and_validates_input():
    samples = noisy_samples(X, 1.0, seed=1)
    y = [np.median(s) for s in samples]
    assert fit_exponent(X, y, samples) == fit_exponent(X, y, samples)
    with pytest.raises(ValueError):
        fit_exponent([1, 2, 3], [1, 0, 3])
    with pytest.raises(ValueError):
        fit_exponent([1, 1, 3], [1, 2, 3])
    with pytest.raises(ValueError):
        fit_exponent(X, y, model="cubic")


def test_local_slopes_of_an_exact_power_law():
    assert np.allclose(local_slopes_xy(X, 3 * X**1.5), 1.5)


def test_fit_exponents_groups_by_the_fields_that_vary():
    points = [
        Point.of(impl, seq_len=int(n), causal=c)
        for impl in ("full", "sdpa-flash")
        for c in (False, True)
        for n in X
    ]
    power = {"full": 2.0, "sdpa-flash": 1.0}

    def time(pt: Point) -> float:
        return 1e-9 * pt.seq_len ** power[pt.impl] * (0.5 if pt.mask.causal else 1.0)

    frame = pd.DataFrame(rows(points, time))
    fits = fit_exponents(frame, "seq_len", "time_median_s")
    assert len(fits) == 4 and set(fits.columns) >= {"impl", "causal", "exponent", "ci_low"}
    for rec in fits.to_dict("records"):
        assert rec["exponent"] == pytest.approx(power[rec["impl"]], abs=1e-9)
    slopes = local_slopes(frame, "seq_len", "time_median_s")
    assert len(slopes) == 4 * (X.size - 1)


def test_rows_that_are_not_ok_are_left_out():
    good = rows([Point("full", seq_len=int(n)) for n in X], lambda p: 1e-9 * p.seq_len**2)
    bad = rows([Point("full", seq_len=16384)], lambda p: 1.0, status="oom")
    fits = fit_exponents(pd.DataFrame(good + bad), "seq_len", "time_median_s")
    assert fits.iloc[0]["x_hi"] == X[-1] and fits.iloc[0]["exponent"] == pytest.approx(2.0)


def test_heads_sweep_at_fixed_d_model_lets_head_dim_co_vary():
    assert covarying("heads", hold=("d_model",)) >= {"head_dim"}
    assert "d_model" in covarying("heads")
    assert "head_dim" in covarying("d_model", hold=("heads",))
    points = [Point("sdpa", heads=h, head_dim=512 // h) for h in (1, 2, 4, 8, 16)]
    frame = pd.DataFrame(rows(points, lambda p: 1e-3 * p.heads**0.1))
    fits = fit_exponents(frame, "heads", "time_median_s", hold=("d_model",))
    assert len(fits) == 1 and fits.iloc[0]["d_model"] == 512
    assert fits.iloc[0]["exponent"] == pytest.approx(0.1)


def test_time_samples_drive_the_interval_of_rate_metrics():
    points = [Point("full", seq_len=int(n)) for n in X]
    samples = dict(zip(X, noisy_samples(X, 2.0, noise=0.1, seed=4), strict=True))
    frame = pd.DataFrame(
        rows(points, lambda p: float(np.median(samples[p.seq_len])), lambda p: samples[p.seq_len])
    )
    frame["tokens_per_s"] = frame["seq_len"] / frame["time_median_s"]
    fit = fit_exponents(frame, "seq_len", "tokens_per_s").iloc[0]
    assert fit["bootstrap"] == "samples+residuals"
    assert fit["ci_low"] <= -1.0 <= fit["ci_high"]


def test_a_setting_missing_from_older_rows_reads_as_its_scenario_default():
    rows = pd.DataFrame({"scenario": ["decode", "attention", "decode"],
                         "step": [None, None, "attention"]})  # fmt: skip
    assert column(rows, "step").tolist()[0::2] == ["block", "attention"]
    assert matches(rows, "step", "block").tolist() == [True, False, False]
    older = pd.DataFrame({"scenario": ["decode", "attention"]})  # written before `step`
    assert column(older, "step").tolist()[0] == "block" and pd.isna(column(older, "step")[1])


def test_a_derived_axis_lets_the_fields_it_is_made_from_vary():
    assert {"seq_len", "contexts"} <= covarying("context_tokens")
    assert {"seq_len", "contexts"} <= covarying("padded_tokens")
    assert "page_size" not in covarying("pages")  # pages of 16 and of 64: separate fits
