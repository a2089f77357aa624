"""``attnbench run --launcher ray|slurm``: the real engines, locally. Ray runs a local 2-CPU
cluster; Slurm is exercised through submitit's LocalExecutor (the same submitit code path, with
local processes instead of sbatch). No mocks: shards really run, fail, resume and merge."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from harness.cli import main
from harness.results import ROWS_FILE, iter_rows, load_env, write_env
from harness.sweep.suite import load_suite
from tests.conftest import calibrated_children_env
from tests.harness.distributed.test_shard import SUITE_48

# test_shard's suite, smaller: 16 points (8 timed: sdpa; 8 skipped in a moment: xformers on a
# CPU), so each shard's process times 4 points instead of 12. The launchers split, fail, retry,
# resume and merge it as they do the 48 (test_shard checks the split of those).
SUITE_16 = (SUITE_48.replace('["sdpa", "xformers", "flash-attn", "sdpa-efficient"]',
                             '["sdpa", "xformers"]')
            .replace("[32, 64, 128]", "[32, 64]").replace('"shard-48"', '"shard-16"'))
assert SUITE_16.count("[32, 64]") == 1 and '["sdpa", "xformers"]' in SUITE_16


def row_ids(run_dir: Path) -> list[str]:
    return [row["point_id"] for row in iter_rows(run_dir / ROWS_FILE)]


def launch(suite: Path, out: Path, *args: object) -> int:
    threads = torch.get_num_threads()
    try:
        return main(["run", str(suite), "--out", str(out), "--shards", "2", *map(str, args)])
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def suite_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("suite") / "shard-16.toml"
    path.write_text(SUITE_16)
    return path


@pytest.fixture(scope="module")
def suite_ids(suite_file: Path) -> set[str]:
    return {p.point_id for p in load_suite(suite_file).points}


@pytest.fixture(scope="module", autouse=True)
def calibrated_workers():
    """The shards' processes (Ray workers, submitit jobs) get this process's CPU calibration
    instead of measuring one each (tests/calibrated_site): the launchers are tested here, not
    the calibration. Set before the Ray cluster starts: its workers inherit this environment."""
    with pytest.MonkeyPatch.context() as patch:
        env = calibrated_children_env()
        for name in ("ATTNBENCH_TEST_CALIBRATION", "PYTHONPATH"):
            patch.setenv(name, env[name])
        yield


@pytest.fixture(scope="module")
def ray_cluster(calibrated_workers):
    ray = pytest.importorskip("ray", reason="the dist extra (ray) is not installed")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_launcher_yields_the_suite_point_set_and_resumes(
    tmp_path: Path, suite_file: Path, suite_ids: set[str], ray_cluster, capsys
) -> None:
    out = tmp_path / "sweep"
    shard1, shard2 = out / "shards" / "shard-1-of-2", out / "shards" / "shard-2-of-2"
    # Shard 2's directory holds a run of another suite: its task fails (and is retried),
    # shard 1 still finishes and is kept.
    shard2.mkdir(parents=True)
    (shard2 / ROWS_FILE).write_text('{"point_id": "x"}\n')
    write_env(shard2, {"suite_fingerprint": "another suite", "shard": {"k": 2, "n": 2}})
    assert launch(suite_file, out, "--launcher", "ray", "--max-retries", "1") == 1
    text = capsys.readouterr().out
    assert "shard 2/2 failed after 1 retries" in text and "different suite file" in text
    assert "shard 1/2 finished" in text
    assert not (out / ROWS_FILE).exists()  # nothing merged while a shard is missing
    kept = (shard1 / ROWS_FILE).read_bytes()
    assert row_ids(shard1)

    # Rerun: only shard 2 runs; shard 1 is skipped untouched; the merged run is the suite.
    shutil.rmtree(shard2)
    assert launch(suite_file, out, "--launcher", "ray") == 0
    text = capsys.readouterr().out
    assert "(1 already done)" in text and "shard 1/2 finished" not in text
    assert (shard1 / ROWS_FILE).read_bytes() == kept
    merged = row_ids(out)
    assert len(merged) == 16 and set(merged) == suite_ids
    assert not set(row_ids(shard1)) & set(row_ids(shard2))
    assert load_env(shard2)["suite_path"] == str(suite_file)  # not the worker's scratch copy

    # A shard cut short resumes at point level: its finished rows are kept as they are.
    lines = (shard2 / ROWS_FILE).read_text().splitlines(keepends=True)
    (shard2 / ROWS_FILE).write_text("".join(lines[:-3]))
    assert launch(suite_file, out, "--launcher", "ray") == 0
    assert (shard2 / ROWS_FILE).read_text().startswith("".join(lines[:-3]))
    assert sorted(row_ids(shard2)) == sorted(json.loads(line)["point_id"] for line in lines)
    assert set(row_ids(out)) == suite_ids


def test_submitit_local_launcher_yields_the_suite_point_set(
    tmp_path: Path, suite_file: Path, suite_ids: set[str], capsys
) -> None:
    pytest.importorskip("submitit", reason="the dist extra (submitit) is not installed")
    out = tmp_path / "sweep"
    assert launch(suite_file, out, "--launcher", "slurm", "--slurm-local") == 0
    merged = row_ids(out)
    assert len(merged) == 16 and set(merged) == suite_ids
    assert "submitted 2 shard job(s)" in capsys.readouterr().out
    assert launch(suite_file, out, "--launcher", "slurm", "--slurm-local") == 0  # resume
    out_text = capsys.readouterr().out
    assert "(2 already done)" in out_text and "submitted" not in out_text


def test_slurm_without_sbatch_says_so(tmp_path: Path, suite_file: Path, capsys) -> None:
    pytest.importorskip("submitit", reason="the dist extra (submitit) is not installed")
    if shutil.which("sbatch"):
        pytest.skip("a real Slurm is installed here")
    assert launch(suite_file, tmp_path / "out", "--launcher", "slurm") == 2
    assert "--slurm-local" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--launcher", "ray", "--shard", "1/2"], "use one"),
        (["--launcher", "ray", "--shards", "0"], "needs --shards"),
        (["--launcher", "ray", "--max-retries", "-1"], "--max-retries"),
    ],
)
def test_bad_launcher_options_are_one_line_errors(
    tmp_path: Path, suite_file: Path, args: list[str], message: str, capsys
) -> None:
    argv = ["run", str(suite_file), "--out", str(tmp_path / "o"), *args]
    if "--shards" not in args:
        argv += ["--shards", "2"]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_launcher_never_overwrites_an_unsharded_run(tmp_path: Path, suite_file: Path, capsys):
    out = tmp_path / "plain"
    out.mkdir()
    (out / ROWS_FILE).write_text('{"point_id": "a"}\n')
    assert (
        main(["run", str(suite_file), "--out", str(out), "--launcher", "ray", "--shards", "2"]) == 2
    )
    assert "not a sharded sweep" in capsys.readouterr().err
    assert (out / ROWS_FILE).read_text() == '{"point_id": "a"}\n'
