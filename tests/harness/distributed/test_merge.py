"""``attnbench merge DIR... --out DIR``: one run from real shard directories; refuses other
suites and duplicate measurements, reports missing points and shards, flags mixed devices."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from harness.cli import main
from harness.distributed.merge import merge_runs
from harness.distributed.shard import shard_done
from harness.results import ENV_FILE, ROWS_FILE, iter_rows, load_env, write_env

pytestmark = pytest.mark.usefixtures("calibrated_once")  # tests/conftest.py: the runs here test
# the command, not the device calibration

# 8 points: sdpa at n = 32 and 64 is measured; xformers and flash-attn (CUDA only) are skipped.
SUITE = """
name = "merge-8"
scenario = "attention"
implementations = ["sdpa", "xformers", "flash-attn", "sdpa-efficient"]
device = "cpu"
[fixed]
batch = 1
heads = 1
head_dim = 16
causal = true
[sweep]
seq_len = [32, 64]
[measure]
budget_s = 0.02
min_samples = 3
check = "full"
"""


def run_cli(*args: object) -> int:
    return main(["run", *map(str, args), "--no-progress", "--no-table"])


def merge_cli(*args: object) -> int:
    return main(["merge", *map(str, args)])


def rows(run_dir: Path) -> list[dict]:
    return list(iter_rows(run_dir / ROWS_FILE))


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(suite file, shard 1/2, shard 2/2), each shard run for real."""
    root = tmp_path_factory.mktemp("merge")
    suite = root / "merge-8.toml"
    suite.write_text(SUITE)
    threads = torch.get_num_threads()
    try:
        for k in (1, 2):
            assert run_cli(suite, "--shard", f"{k}/2", "--out", root / f"s{k}") == 0
    finally:
        torch.set_num_threads(threads)
    return suite, root / "s1", root / "s2"


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edit_env(run_dir: Path, **changes) -> None:
    write_env(run_dir, {**load_env(run_dir), **changes})


def test_merge_of_all_shards_is_complete(tmp_path: Path, shards, capsys) -> None:
    _, s1, s2 = shards
    out = tmp_path / "merged"
    assert merge_cli(s1, s2, "--out", out) == 0
    merged = rows(out)
    assert len(merged) == 8 == len(rows(s1)) + len(rows(s2))
    assert {r["shard"] for r in merged} == {"1/2", "2/2"}
    env = load_env(out)
    assert env["fingerprint"] == load_env(s1)["fingerprint"]
    assert env["merge"]["heterogeneous"] is False and env["merge"]["missing_points"] == []
    assert "shard" not in env and env["suite_fingerprint"] == load_env(s1)["suite_fingerprint"]
    assert "merged 8 of 8 points" in capsys.readouterr().err
    assert main(["table", str(out)]) == 0  # a normal run directory


def test_shards_of_another_suite_are_refused(tmp_path: Path, shards, capsys) -> None:
    _, s1, s2 = shards
    other = copy(s2, tmp_path / "other")
    edit_env(other, suite_fingerprint="0" * 64, suite="something-else")
    assert merge_cli(s1, other, "--out", tmp_path / "merged") == 2
    assert "different suite files" in capsys.readouterr().err
    assert not (tmp_path / "merged").exists()


def test_two_measurements_of_one_point_are_refused(tmp_path: Path, shards, capsys) -> None:
    _, s1, s2 = shards
    again = copy(s1, tmp_path / "again")
    lines = (again / ROWS_FILE).read_text().splitlines()
    row = json.loads(lines[0])
    row["time_median_s"] = 1.0 if row.get("time_median_s") is None else row["time_median_s"] * 2
    (again / ROWS_FILE).write_text("\n".join([json.dumps(row), *lines[1:]]) + "\n")
    assert merge_cli(s1, s2, again, "--out", tmp_path / "merged") == 2
    assert "measured twice" in capsys.readouterr().err


def test_an_identical_copy_of_a_row_is_kept_once(tmp_path: Path, shards, capsys) -> None:
    _, s1, s2 = shards
    twin = copy(s1, tmp_path / "twin")
    report = merge_runs([s1, s2, twin, s1], tmp_path / "merged")
    assert report.rows == 8 and report.complete
    assert any("kept once" in note for note in report.notes)


def test_missing_points_are_reported(tmp_path: Path, shards, capsys) -> None:
    _, s1, s2 = shards
    cut = copy(s2, tmp_path / "cut")
    lines = (cut / ROWS_FILE).read_text().splitlines()
    lost = json.loads(lines[-1])["point_id"]
    (cut / ROWS_FILE).write_text("\n".join(lines[:-1]) + "\n")
    assert merge_cli(s1, cut, "--out", tmp_path / "merged") == 1
    err = capsys.readouterr().err
    assert f"1 point(s) missing: {lost}" in err and "missing shard" not in err
    assert load_env(tmp_path / "merged")["merge"]["missing_points"] == [lost]


def test_heterogeneous_devices_are_flagged_not_mixed(tmp_path: Path, shards, capsys) -> None:
    _, s1, s2 = shards
    h100 = copy(s2, tmp_path / "h100")
    edit_env(h100, fingerprint="cuda-nvidia-h100-80gb-hbm3", device_name="NVIDIA H100 80GB HBM3")
    out = tmp_path / "merged"
    assert merge_cli(s1, h100, "--out", out) == 0  # complete, but flagged
    err = capsys.readouterr().err
    assert "warning: heterogeneous devices" in err and "NVIDIA H100 80GB HBM3" in err
    env = load_env(out)
    assert env["merge"]["heterogeneous"] is True
    assert env["fingerprint"].startswith("mixed:") and "cuda-nvidia-h100" in env["fingerprint"]
    assert env["device_name"] is None  # never one shard's value for all rows
    assert set(env["merge"]["env_differences"]) >= {"fingerprint", "device_name"}
    by_shard = {r["shard"]: r["fingerprint"] for r in rows(out)}
    assert by_shard["2/2"] == "cuda-nvidia-h100-80gb-hbm3" != by_shard["1/2"]


def test_out_must_be_new_unless_forced(tmp_path: Path, shards) -> None:
    _, s1, s2 = shards
    out = tmp_path / "merged"
    assert merge_cli(s1, s2, "--out", out) == 0
    assert merge_cli(s1, s2, "--out", out) == 2
    assert merge_cli(s1, s2, "--out", out, "--force") == 0
    assert merge_cli(s1, s2, "--out", s1) == 2  # never over an input


def test_a_directory_that_is_no_run_is_refused(tmp_path: Path, shards, capsys) -> None:
    _, s1, _ = shards
    (tmp_path / "empty").mkdir()
    assert merge_cli(s1, tmp_path / "empty", "--out", tmp_path / "merged") == 2
    assert "not a run directory" in capsys.readouterr().err


def test_an_empty_shard_is_a_run_directory_without_rows(tmp_path: Path, shards) -> None:
    suite, _, _ = shards
    threads = torch.get_num_threads()
    try:  # 8 points in 9 shards: one shard has nothing to run
        assert run_cli(suite, "--shard", "9/9", "--out", tmp_path / "s9") == 0
    finally:
        torch.set_num_threads(threads)
    env = load_env(tmp_path / "s9")
    assert env["shard"]["point_ids"] == [] and (tmp_path / "s9" / ENV_FILE).is_file()
    assert shard_done(tmp_path / "s9")
    report = merge_runs([tmp_path / "s9"], tmp_path / "merged")
    assert report.rows == 0 and report.missing_shards == [f"{k}/9" for k in range(1, 9)]
