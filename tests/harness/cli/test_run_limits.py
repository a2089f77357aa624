"""``attnbench run``: exit codes CI can trust (a crashing plug-in fails the run, a run that
measured nothing fails it, skips do not) and the whole-run ``--time-limit`` with its
coarse-to-fine ``--dry-run`` order."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from harness import registry
from harness.cli import main
from harness.cli.run import parse_duration
from harness.results import load_rows
from harness.spec import Capabilities, Cost

pytestmark = pytest.mark.usefixtures("calibrated_once")  # tests/conftest.py

SUITE = """
name = "tiny"
scenario = "attention"
implementations = {impls}
[fixed]
heads = 2
head_dim = 16
[sweep]
seq_len = {lengths}
[measure]
budget_s = 0.02
min_samples = 3
passes = 1
"""


def suite_file(tmp_path: Path, impls: list[str], lengths: list[int]) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(SUITE.format(impls=repr(impls).replace("'", '"'), lengths=lengths))
    return path


def cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("4m", 240), ("1h", 3600),
                                               ("1m30s", 90), ("45", 45), ("1.5m", 90),
                                               ("0.25", 0.25), ("1h2m3s", 3723)])
def test_durations_in_the_forms_a_person_writes(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["0", "0s", "-5", "-1m", "abc", "1m30", "inf", "nan", ""])
def test_a_bad_time_limit_is_refused_in_one_line(tmp_path, capsys, text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration(text)
    suite = suite_file(tmp_path, ["sdpa"], [33])
    code, _, err = cli(capsys, "run", suite, "--out", tmp_path / "o", f"--time-limit={text}")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--time-limit" in err
    assert not (tmp_path / "o").exists()


def test_dry_run_lists_each_point_once_ends_first_and_runs_nothing(tmp_path, capsys):
    suite = suite_file(tmp_path, ["full", "sdpa"], [64, 96, 128, 256, 512])
    code, out, err = cli(capsys, "run", suite, "--out", tmp_path / "o", "--dry-run")
    assert code == 0, err
    lines = out.splitlines()
    assert "coarse-to-fine" not in lines[0] and "with --time-limit" in lines[0]
    body = lines[1:]
    assert len(body) == 10 and not (tmp_path / "o").exists()
    # the bundled claims judge full's time over seq_len: its ends come first, then its middle
    assert "full attention n=64 " in body[0] and "full attention n=512 " in body[1]
    assert " L0 " in body[0] and "[attention-time-n2: full]" in body[0]
    assert "full attention n=128 " in body[2] and " L1 " in body[2]


def test_a_time_limit_shorter_than_the_first_point_runs_that_point_and_says_so(tmp_path,
                                                                                capsys):
    suite = suite_file(tmp_path, ["full"], [64, 96, 128, 256])
    out = tmp_path / "run"
    code, _, err = cli(capsys, "run", suite, "--out", out, "--time-limit", "0.001",
                       "--no-progress", "--no-table")
    assert code == 0, err
    assert "longer than the limit: that one point runs" in err
    assert "3 points left out" in err and f"--out {out} --resume" in err
    rows = load_rows(out)
    assert list(rows["seq_len"]) == [64] and list(rows["status"]) == ["ok"]
    assert err.strip().splitlines()[-1] == "attnbench: 1 ok: done: exit 0"


@pytest.fixture
def crashing_plugin(monkeypatch):
    """``boom-attn``: a plug-in that raises at every point, registered for this test only."""
    def boom(q, k, v, mask, scale=None):
        raise RuntimeError("boom at every point")

    registry._load()
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry.register("boom-attn", family="test", caps=Capabilities(devices={"cpu"}),
                      cost=Cost(2, 2))(boom)
    return "boom-attn"


def test_a_plugin_that_raises_at_every_point_fails_the_run(tmp_path, capsys, crashing_plugin):
    suite = suite_file(tmp_path, ["sdpa", crashing_plugin], [33, 48])
    code, _, err = cli(capsys, "run", suite, "--out", tmp_path / "r", "--no-progress",
                       "--no-table")
    assert code == 1, err
    lines = err.strip().splitlines()
    assert ("attnbench: boom-attn: 2 of 2 points ended in error; first: RuntimeError: boom at "
            "every point") in lines
    assert not any(line.startswith("attnbench: sdpa:") for line in lines)
    assert lines[-1] == "attnbench: 2 error, 2 ok: a point failed: exit 1"


def test_a_run_where_every_point_is_skipped_measured_nothing(tmp_path, capsys):
    """xformers has no CPU operator: skipped by capability at every point of a CPU suite."""
    if registry.get("xformers").caps.devices & {"cpu"}:
        pytest.skip("xformers declares a CPU device here")
    suite = suite_file(tmp_path, ["xformers"], [33, 48])
    code, _, err = cli(capsys, "run", suite, "--out", tmp_path / "r", "--no-progress",
                       "--no-table")
    assert code == 3, err
    assert err.strip().splitlines()[-1] == (
        "attnbench: 2 skipped: nothing was measured (no ok row): exit 3")


def test_skips_beside_measured_points_stay_exit_0_and_are_counted(tmp_path, capsys):
    suite = suite_file(tmp_path, ["sdpa", "xformers"], [33])
    code, _, err = cli(capsys, "run", suite, "--out", tmp_path / "r", "--no-progress",
                       "--no-table")
    assert code == 0, err
    assert err.strip().splitlines()[-1] == "attnbench: 1 ok, 1 skipped: done: exit 0"


def test_the_help_documents_the_exit_codes(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert exc.value.code == 0
    for needle in ("exit codes: 0", "1 a point failed (error or mismatch", "3 nothing was "
                   "measured", "130 interrupted", "oom"):
        assert needle in text
