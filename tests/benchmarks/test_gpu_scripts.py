"""The GPU scripts on a machine without a GPU: the proof refuses in one line (exit 2) and its
dry run lists every test it would run; ``gpu_sparse`` keeps going past an unsupported point,
compiles Flex as the registry does and runs the suite's BigBird layout; the workflow template
installs a current CUDA torch."""

from __future__ import annotations

import importlib.util
import json
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


@pytest.mark.parametrize("args, says", [
    (("out", "--minutes", "six"), "--minutes six: not a number of minutes"),
    (("out", "--plan-json"), "--plan-json goes with --dry-run"),
])
def test_the_proof_refuses_bad_options_in_one_line_before_any_work(tmp_path, args, says):
    result = _proof(*(str(tmp_path / a) if a == "out" else a for a in args))
    assert result.returncode == 2 and result.stderr.strip() == f"gpu_proof: {says}"
    assert not (tmp_path / "out").exists()


def test_the_proof_dry_run_lists_every_cuda_test_even_without_pytest_benchmark(tmp_path):
    """Every test that needs CUDA is in one of the proof's selections (the Triton backward
    included). pyproject's addopts carry ``--benchmark-disable``; a GPU machine's Python without
    pytest-benchmark would reject it (exit 4, nothing run) unless the proof replaces them: the
    dry run here has the plugin shadowed."""
    shadow = tmp_path / "shadow" / "pytest_benchmark"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('not installed here')\n")
    env = {**os.environ, "PYTHON": os.environ.get("PYTHON", sys.executable),
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
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
    bench = tmp_path / "clone" / "benchmarks"
    bench.mkdir(parents=True)
    (bench / "gpu_proof.sh").write_text(PROOF.read_text())
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n")
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    env["PATH"] = f"{fake.parent}{os.pathsep}{env['PATH']}"
    result = subprocess.run(["bash", str(bench / "gpu_proof.sh"), "--dry-run"],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "No module named 'torch'" in line and str(fake) in line and ".venv" in line




KINDS = ("setup", "measure", "verdicts", "tests", "kernels")  # the order the steps run in


def _plan(minutes: str, python: str | None = None) -> list[dict]:
    env = {**os.environ, "PYTHON": python or os.environ.get("PYTHON", sys.executable)}
    result = subprocess.run(["bash", str(PROOF), "--dry-run", "--minutes", minutes,
                             "--plan-json"], capture_output=True, text=True, env=env, cwd=ROOT,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _plan_problems(plan: list[dict], minutes: float) -> list[str]:
    """What is wrong with a plan against issue 37's targets, in words (none: it holds)."""
    budget = minutes * 60
    problems = []
    if any(set(step) != {"step", "kind", "cap_s"} for step in plan):
        problems.append("a step is not {step, kind, cap_s}")
    kinds = [step["kind"] for step in plan]
    if [k for k in KINDS if k in kinds] != list(KINDS) or kinds != sorted(kinds, key=KINDS.index):
        problems.append(f"order {kinds}: not setup, measure, verdicts, tests, kernels")
    caps = {kind: sum(s["cap_s"] for s in plan if s["kind"] == kind) for kind in KINDS}
    if any(not isinstance(s["cap_s"], int) or s["cap_s"] < 0 for s in plan):
        problems.append("a cap is not a whole number of seconds >= 0")
    if sum(caps.values()) > budget:
        problems.append(f"caps sum to {sum(caps.values())} s, over the {budget:g} s budget")
    if caps["measure"] < 0.6 * budget:
        problems.append(f"measure {caps['measure']} s: under 60% of {budget:g} s")
    if caps["tests"] > 90:
        problems.append(f"tests {caps['tests']} s: over 90 s")
    return problems


@pytest.mark.parametrize("minutes", ["10", "4", "7.5", "30"])
def test_the_plan_measures_first_within_the_budget(minutes):
    plan = _plan(minutes)
    assert _plan_problems(plan, float(minutes)) == []
    measured = [s["step"] for s in plan if s["kind"] == "measure"]
    assert measured[:3] == ["measure-claims-gpu", "measure-claims-linear-gpu-scaling",
                            "measure-claims-linear-gpu"]  # the headline claims' suites first


def test_the_plan_check_fails_a_plan_out_of_order_over_budget_or_short_of_measuring():
    good = _plan("10")
    assert _plan_problems(good, 10) == []
    swapped = [good[0], good[-1], *good[1:-1]]  # the kernel sweep before the measurements
    assert any("order" in p for p in _plan_problems(swapped, 10))
    heavy = [{**s, "cap_s": s["cap_s"] * 2} if s["kind"] == "tests" else s for s in good]
    assert any("over the 600 s budget" in p or "over 90 s" in p
               for p in _plan_problems(heavy, 10))
    short = [{**s, "cap_s": s["cap_s"] // 2} if s["kind"] == "measure" else s for s in good]
    assert any("under 60%" in p for p in _plan_problems(short, 10))


def test_the_plan_needs_no_torch(tmp_path):
    """The plan is checked where nothing is installed: a Python that cannot import torch."""
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\necho \"No module named 'torch'\" >&2\nexit 1\n")
    fake.chmod(0o755)
    assert _plan_problems(_plan("10", python=str(fake)), 10) == []


def test_the_plan_measures_every_claims_suite_for_a_gpu_with_its_header_time():
    """One measure step per GPU claims suite, and the H100 time the proof shares the measure
    time by is the one the suite's header states."""
    steps = {s["step"].removeprefix("measure-") for s in _plan("10") if s["kind"] == "measure"}
    on_disk = {p.stem for p in (ROOT / "suites").glob("claims-*.toml")
               if load_suite(p).points[0].device == "cuda"}
    assert on_disk and steps == on_disk
    table = dict(re.findall(r'"(claims-[\w-]+):(\d+)"', PROOF.read_text()))
    for name in on_disk:
        header = (ROOT / "suites" / f"{name}.toml").read_text()
        stated = re.search(r"^# Run time on one H100: ~(\d+) seconds", header, re.M)
        assert stated, f"{name}: no '# Run time on one H100: ~N seconds' line"
        assert table[name] == stated.group(1), name


# A Python that stands in for the GPU machine's: it logs every call (with the variables the
# proof exports), answers the CUDA check, writes what each step would leave, and hands the
# summary to the real Python.
FAKE_PYTHON = r"""#!/usr/bin/env bash
echo "$* | cache=$TRITON_CACHE_DIR cap=${STEP_CAP:-} misses=${ATTNBENCH_TRITON_MISSES:-}" >>"$LOG"
arg() { local want=$1; shift; while [ $# -gt 1 ]; do [ "$1" = "$want" ] && echo "$2"; shift; done; }
case "$*" in
  "-c import torch, pytest" | "-c import pytest_benchmark" | "-c import xdist"*) exit 0 ;;
  "-m harness.cli run --help") echo "  --time-limit LIMIT"; exit 0 ;;
  "-m harness.cli run "*)
    out=$(arg --out "$@"); mkdir -p "$out"
    echo '{"impl": "full", "scenario": "attention", "seq_len": 512, "status": "ok"}' \
      >"$out/rows.jsonl"; echo '{}' >"$out/env.json"; exit 0 ;;
  "-m harness.cli claims"*"--json") echo "[]"; exit 0 ;;
  "-m harness.cli report"*) out=$(arg --out "$@"); mkdir -p "$out"
    touch "$out/index.html" "$out/report.md"; exit 0 ;;
  "-m pytest"*)
    for a in "$@"; do case "$a" in --junitxml=*) xml=${a#--junitxml=} ;; esac; done
    echo '<testsuite tests="1" failures="0" errors="0" skipped="0" time="1"/>' >"$xml"; exit 0 ;;
  "benchmarks/warm_cache.py --harvest "*) touch "$3"; exit 0 ;;
  "benchmarks/gpu_proof_summary.py "*) shift
    exec "$REAL_PYTHON" "$REAL_ROOT/benchmarks/gpu_proof_summary.py" "$@" ;;
  -) code=$(cat)
    case "$code" in *is_available*) exit 0 ;; *get_device_name*) echo "torch fake" ;; esac
    exit 0 ;;
  *) exit 0 ;;
esac
"""


def test_the_proof_measures_first_and_returns_what_a_reader_opens(tmp_path):
    """The whole proof with a stand-in Python (no GPU): the steps run in the plan's order
    (setup, the claims suites, claims and report, the tests, the kernel sweep), the suites
    with `--time-limit` at their caps, Triton's cache at its fixed path, the warm cache
    installed in setup and harvested at the end, each measure step counting its compiles into
    its own file; beside the archive, at most eight plain files."""
    clone = tmp_path / "clone"
    (clone / "benchmarks" / "triton_listen").mkdir(parents=True)
    (clone / ".triton-cache").mkdir()
    (clone / "benchmarks" / "gpu_proof.sh").write_text(PROOF.read_text())
    (clone / "benchmarks" / "warm_cache.py").write_text("")
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    log, lease = tmp_path / "calls.log", tmp_path / "lease-out"
    env = {**os.environ, "PYTHON": str(fake), "LOG": str(log), "REAL_PYTHON": sys.executable,
           "REAL_ROOT": str(ROOT)}
    result = subprocess.run(["bash", str(clone / "benchmarks/gpu_proof.sh"), str(tmp_path / "o"),
                             "--minutes", "4", "--archive", str(lease / "proof.tar.gz")],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    calls = log.read_text().splitlines()
    order = [c for c in calls if c.startswith(("-m pip", "-m harness.cli run suites/",
                                              "-m harness.cli claims", "-m pytest -q",
                                              "benchmarks/"))]
    kinds = [("measure" if "cli run" in c else "verdicts" if "cli claims" in c
              else "tests" if "pytest" in c else "setup" if "pip" in c or "--install" in c
              else "kernels" if "kernel_sweep" in c else "harvest") for c in order]
    assert kinds == sorted(kinds, key=[*KINDS, "harvest"].index), kinds
    suites = [re.search(r"suites/([\w-]+)\.toml", c).group(1) for c in order if "cli run" in c]
    assert suites == [s["step"].removeprefix("measure-") for s in _plan("4")
                      if s["kind"] == "measure"]
    for call in (c for c in order if "cli run" in c):
        cap = re.search(r"cap=(\d+)", call).group(1)
        assert f"--time-limit {cap}s" in call and "cache=/tmp/attnbench-triton-cache" in call
        assert re.search(r"misses=\S+/triton-misses/measure-[\w-]+\.jsonl", call), call
    assert any("warm_cache.py --install .triton-cache" in c for c in calls)
    beside = sorted(p.name for p in lease.iterdir())
    assert beside == ["claims.txt", "proof.tar.gz", "report.html", "report.md", "summary.txt",
                      "triton-harvest.tar.gz"]
    assert "every step ran and passed" in (lease / "summary.txt").read_text()


def _summary(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_proof_summary.py"),
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


def test_the_summary_reads_an_interrupted_run_from_its_passes(tmp_path):
    """The first H100 lease cut a run at its cap after 46 of 96 point-passes: no rows.jsonl,
    but every point's first pass in passes.jsonl. The summary counts those."""
    suite = tmp_path / "claims-gpu.toml"
    suite.write_text('name = "claims-gpu"\nscenario = "attention"\nimplementations = ["sdpa"]\n'
                     "[fixed]\nheads = 2\n"
                     "head_dim = 16\n[sweep]\nseq_len = [33, 65]\n[measure]\nbudget_s = 0.02\n"
                     "min_samples = 3\nwarmup_calls = 1\npasses = 2\n")
    out = tmp_path / "proof"
    done = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(suite), "--out",
                           str(out / "measure-claims-gpu"), "--no-progress", "--no-table"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    (out / "measure-claims-gpu" / "rows.jsonl").unlink()  # as if stopped before its last pass
    (out / "steps.tsv").write_text("step\tstatus\tseconds\tcap_s\tnote\n"
                                   "measure-claims-gpu\tstopped at its cap\t77\t62\t\n")
    result = _summary(out)
    assert result.returncode == 1
    assert ("measure-claims-gpu: 2 rows: 2 ok (2 partial: read from an interrupted run's "
            "passes)") in result.stdout, result.stdout


def _row(impl: str, n: int, host_frac: float, graph: str) -> dict:
    return {"impl": impl, "scenario": "attention", "device": "cuda", "seq_len": n, "batch": 4,
            "heads": 16, "head_dim": 128, "status": "ok", "time_median_s": 1e-9 * n * n,
            "peak_mem_bytes": 8 * n * n, "host_frac": host_frac, "cuda_graph": graph}


def test_the_summary_names_each_claim_with_its_evidence(tmp_path):
    """Each claim the measured rows serve: its verdict, n range, points per group, host_frac
    range and timing mode; the decisive share; the Triton compiles of each measure step."""
    run = tmp_path / "measure-claims-gpu"
    run.mkdir()
    rows = [_row("full", n, 0.05 + 0.1 * i, "cuda-graph")
            for i, n in enumerate([512, 1024, 2048, 4096, 8192])]
    rows.append(_row("sdpa-flash", 1024, 0.7, "none"))
    (run / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "steps.tsv").write_text("step\tstatus\tseconds\tcap_s\tnote\n"
                                        "measure-claims-gpu\tok\t20\t26\t\n")
    (tmp_path / "triton-misses").mkdir()
    (tmp_path / "triton-misses" / "measure-claims-gpu.jsonl").write_text('{"k": 1}\n{"k": 2}\n')
    (tmp_path / "claims.json").write_text(json.dumps([
        {"claim": "attention-time-n2", "verdict": "confirmed", "groups": [{"n_points": 5}]},
        {"claim": "flash-speedup-2-4x", "verdict": "inconclusive",
         "groups": [{"n_points": 1}]}]))
    result = _summary(tmp_path)
    assert result.returncode == 0, result.stderr
    lines = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    assert re.search(r"confirmed +seq_len 512\.\.8192 +points/group 5 +host_frac 0\.05–0\.45 "
                     r"+graph$", lines["attention-time-n2"]), lines["attention-time-n2"]
    assert re.search(r"inconclusive +seq_len 1024\.\.8192 +points/group 1 +host_frac "
                     r"0\.15–0\.70 \(1 host-bound\) +eager\+graph$", lines["flash-speedup-2-4x"])
    assert re.search(r"not judged +seq_len 1024 +points/group none", lines["flash-time-n2"])
    assert "decisive 1 of 10 (10%)" in result.stdout
    assert "timed claims reading a host-bound row: 4" in result.stdout
    assert "measure-claims-gpu 2" in lines["triton"]


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
