"""``compare``'s CPU time basis: one-thread CPU rows are judged on CPU time per the reference
kernel's CPU time, which a time-shared core does not move (docs/noise.md). Synthetic rows in
three passes, never timings of this machine."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from harness.cli import main
from harness.compare.findings import CompareError
from harness.compare.noise import CPU_CONTENTION, time_scatter
from harness.compare.rules import CompareOptions, pair_basis, parse_thresholds
from harness.compare.runs import compare_runs
from harness.render.comparison import summary
from harness.scenarios.interface import Point
from tests.harness.compare.test_noise import _write
from tests.harness.compare.test_rerun import FakeRerun

REPORT = CompareOptions(time_gate="report")  # what plain compare uses, without its rerun
REF_S = 1.4e-3  # the reference matmul's time, wall and CPU alike on a quiet core


def _points() -> list[Point]:
    return [Point(impl=i, seq_len=n, heads=2, head_dim=16)
            for i in ("sdpa", "flash-tiled") for n in (64, 128, 256, 512, 1024)]


def _row(point: Point, rng: np.random.Generator, cpu_s: float, wall_x: float = 1.0,
         threads: int = 1, ref_wall_x: float = 1.0, cpu: bool = True) -> dict:
    """A row timed in 3 passes of 15 samples: per-call CPU time around ``cpu_s``; wall time
    that much, times ``wall_x`` (the wait for a core on a time-shared machine); the reference
    kernel's wall time ``ref_wall_x`` times its CPU time. ``cpu=False``: a row recorded before
    CPU time was (no CPU columns)."""
    cpu_groups = [cpu_s * rng.lognormal(0, 0.03, 15) for _ in range(3)]
    wall_groups = [g * wall_x * rng.lognormal(0, 0.05, 15) for g in cpu_groups]
    wall, cpu_pooled = np.concatenate(wall_groups), np.concatenate(cpu_groups)
    row = {**point.columns(), "status": "ok", "threads": threads, "contended": wall_x > 1.5,
           "time_median_s": float(np.median(wall)), "time_samples_s": wall.tolist(),
           "pass_samples": [15, 15, 15], "pass_ref_kernel_s": [REF_S * ref_wall_x] * 3,
           "ref_kernel_s": REF_S * ref_wall_x}
    if cpu:
        row.update(cpu_time_median_s=float(np.median(cpu_pooled)),
                   cpu_time_samples_s=cpu_pooled.tolist(),
                   pass_cpu_medians_s=[float(np.median(g)) for g in cpu_groups],
                   pass_ref_kernel_cpu_s=[REF_S] * 3, ref_kernel_cpu_s=REF_S)
    return row


def _run(path: Path, seed: int, slow: float = 1.0, wall_x: float = 1.0, **kw) -> Path:
    """A run of ``_points()``: flash-tiled ``slow`` times slower in CPU time (real work, so in
    wall time too) and ``wall_x`` times slower in wall time only."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in _points():
        factor, waited = (slow, wall_x) if p.impl == "flash-tiled" else (1.0, 1.0)
        rows.append(_row(p, rng, 1e-3 * p.seq_len / 64 * factor, waited, **kw))
    return _write(path, rows)


def _failed(result) -> set[str]:
    return {f.label.split()[0] for f in result.findings if f.level == "fail"}


def test_auto_compares_one_thread_rows_in_cpu_time_and_fails_a_2x_slowdown(tmp_path: Path):
    base = _run(tmp_path / "b", 0)
    slow = compare_runs(base, _run(tmp_path / "s", 1, slow=2.0), REPORT)
    assert _failed(slow) == {"flash-tiled"} and slow.time_basis == "cpu"
    assert "(time gate: CPU time / ref_kernel_cpu_s)" in summary(slow)
    finding = next(f for f in slow.findings if f.level == "fail")
    assert finding.verdict.startswith("slower in cpu time (")
    assert finding.change.startswith("cpu +") and "; wall +" in finding.change
    assert finding.baseline.endswith("x ref CPU")
    honest = compare_runs(base, _run(tmp_path / "h", 2), REPORT)
    assert honest.exit_code == 0 and honest.count("warn") == 0


def test_a_3x_wall_only_swing_passes_in_cpu_time_and_fails_in_wall_time(tmp_path: Path):
    """flash-tiled's wall time 3x (its core time-shared, the reference kernel's not): the
    same work, so the CPU basis passes it; the normalized wall basis sees +200%."""
    base = _run(tmp_path / "b", 0)
    waited = _run(tmp_path / "w", 1, wall_x=3.0)
    cpu = compare_runs(base, waited, REPORT)
    assert cpu.exit_code == 0
    # its rows were contended: said, with what contention still does to CPU time
    assert any("rows were measured under contention" in n for n in cpu.warnings)
    assert CPU_CONTENTION in cpu.warnings
    wall = compare_runs(base, waited, CompareOptions(time_gate="report", time_basis="normalized"))
    assert _failed(wall) == {"flash-tiled"} and wall.time_basis == "normalized"
    assert CPU_CONTENTION not in wall.warnings


def test_rows_of_several_threads_keep_normalized_wall_time(tmp_path: Path):
    """CPU time of a 2-thread row counts both threads, spin-waits included: auto compares such
    rows in wall time, and says so."""
    base = _run(tmp_path / "b", 0, threads=2)
    waited = compare_runs(base, _run(tmp_path / "w", 1, wall_x=3.0, threads=2), REPORT)
    assert _failed(waited) == {"flash-tiled"} and waited.time_basis == "normalized"
    assert any("ran more than one thread" in n and "wall time" in n for n in waited.warnings)
    forced = CompareOptions(time_gate="report", time_basis="cpu")
    assert compare_runs(base, _run(tmp_path / "f", 1, wall_x=3.0, threads=2), forced).exit_code == 0


def test_rows_without_cpu_time_keep_todays_basis(tmp_path: Path):
    """A baseline recorded before CPU time: its points are compared as before (normalized
    wall time), even where the current rows have CPU time; mixed runs say both."""
    old = _run(tmp_path / "old", 0, cpu=False)
    new = _run(tmp_path / "new", 1, wall_x=3.0)
    result = compare_runs(old, new, REPORT)
    assert result.time_basis == "normalized" and _failed(result) == {"flash-tiled"}
    rng = np.random.default_rng(4)
    mixed = _write(tmp_path / "mixed", [_row(p, rng, 1e-3 * p.seq_len / 64, cpu=p.impl == "sdpa")
                                        for p in _points()])
    both = compare_runs(mixed, _run(tmp_path / "cur", 5), REPORT)
    assert both.time_basis == "cpu+normalized" and both.exit_code == 0
    assert "CPU time / ref_kernel_cpu_s for one-thread rows, else time / ref_kernel_s" in (
        summary(both))


def test_pair_basis_needs_cpu_time_and_one_thread_on_both_sides():
    rng = np.random.default_rng(6)
    point = _points()[0]
    one, two = _row(point, rng, 1e-3), _row(point, rng, 1e-3, threads=2)
    none = _row(point, rng, 1e-3, cpu=False)
    auto = CompareOptions(time_basis="normalized", cpu_rows=True)
    assert pair_basis(auto, one, one) == "cpu"
    assert pair_basis(auto, one, two) == pair_basis(auto, none, one) == "normalized"
    assert pair_basis(CompareOptions(time_basis="normalized"), one, one) == "normalized"
    short = {**one, "cpu_time_samples_s": one["cpu_time_samples_s"][:-1]}  # not one per sample
    assert pair_basis(auto, one, short) == "normalized"


def test_explicit_cpu_basis_without_cpu_time_is_one_line_and_exit_2(tmp_path: Path, capsys):
    old = _run(tmp_path / "old", 0, cpu=False)
    assert main(["compare", str(old), str(old), "--time-basis", "cpu", "--no-rerun"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert re.search(r"--time-basis cpu: impossible \(\d+ timed rows have no CPU time", err)
    absolute = CompareOptions(parse_thresholds("time=median:1ms"), time_basis="cpu")
    with pytest.raises(CompareError, match="threshold is absolute"):
        compare_runs(_run(tmp_path / "b", 0), _run(tmp_path / "c", 1), absolute)


def test_the_rerun_is_judged_in_cpu_time_too(tmp_path: Path):
    """A suspect the rerun shows 2x in CPU time fails; one the rerun shows 3x slower only in
    wall time (waiting for a core) is cleared."""
    base = _run(tmp_path / "b", 0)
    cur = _run(tmp_path / "c", 1, slow=1.6)
    again = compare_runs(base, cur, REPORT, rerun=FakeRerun(_run(tmp_path / "r", 2, slow=2.0)))
    assert _failed(again) == {"flash-tiled"}
    assert all("again in the rerun" in f.verdict for f in again.findings if f.level == "fail")
    waited = _run(tmp_path / "r2", 3, wall_x=3.0)
    cleared = compare_runs(base, cur, REPORT, rerun=FakeRerun(waited))
    assert cleared.exit_code == 0
    assert any("not in the rerun" in f.verdict for f in cleared.findings if f.level == "warn")


def test_the_run_to_run_scatter_uses_each_points_basis():
    """Points whose wall time swings 1-4x between runs while their CPU time does not: the
    scatter read in each point's basis (auto: cpu) stays small, in wall time it does not."""
    rng = np.random.default_rng(7)
    pairs = [(_row(p, rng, 1e-3), _row(p, rng, 1e-3, wall_x=float(rng.uniform(1.0, 4.0))))
             for p in _points()]
    auto = CompareOptions(time_basis="normalized", cpu_rows=True)
    assert time_scatter(pairs, "median", auto) < 0.05
    assert time_scatter(pairs, "median", "normalized") > 0.2
