"""``attnbench baseline save|find|list``: layout, lookup and refusal to overwrite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main
from harness.compare.baseline import find_baseline, list_baselines, machine_key, save_baseline, slug
from harness.results import (
    ENV_FILE,
    ROWS_FILE,
    SCHEMA_VERSION,
    ResultsError,
    RowWriter,
    load_rows,
    write_env,
)
from harness.scenarios.interface import Point

pytestmark = pytest.mark.usefixtures("calibrated_once")  # tests/conftest.py: the runs here test
# the command, not the device calibration

ENV = {
    "run_id": "r1",
    "suite": "smoke",
    "device": "cpu",
    "device_name": "AMD EPYC 9R14",
    "threads": 2,
    "torch": "2.13.0+cpu",
    "fingerprint": "cpu-amd-epyc-9r14-t2",
}


def make_run(path: Path, env: dict | None = None, n: int = 3) -> Path:
    writer = RowWriter(path)
    for seq_len in (128, 256, 512)[:n]:
        point = Point(impl="sdpa", seq_len=seq_len, heads=2, head_dim=16)
        writer.write(
            {
                **point.columns(),
                "suite": "smoke",
                "status": "ok",
                "time_samples_s": [1e-4, 1.1e-4],
                "time_median_s": 1.05e-4,
            }
        )
    if env is not None:
        write_env(path, env)
    return path


def cli(*args: object) -> int:
    return main(["baseline", *map(str, args)])


def test_save_writes_fingerprint_and_suite_dirs(tmp_path: Path, capsys) -> None:
    run, root = make_run(tmp_path / "run", ENV), tmp_path / "baselines"
    assert cli("save", run, "--root", root) == 0
    target = root / "cpu-amd-epyc-9r14-t2" / "smoke"
    assert capsys.readouterr().out.strip() == str(target)
    assert json.loads((target / ENV_FILE).read_text()) == {**ENV, "schema_version": SCHEMA_VERSION}
    assert load_rows(target)["point_id"].tolist() == load_rows(run)["point_id"].tolist()


def test_saved_baseline_compares_clean_with_its_run(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", ENV)
    target = save_baseline(run, tmp_path / "baselines")
    assert main(["compare", str(target), str(run)]) == 0


def test_save_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    root = tmp_path / "baselines"
    save_baseline(make_run(tmp_path / "a", ENV, n=2), root)
    newer = make_run(tmp_path / "b", ENV, n=3)
    assert cli("save", newer, "--root", root) == 2
    assert cli("save", newer, "--root", root, "--force") == 0
    assert len(load_rows(root / "cpu-amd-epyc-9r14-t2" / "smoke")) == 3


def test_save_skips_a_truncated_last_line(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", ENV)
    with (run / ROWS_FILE).open("a") as fh:
        fh.write('{"impl": "sdpa", "seq_l')  # killed mid-write
    with pytest.warns(UserWarning, match="truncated"):
        target = save_baseline(run, tmp_path / "baselines")
    assert len((target / ROWS_FILE).read_text().splitlines()) == 3


def test_save_without_env_exits_2(tmp_path: Path) -> None:
    assert cli("save", make_run(tmp_path / "run"), "--root", tmp_path / "b") == 2


def test_find_exact_and_closest(tmp_path: Path, capsys) -> None:
    root = tmp_path / "baselines"
    save_baseline(make_run(tmp_path / "a", ENV), root)
    other = {**ENV, "fingerprint": "cpu-intel-xeon-t2", "device_name": "Intel Xeon"}
    save_baseline(make_run(tmp_path / "b", other), root)
    gpu = {**ENV, "device": "cuda", "fingerprint": "cuda-h100", "device_name": "H100"}
    save_baseline(make_run(tmp_path / "c", gpu), root)
    assert find_baseline(ENV, "smoke", root) == (root / slug(ENV["fingerprint"]) / "smoke", True)
    # An unknown CPU falls back to a CPU baseline (never the GPU one), flagged as inexact.
    unknown = {**ENV, "fingerprint": "cpu-new-t2", "device_name": "Intel Xeon"}
    path, exact = find_baseline(unknown, "smoke", root)
    assert not exact and path == root / "cpu-intel-xeon-t2" / "smoke"
    run = make_run(tmp_path / "unknown", unknown)
    capsys.readouterr()
    assert cli("find", run, "--root", root) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(path) and "closest" in captured.err
    assert cli("find", run, "--root", root, "--exact") == 2
    with pytest.raises(ResultsError):
        find_baseline(ENV, "no-such-suite", root)
    assert {b.machine for b in list_baselines(root)} == {
        "cpu-amd-epyc-9r14-t2",
        "cpu-intel-xeon-t2",
        "cuda-h100",
    }


def test_machine_key_derived_when_absent() -> None:
    env = {k: v for k, v in ENV.items() if k != "fingerprint"}
    assert machine_key(env) == "cpu AMD EPYC 9R14 2threads torch2.13.0+cpu"
    assert slug(machine_key(env)) == "cpu-amd-epyc-9r14-2threads-torch2.13.0-cpu"
    assert len(slug("x" * 500)) <= 80 and slug("x" * 500) != slug("x" * 499)
    assert slug("../../etc") == "etc"
