"""Plain ``attnbench compare``: a time regression beyond the margin fails only when it shows
again in a rerun (``harness.compare.noise.confirm_by_rerun``; the CLI's rerun measures the
suspects from the current run's own suite, ``harness.cli.rerun``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from harness.cli import main
from harness.compare.findings import Run, load_run
from harness.compare.rules import CompareOptions
from harness.compare.runs import compare_runs
from harness.results import ENV_FILE, ROWS_FILE
from tests.harness.compare.test_compare import POINTS, make_row, read_rows, scale_time, write_run

pytestmark = pytest.mark.usefixtures("calibrated_once")  # tests/conftest.py: the runs here test
# the command, not the device calibration

REPORT = CompareOptions(time_gate="report")


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return write_run(tmp_path / "base", [make_row(p, np.random.default_rng(1)) for p in POINTS])


def _slow(run_dir: Path, tmp_path: Path, name: str, factor: float = 3.0, index: int = 5) -> Path:
    rows = [scale_time(dict(r), factor) if i == index else r
            for i, r in enumerate(read_rows(run_dir))]
    return write_run(tmp_path / name, rows)


class FakeRerun:
    """``rerun(point_ids)`` answering with prepared run directories, one per call."""

    def __init__(self, *dirs: Path | None, contended: bool = False):
        self.dirs, self.contended, self.calls = list(dirs), contended, []

    def __call__(self, point_ids: list[str]) -> tuple[Run | None, str]:
        self.calls.append(point_ids)
        target = self.dirs.pop(0)
        if target is None:
            return None, "its suite x.toml is not here"
        run = load_run(target, [])
        rows = {pid: {**row, "contended": self.contended} for pid, row in run.rows.items()}
        return Run(rows, run.env), str(target)


def test_a_regression_that_does_not_show_again_is_a_warning(base: Path, tmp_path: Path) -> None:
    slow = _slow(base, tmp_path, "slow")
    honest = write_run(tmp_path / "again", [make_row(p, np.random.default_rng(9)) for p in POINTS])
    rerun = FakeRerun(honest)
    result = compare_runs(base, slow, REPORT, rerun=rerun)
    assert result.exit_code == 0 and len(rerun.calls) == 1 and len(rerun.calls[0]) == 1
    (warned,) = [f for f in result.findings if f.metric == "time" and f.level == "warn"
                 and "not in the rerun" in f.verdict]
    assert warned.point_id == rerun.calls[0][0]


def test_a_regression_that_shows_again_in_a_clean_rerun_fails(base: Path, tmp_path: Path) -> None:
    slow = _slow(base, tmp_path, "slow")
    rerun = FakeRerun(_slow(base, tmp_path, "slow-again"))
    result = compare_runs(base, slow, REPORT, rerun=rerun)
    (failed,) = [f for f in result.findings if f.level == "fail"]
    assert result.exit_code == 1 and "again in the rerun" in failed.verdict
    assert len(rerun.calls) == 1


class Busy(FakeRerun):
    """The first rerun contended; the second as ``second_contended`` says."""

    def __init__(self, *dirs: Path, second_contended: bool):
        super().__init__(*dirs, contended=True)
        self.second = second_contended

    def __call__(self, point_ids: list[str]) -> tuple[Run | None, str]:
        if len(self.calls) == 1:
            self.contended = self.second
        return super().__call__(point_ids)


def test_a_contended_rerun_is_measured_once_more(base: Path, tmp_path: Path) -> None:
    slow = _slow(base, tmp_path, "slow")
    honest = write_run(tmp_path / "again", [make_row(p, np.random.default_rng(9)) for p in POINTS])
    clean = Busy(_slow(base, tmp_path, "busy"), honest, second_contended=False)
    assert compare_runs(base, slow, REPORT, rerun=clean).exit_code == 0
    assert len(clean.calls) == 2  # reproduced only under contention; a clean rerun: gone
    busy = Busy(_slow(base, tmp_path, "busy2"), honest, second_contended=True)
    result = compare_runs(base, slow, REPORT, rerun=busy)
    (failed,) = [f for f in result.findings if f.level == "fail"]
    assert result.exit_code == 1 and "contended too" in failed.verdict  # busy cannot clear busy
    still = FakeRerun(_slow(base, tmp_path, "b1"), _slow(base, tmp_path, "b2"), contended=True)
    assert compare_runs(base, slow, REPORT, rerun=still).exit_code == 1
    assert len(still.calls) == 2


def test_without_a_possible_rerun_the_failure_stands_and_says_why(
    base: Path, tmp_path: Path
) -> None:
    slow = _slow(base, tmp_path, "slow")
    result = compare_runs(base, slow, REPORT, rerun=FakeRerun(None))
    assert result.exit_code == 1
    assert any("not confirmed by a rerun (its suite x.toml is not here)" in n
               for n in result.warnings)


def test_memory_and_status_regressions_fail_without_a_rerun(base: Path, tmp_path: Path) -> None:
    rows = read_rows(base)
    rows[2]["peak_mem_bytes"] *= 3
    rows[3] = {**rows[3], "status": "error", "reason": "boom"}
    cur = write_run(tmp_path / "cur", rows)
    rerun = FakeRerun()
    result = compare_runs(base, cur, REPORT, rerun=rerun)
    assert result.exit_code == 1 and rerun.calls == []  # nothing timed to confirm


SUITE = """
name = "tiny"
scenario = "attention"
implementations = ["sdpa"]
device = "cpu"
[fixed]
batch = 1
heads = 2
head_dim = 16
dtype = "float32"
[sweep]
seq_len = [32, 48]
[measure]
budget_s = 0.02
min_samples = 3
passes = 2
threads = 1
"""


def test_plain_compare_reruns_the_suspects_from_the_runs_suite(tmp_path: Path, capsys) -> None:
    """A real run; a baseline made 1000x faster than it, so any honest rerun reproduces the
    'regression' whatever this machine's load: plain compare measures again and fails it."""
    suite = tmp_path / "tiny.toml"
    suite.write_text(SUITE)
    cur = tmp_path / "cur"
    assert main(["run", str(suite), "--out", str(cur), "--no-progress", "--no-table"]) == 0
    base = tmp_path / "base"
    shutil.copytree(cur, base)
    rows = [scale_time(dict(r), 1e-3) for r in read_rows(cur)]
    (base / ROWS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    capsys.readouterr()
    out = tmp_path / "rerun"
    assert main(["compare", str(base), str(cur), "--rerun-out", str(out)]) == 1
    captured = capsys.readouterr()
    assert "measuring them again (5 passes) to confirm" in captured.err
    # both points, again in the rerun (and in a second one where this machine's load flagged
    # the first as contended)
    assert captured.out.count("again in the rerun (") in (2, 4)
    assert len(read_rows(out)) == 2 and (out / ENV_FILE).is_file()
    assert main(["compare", str(base), str(cur), "--no-rerun"]) == 1
    assert "measuring them again" not in capsys.readouterr().err


def test_a_wide_slowdown_beyond_the_margin_is_a_suspect_the_rerun_decides(
    base: Path, tmp_path: Path
) -> None:
    """+76% with an interval [+20%, +176%] (not wholly above +50%): a warning, but measured
    again; failed when the rerun shows it beyond the margin, a plain warning when not."""
    rows = read_rows(base)
    rows[5] = scale_time(make_row(POINTS[5], np.random.default_rng(2), cv=0.3, n=8), 1.8)
    cur = write_run(tmp_path / "cur", rows)
    (first,) = [f for f in compare_runs(base, cur, REPORT).findings if f.level == "warn"]
    assert first.suspect and "not wholly above the --time-fail margin" in first.verdict
    confirmed = compare_runs(base, cur, REPORT, rerun=FakeRerun(_slow(base, tmp_path, "s", 1.8)))
    (failed,) = [f for f in confirmed.findings if f.level == "fail"]
    assert failed.point_id == first.point_id and "again in the rerun" in failed.verdict
    honest = write_run(tmp_path / "again", [make_row(p, np.random.default_rng(9)) for p in POINTS])
    cleared = compare_runs(base, cur, REPORT, rerun=FakeRerun(honest))
    (warned,) = [f for f in cleared.findings if f.level == "warn"]
    assert cleared.exit_code == 0 and not warned.suspect and "not in the rerun" in warned.verdict
