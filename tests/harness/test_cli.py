"""The command line as a user meets it: list, run, table."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
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


# --- papercuts: fast help, one-line usage errors, quiet pipes, strict JSON -------------------


def test_help_imports_nothing_heavy_and_is_fast():
    code = (
        "import sys, time, contextlib, io\n"
        "t = time.perf_counter()\n"
        "from harness.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    try:\n"
        "        main(['--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print(round(time.perf_counter() - t, 3), 'table' in out.getvalue(),\n"
        "      sorted(m for m in ('torch', 'matplotlib', 'pandas', 'numpy') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    seconds, listed, heavy = result.stdout.split(" ", 2)
    assert listed == "True" and heavy.strip() == "[]", result.stdout
    assert float(seconds) < 1.0


def test_subcommand_help_loads_only_its_module():
    from harness.cli import build_parser

    code = (
        "import sys\nfrom harness.cli import build_parser\n"
        "try:\n    build_parser('table').parse_args(['table', '--help'])\n"
        "except SystemExit:\n    pass\n"
        "print('torch' in sys.modules, 'matplotlib' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip().endswith("False False"), result.stdout
    for name in ("table", "report", "compare", "baseline", "claims", "maxlen", "merge", "run"):
        assert name in build_parser(name)._subparsers._group_actions[0].choices


def test_usage_errors_have_one_prefix(capsys):
    from harness.cli import main

    assert main(["table"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnbench: table: ") and "attnbench: attnbench" not in err
    assert len(err.splitlines()) == 1 and "RUN_DIR" in err


def test_resume_without_out_is_a_usage_error(capsys):
    from harness.cli import main

    assert main(["run", "--resume", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--resume needs --out" in err


def _small_run(path: Path, suite: str, impls=("sdpa", "full")) -> Path:
    from harness.results import RowWriter, write_env
    from harness.scenarios.interface import Point

    writer = RowWriter(path)
    for impl in impls:
        for n in (64, 128):
            writer.write({**Point(impl, seq_len=n).columns(), "run_id": path.name,
                          "suite": suite, "status": "ok", "time_median_s": 1e-3 * n,
                          "peak_mem_bytes": 1024.0 * n, "max_abs_err": float("nan")})
    write_env(path, {"run_id": path.name, "suite": suite})
    return path


def test_table_into_a_closed_pipe_exits_quietly(tmp_path, monkeypatch, capsys):
    from harness.cli import main

    run = _small_run(tmp_path / "run", "tiny")

    class ClosedPipe(io.StringIO):
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def fileno(self):
            raise io.UnsupportedOperation("no fd")

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert main(["table", str(run)]) == 141
    assert capsys.readouterr().err == ""


def test_table_formats_baseline_and_metrics_from_the_cli(tmp_path, capsys):
    from harness.cli import main

    run = _small_run(tmp_path / "run", "tiny")
    assert main(["table", str(run), "--format", "csv", "--baseline", "sdpa",
                 "--metric", "rel_err", "--metric", "time_median_s"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("impl,seq_len,status") and "speedup_vs_sdpa" in lines[0]
    assert len(lines) == 5
    assert main(["table", str(run), "--baseline", "nope"]) == 2
    assert "--baseline nope" in capsys.readouterr().err


def test_compare_of_two_suites_is_a_usage_error(tmp_path, capsys):
    from harness.cli import main

    a = _small_run(tmp_path / "a", "smoke")
    b = _small_run(tmp_path / "b", "sparse-cpu", impls=("local",))
    assert main(["compare", str(a), str(b)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'smoke'" in err and "'sparse-cpu'" in err


def test_claims_json_is_strict_json_with_nan_rows(tmp_path):
    run = _small_run(tmp_path / "run", "tiny")
    result = cli("claims", str(run), "--json")
    assert result.returncode == 0, result.stderr
    verdicts = json.loads(result.stdout, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    assert verdicts and all(v["verdict"] in {"confirmed", "refuted", "inconclusive"}
                            for v in verdicts)


def test_json_guard_turns_nan_into_null():
    import numpy as np

    from harness.results import dumps_json

    text = dumps_json({"a": float("nan"), "b": [np.float64("inf"), 1.5], "c": np.int64(3)})
    assert json.loads(text) == {"a": None, "b": [None, 1.5], "c": 3}


def test_maxlen_says_up_front_how_long_verification_takes():
    from harness.execute.maxlen import verification_notice
    from harness.scenarios.interface import Point

    slow = verification_notice(Point("sdpa"), 256 * 2**20, 64, 120.0)
    fast = verification_notice(Point("full", causal=True), 256 * 2**20, 64, 120.0)
    assert "isolated runs" in slow and "min in all" in slow and "--no-verify" in slow
    assert "--no-verify" not in fast
