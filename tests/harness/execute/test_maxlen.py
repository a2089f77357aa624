"""``attnbench maxlen``: the search, the prediction, and verification in memory-capped children."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from harness.cli import main
from harness.execute import isolate
from harness.execute.isolate import capped_run_task, run_isolated
from harness.execute.maxlen import find_max_len, largest_fitting, predicted_max
from harness.scenarios.interface import Point, cost_of


class Counted:
    """fits(n) = n <= limit, counting calls."""

    def __init__(self, limit: int):
        self.limit, self.calls = limit, []

    def __call__(self, n: int) -> bool:
        self.calls.append(n)
        return n <= self.limit


@pytest.mark.parametrize("limit", [64, 100, 1000, 4096, 4160, 12345, 2**20 + 7])
@pytest.mark.parametrize("start", [64, 3000, 4096, 50_000])
def test_largest_fitting_finds_the_boundary_from_any_start(limit, start):
    fits = Counted(limit)
    lo, hi = largest_fitting(fits, start, 64)
    assert lo == limit // 64 * 64 and hi == lo + 64
    assert len(fits.calls) <= 2 * (limit + start).bit_length() + 4  # logarithmic, not linear
    assert len(set(fits.calls)) == len(fits.calls)  # never runs a length twice


def test_largest_fitting_edges():
    assert largest_fitting(Counted(10), 4096, 64) == (0, 64)  # nothing fits
    assert largest_fitting(Counted(10**9), 64, 64, cap=1000) == (960, None)  # everything fits
    fits = Counted(4100)
    assert largest_fitting(fits, 4096, 64) == (4096, 4160)
    assert fits.calls[:2] == [4096, 4352]  # a good start costs a couple of runs


def test_prediction_is_the_largest_length_within_budget():
    point = Point(impl="full", heads=8, head_dim=64)
    budget = 2 * 2**30
    n = predicted_max(point, budget, 64)
    assert cost_of(replace(point, seq_len=n)).peak_bytes <= budget
    assert cost_of(replace(point, seq_len=n + 64)).peak_bytes > budget
    flash = predicted_max(replace(point, impl="sdpa-flash"), budget, 64)
    assert flash > 10 * n  # O(n) memory reaches much further than O(n^2)


def test_capped_run_reports_oom_instead_of_meeting_the_oom_killer():
    point = Point(impl="full", heads=2, head_dim=16, seq_len=2048)
    payload = {"point": point.fields(), "budget": 8 * 2**20, "warmup_len": 64, "threads": 1}
    over = run_isolated(capped_run_task, payload, timeout_s=120).result
    assert over["status"] == "oom" and "allocate" in over["reason"]
    assert over["limit"] == "RLIMIT_DATA"
    fits = run_isolated(capped_run_task, {**payload, "budget": 256 * 2**20}, 120).result
    assert fits["status"] == "ok"
    assert fits["peak_bytes"] >= 2 * 2 * 2048 * 2048 * 4  # the two score matrices were live


def test_verified_max_brackets_the_boundary_next_to_the_prediction():
    point = Point(impl="full", heads=2, head_dim=16)
    result = find_max_len(point, 64 * 2**20, multiple=64, time_limit_s=120, threads=1)
    assert result.runs[result.verified]["status"] == "ok"
    assert result.runs[result.verified]["peak_bytes"] <= 64 * 2**20
    assert result.runs[result.first_failing]["status"] in ("oom", "error", "over-budget")
    assert result.first_failing == result.verified + 64 and not result.time_limited
    # the model is exact up to allocator slack for materialized scores
    assert abs(result.verified - result.predicted) <= 0.05 * result.predicted
    assert len(result.runs) <= 6


def test_a_too_slow_boundary_is_reported_as_a_lower_bound(monkeypatch):
    """Runs beyond some length time out: the climb reports the largest that finished."""
    from harness.execute import maxlen

    def fake_run(point, budget, multiple, time_limit_s, threads):
        if point.seq_len >= 5000:
            return {"status": "timeout", "reason": "no result within 1 s"}
        return {"status": "ok", "seconds": 0.1, "peak_bytes": 1}

    monkeypatch.setattr(maxlen, "_verify_run", fake_run)
    result = find_max_len(Point(impl="sdpa-flash"), 2**30, multiple=64)
    assert result.time_limited and result.verified == 4096 and result.first_failing >= 5000


def test_cli_json_output(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["full", "--heads", "2", "--head-dim", "16", "--budget", "32MiB", "--threads", "1"]
    assert main(["maxlen", *args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["budget_bytes"] == 32 * 2**20 and report["point"]["heads"] == 2
    assert 0 < report["verified_max_seq_len"] < report["first_failing_seq_len"]
    assert report["predicted_max_seq_len"] > 0
    assert list(tmp_path.iterdir()) == []  # maxlen writes nothing


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["nope"], "unknown implementation"),
        (["full", "--heads", "0"], "heads"),
        (["full", "--window", "-3", "0"], "window"),
        (["sdpa", "--window", "16", "0"], "cannot run"),
        (["full", "--dtype", "float8"], "float8"),
        (["full", "--budget", "lots"], "not a size"),
        (["full", "--multiple", "0"], "--multiple"),
        (["full", "--scenario", "training"], "training"),
    ],
)
def test_bad_maxlen_arguments_are_one_line(capsys, args, needle):
    assert main(["maxlen", *args, "--no-verify"]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_prediction_only(capsys):
    assert main(["maxlen", "full", "--heads", "8", "--head-dim", "64", "--budget", "2GiB",
                 "--no-verify"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    expected = predicted_max(Point(impl="full", heads=8, head_dim=64), 2 * 2**30, 64)
    assert f"predicted max seq_len: {expected} " in out and "verified" not in out


def test_capped_runs_warm_up_in_the_target_length_bucket(monkeypatch):
    """The warm-up (uncapped) runs in the candidate length's power-of-two bucket, so an
    autotuned kernel tunes there and not inside the capped, measured call."""
    from harness.execute import maxlen

    payloads = []

    def fake_run(fn, payload, timeout_s=None):
        payloads.append(payload)
        n = payload["point"]["seq_len"]
        return isolate.ChildOutcome(
            {"status": "ok" if n <= 5000 else "oom", "reason": None}, "ok", None, 0.0
        )

    monkeypatch.setattr(maxlen, "run_isolated", fake_run)
    find_max_len(Point(impl="sdpa", heads=2, head_dim=16), 2**30, multiple=64, time_limit_s=None)
    assert len(payloads) > 3
    for payload in payloads:
        n, warm = payload["point"]["seq_len"], payload["warmup_len"]
        assert warm <= n and warm % 64 == 0
        assert (warm - 1).bit_length() == (n - 1).bit_length(), (n, warm)  # same bucket
    assert maxlen.warmup_length(4096, 64) == 2112 and maxlen.warmup_length(8192, 64) == 4160
    assert maxlen.warmup_length(64, 64) == 64 and maxlen.warmup_length(128, 64) == 128


def peaks_of(peak, cap_seen=None):
    """A stand-in for the child: it finishes every length (no cap in the way) and reports the
    measured peak ``peak(n)``; the caps it was given go to ``cap_seen``."""

    def fake_run(fn, payload, timeout_s=None):
        if cap_seen is not None:
            cap_seen.append(payload["budget"])
        n = payload["point"]["seq_len"]
        record = {"status": "ok", "seconds": 0.1, "peak_bytes": peak(n),
                  "mem_method": "torch-profiler"}  # fmt: skip
        return isolate.ChildOutcome(record, "ok", None, 0.0)

    return fake_run


def test_the_measured_peak_decides_not_surviving_the_cap(monkeypatch):
    """The issue's run: 8192 finished under the cap with a measured peak of 67206656 B over a
    64 MiB budget and was the answer. A finished run over the budget does not fit."""
    from harness.execute import maxlen

    budget, caps = 64 * 2**20, []
    monkeypatch.setattr(maxlen, "run_isolated", peaks_of(lambda n: 8192 * n, caps))
    result = find_max_len(Point(impl="local"), budget, multiple=64, time_limit_s=None)
    assert result.verified == 8192 and budget >= 8192 * 8192  # 8192 * 8192 = 64 MiB exactly
    assert result.runs[8256]["status"] == "over-budget" and result.first_failing == 8256
    assert "67633152 B > budget 67108864 B" in result.runs[8256]["reason"]
    assert set(caps) == {budget + maxlen.headroom(budget)}  # the cap is only a safety net
    over = find_max_len(Point(impl="local"), budget - 1, multiple=64, time_limit_s=None)
    assert over.verified == 8128  # one byte less: 8192 is over


def test_the_same_question_gives_the_same_answer_and_the_same_runs(monkeypatch):
    from harness.execute import maxlen

    def staircase(n: int) -> int:  # a peak that is flat in steps
        return (n // 320 + 1) * 2**20

    monkeypatch.setattr(maxlen, "run_isolated", peaks_of(staircase))
    first = find_max_len(Point(impl="local"), 25 * 2**20, multiple=64, time_limit_s=None)
    again = find_max_len(Point(impl="local"), 25 * 2**20, multiple=64, time_limit_s=None)
    assert first.verified == again.verified and list(first.runs) == list(again.runs)
    assert staircase(first.verified) <= 25 * 2**20 < staircase(first.verified + 64)


def test_the_rss_fallback_clears_the_budget_by_its_error(monkeypatch):
    from harness.execute import maxlen

    def fake_run(fn, payload, timeout_s=None):
        record = {"status": "ok", "peak_bytes": 60 * 2**20 + payload["point"]["seq_len"],
                  "mem_method": "rss-hwm"}  # fmt: skip
        return isolate.ChildOutcome(record, "ok", None, 0.0)

    monkeypatch.setattr(maxlen, "run_isolated", fake_run)
    record = maxlen._verify_run(Point(impl="local", seq_len=64), 61 * 2**20 - 100, 64, None, 1)
    assert record["status"] == "over-budget" and "rss-hwm's error" in record["reason"]


def test_the_search_never_goes_below_the_shortest_length():
    fits = Counted(10)
    assert largest_fitting(fits, 64, 64, low=1024) == (0, 1024)
    assert min(fits.calls) == 1024
    fits = Counted(5000)
    assert largest_fitting(fits, 64, 64, low=1024) == (4992, 5056)
    assert min(fits.calls) >= 1024


@pytest.mark.slow
def test_a_real_boundary_is_within_the_budget_and_the_same_twice():
    """``local`` (causal window 63) under a 24 MiB budget, searched twice in fresh children:
    the answer's measured peak is within the budget and the next length's is not."""
    from harness.masks import MaskSpec
    from harness.scenarios.suite_mask import PointMask

    point = Point(impl="local", heads=4, head_dim=32,
                  masking=PointMask(MaskSpec(causal=True, window=(63, 0))))  # fmt: skip
    budget = 24 * 2**20
    answers = []
    for _ in range(2):
        result = find_max_len(point, budget, multiple=1024, time_limit_s=120, threads=1)
        assert result.runs[result.verified]["peak_bytes"] <= budget
        assert result.runs[result.first_failing]["status"] in ("over-budget", "oom")
        answers.append((result.verified, list(result.runs)))
    assert answers[0] == answers[1] and answers[0][0] > 0


def test_the_budget_is_printed_in_the_unit_it_was_given(capsys):
    args = ["maxlen", "local", "--causal", "--window", "255", "0", "--no-verify"]
    assert main([*args, "--budget", "64MiB"]) == 0
    out = capsys.readouterr().out
    assert "budget 64 MiB (67108864 B)" in out and "GiB" not in out
    assert main([*args, "--budget", "0.5GiB", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["budget"] == "0.5 GiB"
    assert main([*args, "--budget", "100MB"]) == 0
    assert "budget 100 MB (100000000 B)" in capsys.readouterr().out


def test_scenario_settings_flags_come_from_the_scenarios(capsys):
    """``--norm``/``--cache``/``--qk-std``: declared by the scenarios, not listed by maxlen."""
    from harness.cli.maxlen import scenario_settings
    from harness.scenarios import interface

    flags = scenario_settings()
    for word in interface.names():
        for name in interface.settings_types(interface.get(word)):
            assert word.split("+")[0] in flags[name][1]
    args = ["maxlen", "local", "--scenario", "decode", "--causal", "--window", "255", "0",
            "--cache", "rolling", "--layers", "1", "--budget", "1GiB", "--no-verify", "--json"]
    assert main(args) == 0
    point = json.loads(capsys.readouterr().out)["point"]
    assert point["cache"] == "rolling" and point["layers"] == 1
