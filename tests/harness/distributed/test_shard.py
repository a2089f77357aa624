"""``attnbench run --shard K/N``: a deterministic, cost-balanced partition of a suite's points,
each shard a normal run directory; shards 1/2 and 2/2 merge back into the whole suite."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from harness.cli import main
from harness.distributed.shard import (
    LATER_PASS_S,
    LATER_UNTIMED_CALLS,
    MIN_TIMED_CALLS,
    NOMINAL_FLOPS,
    POINT_OVERHEAD_S,
    UNTIMED_CALLS,
    ShardSpec,
    parse_shard,
    partition,
    predicted_seconds,
    select_shard,
)
from harness.results import ENV_FILE, iter_rows, load_env
from harness.scenarios.interface import Point, cost_of
from harness.sweep.suite import load_suite

pytestmark = pytest.mark.usefixtures("calibrated_once")  # tests/conftest.py: the runs here test
# the command, not the device calibration

# 48 points: 12 tiny sdpa points are measured; the other 36 are outside their implementation's
# declared capabilities on CPU and become "skipped" rows at once (real rows, fast tests). One
# timing pass: shards split, run, resume and merge points; how passes combine is tested apart.
SUITE_48 = """
name = "shard-48"
scenario = "attention"
implementations = ["sdpa", "xformers", "flash-attn", "sdpa-efficient"]
device = "cpu"
[fixed]
batch = 1
head_dim = 16
dtype = "float32"
[sweep]
seq_len = [32, 64, 128]
causal = [false, true]
heads = [1, 2]
[measure]
budget_s = 0.02
min_samples = 3
check = "full"
passes = 1
"""
# The same points written in another order (implementations and sweep values reversed).
SUITE_48_REORDERED = (
    SUITE_48.replace(
        '["sdpa", "xformers", "flash-attn", "sdpa-efficient"]',
        '["sdpa-efficient", "flash-attn", "xformers", "sdpa"]',
    )
    .replace("[32, 64, 128]", "[128, 64, 32]")
    .replace("[false, true]", "[true, false]")
    .replace("[1, 2]", "[2, 1]")
)


def write_suite(path: Path, text: str = SUITE_48) -> Path:
    path.write_text(text)
    return path


def ids(points) -> set[str]:
    return {p.point_id for p in points}


def row_ids(run_dir: Path) -> list[str]:
    return [row["point_id"] for row in iter_rows(run_dir / "rows.jsonl")]


def run_cli(*args: object) -> int:
    return main(["run", *map(str, args), "--no-progress", "--no-table"])


@pytest.fixture(scope="module")
def suite_file(tmp_path_factory) -> Path:
    return write_suite(tmp_path_factory.mktemp("suite") / "shard-48.toml")


@pytest.fixture(scope="module")
def shard_dirs(tmp_path_factory, suite_file) -> tuple[Path, Path]:
    """Shards 1/2 and 2/2 of the 48-point suite, each run by ``attnbench run --shard``."""
    threads = torch.get_num_threads()
    root = tmp_path_factory.mktemp("shards")
    try:
        for k in (1, 2):
            assert run_cli(suite_file, "--shard", f"{k}/2", "--out", root / f"s{k}") == 0
    finally:
        torch.set_num_threads(threads)
    return root / "s1", root / "s2"


# --- the partition (pure) ------------------------------------------------------------------


def test_suite_has_48_points(suite_file: Path) -> None:
    assert len(load_suite(suite_file).points) == 48


@pytest.mark.parametrize("n", [1, 2, 3, 5, 48, 50])
def test_shards_are_disjoint_and_cover_the_suite(suite_file: Path, n: int) -> None:
    points = load_suite(suite_file).points
    shards = partition(points, n)
    assert len(shards) == n
    assert sum(len(s) for s in shards) == len(points)
    assert set().union(*(ids(s) for s in shards)) == ids(points)
    assert [select_shard(points, k, n) for k in range(1, n + 1)] == shards


def test_partition_is_stable_under_reordering_of_the_suite_file(tmp_path: Path) -> None:
    a = load_suite(write_suite(tmp_path / "a.toml")).points
    b = load_suite(write_suite(tmp_path / "b.toml", SUITE_48_REORDERED)).points
    assert [p.point_id for p in a] != [p.point_id for p in b]  # really another order
    for n in (2, 3, 7):
        assert [ids(s) for s in partition(a, n)] == [ids(s) for s in partition(b, n)]


def test_partition_balances_predicted_time_not_count() -> None:
    # One point at n=8192 costs more than the twenty small ones together.
    points = [Point("sdpa", seq_len=8192)]
    points += [Point.of("sdpa", seq_len=64, seed=s) for s in range(20)]
    shards = partition(points, 2)
    loads = [sum(predicted_seconds(p) for p in s) for s in shards]
    assert sorted(len(s) for s in shards) == [1, 20]
    assert abs(loads[0] - loads[1]) <= max(predicted_seconds(p) for p in points)
    # LPT's guarantee on a mixed sweep: no shard exceeds the mean by more than one point.
    sweep = [
        Point.of(impl, seq_len=n, causal=c)
        for impl in ("sdpa", "full", "flash-tiled")
        for n in (128, 512, 1024, 2048, 4096)
        for c in (False, True)
    ]
    for n in (2, 3, 4):
        loads = [sum(predicted_seconds(p) for p in s) for s in partition(sweep, n)]
        biggest = max(predicted_seconds(p) for p in sweep)
        assert max(loads) - sum(loads) / n <= biggest


def test_declared_unsupported_points_cost_almost_nothing() -> None:
    assert predicted_seconds(Point("xformers", seq_len=4096)) < 0.1
    assert predicted_seconds(Point("sdpa", seq_len=4096)) > predicted_seconds(Point("sdpa"))


@pytest.mark.parametrize(
    "point",
    [
        Point.of("full", seq_len=4096, causal=True),
        Point.of("bigbird", seq_len=4096, block_size=64, window_left=1, window_right=1,
              global_tokens=64, random_blocks=2),
        Point.of("sdpa", "block+backward", seq_len=2048),
        Point.of("sdpa", "decode", seq_len=4096, causal=True, cache="none", gen_tokens=4),
    ],
    ids=["causal", "bigbird", "block", "decode"],
)
def test_the_planner_prices_a_point_by_its_scenarios_planned_flops(point: Point) -> None:
    """One FLOP model: the planner's call time is the scenario's predicted FLOPs (a decode
    point's prefill and generated steps included) at the nominal rate."""
    cost = cost_of(point)
    call_s = cost.predicted_flops / NOMINAL_FLOPS["cpu"]
    timed = max(min(60.0, 50 * call_s), MIN_TIMED_CALLS * call_s)
    expected = POINT_OVERHEAD_S + UNTIMED_CALLS * call_s + timed
    assert predicted_seconds(point, 60.0) == pytest.approx(expected, rel=1e-12)
    # a later pass times only: no fixed checks, one warm-up call
    later = LATER_PASS_S + LATER_UNTIMED_CALLS * call_s + timed
    assert predicted_seconds(point, 60.0, first=False) == pytest.approx(later, rel=1e-12)
    assert cost.predicted_flops >= cost.executed_flops > 0


def test_a_decode_point_plans_its_prefill_and_every_generated_step() -> None:
    point = Point.of("sdpa", "decode", seq_len=512, causal=True, gen_tokens=4)
    cost = cost_of(point)
    prefill = cost_of(point).predicted_flops - 4 * cost.executed_flops
    # the prefill: every layer's dense layers over 512 tokens plus 512·513/2 causal pairs
    layers, d, heads, head_dim = 2, 512, 8, 64
    per_token = 2 * d * (4 * d) + 2 * d * 4 * d * 2  # W_Q/K/V/O + gelu FFN
    pairs = 512 * 513 // 2
    assert prefill == pytest.approx(layers * (per_token * 512 + 4 * heads * head_dim * pairs))


@pytest.mark.parametrize("text", ["0/2", "3/2", "a/b", "2", "1/0"])
def test_parse_shard_rejects_bad_specs(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_shard(text)


def test_parse_shard() -> None:
    assert parse_shard(" 2/4 ") == ShardSpec(2, 4)
    assert ShardSpec(2, 4).dirname == "shard-2-of-4"


# --- shards as run directories ---------------------------------------------------------------


def test_shards_1_and_2_of_2_are_disjoint_and_merge_into_the_whole_suite(
    tmp_path: Path, suite_file: Path, shard_dirs: tuple[Path, Path]
) -> None:
    s1, s2 = shard_dirs
    one, two = row_ids(s1), row_ids(s2)
    assert one and two and not set(one) & set(two)
    suite_ids = ids(load_suite(suite_file).points)
    assert len(one) + len(two) == 48
    assert main(["merge", str(s1), str(s2), "--out", str(tmp_path / "merged")]) == 0
    merged = row_ids(tmp_path / "merged")
    assert len(merged) == 48 and set(merged) == suite_ids
    statuses = {r["status"] for r in iter_rows(tmp_path / "merged" / "rows.jsonl")}
    assert statuses == {"ok", "skipped"}  # real measurements and real skips


def test_shard_env_records_the_shard_and_the_suite(suite_file: Path, shard_dirs) -> None:
    suite = load_suite(suite_file)
    for k, run_dir in enumerate(shard_dirs, 1):
        env = load_env(run_dir)
        assert (env["shard"]["k"], env["shard"]["n"]) == (k, 2)
        assert set(env["shard"]["point_ids"]) == set(row_ids(run_dir))
        assert env["shard"]["point_ids"] == [
            p.point_id for p in select_shard(suite.points, k, 2, 0.02)
        ]
        assert env["shard"]["suite_point_ids"] == sorted(ids(suite.points))
        assert env["suite_fingerprint"] == suite.sha256


def test_a_missing_shard_is_reported_by_merge(tmp_path: Path, shard_dirs, capsys) -> None:
    s1, _ = shard_dirs
    assert main(["merge", str(s1), "--out", str(tmp_path / "merged")]) == 1
    err = capsys.readouterr().err
    assert "missing shard(s): 2/2" in err
    assert f"{48 - len(row_ids(s1))} point(s) missing" in err
    merge = json.loads((tmp_path / "merged" / ENV_FILE).read_text())["merge"]
    assert merge["missing_shards"] == ["2/2"] and len(merge["missing_points"]) == 48 - len(
        row_ids(s1)
    )


def test_resuming_a_shard_directory_as_another_shard_is_refused(
    tmp_path: Path, suite_file: Path, shard_dirs, capsys
) -> None:
    import shutil

    copy = tmp_path / "s1"
    shutil.copytree(shard_dirs[0], copy)
    assert run_cli(suite_file, "--shard", "2/2", "--out", copy, "--resume") == 2
    assert "holds shard 1/2" in capsys.readouterr().err
    assert run_cli(suite_file, "--out", copy, "--resume") == 2  # the whole suite into a shard
    before = (copy / "rows.jsonl").read_bytes()
    assert run_cli(suite_file, "--shard", "1/2", "--out", copy, "--resume") == 0  # all done
    assert (copy / "rows.jsonl").read_bytes() == before


def test_shards_without_a_launcher_is_an_error(tmp_path: Path, suite_file: Path, capsys) -> None:
    assert run_cli(suite_file, "--shards", "2", "--out", tmp_path / "o") == 2
    assert "--launcher" in capsys.readouterr().err and not (tmp_path / "o").exists()
