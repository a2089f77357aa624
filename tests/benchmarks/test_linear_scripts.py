"""The linear family's scripts on the CPU: ``linear_targets.py --dry-run`` runs the GPU script's
code at tiny sizes and writes every row; without a GPU and without ``--dry-run`` it refuses in
one line (exit 2); ``linear_launches.py`` counts the same ops per call at two lengths with one
segment."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ROOT / "benchmarks" / "linear_targets.py"
LAUNCHES = ROOT / "benchmarks" / "linear_launches.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)


def test_the_targets_dry_run_measures_every_row(tmp_path):
    out = tmp_path / "targets.json"
    result = run(str(TARGETS), str(out), "--dry-run")
    assert result.returncode == 0, result.stderr[-2000:]
    payload = json.loads(out.read_text())
    rows = {(r["row"], r["n"]): r for r in payload["rows"]}
    assert {n for _, n in rows} == {512, 1024}
    for name in ("linear", "linear-causal", "performer", "linformer", "sdpa-flash", "nystrom"):
        for n in (512, 1024):
            row = rows[(name, n)]
            assert row["ms"] > 0 and row["aten_ops"] > 0 and row["host_frac"] > 0, row
            assert row["device_ms"] > 0 and row["reps"] >= 3, row
    # one segment on this path too: the same ops at both lengths
    for name in ("linear", "linear-causal", "performer", "linformer"):
        assert rows[(name, 512)]["aten_ops"] == rows[(name, 1024)]["aten_ops"], name
    # both paths of the non-causal rows, each row saying which ran (the CPU: PyTorch)
    for name in ("linear", "linear-torch", "performer", "performer-torch"):
        assert rows[(name, 1024)]["path"] == "torch", name
    assert rows[("linear-torch", 1024)]["fused"] == 0
    assert [r["row"] for r in payload["rows"]][-2:] == ["fla-linear", "fla-linear"]  # last
    fla = rows[("fla-linear", 1024)]
    assert "ms" in fla or "skipped" in fla or "error" in fla
    targets = {t["target"]: t for t in payload["targets"]}
    assert len(targets) == 7 and all(t["met"] is None for t in targets.values())
    chunk = rows[("linear-causal-chunk", 1024)]  # the candidate: the interpreter's, or why not
    assert chunk["fused"] == 1 and ("ms" in chunk or "fused = 1" in chunk["skipped"]), chunk
    assert "| linear-causal | 1024 |" in result.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU refusal")
def test_the_targets_without_a_gpu_refuse_in_one_line(tmp_path):
    out = tmp_path / "targets.json"
    result = run(str(TARGETS), str(out))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("linear_targets: no CUDA device"), result.stderr
    assert not out.exists()


def test_the_launch_counts_do_not_grow_with_n_for_one_segment(tmp_path):
    out = tmp_path / "launches.json"
    result = run(str(LAUNCHES), "--lengths", "512", "1024", "--no-time", "--old-ref", "",
                 "--json", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads(out.read_text())["launches"]
    one = [r for r in rows if r["variant"] == "new, one segment"]
    assert len(one) == 6
    for r in one:
        assert r["ops"]["512"] == r["ops"]["1024"] > 0, r
    assert "Launches per call" in result.stdout
    fused = {(r["impl"], r["causal"]): r for r in json.loads(out.read_text())["fused"]}
    for key, launches in ((("linear", False), 3), (("linear", True), 3),
                          (("performer", False), 3), (("performer", True), 3),
                          (("nystrom", False), 4)):
        counts = fused[key]["launches"]
        assert fused[key]["why"] is None and counts["512"] == counts["1024"], fused[key]
        assert counts["512"][0] == launches, fused[key]  # Triton launches
    assert fused[("linformer", False)]["why"].startswith("no fused path")
