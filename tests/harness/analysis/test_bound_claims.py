"""Bound claims (``expect_value_min``/``_max``): a row column against a floor or a ceiling at
every point, the noise of each point's samples considered. Planted rows whose verdict is
known: clearly above the floor (confirmed), clearly below (refuted), within the noise of the
floor (inconclusive), above at some lengths only (holds in part); a column without samples is
judged on its values alone and says so."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harness.analysis import claims as cl
from harness.analysis.verdicts import evaluate

NS = (1024, 2048, 4096, 8192)


def rows(fraction, noise: float = 0.01, ns=NS, seed: int = 0) -> pd.DataFrame:
    """Decode-like rows of ``sdpa`` whose ``bw_fraction`` at n is ``fraction(n)``, each with
    20 time samples at ``noise`` relative spread (bw_fraction moves as 1/time)."""
    rng = np.random.default_rng(seed)
    out = []
    for n in ns:
        t = 1e-3 * n / 1024
        samples = list(t * np.exp(rng.normal(0, noise, 20)))
        med = float(np.median(samples))
        out.append(
            {
                "run_id": "r",
                "impl": "sdpa",
                "scenario": "decode",
                "device": "cuda",
                "seq_len": n,
                "cache": "full",
                "status": "ok",
                "time_median_s": med,
                "time_samples_s": samples,
                "bw_fraction": fraction(n) * t / med,
                "cache_bytes": 1e6 * n,
            }
        )
    return pd.DataFrame(out)


def claim(**kw) -> cl.Claim:
    base = {
        "id": "bw",
        "impl": "sdpa",
        "scenario": "decode",
        "metric": "bw_fraction",
        "over": "seq_len",
        "expect_value_min": 0.8,
    }
    entry = {k: v for k, v in {**base, **kw}.items() if v is not None}  # None: key left out
    return cl.parse_claims({"claim": [entry]})[0]


@pytest.mark.parametrize(
    ("fraction", "noise", "verdict"),
    [
        (lambda n: 0.9, 0.01, "confirmed"),
        (lambda n: 0.5, 0.01, "refuted"),
        (lambda n: 0.8, 0.05, "inconclusive"),  # on the floor: the noise decides nothing
        (lambda n: 0.9 if n >= 4096 else 0.6, 0.01, "holds in part"),
        # on the floor at the short lengths, clearly under it at the long ones: a
        # counterexample, so refuted although the short lengths decide nothing
        (lambda n: 0.8 if n <= 2048 else 0.5, 0.05, "refuted"),
    ],
)
def test_a_floor_on_a_timed_column(fraction, noise, verdict):
    got = evaluate(claim(), rows(fraction, noise))
    assert got.kind == "bound" and got.verdict == verdict, got.reason
    assert got.expected == "bw_fraction >= 0.8"
    if verdict == "inconclusive":  # the interval holds the floor: it is the noise, not a miss
        assert got.ci_low < 0.8 < got.ci_high
    wheres = [r["where"] for r in got.regions]
    if "straddles" in wheres and verdict == "refuted":
        assert wheres == ["straddles", "below"], got.regions
        assert "over part of the range, on an edge over the rest" in got.reason


def test_a_ceiling_on_the_time_and_the_interval_from_the_samples():
    df = rows(lambda n: 0.9)  # time 1 ms .. 8 ms
    assert (
        evaluate(
            claim(metric="time_median_s", expect_value_min=None, expect_value_max=0.01), df
        ).verdict
        == "confirmed"
    )
    over = evaluate(claim(metric="time_median_s", expect_value_min=None, expect_value_max=3e-3), df)
    assert over.verdict == "holds in part" and "below" not in over.reason
    assert over.ci_low < over.ci_high  # each point's median interval, from 20 samples


def test_a_column_without_samples_is_judged_on_its_values_and_says_so():
    df = rows(lambda n: 0.9)
    got = evaluate(
        claim(metric="cache_bytes", expect_value_min=None, expect_value_max=1e6 * 8192), df
    )
    assert got.verdict == "confirmed" and "no per-call samples of cache_bytes" in got.reason


def test_one_point_of_a_claim_over_a_range_is_not_judged():
    got = evaluate(claim(), rows(lambda n: 0.9, ns=(8192,)))
    assert got.verdict == "inconclusive" and got.reason.startswith("one point")
    single = evaluate(claim(range=[8192, 8192]), rows(lambda n: 0.9, ns=(8192,)))
    assert single.verdict == "confirmed"


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({"expect_value_min": 0.9, "expect_value_max": 0.8}, "must be <= expect_value_max"),
        ({"baseline": "full"}, "no baseline"),
        ({"expect_exponent": 1.0}, "set exactly one of"),
    ],
)
def test_bad_bound_claims_are_one_line(entry, words):
    with pytest.raises(cl.ClaimsError, match=words):
        claim(**entry)
