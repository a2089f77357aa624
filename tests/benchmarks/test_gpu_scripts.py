"""The GPU scripts on a machine without a GPU: the proof refuses in one line (exit 2) and its
dry run lists every test it would run; ``gpu_sparse`` keeps going past an unsupported point,
compiles Flex as the registry does and runs the suite's BigBird layout; the workflow template
installs a current CUDA torch."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.sweep.suite import load_suite

ROOT = Path(__file__).resolve().parents[2]
PROOF = ROOT / "benchmarks" / "gpu_proof.sh"
needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU refusal")


def _proof(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": os.environ.get("PYTHON", sys.executable)}
    return subprocess.run(["bash", str(PROOF), *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=600)


@needs_no_gpu
def test_the_proof_without_a_gpu_exits_2_with_one_line(tmp_path):
    result = _proof(str(tmp_path / "out"))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_proof: no CUDA GPU here"), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "out").exists()  # nothing installed, nothing written


def test_the_proof_refuses_a_missing_out_dir_in_one_line():
    result = _proof()
    assert result.returncode == 2 and result.stderr.strip().startswith("usage:")


def test_the_proof_dry_run_lists_every_cuda_test_and_the_kernel_backward():
    result = _proof("--dry-run")
    assert result.returncode == 0, result.stderr
    listed = set(result.stdout.splitlines())
    cuda = {line.split(": ", 1)[1] for line in listed if line.startswith("cuda: ")}
    flex = {line.split(": ", 1)[1] for line in listed if line.startswith("flex: ")}
    assert any(t.startswith("tests/cuda/test_cuda.py::") for t in cuda)
    kernel_tests = "tests/implementations/_kernels/test_triton_kernels.py::"
    kernels = {t for t in cuda if t.startswith(kernel_tests)}
    assert any("test_gradients_fp32" in t for t in kernels)  # the Triton backward
    assert any("test_forward_fp32" in t for t in kernels)
    assert any("test_split_kv_decode" in t for t in kernels)
    timing, nvml = "tests/harness/measure/test_timing.py::", "tests/harness/measure/test_nvml.py::"
    assert f"{timing}test_cuda_flush_per_call_times_one_call_per_event_pair" in cuda
    assert f"{nvml}test_cuda_clock_columns_come_from_nvml_or_say_why" in cuda
    assert any(t.startswith("tests/implementations/test_flex.py::") for t in flex)
    # every test that skips itself without CUDA is in the proof
    marked = _tests_skipping_without_cuda()
    assert marked and marked <= cuda | flex, sorted(marked - cuda - flex)


def test_the_proof_runs_its_tests_where_pytest_benchmark_is_missing(tmp_path):
    """pyproject's addopts carry ``--benchmark-disable``; a GPU machine's Python without
    pytest-benchmark would reject it (exit 4, nothing run) unless the proof replaces them."""
    shadow = tmp_path / "shadow" / "pytest_benchmark"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('not installed here')\n")
    env = {**os.environ, "PYTHON": os.environ.get("PYTHON", sys.executable),
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
           "PYTHONPATH": os.pathsep.join([str(shadow.parent), str(ROOT)])}
    result = subprocess.run(["bash", str(PROOF), "--dry-run"], capture_output=True, text=True,
                            env=env, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert any(line.startswith("cuda: tests/implementations/_kernels/test_triton_kernels.py::")
               for line in result.stdout.splitlines())


def _tests_skipping_without_cuda() -> set[str]:
    """Test ids of the functions decorated to skip without CUDA, found by reading the files."""
    found = set()
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        text = path.read_text()
        rel = path.relative_to(ROOT).as_posix()
        for match in re.finditer(
            r"skipif\(not torch\.cuda\.is_available\(\)[^\n]*\n(?:@[^\n]*\n)*def (test_\w+)", text
        ):
            found.add(f"{rel}::{match.group(1)}")
    return found


def _gpu_sparse():
    spec = importlib.util.spec_from_file_location("gpu_sparse", ROOT / "benchmarks/gpu_sparse.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_sparse_keeps_going_past_an_unsupported_flash_point(monkeypatch):
    gpu_sparse = _gpu_sparse()

    def unsupported(name, mask, n, d, backward=False):
        raise RuntimeError("head_dim 128 not supported here")

    def timed(label, n, d, mask, fn, backward=False):
        return {"case": label, "n": n, "head_dim": d, "ms": 1.0, "tflops_useful": 100.0,
                "agree": True, "status": "ok"}

    monkeypatch.setattr(gpu_sparse, "registry_fn", unsupported)
    monkeypatch.setattr(gpu_sparse, "row", timed)
    monkeypatch.setattr(gpu_sparse, "print", lambda *a, **k: None, raising=False)
    rows = gpu_sparse.flash_table([4096])
    assert len(rows) == 16
    ours = [r for r in rows if r["case"] == "flash-tiled"]
    assert len(ours) == 8 and all(r["status"].startswith("skipped: head_dim 128") for r in ours)
    assert all(r["status"] == "ok" for r in rows if r["case"] == "sdpa-flash")


def test_gpu_sparse_compiles_plain_flex_without_dynamic_shapes(monkeypatch):
    from torch.nn.attention import flex_attention as flex_module

    gpu_sparse = _gpu_sparse()
    seen = {}
    monkeypatch.setattr(flex_module, "create_block_mask", lambda *a, **k: "block mask")
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.update(kw) or fn)
    gpu_sparse.plain_flex(256)
    assert seen.get("dynamic") is False


def test_gpu_sparse_runs_the_suites_bigbird_layout():
    gpu_sparse = _gpu_sparse()
    suite = load_suite(ROOT / "suites/sparse-gpu.toml")
    masks = {p.mask for p in suite.points if p.impl in ("bigbird", "flex-blocksparse")}
    assert masks == {gpu_sparse.SPARSE["bigbird"][1]} == {gpu_sparse.SPARSE["flex-blocksparse"][1]}


def test_the_workflow_installs_a_current_cuda_torch():
    """The cu118/cu121/cu124 indexes stop at torch 2.6 or older."""
    text = (ROOT / ".github/workflows/gpu-benchmark.yml").read_text()
    installs = [line for line in text.splitlines() if re.search(r"pip install .*torch", line)]
    assert len(installs) == 2
    assert not re.search(r"whl/cu1(1\d|2[0-4])\b", text)
    assert all('"torch>=2.7"' in line for line in installs)
