"""The whole-run time limit: which passes fit, and what a cut run leaves behind (rows of the
points that finished every pass, the other finished passes in passes.jsonl, nothing else).
Time is a fake clock the executor advances: no test here depends on this machine's speed."""

from __future__ import annotations

import pytest

from harness.execute import runner
from harness.execute.deadline import UPWARD, Deadline
from harness.measure.timing import TimingConfig
from harness.results import PASSES_FILE, RowWriter, iter_rows, read_run
from harness.scenarios.interface import Point
from harness.sweep.suite import MeasureConfig

POINTS = [Point(impl="sdpa", seq_len=n, heads=2, head_dim=8) for n in (16, 24, 32, 48)]


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_first_pass_always_fits_and_then_the_pace_decides():
    clock = Clock()
    deadline = Deadline(10.0, predict=lambda p: p.seq_len / 16, clock=clock)
    big, small = POINTS[3], POINTS[0]  # predicted 3 s and 1 s
    assert deadline.fits(big, True)  # the first pass, even if it cannot fit
    clock.now += 6.0
    deadline.record(big, True, 6.0)  # twice as slow as predicted
    assert deadline.expected(small, True) == pytest.approx(2.0)
    assert deadline.expected(small, False) == pytest.approx(2.0)  # no later pass yet: first's
    assert not deadline.fits(big, True)  # 6 s expected, 4 s left
    assert deadline.fits(small, True)
    clock.now += 4.5
    assert not deadline.fits(small, True)  # time is up: nothing fits


def test_without_a_predictor_the_mean_pass_decides():
    clock = Clock()
    deadline = Deadline(5.0, clock=clock)
    assert deadline.fits(POINTS[0], True)
    clock.now += 2.0
    deadline.record(POINTS[0], True, 2.0)
    assert deadline.fits(POINTS[1], True)  # 2 s expected, 3 s left
    clock.now += 1.5
    assert not deadline.fits(POINTS[1], True)


def _executor(clock: Clock, seconds: dict[int, float], ran: list):
    """A stand-in for the isolated executor: each pass takes ``seconds[seq_len]`` of the
    fake clock and returns an ok record."""

    def execute(point, pass_index=0):
        clock.now += seconds[point.seq_len]
        ran.append((point.seq_len, pass_index))
        return {**runner.point_row(point), "status": "ok", "time_samples_s": [1e-3] * 3,
                "calls_per_sample": 1, "time_median_s": 1e-3}

    return execute


def test_a_cut_run_keeps_finished_rows_and_passes_and_leaves_the_rest_out(tmp_path):
    clock, ran = Clock(), []
    seconds = {16: 1.0, 24: 1.0, 32: 1.0, 48: 1.0}
    deadline = Deadline(7.5, clock=clock)
    config = MeasureConfig(timing=TimingConfig(budget_s=0.01), passes=2)
    order = [3, 0, 2, 1]  # coarse to fine: n=48, 16, 32, 24
    counts = runner.run_points(POINTS, RowWriter(tmp_path), config, run_id="r", suite_name="s",
                               executor=_executor(clock, seconds, ran), first_order=order,
                               deadline=deadline)
    assert [n for n, k in ran if k == 0] == [48, 16, 32, 24]  # the first pass in that order
    assert len(ran) == 7  # 4 first passes, then 3 of the 4 later passes fit in 7.5 s
    finished = {POINTS[i].point_id for i in range(4)} - deadline.cut
    rows = list(iter_rows(tmp_path / "rows.jsonl"))
    assert {r["point_id"] for r in rows} == finished and counts == {"ok": 3}
    assert len(deadline.cut) == 1 and not deadline.left_out
    run = read_run(tmp_path)  # the cut point is read back from its finished pass
    assert run.partial == 1 and len(run.rows) == 4


def test_a_pass_that_does_not_fit_leaves_its_point_out_but_smaller_ones_still_run(tmp_path):
    clock, ran = Clock(), []
    seconds = {16: 1.0, 24: 1.0, 32: 1.0, 48: 8.0}
    predicted = {16: 1.0, 24: 1.0, 32: 1.0, 48: 8.0}
    deadline = Deadline(5.0, predict=lambda p: predicted[p.seq_len], clock=clock)
    config = MeasureConfig(timing=TimingConfig(budget_s=0.01), passes=1)
    runner.run_points(POINTS, RowWriter(tmp_path), config, run_id="r", suite_name="s",
                      executor=_executor(clock, seconds, ran), first_order=[0, 3, 1, 2],
                      deadline=deadline)
    assert ran == [(16, 0), (24, 0), (32, 0)]  # n=48 (8 s) did not fit; the rest did
    assert deadline.left_out == {POINTS[3].point_id}
    assert (tmp_path / PASSES_FILE).is_file()


def test_first_order_must_name_every_point_once(tmp_path):
    with pytest.raises(ValueError, match="every point index once"):
        runner.run_points(POINTS, RowWriter(tmp_path), MeasureConfig(), run_id="r",
                          suite_name="s", executor=lambda *a, **k: {}, first_order=[0, 0, 1])


def test_the_eta_of_a_time_limited_run_is_never_past_its_limit():
    import io

    from harness.terminal import Progress

    clock = Clock()
    plan = {(p, k): 10.0 for p in ("a", "b", "c") for k in range(3)}
    with Progress(plan, 3, stream=io.StringIO(), clock=clock, limit_s=30.0) as bar:
        assert bar.eta_s() == 30.0  # 90 s predicted, 30 s allowed
        clock.now += 25
        bar.step("a", 0, "ok")
        assert bar.eta_s() == pytest.approx(5.0)
        clock.now += 10
        assert bar.eta_s() == 0.0
    with Progress(plan, 3, stream=io.StringIO(), clock=clock) as bar:
        assert bar.eta_s() == 90.0  # no limit: the prediction


def test_a_large_point_is_expected_to_take_its_calls_at_the_measured_call_time():
    """Small points are overhead: their pace says little about a large point's calls. The
    measured call time of the same implementation, scaled by FLOPs, bounds it from below."""
    clock = Clock()
    deadline = Deadline(60.0, predict=lambda p: 1.0, clock=clock, calls=(10, 5),
                        flops=lambda p: float(p.seq_len**2))
    small, large = POINTS[0], POINTS[3]  # n=16, n=48: 9x the FLOPs
    assert deadline.fits(small, True)
    clock.now += 1.0
    deadline.record(small, True, record={"status": "ok", "time_median_s": 0.5})
    # 9x the FLOPs upwards: 9^UPWARD x the call time, not the pace's 1 s
    assert deadline.expected(large, True) == pytest.approx(10 * 0.5 * 9**UPWARD)
    assert deadline.expected(large, False) == pytest.approx(5 * 0.5 * 9**UPWARD)
    clock.now += 20.0
    deadline.record(large, True, 0.0, record={"status": "ok", "time_median_s": 4.5})
    assert deadline.expected(small, True) == pytest.approx(10 * 0.5)  # its own time, linear
    assert deadline.expected(POINTS[2], True) == pytest.approx(10 * 4.5 * (32 / 48) ** 2)
    assert deadline.fits(small, True)  # 5 s expected, 39 s left
    assert not deadline.fits(large, True)  # 45 s expected
    other = Point(impl="full", seq_len=48, heads=2, head_dim=8)
    assert deadline.expected(other, True) == pytest.approx(0.5)  # no call time: the pace


def test_points_that_lose_their_purpose_when_an_end_is_left_out_are_left_out_too(tmp_path):
    clock, ran = Clock(), []
    seconds = {16: 1.0, 24: 1.0, 32: 1.0, 48: 8.0}
    deadline = Deadline(5.0, predict=lambda p: seconds[p.seq_len], clock=clock)
    middle = POINTS[2].point_id  # n=32: its group's end n=48 will not fit

    def wanted(point_id, left_out):
        return not (point_id == middle and POINTS[3].point_id in left_out)

    runner.run_points(POINTS, RowWriter(tmp_path), MeasureConfig(passes=1), run_id="r",
                      suite_name="s", executor=_executor(clock, seconds, ran),
                      first_order=[0, 3, 2, 1], deadline=deadline, wanted=wanted)
    assert ran == [(16, 0), (24, 0)]
    assert deadline.left_out == {POINTS[3].point_id, middle}


def test_only_first_passes_fit_until_later_passes_are_let_in():
    """A session over several suites runs every first pass before any later one: while
    ``later_passes`` is False a later pass does not fit and its point is not cut."""
    clock = Clock()
    deadline = Deadline(100.0, clock=clock, later_passes=False)
    point = POINTS[0]
    assert deadline.fits(point, True)
    deadline.record(point, True, 1.0)
    assert not deadline.fits(point, False)
    deadline.leave(point.point_id, 1)
    assert not deadline.dropped(point.point_id) and not deadline.cut
    deadline.later_passes = True
    assert deadline.fits(point, False)
    deadline.leave(point.point_id, 2)  # a refusal once later passes may run is a cut
    assert deadline.dropped(point.point_id)
