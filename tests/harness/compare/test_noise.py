"""Numbers that survive a shared machine: pass orders, passes as variance, contention flags,
normalized comparison, and the CI gate on recorded real runs (a real slowdown vs an honest
rerun, under a busy neighbour)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.compare.rules import CompareOptions, parse_thresholds
from harness.compare.runs import compare_runs
from harness.execute.passlog import PASSES_FILE
from harness.execute.runner import run_points
from harness.measure import contention, passes
from harness.render.comparison import summary
from harness.results import RowWriter, load_rows, write_env
from harness.scenarios.interface import Point, point_from_row
from harness.sweep.suite import MeasureConfig, parse_suite

POINTS = [Point(impl="sdpa", seq_len=n, heads=2, head_dim=16) for n in range(16, 16 + 12)]


def test_pass_order_is_deterministic_and_differs_between_passes() -> None:
    orders = passes.pass_orders(12, 3, seed=7)
    assert orders == passes.pass_orders(12, 3, seed=7)
    assert all(sorted(o) == list(range(12)) for o in orders)
    assert orders[0] != orders[1] != orders[2]
    assert passes.pass_orders(12, 3, seed=8) != orders
    assert passes.pass_orders(12, 5, seed=7)[:3] == orders  # a pass's order ignores the count


class FakeMachine:
    """An executor with a fake clock: every point takes ``TRUE`` seconds, except that calls
    during a burst (the 7th to 12th executions, wherever they fall) run 5x slower."""

    TRUE = 1e-3

    def __init__(self, fail_at: int | None = None):
        self.calls, self.fail_at = 0, fail_at
        self.rng = np.random.default_rng(0)

    def samples(self) -> list[float]:
        self.calls += 1
        if self.calls == self.fail_at:
            raise KeyboardInterrupt  # the run is killed here
        factor = 5.0 if 7 <= self.calls <= 12 else 1.0
        return (self.TRUE * factor * self.rng.lognormal(0, 0.01, 20)).tolist()

    def __call__(self, point: Point, pass_index: int = 0) -> dict:
        record = {"time_samples_s": self.samples(), "calls_per_sample": 1, "status": "ok",
                  "ref_kernel_s": 1e-3, "contended": False, "contention": "fake"}
        if pass_index:
            return record
        times = record["time_samples_s"]
        return {**point.columns(), **record, "time_median_s": float(np.median(times)),
                "tokens_per_s": 1.0}


def _run(tmp_path: Path, machine: FakeMachine, points_passes: int) -> dict[str, dict]:
    config = MeasureConfig(passes=points_passes, order_seed=1)
    run_points(POINTS, RowWriter(tmp_path), config, run_id="r", suite_name="s",
               executor=machine)
    return {r["point_id"]: r for r in (json.loads(x) for x in open(tmp_path / "rows.jsonl"))}


def test_a_burst_in_one_pass_is_variance_not_bias(tmp_path: Path) -> None:
    one = _run(tmp_path / "one", FakeMachine(), 1)
    hit = [r for r in one.values() if r["time_median_s"] > 2 * FakeMachine.TRUE]
    assert len(hit) == 6  # one pass: the burst is six confidently wrong points
    assert all(r["time_ci_low_s"] > 2 * FakeMachine.TRUE for r in hit)
    three = _run(tmp_path / "three", FakeMachine(), 3)
    medians = np.array([r["time_median_s"] for r in three.values()])
    assert np.allclose(medians, FakeMachine.TRUE, rtol=0.05)  # no point is biased
    wide = [r for r in three.values() if max(r["pass_medians_s"]) > 2 * FakeMachine.TRUE]
    assert len(wide) == 6 and all(r["time_ci_high_s"] > 2 * FakeMachine.TRUE for r in wide)
    assert all(r["passes"] == 3 and len(r["pass_samples"]) == 3 for r in three.values())


def test_a_killed_run_resumes_without_losing_finished_passes(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path, FakeMachine(fail_at=20), 3)  # killed in the second pass
    logged = (tmp_path / PASSES_FILE).read_text().splitlines()
    assert len(logged) == 19
    again = FakeMachine()
    done = _run(tmp_path, again, 3)
    assert again.calls == 3 * len(POINTS) - 19  # only the missing passes ran
    assert len(done) == len(POINTS) and all(r["passes"] == 3 for r in done.values())


def test_suite_measure_keys() -> None:
    doc = {"name": "s", "scenario": "attention", "implementations": ["sdpa"],
           "sweep": {"seq_len": [16]}, "measure": {"passes": 5, "order_seed": 3}}
    measure = parse_suite(doc).measure
    assert (measure.passes, measure.order_seed) == (5, 3)
    assert parse_suite({**doc, "measure": {}}).measure.passes == 3


STAT = "cpu  100 0 50 800 10 0 0 0 0 0\ncpu0 50 0 25 400 5 0 0 0 0 0\ncpu1 50 0 25 400 5 0 0 0\n"


def test_parse_stat_reads_our_cpus() -> None:
    assert contention.parse_stat(STAT) == (150, 0, 960)
    assert contention.parse_stat(STAT, {1}) == (75, 0, 480)


def _reading(busy_s: float, own_s: float, steal_ticks: int = 0, wall: float = 1.0):
    a = contention.CpuSnapshot(0, 0, 0, 0.0, 0.0, 0.5)
    b = contention.CpuSnapshot(int(busy_s * 100), steal_ticks, 200, own_s, wall, 2.3)
    return contention.cpu_between(a, b, cpus=2, hz=100)


@pytest.mark.parametrize(
    ("busy", "own", "steal", "threads", "flagged"),
    [
        (2.0, 1.95, 0, 2, False),  # all ours
        (2.0, 0.6, 0, 2, True),  # another process took 1.4 cores
        (1.3, 1.0, 0, 1, False),  # others used the spare core: no harm to a 1-thread point
        (2.0, 0.6, 0, 1, True),  # ...but 1.4 cores is more than the spare one
        (1.0, 1.0, 30, 2, True),  # the hypervisor stole 15%
    ],
)
def test_contention_from_synthetic_proc_readings(busy, own, steal, threads, flagged) -> None:
    contended, reason = contention.assess(_reading(busy, own, steal), threads)
    assert contended is flagged
    assert ("load 2.30" in reason) and (("cores" in reason) or ("steal" in reason))


def test_tick_rounding_is_not_contention() -> None:
    cpu = _reading(0.09, 0.05, wall=0.05)  # 4 ticks over a 50 ms interval: rounding
    assert contention.assess(cpu, 2)[0] is False


def test_gpu_throttle_and_other_processes_flag() -> None:
    quiet = {"gpu_other_processes": 0, "gpu_throttle_reasons": 0x1, "gpu_contention_status": "ok"}
    assert contention.assess(None, 1, quiet)[0] is False
    assert contention.assess(None, 1, {**quiet, "gpu_throttle_reasons": 0x40})[0] is True
    assert contention.assess(None, 1, {**quiet, "gpu_other_processes": 2})[0] is True


def test_usable_rows_leave_out_contended_rows_unless_allowed() -> None:
    rows = pd.DataFrame({"contended": [True, False, None], "contention": ["busy", "ok", None]})
    kept, note = contention.usable_rows(rows, allow_contended=False)
    assert len(kept) == 2 and "1 of 3" in note and "left out" in note
    kept, note = contention.usable_rows(rows, allow_contended=True)
    assert len(kept) == 3 and "used" in note
    assert contention.usable_rows(rows.iloc[1:], False)[1] is None


# --- compare: normalized vs absolute ---------------------------------------------------------


def _row(point: Point, rng, time_s: float, ref_s: float) -> dict:
    groups = [time_s * rng.lognormal(0, 0.03, 15) for _ in range(3)]
    pooled = np.concatenate(groups)
    return {**point.columns(), "status": "ok", "time_median_s": float(np.median(pooled)),
            "time_samples_s": pooled.tolist(), "pass_samples": [15, 15, 15],
            "pass_ref_kernel_s": [ref_s] * 3, "ref_kernel_s": ref_s, "contended": False}


def _write(path: Path, rows: list[dict]) -> Path:
    writer = RowWriter(path)
    for row in rows:
        writer.write(row)
    write_env(path, {"suite": "s", "device": "cpu", "fingerprint": "f"})
    return path


def _points() -> list[Point]:
    return [Point(impl=i, seq_len=n, heads=2, head_dim=16)
            for i in ("sdpa", "flash-tiled") for n in (64, 128, 256, 512, 1024)]


def test_normalized_time_forgives_a_uniformly_slower_machine(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    base = _write(tmp_path / "b", [_row(p, rng, 1e-3 * p.seq_len / 64, 1e-3) for p in _points()])
    slower = _write(tmp_path / "c", [_row(p, rng, 2e-3 * p.seq_len / 64, 2e-3)
                                     for p in _points()])
    absolute = compare_runs(base, slower, CompareOptions(time_basis="absolute"))
    normalized = compare_runs(base, slower, CompareOptions())
    assert absolute.exit_code == 1 and absolute.time_basis == "absolute"
    assert normalized.exit_code == 0 and normalized.time_basis == "normalized"
    assert "time / ref_kernel_s" in summary(normalized)


def test_normalized_time_catches_one_slower_implementation(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    base = _write(tmp_path / "b", [_row(p, rng, 1e-3, 1e-3) for p in _points()])
    slow = _write(tmp_path / "c", [_row(p, rng, 2e-3 if p.impl == "sdpa" else 1e-3, 1e-3)
                                   for p in _points()])
    result = compare_runs(base, slow, CompareOptions(time_gate="report"))
    failed = {f.label.split()[0] for f in result.findings if f.level == "fail"}
    assert failed == {"sdpa"} and result.time_basis == "normalized"


def test_a_finding_says_which_time_basis_failed_it(tmp_path: Path) -> None:
    """A faster machine where sdpa got 2x slower per reference time but 20% faster in seconds:
    the row fails on the normalized basis, and says so; the absolute change is shown as not
    gated (it once read ``FAIL ... slower`` beside ``(absolute -33.1%)`` alone)."""
    rng = np.random.default_rng(3)
    base = _write(tmp_path / "b", [_row(p, rng, 1e-3, 1e-3) for p in _points()])
    fast = _write(tmp_path / "c", [_row(p, rng, 0.8e-3 if p.impl == "sdpa" else 0.4e-3, 0.4e-3)
                                   for p in _points()])
    (finding, *_) = [f for f in compare_runs(base, fast, CompareOptions()).findings
                     if f.level == "fail"]
    assert finding.verdict.startswith("slower in normalized time (")
    assert finding.change.startswith("normalized +") and "; absolute -" in finding.change
    assert finding.change.endswith("(not gated)")
    absolute = compare_runs(fast, base, CompareOptions(time_basis="absolute"))
    assert {f.verdict.split(" (")[0] for f in absolute.findings if f.level == "fail"} == {
        "slower in absolute time"}


def test_rows_without_a_reference_time_fall_back_to_absolute(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    rows = [{k: v for k, v in _row(p, rng, 1e-3, 1e-3).items()
             if k not in ("ref_kernel_s", "pass_ref_kernel_s")} for p in _points()]
    base = _write(tmp_path / "b", rows)
    assert compare_runs(base, base, CompareOptions()).time_basis == "absolute"
    opts = CompareOptions(checks=parse_thresholds(None), time_basis="normalized")
    with pytest.raises(Exception, match="impossible"):
        compare_runs(base, base, opts)


# --- the CI gate on recorded runs -------------------------------------------------------------

GATE_SAMPLES = Path(__file__).resolve().parent / "data" / "gate_samples.json"


class Replay:
    """An executor with a fake clock: each pass of a point returns the samples that pass took
    in a real run (recorded by ``scripts/gate_power.py --record-gate``), so the gate sees real
    noise -- a neighbour busy on one core included -- and answers the same every time."""

    def __init__(self, recorded: list[dict]):
        self.passes = {point_from_row(r["point"]).point_id: r["passes"] for r in recorded}

    def __call__(self, point: Point, pass_index: int = 0) -> dict:
        record = dict(self.passes[point.point_id][pass_index])
        if pass_index:
            return record
        return {**point.columns(), **record,
                "time_median_s": float(np.median(record["time_samples_s"]))}


def _replayed_run(path: Path, recorded: list[dict]) -> Path:
    points = [point_from_row(r["point"]) for r in recorded]
    config = MeasureConfig(passes=len(recorded[0]["passes"]), check="none")
    run_points(points, RowWriter(path), config, run_id=path.name, suite_name="gate",
               executor=Replay(recorded))
    write_env(path, {"suite": "gate", "device": "cpu", "fingerprint": "f"})
    return path


def test_ci_gate_flags_a_real_slowdown_and_passes_an_honest_rerun(tmp_path: Path) -> None:
    """Real runs of a small suite (a baseline, an honest rerun, and one with flash-tiled made
    3x slower by a real delay), measured with a neighbour busy on one core (the recording had
    the machine to itself and the neighbour: see the file's ``scheduling``) and replayed
    through the runner's passes into the gate of .ci/run. scripts/gate_power.py measures the
    gate's false-alarm and detection rates on live runs."""
    recorded = json.loads(GATE_SAMPLES.read_text())
    assert "busy" in recorded["neighbour"]
    runs = {name: _replayed_run(tmp_path / name, rows)
            for name, rows in recorded["conditions"].items()}
    base = runs["base"]
    assert load_rows(base)["ref_kernel_s"].gt(0).all()
    assert (load_rows(base)["passes"] == 3).all()
    ci = CompareOptions(time_gate="report")  # the gate of .ci/run
    honest = compare_runs(base, runs["honest"], ci)
    assert honest.exit_code == 0 and honest.time_basis == "normalized"
    slowed = compare_runs(base, runs["slow"], ci)
    failed = {f.label.split()[0] for f in slowed.findings if f.level == "fail"}
    assert failed == {"flash-tiled"}
