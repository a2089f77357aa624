"""The command line as a user meets it: list, run, table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from harness import registry
from harness.masks import MaskSpec
from harness.results import load_env, load_rows
from tests.conftest import CORE_IMPLEMENTATIONS

TINY = """
name = "tiny"
scenario = "attention"
implementations = ["full", "sdpa", "flash-tiled", "xformers"]
[fixed]
heads = 2
head_dim = 16
causal = true
[sweep]
seq_len = [33, 64]
[measure]
budget_s = 0.02
min_samples = 3
"""


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


def _tiny_call_works(name: str) -> bool:
    """This test's own verdict: does one tiny real call of ``name`` run on this machine's
    preferred declared device? (Independent of the registry's cached probe.)"""
    impl = registry.get(name)
    kinds = ["cuda", "cpu"] if torch.cuda.is_available() else ["cpu"]
    kind = next((d for d in kinds if d in impl.caps.devices), None)
    if kind is None:
        return False
    dtype = torch.float16 if kind == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 16, 64, generator=gen).to(kind, dtype) for _ in range(3))
    try:
        return bool(torch.isfinite(impl.fn(q, k, v, MaskSpec(causal=True))).all())
    except Exception:  # any failure of the real call means unavailable
        return False


def test_list_shows_every_implementation_with_availability():
    result = cli("list", "--json")
    assert result.returncode == 0, result.stderr
    listed = {d["name"]: d for d in json.loads(result.stdout)}
    assert set(CORE_IMPLEMENTATIONS) <= set(listed)
    assert listed["sdpa"]["available"] is True
    # optional backends: availability is what a real call says, on CPU and CUDA machines alike
    for name in ("xformers", "flash-attn", "sdpa-efficient", "sdpa-cudnn", "sdpa-flash"):
        assert listed[name]["available"] is _tiny_call_works(name), listed[name]
        if not listed[name]["available"]:
            assert listed[name]["status"].startswith("unavailable: "), listed[name]
            reason = registry.get(name).unavailable_reason()
            assert listed[name]["status"] == f"unavailable: {reason}"


def test_run_writes_rows_env_and_prints_a_table(tmp_path):
    suite = tmp_path / "tiny.toml"
    suite.write_text(TINY)
    out = tmp_path / "run"
    result = cli("run", str(suite), "--out", str(out), "--no-progress")
    assert result.returncode == 0, result.stderr
    rows = load_rows(out)
    assert len(rows) == 8
    assert set(rows["status"]) == {"ok", "skipped"}
    assert rows.loc[rows["status"] == "ok", "agree"].all()
    env = load_env(out)
    assert env["calibration"]["matmul_flops_per_s"] > 0 and env["threads"] >= 1
    assert "median time (ms)" in result.stdout and "flash-tiled" in result.stdout
    table = cli("table", str(out))
    assert table.returncode == 0 and "peak memory (MiB)" in table.stdout


def test_run_refuses_to_overwrite_a_finished_run(tmp_path):
    suite = tmp_path / "tiny.toml"
    suite.write_text(TINY.replace('["full", "sdpa", "flash-tiled", "xformers"]', '["sdpa"]'))
    out = tmp_path / "run"
    assert cli("run", str(suite), "--out", str(out), "--no-progress", "--no-table").returncode == 0
    again = cli("run", str(suite), "--out", str(out), "--no-progress")
    assert again.returncode == 2 and "--resume" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1


def test_table_of_a_missing_directory_is_one_line(tmp_path):
    result = cli("table", str(tmp_path / "nope"))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
