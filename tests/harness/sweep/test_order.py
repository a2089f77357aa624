"""The coarse-to-fine order of a time-limited run: bisection of a swept axis in log space,
groups interleaved level by level, a ratio claim's pair together, and the judged groups the
analysis finds in a suite."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import pytest

from harness.analysis.claims import DEFAULT_CLAIMS, load_claims, parse_claims
from harness.analysis.groups import judged_groups
from harness.sweep.order import bisection_levels, coarse_to_fine, describe
from harness.sweep.suite import MeasureConfig, parse_suite


@dataclass(frozen=True)
class G:
    label: str
    units: tuple


def test_bisection_starts_with_the_ends_then_the_log_middles():
    xs = [512, 768, 1024, 1536, 2048, 3072, 4096, 8192]
    levels = bisection_levels(list(reversed(xs)))
    assert levels[0] == [512, 8192]
    assert levels[1] == [2048]  # sqrt(512 * 8192)
    assert levels[2] == [1024, 4096]
    assert sorted(x for level in levels for x in level) == xs  # each value once


@pytest.mark.parametrize("count", [1, 2, 3, 5, 16, 33])
def test_each_level_halves_the_largest_gap_in_log_space(count):
    """Octave steps 2^0..2^m: after level L no gap between chosen values is wider than
    ceil(m / 2^L) octaves, and every value comes exactly once."""
    xs = [2.0**k for k in range(count)]
    seen: list[float] = []
    for level, values in enumerate(bisection_levels(xs)):
        seen = sorted(seen + values)
        gaps = [math.log2(b / a) for a, b in itertools.pairwise(seen)]
        assert max(gaps, default=0) <= math.ceil((count - 1) / 2**level)
    assert seen == xs


def test_non_positive_values_bisect_linearly():
    assert bisection_levels([0, 1, 2, 3, 4]) == [[0, 4], [2], [1, 3]]
    assert bisection_levels([]) == []


def test_groups_interleave_level_by_level_and_a_pair_comes_together():
    a = G("a", ((1, ("a1",)), (2, ("a2",)), (4, ("a4",)), (8, ("a8",))))
    pair = G("ratio", ((2, ("b2", "a2")), (8, ("b8", "a8")), (4, ("b4", "a4"))))
    ids = ["z", "a1", "a2", "a4", "a8", "b2", "b4", "b8"]
    slots = coarse_to_fine(ids, [a, pair])
    order = [s.point_id for s in slots]
    assert order[:2] == ["a1", "a8"]  # group a's ends
    assert order[2:5] == ["b2", "a2", "b8"]  # the pair's ends, each pair together (a8 is in)
    assert {s.point_id: s.level for s in slots}["a2"] == 0  # placed by the pair's end
    assert order[-1] == "z" and slots[-1].level is None  # read by no group: last
    assert sorted(order) == sorted(ids)


def test_ids_a_group_names_but_the_run_lacks_are_left_out():
    slots = coarse_to_fine(["a1"], [G("a", ((1, ("a1",)), (2, ("gone",))))])
    assert [s.point_id for s in slots] == ["a1"]
    assert describe(slots, {"a1": "full n=1"}) == ["1  L0  full n=1  [a]"]


SUITE = {
    "name": "t", "scenario": "attention", "implementations": ["full", "sdpa-flash", "sdpa"],
    "fixed": {"heads": 2, "head_dim": 16},
    "sweep": {"seq_len": [64, 96, 128, 192, 256, 512]},
}


def test_the_judged_groups_of_the_cpu_claims_suite_order_its_points():
    suite = parse_suite(SUITE)
    claims = parse_claims({"claim": [
        {"id": "time", "impl": "full", "metric": "time_median_s", "over": "seq_len",
         "expect_exponent": 2, "tolerance": 0.3},
        {"id": "mem", "impl": "sdpa-flash", "metric": "peak_mem_bytes", "over": "seq_len",
         "range": [96, 256], "expect_exponent": 1, "tolerance": 0.3},
        {"id": "speedup", "impl": "sdpa-flash", "baseline": "full", "metric": "time_median_s",
         "over": "seq_len", "range": [128, 512], "ratio": "baseline/impl",
         "expect_ratio_min": 2},
        {"id": "one-value", "impl": "sdpa", "metric": "time_median_s", "over": "heads",
         "expect_exponent": 1},
    ]})
    groups = judged_groups(suite.points, claims)
    assert [g.label for g in groups] == ["time: full", "mem: sdpa-flash",
                                         "speedup: sdpa-flash vs full"]  # one heads value: none
    by_id = {p.point_id: p for p in suite.points}
    slots = coarse_to_fine([p.point_id for p in suite.points], groups)
    order = [(by_id[s.point_id].impl, by_id[s.point_id].seq_len) for s in slots]
    level0 = order[: sum(s.level == 0 for s in slots)]
    assert level0 == [("full", 64), ("full", 512), ("sdpa-flash", 96), ("sdpa-flash", 256),
                      ("sdpa-flash", 128), ("full", 128), ("sdpa-flash", 512)]
    assert [o for o, s in zip(order, slots, strict=True) if s.level is None] == [
        ("sdpa-flash", 64), *(("sdpa", n) for n in SUITE["sweep"]["seq_len"])]


def test_every_bundled_claims_group_of_claims_cpu_gets_its_ends_first():
    """The suite and claims file the issue's target names: every group's smallest and largest
    seq_len come before any point of a finer level."""
    from harness import bundled
    from harness.sweep.suite import load_suite

    suite = load_suite(bundled("claims-cpu.toml"))
    groups = judged_groups(suite.points, load_claims(DEFAULT_CLAIMS))
    assert len(groups) >= 5
    slots = coarse_to_fine([p.point_id for p in suite.points], groups)
    first_fine = next(i for i, s in enumerate(slots) if s.level != 0)
    ends = {pid for g in groups for x, ids in g.units
            if x in (g.units[0][0], g.units[-1][0]) for pid in ids}
    assert {s.point_id for s in slots[:first_fine]} == ends


def test_the_stopping_rule_lets_a_decided_group_wait_and_not_an_open_one():
    """Memory exactly linear in n for sdpa-flash (its claim: exponent 1 ± 0.3): decided once
    three lengths are in; full's quadratic memory claim with two lengths is still open."""
    from harness.analysis.groups import StoppingRule

    suite = parse_suite(SUITE)
    claims = parse_claims({"claim": [
        {"id": "mem", "impl": "sdpa-flash", "metric": "peak_mem_bytes", "over": "seq_len",
         "expect_exponent": 1, "tolerance": 0.3},
        {"id": "full-mem", "impl": "full", "metric": "peak_mem_bytes", "over": "seq_len",
         "expect_exponent": 2, "tolerance": 0.3},
    ]})
    groups = judged_groups(suite.points, claims)
    rule = StoppingRule(groups, claims, clock=lambda: 0.0)  # no time spent: always judges
    flash = [p for p in suite.points if p.impl == "sdpa-flash"]
    full = [p for p in suite.points if p.impl == "full"]

    def row(p, peak):
        return {**p.columns(), "status": "ok", "peak_mem_bytes": peak}

    rows = [row(p, 1000 * p.seq_len) for p in flash[:2]] + [row(p, p.seq_len**2) for p in full[:2]]
    assert rule(rows) == set()  # two lengths each: no group is judged yet
    rows.append(row(flash[2], 1000 * flash[2].seq_len))
    assert rule(rows) == {p.point_id for p in flash}
    assert rule.decided == {"mem: sdpa-flash": "confirmed"}
    ticks = iter([0.0, 10.0, 11.0])  # the first call takes 10 s of an 11 s run: over 5 %
    slow = StoppingRule(groups, claims, clock=lambda: next(ticks))
    assert slow(rows[:2]) == set()
    assert slow(rows) == set() and slow.decided == {}  # judged nothing: over its share


def test_the_runner_moves_a_deferred_group_to_the_back_of_the_first_pass(tmp_path):
    from harness.execute import runner
    from harness.results import RowWriter

    suite = parse_suite(SUITE)
    points = [p for p in suite.points if p.impl != "sdpa"]
    ran: list[str] = []

    def execute(point, pass_index=0):
        ran.append(point.point_id)
        return {**runner.point_row(point), "status": "ok", "time_samples_s": [1e-3],
                "calls_per_sample": 1, "time_median_s": 1e-3}

    late = {p.point_id for p in points if p.impl == "full"}
    order = list(range(len(points)))  # full's 6 points first, then sdpa-flash's

    def defer(rows):
        return late if len(rows) >= 2 else set()  # full's group decided after two points

    runner.run_points(points, RowWriter(tmp_path), MeasureConfig(passes=1), run_id="r",
                      suite_name="s", executor=execute, first_order=order, defer=defer)
    assert ran[:2] == [points[0].point_id, points[1].point_id]
    assert [pid in late for pid in ran[2:]] == [False] * 6 + [True] * 4


def test_a_group_that_lost_an_end_to_the_time_limit_spends_nothing_on_its_middles():
    from harness.analysis.groups import StoppingRule

    suite = parse_suite(SUITE)
    claims = parse_claims({"claim": [
        {"id": "a", "impl": "full", "metric": "peak_mem_bytes", "over": "seq_len",
         "expect_exponent": 2},
        {"id": "b", "impl": "full", "metric": "peak_mem_bytes", "over": "seq_len",
         "range": [64, 256], "expect_exponent": 2},
        {"id": "c", "impl": "sdpa-flash", "metric": "peak_mem_bytes", "over": "seq_len",
         "expect_exponent": 1},
    ]})
    rule = StoppingRule(judged_groups(suite.points, claims), claims)
    pid = {(p.impl, p.seq_len): p.point_id for p in suite.points}
    out = {pid["full", 512], pid["sdpa-flash", 512]}  # the large ends did not fit
    assert rule.wanted(pid["full", 128], out)  # group b (64..256) still has both ends
    assert not rule.wanted(pid["sdpa-flash", 128], out)  # c lost its end: no fit to serve
    assert rule.wanted(pid["sdpa", 128], out)  # read by no claim: as time allows
    assert rule.wanted(pid["sdpa-flash", 128], set())
