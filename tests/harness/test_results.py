"""The one results loader: the format version, bad rows said one line each, and the rows of an
interrupted multi-pass run read from its finished passes (marked partial)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from harness.cli import main
from harness.errors import ResultsWarning
from harness.execute.runner import run_points
from harness.results import (
    ENV_FILE,
    PASSES_FILE,
    ROWS_FILE,
    SCHEMA_VERSION,
    RowWriter,
    load_env,
    load_rows,
    write_env,
)
from harness.scenarios.interface import Point
from harness.sweep.suite import MeasureConfig

ROOT = Path(__file__).resolve().parents[2]
BASELINE = ROOT / "results" / "baselines" / "cpu-amd-epyc-t1" / "smoke"


def _ok_row(impl: str, n: int, seconds: float = 1e-3) -> dict:
    return {**Point(impl, seq_len=n).columns(), "run_id": "r", "suite": "s", "status": "ok",
            "time_median_s": seconds, "peak_mem_bytes": 1024.0 * n}


def _run(path: Path, rows: list[dict], lines: list[str] = ()) -> Path:
    writer = RowWriter(path)
    for row in rows:
        writer.write(row)
    with (path / ROWS_FILE).open("a") as fh:
        fh.writelines(line + "\n" for line in lines)
    write_env(path, {"run_id": "r", "suite": "s"})
    return path


def _cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


# --- the format version -----------------------------------------------------------------------


def test_rows_and_env_carry_the_format_version(tmp_path: Path) -> None:
    run = _run(tmp_path / "run", [_ok_row("sdpa", 64)])
    line = json.loads((run / ROWS_FILE).read_text().splitlines()[0])
    assert line["schema_version"] == SCHEMA_VERSION
    assert load_env(run)["schema_version"] == SCHEMA_VERSION
    assert load_rows(run)["schema_version"].tolist() == [SCHEMA_VERSION]


def test_the_committed_baseline_without_a_version_reads_as_version_1(capsys) -> None:
    assert "schema_version" not in (BASELINE / ROWS_FILE).read_text()
    frame = load_rows(BASELINE)
    assert set(frame["schema_version"]) == {1} and len(frame) == 48
    code, _, err = _cli(capsys, "compare", BASELINE, BASELINE)
    assert code == 0, err


@pytest.mark.parametrize("where", [ROWS_FILE, ENV_FILE])
def test_a_newer_format_version_is_refused_in_one_line(tmp_path: Path, capsys, where) -> None:
    run = _run(tmp_path / "run", [_ok_row("sdpa", 64)])
    path = run / where
    text = path.read_text().replace(f'"schema_version": {SCHEMA_VERSION}',
                                    f'"schema_version": {SCHEMA_VERSION + 1}')
    path.write_text(text)
    for verb in (("table",), ("claims",), ("compare", run)):
        code, _, err = _cli(capsys, verb[0], *verb[1:], run)
        assert code == 2, (verb, err)
        assert err.count("\n") == 1 and "newer than this attnbench reads" in err, err
        assert f"version {SCHEMA_VERSION + 1}" in err and "Traceback" not in err


# --- garbage rows -----------------------------------------------------------------------------


def test_bad_lines_are_left_out_with_one_line_each(tmp_path: Path, capsys) -> None:
    good = [_ok_row("sdpa", 64), _ok_row("sdpa", 128)]
    bad = ['{"impl": "sdpa", "status": "ok", "seq_len": 2', "[1, 2, 3]",
           json.dumps({**_ok_row("sdpa", 256), "seq_len": "abc"}),
           json.dumps({**_ok_row("sdpa", 512), "status": "fine"})]
    run = _run(tmp_path / "run", good, bad)
    code, out, err = _cli(capsys, "table", run)
    assert code == 0
    lines = err.strip().splitlines()
    assert len(lines) == 4 and all(line.startswith("attnbench: warning: ") for line in lines)
    assert "UserWarning" not in err and "warnings.warn" not in err
    assert ":3: not a complete JSON line" in lines[0] and ":4: not a JSON object" in lines[1]
    assert 'seq_len = "abc" is not an integer' in lines[2] and "status = 'fine'" in lines[3]
    assert "64" in out and "128" in out and "abc" not in out and "(no rows)" not in out


@pytest.mark.parametrize(
    "content",
    ["", "[1, 2, 3]\n", "not json\n{\n", '{"impl": "sdpa", "status": "ok", "seq_len": "abc"}\n'],
    ids=["empty", "list", "corrupt", "bad-type"],
)
def test_no_usable_row_is_exit_2_in_one_line(tmp_path: Path, capsys, content) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / ROWS_FILE).write_text(content)
    for verb in ("table", "claims", "report"):
        extra = ("--out", tmp_path / "report") if verb == "report" else ()
        code, out, err = _cli(capsys, verb, run, *extra)
        assert code == 2, (verb, content, err)
        assert "no usable rows" in err.splitlines()[-1] and "Traceback" not in err
        assert "(no rows)" not in out


def test_nan_rows_with_missing_fields_are_left_out_of_compare(tmp_path: Path, capsys) -> None:
    rows = [_ok_row("sdpa", n) for n in (64, 128)]
    broken = '{"impl": "sdpa", "status": "ok", "seq_len": NaN, "heads": NaN, "time_median_s": NaN}'
    base = _run(tmp_path / "base", rows)
    cur = _run(tmp_path / "cur", rows, [broken])
    code, out, err = _cli(capsys, "compare", base, cur)
    assert code == 0, err
    assert "internal error" not in err and "not a valid point (seq_len is missing)" in out
    only_broken = _run(tmp_path / "only", [], [broken])
    code, _, err = _cli(capsys, "compare", base, only_broken)
    assert code == 2 and "no usable rows" in err and "internal error" not in err


# --- an interrupted multi-pass run ------------------------------------------------------------

POINTS = [Point("sdpa", seq_len=n, heads=2, head_dim=16) for n in (16, 32, 48, 64)]


class Interrupting:
    """An executor with a fake clock that is interrupted (Ctrl-C) at its ``stop_at``-th call."""

    def __init__(self, stop_at: int | None = None):
        self.calls, self.stop_at = 0, stop_at
        self.rng = np.random.default_rng(0)

    def __call__(self, point: Point, pass_index: int = 0) -> dict:
        self.calls += 1
        if self.calls == self.stop_at:
            raise KeyboardInterrupt
        record = {"time_samples_s": (1e-3 * self.rng.lognormal(0, 0.01, 9)).tolist(),
                  "calls_per_sample": 1, "status": "ok", "ref_kernel_s": 1e-3}
        if pass_index:
            return record
        return {**point.columns(), **record, "time_median_s": 1e-3, "peak_mem_bytes": 4096}


def _interrupted_run(path: Path, stop_at: int) -> Path:
    write_env(path, {"run_id": "interrupted", "suite": "s"})
    with pytest.raises(KeyboardInterrupt):
        run_points(POINTS, RowWriter(path), MeasureConfig(passes=3), run_id="interrupted",
                   suite_name="s", executor=Interrupting(stop_at))
    return path


def test_an_interrupted_run_is_readable_from_its_finished_passes(tmp_path: Path, capsys) -> None:
    run = _interrupted_run(tmp_path / "run", stop_at=7)  # 4 first passes, 2 second passes
    assert not (run / ROWS_FILE).exists() and (run / PASSES_FILE).is_file()
    with pytest.warns(ResultsWarning, match="interrupted run"):
        frame = load_rows(run).set_index("seq_len")
    assert len(frame) == 4 and frame["partial"].all()
    assert sorted(frame["passes"]) == [1, 1, 2, 2]  # each row says how many passes went in
    assert set(frame["run_id"]) == {"interrupted"} and set(frame["suite"]) == {"s"}
    two = frame[frame["passes"] == 2]
    assert all(len(s) == 2 for s in two["pass_samples"])
    code, out, err = _cli(capsys, "table", run)
    assert code == 0 and "16" in out and "64" in out
    assert "interrupted run: 4 points read" in err and "--resume" in err
    shutil.copytree(run, tmp_path / "copy")
    code, out, err = _cli(capsys, "compare", run, tmp_path / "copy")
    assert code == 0 and "partial" in out


def test_the_report_says_a_run_was_interrupted(tmp_path: Path, capsys) -> None:
    run = _interrupted_run(tmp_path / "run", stop_at=7)
    code, _, err = _cli(capsys, "report", run, "--out", tmp_path / "report")
    assert code == 0, err
    text = (tmp_path / "report" / "report.md").read_text()
    assert "run interrupted was interrupted: 4 of its points come from their finished" in text
    assert "--resume" in text


def test_resuming_finishes_the_partial_rows(tmp_path: Path) -> None:
    run = _interrupted_run(tmp_path / "run", stop_at=7)
    run_points(POINTS, RowWriter(run), MeasureConfig(passes=3), run_id="interrupted",
               suite_name="s", executor=Interrupting())
    frame = load_rows(run)
    assert len(frame) == 4 and "partial" not in frame.columns
    assert (frame["passes"] == 3).all()
