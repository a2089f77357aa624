"""How groups make a verdict, on planted rows: thin groups listed and not counted, deciding
groups that disagree give ``mixed``, time judged against the executed work, host-bound rows
left out of time evidence, ratio claims answered along the axis, optional columns read with
their schema default."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from harness.analysis import claims as cl
from harness.analysis.frames import column
from harness.analysis.verdicts import combine, evaluate, host_bound
from harness.scenarios.interface import Point

NS = (1024, 1536, 2048, 3072, 4096, 6144, 8192)
CALIBRATION = {"matmul_flops_per_s": 1e11, "mem_bandwidth_bytes_per_s": 1e11,
               "threads": 1}
ENVS = {"r": {"run_id": "r", "calibration": CALIBRATION}}


def rows(impl: str, seconds, ns=NS, seed=0, **fields) -> list[dict]:
    """Ok rows of ``impl`` over ``ns`` with time ``seconds(point)``, 20 samples at 1 % noise,
    and their analytic FLOPs as the runner records them."""
    rng = np.random.default_rng(seed)
    out = []
    for n in ns:
        point = Point.of(impl, seq_len=n, **fields)
        t = seconds(point)
        samples = list(t * np.exp(rng.normal(0, 0.01, 20)))
        out.append({**point.columns(), "run_id": "r", "status": "ok", "threads": 1,
                    "time_median_s": float(np.median(samples)), "time_samples_s": samples,
                    "peak_mem_bytes": 1e3 * n})
    return out


def claim(**kw) -> cl.Claim:
    base = {"id": "c", "impl": "full", "metric": "time_median_s", "over": "seq_len",
            "expect_exponent": 2.0}
    return cl.parse_claims({"claim": [{**base, **kw}]})[0]


def judged(verdict: str, group: str, thin: bool = False) -> dict:
    return {"verdict": verdict, "group": group, "thin": thin, "measured": 1.0, "ci_low": 0.9,
            "ci_high": 1.1, "n_points": 3 if thin else 9, "reason": verdict}


# --- combining groups ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("groups", "expected"),
    [
        ([judged("confirmed", "a"), judged("inconclusive", "b", thin=True)], "confirmed"),
        ([judged("confirmed", "a"), judged("refuted", "b")], "mixed"),
        ([judged("refuted", "a"), judged("inconclusive", "b")], "refuted"),
        ([judged("confirmed", "a"), judged("inconclusive", "b")], "inconclusive"),
        ([judged("holds in part", "a"), judged("confirmed", "b")], "holds in part"),
        ([judged("inconclusive", "a", thin=True)], "inconclusive"),
    ],
)
def test_the_groups_with_enough_data_decide(groups, expected):
    verdict, decisive, words = combine(groups)
    assert verdict == expected
    if expected == "mixed":
        assert decisive["verdict"] == "refuted" and "groups disagree: a: confirmed" in words
    if groups[-1]["thin"] and groups[-1]["verdict"] == "inconclusive" and len(groups) > 1:
        assert words == "; not judged: b (thin data: 3 points)" and decisive["group"] == "a"


def test_a_thin_group_from_another_run_does_not_make_the_claim_inconclusive():
    """Nine points at B4 confirm n²; three points at B1, whose plateau is too short for an
    interval that decides, are listed as not judged."""
    wide = rows("full", lambda p: 1e-9 * p.seq_len**2, batch=4)
    thin = rows("full", lambda p: 1e-9 * p.seq_len**2 * (1 + 0.3 * (p.seq_len == 2048)),
                ns=(1024, 2048, 4096), batch=1, seed=1)
    alone = evaluate(claim(), pd.DataFrame(wide), ENVS)
    both = evaluate(claim(), pd.DataFrame(wide + thin), ENVS)
    assert alone.verdict == both.verdict == "confirmed"
    assert "not judged: batch=1 (thin data: 3 points)" in both.reason
    assert both.measured == pytest.approx(alone.measured)


# --- time against the executed work ------------------------------------------------------------


def local_rows(n: int, windows, per_flop: float, overhead: float = 0.0) -> list[dict]:
    """local rows at one n over ``windows`` whose time follows their executed FLOPs (the tile
    plan's count, as the runner records it), plus ``overhead`` seconds per call."""
    out = []
    for w in windows:
        fields = {"causal": True, "window_left": w - 1, "window_right": 0}
        row = rows("local", lambda p: 0.0, ns=(n,), **fields)[0]
        point = Point.of("local", seq_len=n, **fields)
        from harness.scenarios.interface import cost_of

        flops = cost_of(point).executed_flops
        t = per_flop * flops + overhead
        row.update(time_median_s=t, time_samples_s=[t * (1 + 0.002 * i) for i in range(-5, 6)],
                   executed_flops=flops, useful_flops=cost_of(point).useful_flops)
        out.append(row)
    return out


def test_time_that_follows_tile_overhead_is_no_refutation():
    """At w = 32..256 the CPU tile path executes a band of w + 64 keys: executed work grows
    as w^0.6. A device that follows it exactly gives time ^0.6, which must not refute O(n·w)."""
    c = claim(impl="local", over="window", expect_exponent=1.0,
              source="seed text: sliding-window attention costs O(n·w)")
    v = evaluate(c, pd.DataFrame(local_rows(4096, (32, 48, 64, 96, 128, 192, 256), 1e-11)), ENVS)
    assert v.verdict == "inconclusive"
    assert "executed work grows as window^0." in v.reason and "tile overhead" in v.reason
    assert "sizes too small to test O(n·w)" in v.reason


def test_time_outside_the_band_where_the_work_is_inside_still_refutes():
    """Windows well above the tile: the executed work grows as w^~0.97; a time that grows as
    w^0.5 over them (a device that slows per FLOP is flat: rate follows w^0.47) is refuted."""
    c = claim(impl="local", over="window", expect_exponent=1.0, plateau=0.6)
    windows = (1024, 1536, 2048, 3072, 4096, 6144, 8192)
    base = local_rows(65536, windows, 1e-11)
    for r in base:  # time ∝ w^0.5 while the work ∝ w^~0.97: utilization climbs, inside ±0.6
        r["time_median_s"] *= (r["window_left"] + 1) ** -0.5
        r["time_samples_s"] = [s * (r["window_left"] + 1) ** -0.5 for s in r["time_samples_s"]]
    v = evaluate(c, pd.DataFrame(base), ENVS)
    assert v.verdict == "refuted", v.reason
    assert v.measured == pytest.approx(0.45, abs=0.05)  # the work's ~0.95, less 0.5


def test_a_dense_kernel_claimed_linear_in_document_length_is_still_refuted():
    """Executed work flat in l (a dense kernel computes n² whatever the documents) is another
    law, not an overhead that fades with size: the time verdict stands."""
    c = claim(impl="full", expect_exponent=1.0)
    flat = rows("full", lambda p: 1e-3)  # time flat in n where the claim says ∝ n
    for r in flat:
        r["executed_flops"] = 1e9  # the work the row says it executed: flat too
    assert evaluate(c, pd.DataFrame(flat), ENVS).verdict == "refuted"


# --- host-bound rows ---------------------------------------------------------------------------


def test_host_bound_rows_get_no_time_verdict():
    base = rows("full", lambda p: 1e-9 * p.seq_len**2)
    every = [{**r, "host_frac": 0.8} for r in base]
    v = evaluate(claim(), pd.DataFrame(every), ENVS)
    assert v.verdict == "inconclusive" and v.measured is None
    assert v.reason.startswith("no time verdict: host-bound: the GPU waits on the host")
    assert "host_frac 0.8 at seq_len 1024..8192" in v.reason
    some = [{**r, "host_frac": 0.9 if r["seq_len"] <= 1536 else None} for r in base]
    v = evaluate(claim(), pd.DataFrame(some), ENVS)
    assert v.verdict == "confirmed" and v.host_bound_left_out == 2
    assert "2 rows left out: host-bound: the GPU waits on the host" in v.reason
    memory = claim(metric="peak_mem_bytes", expect_exponent=1.0)  # allocations: not timed
    assert evaluate(memory, pd.DataFrame(every), ENVS).verdict == "confirmed"


def test_host_frac_absent_or_null_is_not_host_bound():
    frame = pd.DataFrame([{"host_frac": None}, {"host_frac": 0.49}, {"host_frac": 0.5}, {}])
    assert host_bound(frame).tolist() == [False, False, True, False]
    assert host_bound(pd.DataFrame([{"seq_len": 1}])).tolist() == [False]


# --- optional columns --------------------------------------------------------------------------


def test_an_optional_column_reads_its_schema_default():
    frame = pd.DataFrame([{"seq_len": 1}, {"seq_len": 2}])
    assert column(frame, "document_len").isna().all()  # a measurement: null
    assert column(frame, "prefix_len").tolist() == [0, 0]  # a point field: its default
    assert column(frame, "dilation").tolist() == [1, 1]


def test_a_claim_over_document_len_on_rows_without_documents_says_so():
    c = claim(impl="full", over="document_len", expect_exponent=1.0)
    v = evaluate(c, pd.DataFrame(rows("full", lambda p: 1e-3)), ENVS)
    assert v.verdict == "inconclusive" and v.rows_seen == 0
    assert v.reason == "missing rows: the 7 impl=full rows have no document_len"


# --- ratio claims along the axis ---------------------------------------------------------------


def ratio_claim() -> cl.Claim:
    entry = {"id": "c", "impl": "sdpa", "baseline": "full", "metric": "time_median_s",
             "over": "seq_len", "ratio": "baseline/impl", "expect_ratio_min": 2.0,
             "expect_ratio_max": 4.0}
    return cl.parse_claims({"claim": [entry]})[0]


def speedup_rows(speedup) -> pd.DataFrame:
    base = rows("full", lambda p: 1e-9 * p.seq_len**2, seed=1)
    fast = rows("sdpa", lambda p: 1e-9 * p.seq_len**2 / speedup(p.seq_len), seed=2)
    return pd.DataFrame(base + fast)


@pytest.mark.parametrize(
    ("speedup", "verdict", "words"),
    [
        (lambda n: 3.0, "confirmed", ["inside the claimed band over the whole range: holds at "
                                      "seq_len 1024..8192 (2.9"]),
        (lambda n: 6.0, "refuted", ["outside the claimed band over the whole range: above at "
                                    "seq_len 1024..8192 (5.9"]),
        (lambda n: 3.0 if n <= 2048 else 5.0, "holds in part",
         ["holds at seq_len 1024..2048 (", "); above from 3072 (4.9"]),
        (lambda n: 1.0 if n <= 1536 else 3.0 if n <= 4096 else 6.0, "holds in part",
         ["below at seq_len 1024..1536 (", "); holds at 2048..4096 (", "); above from 6144 ("]),
        # on the band's upper edge up to 2048, above it from 3072: refuted over part of the range
        (lambda n: 4.0 if n <= 2048 else 6.0, "refuted",
         ["outside the claimed band over part of the range, on an edge over the rest",
          "on an edge at seq_len 1024..2048 (", "); above from 3072 (5.9"]),
    ],
)
def test_a_ratio_claim_says_where_along_the_axis_it_holds(speedup, verdict, words):
    v = evaluate(ratio_claim(), speedup_rows(speedup), ENVS)
    assert v.verdict == verdict, v.reason
    at = [v.reason.find(w) for w in words]
    assert at[0] == 0 and all(a < b for a, b in itertools.pairwise(at)), v.reason
    spans = [(r["from"], r["to"]) for r in v.regions]
    assert spans[0][0] == 1024 and spans[-1][1] == 8192  # the regions tile the swept range
    assert all(a[1] < b[0] for a, b in itertools.pairwise(spans))
    assert all(r["ci_low"] <= r["low"] <= r["high"] <= r["ci_high"] for r in v.regions)
    assert {r["where"] for r in v.regions} <= {"inside", "above", "below", "straddles"}
    assert all(r["over"] == "seq_len" for r in v.regions)


def test_regions_are_in_the_json():
    v = evaluate(ratio_claim(), speedup_rows(lambda n: 3.0 if n <= 2048 else 5.0), ENVS)
    regions = v.as_dict()["regions"]
    assert [(r["from"], r["to"], r["where"]) for r in regions] == [
        (1024.0, 2048.0, "inside"), (3072.0, 8192.0, "above")]
    assert set(regions[0]) == {"group", "over", "from", "to", "where", "low", "high", "ci_low",
                               "ci_high"}
