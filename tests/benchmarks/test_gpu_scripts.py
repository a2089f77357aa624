"""The lease's proof (lease/proof.sh) on a machine without a GPU: it refuses in one
line (exit 2), its dry run lists every test it would run, its schedule gives the verdicts the
budget first, a stand-in Python runs every step in order, and the summary reads what a proof
leaves, finished or cut short; the workflow template installs a current CUDA torch."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.cli import main

ROOT = Path(__file__).resolve().parents[2]
PROOF = ROOT / "lease" / "proof.sh"
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
    assert len(lines) == 1 and lines[0].startswith("proof: no CUDA GPU here"), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "out").exists()  # nothing installed, nothing written


def test_the_proof_refuses_a_missing_out_dir_in_one_line():
    result = _proof()
    assert result.returncode == 2 and result.stderr.strip().startswith("usage:")


@pytest.mark.parametrize("args, says", [
    (("out", "--minutes", "six"), "--minutes six: not a number of minutes"),
    (("out", "--schedule-json"), "--schedule-json goes with --dry-run"),
])
def test_the_proof_refuses_bad_options_in_one_line_before_any_work(tmp_path, args, says):
    result = _proof(*(str(tmp_path / a) if a == "out" else a for a in args))
    assert result.returncode == 2 and result.stderr.strip() == f"proof: {says}"
    assert not (tmp_path / "out").exists()


def test_the_proof_dry_run_lists_every_cuda_test_even_without_pytest_benchmark(tmp_path):
    """Every test that needs CUDA is in one of the proof's selections (the Triton backward
    included). pyproject's addopts carry ``--benchmark-disable``; a GPU machine's Python without
    pytest-benchmark would reject it (exit 4, nothing run) unless the proof replaces them: the
    dry run here has the plugin shadowed."""
    shadow = tmp_path / "shadow" / "pytest_benchmark"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('not installed here')\n")
    # --assert=plain: the proof's collections skip rewriting the asserts of ~200 test modules
    # (half their time here, where PYTHONDONTWRITEBYTECODE keeps nothing between runs);
    # which tests are collected does not depend on it
    env = {**os.environ, "PYTHON": os.environ.get("PYTHON", sys.executable),
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTEST_ADDOPTS": "--assert=plain",
           "PYTHONPATH": os.pathsep.join([str(shadow.parent), str(ROOT)])}
    result = subprocess.run(["bash", str(PROOF), "--dry-run"], capture_output=True, text=True,
                            env=env, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    listed = [line.split(": ", 1) for line in result.stdout.splitlines()]
    cuda = {test for selection, test in listed if selection in ("cuda", "cuda-alone")}
    assert any(t.startswith("tests/cuda/test_cuda.py::") for t in cuda)
    kernel_tests = "tests/implementations/_kernels/triton/test_masked_attention.py::"
    kernels = {t for t in cuda if t.startswith(kernel_tests)}
    assert any("test_gradients_fp32" in t for t in kernels)  # the Triton backward
    assert any("test_forward_fp32" in t for t in kernels)
    assert any("test_split_kv_decode" in t for t in kernels)
    timing, nvml = "tests/harness/measure/test_timing.py::", "tests/harness/measure/test_nvml.py::"
    assert f"{timing}test_cuda_flush_per_call_times_one_call_per_event_pair" in cuda
    assert f"{nvml}test_cuda_clock_columns_come_from_nvml_or_say_why" in cuda
    assert {selection for selection, _ in listed} == {"cuda", "cuda-alone"}  # no CPU files
    # every test that skips itself without CUDA is in the proof
    marked = _tests_skipping_without_cuda()
    functions = {test.split("[", 1)[0] for test in cuda}  # a parametrized test by its function
    assert marked and marked <= functions, sorted(marked - functions)


def test_the_proof_says_why_the_python_it_found_cannot_run_it(tmp_path):
    """A fresh clone with the venv not activated: the proof finds README's .venv, else python3,
    and when that one cannot import torch it says so, instead of 'collecting failed'."""
    bench = tmp_path / "clone" / "lease"
    bench.mkdir(parents=True)
    (bench / "proof.sh").write_text(PROOF.read_text())
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n")
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    env["PATH"] = f"{fake.parent}{os.pathsep}{env['PATH']}"
    result = subprocess.run(["bash", str(bench / "proof.sh"), "--dry-run"],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "No module named 'torch'" in line and str(fake) in line and ".venv" in line




KINDS = ("setup", "verdicts", "tests", "kernels")  # the order the steps run in


def _schedule(minutes: str, python: str | None = None) -> list[dict]:
    env = {**os.environ, "PYTHON": python or os.environ.get("PYTHON", sys.executable)}
    result = subprocess.run(["bash", str(PROOF), "--dry-run", "--minutes", minutes,
                             "--schedule-json"], capture_output=True, text=True, env=env, cwd=ROOT,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _schedule_problems(schedule: list[dict], minutes: float) -> list[str]:
    """What is wrong with a schedule against issue 37's targets, in words (none: it holds)."""
    budget = minutes * 60
    problems = []
    if any(set(step) != {"step", "kind", "cap_s"} for step in schedule):
        problems.append("a step is not {step, kind, cap_s}")
    kinds = [step["kind"] for step in schedule]
    if [k for k in KINDS if k in kinds] != list(KINDS) or kinds != sorted(kinds, key=KINDS.index):
        problems.append(f"order {kinds}: not setup, verdicts, tests, kernels")
    caps = {kind: sum(s["cap_s"] for s in schedule if s["kind"] == kind) for kind in KINDS}
    if any(not isinstance(s["cap_s"], int) or s["cap_s"] < 0 for s in schedule):
        problems.append("a cap is not a whole number of seconds >= 0")
    if sum(caps.values()) > budget:
        problems.append(f"caps sum to {sum(caps.values())} s, over the {budget:g} s budget")
    if caps["verdicts"] < 0.6 * budget:
        problems.append(f"verdicts {caps['verdicts']} s: under 60% of {budget:g} s")
    if caps["tests"] > 90:
        problems.append(f"tests {caps['tests']} s: over 90 s")
    return problems


@pytest.mark.parametrize("minutes", ["10", "4", "7.5", "30"])
def test_the_schedule_measures_first_within_the_budget(minutes):
    schedule = _schedule(minutes)
    assert _schedule_problems(schedule, float(minutes)) == []
    assert [s["step"] for s in schedule[:2]] == ["setup", "verdicts"]  # the claims first


def test_the_schedule_check_fails_a_schedule_out_of_order_over_budget_or_short_of_measuring():
    good = _schedule("10")
    assert _schedule_problems(good, 10) == []
    swapped = [good[0], good[-1], *good[1:-1]]  # the kernel sweep before the measurements
    assert any("order" in p for p in _schedule_problems(swapped, 10))
    heavy = [{**s, "cap_s": s["cap_s"] * 2} if s["kind"] == "tests" else s for s in good]
    assert any("over the 600 s budget" in p or "over 90 s" in p
               for p in _schedule_problems(heavy, 10))
    short = [{**s, "cap_s": s["cap_s"] // 2} if s["kind"] == "verdicts" else s for s in good]
    assert any("under 60%" in p for p in _schedule_problems(short, 10))


def test_the_schedule_needs_no_torch(tmp_path):
    """The schedule is checked where nothing is installed: a Python that cannot import torch."""
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\necho \"No module named 'torch'\" >&2\nexit 1\n")
    fake.chmod(0o755)
    assert _schedule_problems(_schedule("10", python=str(fake)), 10) == []


# A Python that stands in for the GPU machine's: it logs every call (with the variables the
# proof exports), answers the proof's questions (a GPU among them), writes what each step would
# leave, and hands the summary to the real Python.
FAKE_PYTHON = r"""#!/usr/bin/env bash
echo "$* | cache=$TRITON_CACHE_DIR cap=${STEP_CAP:-} misses=${ATTNBENCH_TRITON_MISSES:-}" >>"$LOG"
arg() { local want=$1; shift; while [ $# -gt 1 ]; do [ "$1" = "$want" ] && echo "$2"; shift; done; }
case "$*" in
  "-m harness.cli verdicts "*)
    out=$(arg --out "$@"); mkdir -p "$out/claims-gpu"
    echo '{"impl": "full", "scenario": "attention", "seq_len": 512, "status": "ok"}' \
      >"$out/claims-gpu/rows.jsonl"; echo '{}' >"$out/claims-gpu/env.json"
    echo '[{"claim": "attention-time-n2", "verdict": "confirmed"}]' >"$out/verdicts.json"
    echo "| claim | verdict |" >"$out/verdicts.md"; mkdir -p "$out/report"
    touch "$out/report/index.html"; exit 0 ;;
  "-m pytest"*)
    for a in "$@"; do case "$a" in --junitxml=*) xml=${a#--junitxml=} ;; esac; done
    echo '<testsuite tests="1" failures="0" errors="0" skipped="0" time="1"/>' >"$xml"; exit 0 ;;
  *"/lease/warm_cache.py --harvest "*) touch "$3"; exit 0 ;;
  *"/lease/summary.py "*) shift
    exec "$REAL_PYTHON" "$REAL_ROOT/lease/summary.py" "$@" ;;
  -) code=$(cat)
    case "$code" in
      *proof-facts*) echo "proof-facts 1 1 1 1 fake" ;;  # benchmark, xdist >= 3.2, a GPU
      *get_device_name*) echo "torch fake" ;;
    esac
    exit 0 ;;
  *) exit 0 ;;
esac
"""


def test_the_proof_measures_first_and_returns_what_a_reader_opens(tmp_path):
    """The whole proof with a stand-in Python (no GPU): the steps run in the schedule's order
    (setup, `attnbench verdicts --device cuda` at its cap, the tests, the kernel sweep),
    Triton's cache at its fixed path, the warm cache installed in setup and harvested at the
    end, the verdicts step counting its compiles into its own file; beside the archive, at most
    eight plain files."""
    clone = tmp_path / "clone"
    (clone / "lease" / "triton_listen").mkdir(parents=True)
    (clone / ".triton-cache").mkdir()
    (clone / "lease" / "proof.sh").write_text(PROOF.read_text())
    (clone / "lease" / "warm_cache.py").write_text("")
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    log, lease = tmp_path / "calls.log", tmp_path / "lease-out"
    env = {**os.environ, "PYTHON": str(fake), "LOG": str(log), "REAL_PYTHON": sys.executable,
           "REAL_ROOT": str(ROOT)}
    result = subprocess.run(["bash", str(clone / "lease/proof.sh"), str(tmp_path / "o"),
                             "--minutes", "4", "--archive", str(lease / "proof.tar.gz")],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    calls = log.read_text().splitlines()
    order = [c for c in calls if c.startswith(("-m pip", "-m harness.cli verdicts",
                                              "-m pytest -q")) or "/benchmarks/" in c]
    kinds = [("verdicts" if "cli verdicts" in c else "tests" if c.startswith("-m pytest")
              else "setup" if c.startswith("-m pip") or "--install" in c
              else "kernels" if "kernel_sweep" in c else "harvest") for c in order]
    assert kinds == sorted(kinds, key=[*KINDS, "harvest"].index), kinds
    (verdicts,) = [c for c in order if "cli verdicts" in c]
    cap = int(re.search(r"cap=(\d+)", verdicts).group(1))
    assert cap == next(s["cap_s"] for s in _schedule("4") if s["step"] == "verdicts")
    minutes = float(re.search(r"--minutes (\S+)", verdicts).group(1))
    assert 0 < minutes * 60 < cap and "--device cuda" in verdicts
    assert re.search(r"--out \S+/o/verdicts\b", verdicts), verdicts
    assert "cache=/tmp/attnbench-triton-cache" in verdicts
    assert re.search(r"misses=\S+/triton-misses/verdicts\.jsonl", verdicts), verdicts
    assert any("warm_cache.py --install .triton-cache" in c for c in calls)
    beside = sorted(p.name for p in lease.iterdir())
    assert beside == ["proof.tar.gz", "report.html", "summary.txt", "triton-harvest.tar.gz",
                      "verdicts.md"]
    summary = (lease / "summary.txt").read_text()
    assert "every step ran and passed" in summary and "decisive 1 of 1" in summary


def _summary(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "lease/summary.py"),
                           str(out)], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_the_summary_of_a_proof_cut_short_names_what_failed_and_what_did_not_fit(tmp_path):
    (tmp_path / "steps.tsv").write_text(
        "step\tstatus\tseconds\tcap_s\tnote\n"
        "setup\tok\t12\t45\t\n"
        "tests-parallel\tok\t80\t150\t\n"
        "smoke\tnot run\t0\t0\tdid not fit: 3 s left of 360\n")
    (tmp_path / "tests-parallel.log").write_text("")
    (tmp_path / "tests-parallel.xml").write_text(
        '<testsuites><testsuite tests="3" failures="1" errors="0" skipped="0" time="80">'
        '<testcase classname="tests.k" name="test_a"/><testcase classname="tests.k" name="test_b"/>'
        '<testcase classname="tests.k" name="test_c"><failure message="agree False"/></testcase>'
        "</testsuite></testsuites>")
    result = _summary(tmp_path)
    assert result.returncode == 1, result.stderr
    out = result.stdout
    assert "smoke" in out and "did not fit: 3 s left of 360" in out
    assert "2 passed, 1 failed" in out and "tests.k::test_c: agree False" in out
    (tmp_path / "steps.tsv").write_text("step\tstatus\tseconds\tcap_s\tnote\n"
                                        "setup\tok\t12\t45\t\n")
    (tmp_path / "tests-parallel.log").unlink()
    clean = _summary(tmp_path)
    assert clean.returncode == 0 and "every step ran and passed" in clean.stdout


@pytest.mark.usefixtures("calibrated_once")  # tests/conftest.py: the run is not about it
def test_the_summary_reads_an_interrupted_run_from_its_passes(tmp_path, capsys):
    """The first H100 lease cut a run at its cap after 46 of 96 point-passes: no rows.jsonl,
    but every point's first pass in passes.jsonl. The summary counts those. (The run is made
    in this process: the summary, a script of its own, reads what it left.)"""
    suite = tmp_path / "claims-gpu.toml"
    suite.write_text('name = "claims-gpu"\nscenario = "attention"\nimplementations = ["sdpa"]\n'
                     "[fixed]\nheads = 2\n"
                     "head_dim = 16\n[sweep]\nseq_len = [33, 65]\n[measure]\nbudget_s = 0.02\n"
                     "min_samples = 3\nwarmup_calls = 1\npasses = 2\n")
    out = tmp_path / "proof"
    threads = torch.get_num_threads()
    try:
        code = main(["run", str(suite), "--out", str(out / "verdicts" / "claims-gpu"),
                     "--no-progress", "--no-table"])
    finally:
        torch.set_num_threads(threads)
    assert code == 0, capsys.readouterr().err
    (out / "verdicts" / "claims-gpu" / "rows.jsonl").unlink()  # stopped before its last pass
    (out / "steps.tsv").write_text("step\tstatus\tseconds\tcap_s\tnote\n"
                                   "verdicts\tstopped at its cap\t77\t62\t\n")
    result = _summary(out)
    assert result.returncode == 1
    assert ("verdicts/claims-gpu: 2 rows: 2 ok (2 partial: read from an interrupted run's "
            "passes)") in result.stdout, result.stdout


def test_the_summary_counts_the_verdicts_and_each_steps_compiles(tmp_path):
    """The verdicts of ``verdicts/verdicts.json`` counted (the verb's own table,
    verdicts.md, has each claim's evidence), the decisive share, and the Triton compiles of
    each step."""
    (tmp_path / "verdicts").mkdir()
    (tmp_path / "steps.tsv").write_text("step\tstatus\tseconds\tcap_s\tnote\n"
                                        "verdicts\tok\t20\t26\t\n")
    (tmp_path / "triton-misses").mkdir()
    (tmp_path / "triton-misses" / "verdicts.jsonl").write_text('{"k": 1}\n{"k": 2}\n')
    (tmp_path / "verdicts" / "verdicts.json").write_text(json.dumps([
        {"claim": "attention-time-n2", "verdict": "confirmed"},
        {"claim": "flash-speedup-2-4x", "verdict": "inconclusive"},
        {"claim": "false-full-memory-n1", "verdict": "refuted"}]))
    result = _summary(tmp_path)
    assert result.returncode == 0, result.stderr
    assert ("verdicts: 3 claims: 1 confirmed, 1 inconclusive, 1 refuted; decisive 2 of 3 (67%)"
            in result.stdout), result.stdout
    assert "verdicts 2" in result.stdout
    (tmp_path / "verdicts" / "verdicts.json").unlink()
    assert "no verdicts.json (the verdicts step did not finish)" in _summary(tmp_path).stdout


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


def test_the_workflow_installs_a_current_cuda_torch():
    """The cu118/cu121/cu124 indexes stop at torch 2.6 or older."""
    text = (ROOT / ".github/workflows/gpu-benchmark.yml").read_text()
    installs = [line for line in text.splitlines() if re.search(r"pip install .*torch", line)]
    assert len(installs) == 2
    assert not re.search(r"whl/cu1(1\d|2[0-4])\b", text)
    assert all('"torch>=2.7"' in line for line in installs)
