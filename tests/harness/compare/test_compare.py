"""``attnbench compare``: acceptance checks of issue 6 on synthetic run directories.

Runs are built in tmp_path with noisy raw samples (log-normal around a per-point time, plus
rare slow outliers, the shape CPU timings have), never with timings of this machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.cli import main
from harness.compare.noise import time_scatter
from harness.compare.rules import CompareOptions, Threshold, parse_thresholds, time_change
from harness.compare.runs import compare_runs
from harness.measure import allocator
from harness.render.comparison import markdown
from harness.results import ENV_FILE, ROWS_FILE, RowWriter, write_env
from harness.scenarios.interface import Point, point_fields

POINTS = [
    Point.of(impl=impl, seq_len=n, heads=4, head_dim=32, causal=causal)
    for impl in ("full", "sdpa", "flash-tiled")
    for n in (128, 256)
    for causal in (False, True)
]
ENV = {
    "run_id": "r",
    "suite": "smoke",
    "device": "cpu",
    "device_name": "Test CPU",
    "threads": 2,
    "torch": "2.13.0+cpu",
    "fingerprint": "cpu-test-cpu-t2",
    "calibration": {"matmul_flops_per_s": 1.7e11},
}


def samples(rng: np.random.Generator, median: float, cv: float, n: int) -> list[float]:
    """``n`` per-call times around ``median``: log-normal spread ``cv`` plus ~3% outliers."""
    x = median * rng.lognormal(0.0, cv, n)
    outliers = rng.random(n) < 0.03
    x[outliers] *= rng.uniform(1.5, 3.0, outliers.sum())
    return x.tolist()


def make_row(point: Point, rng: np.random.Generator, cv: float = 0.05, n: int = 25) -> dict:
    base_time = 2e-4 * (point.seq_len / 128) ** 2 * (1.5 if point.impl == "full" else 1.0)
    times = samples(rng, base_time, cv, n)
    mem = 4 * point.heads * point.seq_len * (point.seq_len if point.impl == "full" else 64) * 2
    return {
        **point.columns(),
        "run_id": "r",
        "suite": "smoke",
        "device_name": "Test CPU",
        "status": "ok",
        "reason": None,
        "time_median_s": float(np.median(times)),
        "time_iqr_s": float(np.subtract(*np.percentile(times, [75, 25]))),
        "time_samples_s": times,
        "samples": len(times),
        "peak_mem_bytes": mem,
        "mem_method": "profiler",
        "max_abs_err": 3e-7 * (1 + rng.random()),
        "rel_err": 1e-7,
        "tolerance": 1e-4,
        "agree": True,
    }


def write_run(path: Path, rows: list[dict], env: dict | None = None) -> Path:
    writer = RowWriter(path)
    for row in rows:
        writer.write(row)
    write_env(path, env if env is not None else ENV)
    return path


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / ROWS_FILE).read_text().splitlines()]


@pytest.fixture
def base(tmp_path: Path) -> Path:
    rng = np.random.default_rng(1)
    return write_run(tmp_path / "base", [make_row(p, rng) for p in POINTS])


def variant(base: Path, tmp_path: Path, edit, name: str = "cur", env: dict | None = None) -> Path:
    """A copy of ``base`` with ``edit(index, row) -> row | None`` applied (None drops it)."""
    rows = [edit(i, dict(r)) for i, r in enumerate(read_rows(base))]
    return write_run(tmp_path / name, [r for r in rows if r is not None], env)


def scale_time(row: dict, factor: float) -> dict:
    """``row`` as slower (or faster) code would time it: wall and, where kept, CPU time."""
    row["time_samples_s"] = [t * factor for t in row["time_samples_s"]]
    row["time_median_s"] *= factor
    if row.get("cpu_time_samples_s"):
        row["cpu_time_samples_s"] = [t * factor for t in row["cpu_time_samples_s"]]
        row["cpu_time_median_s"] *= factor
    return row


def run_cli(*args: object) -> int:
    return main(["compare", *map(str, args)])


def test_run_against_itself_exits_0(base: Path) -> None:
    assert run_cli(base, base) == 0


def test_the_summary_says_1_point_not_1_points(tmp_path: Path, capsys) -> None:
    one = write_run(tmp_path / "one", [make_row(POINTS[0], np.random.default_rng(3))])
    assert run_cli(one, one) == 0
    assert "no regressions, 0 warnings over 1 point (" in capsys.readouterr().out


def test_independent_noisy_rerun_exits_0(base: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(2)  # same distribution, fresh noise and outliers
    rerun = write_run(tmp_path / "rerun", [make_row(p, rng) for p in POINTS])
    assert run_cli(base, rerun) == 0


def test_times_1_5x_exit_1(base: Path, tmp_path: Path, capsys) -> None:
    cur = variant(base, tmp_path, lambda i, r: scale_time(r, 1.5))
    assert run_cli(base, cur, "--strict") == 1
    assert "slower" in capsys.readouterr().out


def test_one_point_slower_is_enough(base: Path, tmp_path: Path) -> None:
    cur = variant(base, tmp_path, lambda i, r: scale_time(r, 1.5) if i == 3 else r)
    result = compare_runs(base, cur, CompareOptions())
    fails = [f for f in result.findings if f.level == "fail"]
    assert [f.metric for f in fails] == ["time"] and result.exit_code == 1


@pytest.mark.parametrize(("cv", "n", "code"), [(0.01, 40, 1), (0.30, 6, 0)])
def test_small_slowdown_fails_only_beyond_noise(
    tmp_path: Path, cv: float, n: int, code: int
) -> None:
    """+15% against a 10% threshold: a regression with tight samples, noise with wide ones."""
    base_rng, cur_rng = np.random.default_rng(3), np.random.default_rng(4)
    base = write_run(tmp_path / "base", [make_row(p, base_rng, cv, n) for p in POINTS])
    cur_rows = [scale_time(make_row(p, cur_rng, cv, n), 1.15) for p in POINTS]
    cur = write_run(tmp_path / "cur", cur_rows)
    assert run_cli(base, cur, "--strict") == code


def test_time_change_interval_brackets_the_truth() -> None:
    rng = np.random.default_rng(5)
    check = Threshold("time", "median", 0.10)
    change = time_change(check, samples(rng, 1e-3, 0.05, 30), samples(rng, 1.5e-3, 0.05, 30))
    assert change.method == "bootstrap" and change.low < 0.5 < change.high
    assert change.high - change.low < 0.2
    fallback = time_change(check, None, None, 1e-3, 1.2e-3, (0.9e-3, 1.1e-3), (1.1e-3, 1.3e-3))
    assert fallback.method == "run-ci" and fallback.low == pytest.approx(0.0)


def test_time_gate_report_warns_unless_wide_margin(base: Path, tmp_path: Path) -> None:
    slow = variant(base, tmp_path, lambda i, r: scale_time(r, 1.3), "slow")
    very_slow = variant(base, tmp_path, lambda i, r: scale_time(r, 2.5), "very_slow")
    assert run_cli(base, slow, "--time-gate", "report") == 0
    assert run_cli(base, slow) == 0  # plain compare is the report gate
    assert run_cli(base, slow, "--strict") == 1
    assert run_cli(base, slow, "--time-gate", "hard") == 1
    assert run_cli(base, very_slow, "--time-gate", "report", "--time-fail", "50%") == 1
    result = compare_runs(base, slow, CompareOptions(time_gate="report"))
    assert result.count("warn") > 0 and result.count("fail") == 0


def test_report_gate_fails_a_lone_wide_slowdown(base: Path, tmp_path: Path) -> None:
    """One point 3x slower while the others hold still: beyond the margin and the scatter."""
    cur = variant(base, tmp_path, lambda i, r: scale_time(r, 3.0) if i == 5 else r)
    assert run_cli(base, cur, "--time-gate", "report") == 1


def test_report_gate_warns_on_time_against_another_machines_baseline(
    base: Path, tmp_path: Path
) -> None:
    """A lone 3x slowdown fails the report gate on the baseline's own machine; against another
    machine's baseline it is a warning (normalized time does not carry across CPU models),
    while the hard gate and a memory regression still fail."""
    slow = lambda i, r: scale_time(r, 3.0) if i == 5 else r
    other = {**ENV, "fingerprint": "cpu-other-cpu-t2"}
    cur = variant(base, tmp_path, slow, env=other)
    result = compare_runs(base, cur, CompareOptions(time_gate="report"))
    assert result.exit_code == 0 and result.count("warn") >= 1
    assert any("another machine's baseline" in note for note in result.warnings)
    assert run_cli(base, cur, "--strict") == 1  # the hard gate
    assert run_cli(base, cur) == 0  # plain compare: the report gate
    same = variant(base, tmp_path, slow, name="same")
    assert run_cli(base, same, "--time-gate", "report") == 1

    def slow_and_big(i: int, row: dict) -> dict:
        row = slow(i, row)
        if i == 5:
            row["peak_mem_bytes"] *= 3
        return row

    bigger = variant(base, tmp_path, slow_and_big, name="bigger", env=other)
    assert run_cli(base, bigger, "--time-gate", "report") == 1


def test_report_gate_tolerates_a_busy_machine(base: Path, tmp_path: Path) -> None:
    """Every point scattered by load (log-normal, sd 0.8): hard gate fails, report gate warns."""
    factors = np.random.default_rng(6).lognormal(0.0, 0.8, len(POINTS))
    assert factors.max() > 2.0  # some points look more than 2x slower
    cur = variant(base, tmp_path, lambda i, r: scale_time(r, factors[i]))
    assert run_cli(base, cur, "--strict") == 1
    assert run_cli(base, cur) == 0
    result = compare_runs(base, cur, CompareOptions(time_gate="report"))
    assert result.exit_code == 0 and result.count("warn") > 0
    assert any("scatter" in note for note in result.warnings)


def test_confirm_run_must_reproduce_a_time_regression(base: Path, tmp_path: Path) -> None:
    slow = variant(base, tmp_path, lambda i, r: scale_time(r, 2.0) if i == 0 else r, "slow")
    rerun = write_run(tmp_path / "rerun", [make_row(p, np.random.default_rng(7)) for p in POINTS])
    slow_again = variant(rerun, tmp_path, lambda i, r: scale_time(r, 2.0) if i == 0 else r, "s2")
    assert run_cli(base, slow, "--confirm", rerun) == 0
    assert run_cli(base, slow, "--confirm", slow_again) == 1
    result = compare_runs(base, slow, CompareOptions(), confirm=[rerun])
    warned = [f.verdict for f in result.findings if f.level == "warn"]
    assert len(warned) == 1 and warned[0].endswith("not in rerun")


def test_report_gate_takes_the_largest_scatter_over_all_runs(base: Path, tmp_path: Path) -> None:
    """A lone 3x slowdown fails the report gate, unless a confirm run shows the machine is busy."""
    slow = variant(base, tmp_path, lambda i, r: scale_time(r, 3.0) if i == 5 else r, "slow")
    factors = np.random.default_rng(8).lognormal(0.0, 0.8, len(POINTS))
    factors[5] = 3.0  # the regression reproduces, among busy-machine scatter
    busy = variant(base, tmp_path, lambda i, r: scale_time(r, factors[i]), "busy")
    steady = variant(base, tmp_path, lambda i, r: scale_time(r, 3.0) if i == 5 else r, "again")
    assert run_cli(base, slow, "--time-gate", "report", "--confirm", steady) == 1
    assert run_cli(base, slow, "--time-gate", "report", "--confirm", busy) == 0


def test_time_scatter() -> None:
    rows = [{"time_median_s": 1.0}] * 10
    slower = [{"time_median_s": 2.0}] * 10
    assert time_scatter(zip(rows, slower, strict=True)) == pytest.approx(0.0)
    assert time_scatter(zip(rows[:7], slower[:7], strict=True)) is None
    spread = [{"time_samples_s": [f, f]} for f in np.exp([-1, 1] * 5)]
    assert time_scatter(zip(rows, spread, strict=True)) == pytest.approx(1.4826)


def test_threshold_is_configurable(base: Path, tmp_path: Path) -> None:
    cur = variant(base, tmp_path, lambda i, r: scale_time(r, 1.5))
    assert run_cli(base, cur, "--strict", "--threshold", "time=median:100%") == 0
    assert run_cli(base, cur, "--strict", "--threshold", "mean:20%") == 1


def test_normalize_peak_forgives_a_slower_machine(base: Path, tmp_path: Path) -> None:
    env = {
        **ENV,
        "fingerprint": "cpu-slower-t2",
        "calibration": {"matmul_flops_per_s": 1.7e11 / 1.5},
    }
    cur = variant(base, tmp_path, lambda i, r: scale_time(r, 1.5), env=env)
    assert run_cli(base, cur, "--strict") == 1
    assert run_cli(base, cur, "--strict", "--normalize-peak") == 0


def test_normalize_peak_without_calibration_exits_2(base: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in ENV.items() if k != "calibration"}
    cur = variant(base, tmp_path, lambda i, r: r, env=env)
    assert run_cli(base, cur, "--normalize-peak") == 2


@pytest.mark.parametrize(("factor", "code"), [(1.3, 1), (1.02, 0), (0.7, 0)])
def test_peak_memory(base: Path, tmp_path: Path, factor: float, code: int) -> None:
    def edit(i: int, r: dict) -> dict:
        r["peak_mem_bytes"] = int(r["peak_mem_bytes"] * factor)
        return r

    assert run_cli(base, variant(base, tmp_path, edit)) == code


def test_one_point_disagreeing_exits_1(base: Path, tmp_path: Path) -> None:
    cur = variant(base, tmp_path, lambda i, r: {**r, "agree": False} if i == 2 else r)
    result = compare_runs(base, cur, CompareOptions())
    assert result.exit_code == 1
    assert [f.verdict for f in result.findings if f.level == "fail"] == ["agree -> false"]


def test_error_growing_beyond_tolerance_exits_1(base: Path, tmp_path: Path) -> None:
    cur = variant(base, tmp_path, lambda i, r: {**r, "max_abs_err": 5e-4} if i == 0 else r)
    assert run_cli(base, cur) == 1
    within = variant(base, tmp_path, lambda i, r: {**r, "max_abs_err": 5e-5}, "within")
    assert run_cli(base, within) == 0  # grew, but within tolerance: reported, not failed


@pytest.mark.parametrize("status", ["error", "oom", "mismatch", "timeout"])
def test_status_regression_exits_1(base: Path, tmp_path: Path, status: str) -> None:
    def edit(i: int, r: dict) -> dict:
        if i == 1:
            r.update(status=status, reason="boom", time_samples_s=None, time_median_s=None)
        return r

    assert run_cli(base, variant(base, tmp_path, edit)) == 1


def test_fixed_status_exits_0(base: Path, tmp_path: Path) -> None:
    broken = variant(base, tmp_path, lambda i, r: {**r, "status": "error"} if i == 1 else r, "b")
    assert run_cli(broken, base) == 0


def test_missing_point_is_reported_and_fails(base: Path, tmp_path: Path, capsys) -> None:
    cur = variant(base, tmp_path, lambda i, r: None if i == 4 else r)
    assert run_cli(base, cur) == 1
    assert "missing" in capsys.readouterr().out


def test_new_point_is_reported_without_failing(base: Path, tmp_path: Path, capsys) -> None:
    extra = make_row(
        Point(impl="sdpa", seq_len=512, heads=4, head_dim=32), np.random.default_rng(4)
    )
    cur = write_run(tmp_path / "cur", [*read_rows(base), extra])
    assert run_cli(base, cur) == 0
    assert "new" in capsys.readouterr().out


def test_rows_are_matched_by_point_not_position(base: Path, tmp_path: Path) -> None:
    """Reversed order compares clean: matching by position would pair n=128 with n=256."""
    cur = write_run(tmp_path / "cur", read_rows(base)[::-1])
    assert run_cli(base, cur) == 0


def test_fingerprint_difference_warns(base: Path, tmp_path: Path, capsys) -> None:
    cur = variant(base, tmp_path, lambda i, r: r, env={**ENV, "fingerprint": "cpu-other-t4"})
    assert run_cli(base, cur) == 0
    assert "fingerprints differ" in capsys.readouterr().out


def test_markdown_summary(base: Path, tmp_path: Path) -> None:
    cur = variant(base, tmp_path, lambda i, r: {**r, "agree": False} if i == 0 else r)
    out = tmp_path / "summary.md"
    assert run_cli(base, cur, "--markdown", out) == 1
    text = out.read_text()
    assert "regressed" in text and "agree -> false" in text and "| FAIL |" in text
    clean = markdown(compare_runs(base, base, CompareOptions()))
    assert "passed" in clean and "no regressions" in clean


@pytest.mark.parametrize(
    "breakage",
    ["missing_dir", "empty_rows", "rows_without_points", "bad_env", "bad_threshold"],
)
def test_unusable_input_exits_2(base: Path, tmp_path: Path, breakage: str) -> None:
    cur = tmp_path / "cur"
    args: list[object] = [base, cur]
    if breakage == "empty_rows":
        write_run(cur, [])
        (cur / ROWS_FILE).touch()
    elif breakage == "rows_without_points":
        write_run(cur, [{"time_median_s": 1.0}])
    elif breakage == "bad_env":
        shutil.copytree(base, cur)
        (cur / "env.json").write_text("{not json")
    elif breakage == "bad_threshold":
        args = [base, base, "--threshold", "time=fastest:10%"]
    assert run_cli(*args) == 2


def test_parse_checks() -> None:
    checks = parse_thresholds("time=median:5%,mem=1MiB")
    assert checks["time"] == Threshold("time", "median", 0.05)
    assert checks["mem"] == Threshold("mem", "peak", 2**20, relative=False)
    assert parse_thresholds("mean:0.002")["time"] == Threshold(
        "time", "mean", 0.002, relative=False
    )
    assert parse_thresholds(None)["time"].describe() == "median:10%"
    for bad in ("time=median:", "speed=10%", "mem=max:5%", "time=median:10 parsecs"):
        with pytest.raises(ValueError):
            parse_thresholds(bad)


# --- piped output and an all-skipped current run ----------------------------------------------


@contextlib.contextmanager
def closed_pipe():
    """stdout is a pipe whose reader has left (``| true``, or ``| head`` once it has its lines):
    every write fails with EPIPE, as it does for the real command. (Set inside the test: pytest
    puts its own capture back on sys.stdout between a fixture's setup and the test.)"""
    read_end, write_end = os.pipe()
    os.close(read_end)
    stream, saved = os.fdopen(write_end, "w"), sys.stdout
    sys.stdout = stream
    try:
        yield stream
    finally:
        sys.stdout = saved
        with contextlib.suppress(OSError):
            stream.close()


def test_a_closed_pipe_keeps_compares_verdict(base: Path, tmp_path: Path) -> None:
    """rich answers a broken pipe with SystemExit(1), the regression code; compare must exit
    with its own verdict: 0 for a clean comparison, 1 for a regression."""
    slow = variant(base, tmp_path, lambda i, r: scale_time(r, 3.0))
    summary_md = tmp_path / "summary.md"
    with closed_pipe():
        clean = run_cli(base, base, "--all")
    with closed_pipe():
        regressed = run_cli(base, slow, "--all", "--markdown", summary_md)
    assert (clean, regressed) == (0, 1)
    assert "regressed" in summary_md.read_text()  # written even though stdout was gone


def test_a_closed_pipe_is_a_quiet_exit_0_for_table_and_list(base: Path, capsys) -> None:
    """Every write meets the closed pipe here (``| head`` once it has its lines): the same
    quiet exit whether the output was one write or many."""
    with closed_pipe():
        table = main(["table", str(base)])
    with closed_pipe():
        listing = main(["list"])
    assert (table, listing) == (0, 0)
    assert capsys.readouterr().err == ""


def test_an_all_skipped_current_run_lists_every_ok_point(tmp_path: Path, capsys) -> None:
    """What ``attnbench run suites/smoke.toml --mem-budget 1KiB`` writes: every point skipped
    before it ran (no time, no memory, no reference-kernel time)."""
    baseline = Path(__file__).resolve().parents[3] / "results/baselines/cpu-amd-epyc-t1/smoke"
    identity = ("impl", "family", "device_name", "threads", "predicted_mem_bytes", "point_id")
    skipped = []
    for row in read_rows(baseline):
        kept = {k: v for k, v in row.items() if k in point_fields() or k in identity}
        skipped.append({**kept, "status": "skipped", "reason": "predicted peak 1 MiB > 1 KiB"})
    cur = write_run(tmp_path / "skipped", skipped, json.loads((baseline / ENV_FILE).read_text()))
    ok_points = sum(r["status"] == "ok" for r in read_rows(baseline))
    assert run_cli(baseline, cur) == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "internal error" not in err, err
    assert out.count("ok -> skipped") == ok_points and f"{ok_points} regressions" in out
    result = compare_runs(baseline, cur, CompareOptions())
    assert {f.metric for f in result.findings if f.level == "fail"} == {"status"}


def test_a_file_gets_the_whole_table_uncut(tmp_path: Path, capsys) -> None:
    """Written to a file or pipe, no cell is cut or wrapped, however long the labels (a
    third-party plug-in's name, a mask with every feature)."""
    name = "vendor-fused-sliding-window-attention-with-global-tokens-v2"
    points = [Point.of(impl=name, seq_len=n, heads=4, head_dim=32, causal=True, window_left=255,
                    window_right=0, dilation=2, global_tokens=16) for n in (128, 256)]
    rng = np.random.default_rng(9)
    base = write_run(tmp_path / "base", [make_row(p, rng) for p in points])
    cur = variant(base, tmp_path, lambda i, r: {**r, "agree": False})
    assert run_cli(base, cur, "--all") == 1
    out = capsys.readouterr().out
    assert "…" not in out and "..." not in out
    for point in points:
        assert point.label() in out  # each whole label on one line


def test_allocator_state_difference_warns(base: Path, tmp_path: Path, capsys) -> None:
    """A baseline taken in another malloc state (or before it was recorded) is said, not failed."""
    tuned = variant(base, tmp_path, lambda i, r: r, env={**ENV, "malloc_tuning": allocator.TUNED})
    assert run_cli(base, tuned) == 0
    assert "allocator states differ (baseline not recorded" in capsys.readouterr().out
    assert run_cli(tuned, tuned) == 0
    assert "allocator states differ" not in capsys.readouterr().out
