"""Reliability: bad input is refused in one line before anything is written; a run killed
mid-sweep resumes without losing or duplicating a point; over-budget points are skipped with the
prediction; crashing, aborting and hanging points become rows in isolated runs."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.cli import main
from harness.errors import ResultsWarning
from harness.execute.isolate import describe_exit, run_isolated
from harness.execute.runner import run_point
from harness.measure.device import get_device
from harness.results import ROWS_FILE, load_rows
from harness.scenarios.interface import Point, cost_of, point_from_row
from harness.sweep.suite import MeasureConfig, load_suite
from tests.conftest import calibrated_children_env, calibrated_cli_argv

# The runs here test failure and recovery, not the device calibration: in this process and in
# the CLI processes they start, a run gets the one this test process measured (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("calibrated_once")

ROOT = Path(__file__).resolve().parents[3]
# the points here are timed only to have rows: each pass's budget as short as the timing allows
MEASURE = "[measure]\nbudget_s = 0.02\nmin_samples = 3\nwarmup_calls = 1\nthreads = 2\n"
HEAD = 'name = "rel"\nscenario = "attention"\n'

# A plug-in installed the way third parties install one: a distribution with an entry point in
# the ``attnbench.implementations`` group, found on PYTHONPATH by the parent and the children.
PLUGIN = """
import ctypes, os, time
from harness.registry import register
from harness.spec import Capabilities, Cost

def _add(name):
    return register(name, family="test", caps=Capabilities(), cost=Cost(2, 2))

@_add("test-segfault")
def segfault(q, k, v, mask, scale=None):
    return ctypes.string_at(0)

@_add("test-abort")
def abort(q, k, v, mask, scale=None):
    os.abort()

@_add("test-hang")
def hang(q, k, v, mask, scale=None):
    time.sleep(3600)

import torch
import torch.nn.functional as F

FAULT_AT = 48  # seq_len of the first point of test-poison's sweep

def _fault(*args, **kwargs):
    raise torch.AcceleratorError("CUDA error: device-side assert triggered")

# A kernel that trips a device-side assert at its first sweep point, in whatever process runs
# that point. From then on that process is as a poisoned CUDA context leaves it: every kernel
# call fails the same way. Other processes (fresh children) are not touched.
@_add("test-poison")
def poison(q, k, v, mask, scale=None):
    if q.shape[-2] == FAULT_AT:
        F.scaled_dot_product_attention = torch.matmul = torch.bmm = torch.softmax = _fault
        _fault()
    return F.scaled_dot_product_attention(q, k, v, scale=scale)
"""


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Path:
    """A folder holding the crashing test implementations' distribution."""
    site = tmp_path_factory.mktemp("site")
    (site / "attnbench_crashers.py").write_text(PLUGIN)
    info = site / "attnbench_crashers-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: attnbench-crashers\nVersion: 0.1\n"
    )
    (info / "entry_points.txt").write_text(
        "[attnbench.implementations]\ncrashers = attnbench_crashers\n"
    )
    return site


@pytest.fixture(scope="module")
def plugin_env(plugin_site) -> dict:
    """Environment for CLI subprocesses that have the crashing test implementations; an
    isolated run's children get this process's calibration too (tests/calibrated_site)."""
    return calibrated_children_env(
        {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_site), str(ROOT)])})


@pytest.fixture
def crashers_here(plugin_site, monkeypatch):
    """The crashing plug-ins' distribution found by this process's registry too, for this test
    only (registry and plug-in state copied, the module dropped afterwards): for a command
    that must know their names but runs none of them here (a resume with nothing left)."""
    from harness import plugins, registry

    registry.names()  # the built-ins first
    for module, name in ((registry, "_REGISTRY"), (registry, "_ORIGINS"),
                         (registry, "_CONTRACT"), (registry, "_LOAD_ERRORS"),
                         (plugins, "_LOADED"), (plugins, "_DIGESTS")):
        monkeypatch.setattr(module, name, dict(getattr(module, name)))
    monkeypatch.syspath_prepend(str(plugin_site))
    monkeypatch.setattr(registry, "_loaded", False)  # the next lookup finds the entry point
    import torch
    import torch.nn.functional as F

    # should a regression run the poisoning point here after all, the test fails and the
    # functions it replaces come back for the next test
    monkeypatch.setattr(F, "scaled_dot_product_attention", F.scaled_dot_product_attention)
    for name in ("matmul", "bmm", "softmax"):
        monkeypatch.setattr(torch, name, getattr(torch, name))
    yield
    sys.modules.pop("attnbench_crashers", None)


def cli(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``attnbench ARGS`` in a fresh process (calibrated as ``calibrated_cli_argv`` says)."""
    return subprocess.run(
        calibrated_cli_argv(*args),
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def write_suite(path: Path, body: str) -> Path:
    path.write_text(HEAD + body + MEASURE)
    return path


def assert_one_line(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnbench: "), stderr


# --- bad input ------------------------------------------------------------------------------

MALFORMED = {
    "unknown-key": 'implementations = ["full"]\ncolour = "blue"\n',
    "unknown-impl": 'implementations = ["full", "fastest-attention"]\n',
    "heads-and-length": 'implementations = ["full"]\n[fixed]\nheads = 3\nd_model = 64\n'
    "[sweep]\nseq_len = [-128, 64]\n",
    "broken-toml": 'implementations = ["full"\n[fixed]\nheads = 4\n',
}


def test_malformed_suites_and_a_missing_file_exit_nonzero_in_one_line(tmp_path, capsys):
    """Exit 2, one stderr line naming the file and the problem, nothing written."""
    cases = {name: write_suite(tmp_path / f"{name}.toml", body) for name, body in MALFORMED.items()}
    cases["missing-file"] = tmp_path / "no-such-suite.toml"
    expected = {
        "unknown-key": "colour",
        "unknown-impl": "fastest-attention",
        "heads-and-length": "-128",
        "broken-toml": "line",
        "missing-file": "not found",
    }
    for name, suite in cases.items():
        code, err = run_in_process(capsys, "run", str(suite), "--out", str(tmp_path / f"o-{name}"))
        assert code == 2, (name, err)
        assert_one_line(err)
        assert str(suite) in err and expected[name] in err
        assert not (tmp_path / f"o-{name}").exists(), name


def run_in_process(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    return code, capsys.readouterr().err


def test_heads_not_dividing_d_model_is_named(tmp_path, capsys):
    suite = write_suite(
        tmp_path / "s.toml", 'implementations = ["full"]\n[fixed]\nheads = 3\nd_model = 64\n'
    )
    code, err = run_in_process(capsys, "run", str(suite), "--out", str(tmp_path / "o"))
    assert code == 2 and "d_model = 64" in err and "heads=3" in err
    assert_one_line(err)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ('implementations = ["full"]\n[fixed]\ndtype = "float8"\n', "float8"),
        ('implementations = ["full"]\ndevice = "tpu"\n', "tpu"),
        ('implementations = ["full"]\n[fixed]\nwindow = [-4, 0]\n', "[-4, 0]"),
        ('implementations = ["full"]\n[fixed]\nwindow_right = -2\n', "window_right"),
    ],
    ids=["dtype", "device", "window", "window-side"],
)
def test_bad_point_fields_are_refused(tmp_path, capsys, body, needle):
    suite = write_suite(tmp_path / "s.toml", body)
    code, err = run_in_process(capsys, "run", str(suite), "--out", str(tmp_path / "o"))
    assert code == 2 and needle in err
    assert_one_line(err)
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_an_unavailable_device_is_refused_before_anything_is_written(tmp_path, capsys):
    suite = write_suite(tmp_path / "s.toml", 'implementations = ["sdpa"]\ndevice = "cuda"\n')
    code, err = run_in_process(capsys, "run", str(suite), "--out", str(tmp_path / "o"))
    assert code == 2 and "cuda" in err
    assert_one_line(err)
    assert not (tmp_path / "o").exists()


def test_bad_out_and_bad_arguments_are_one_line_and_write_nothing(tmp_path, capsys):
    suite = write_suite(tmp_path / "s.toml", 'implementations = ["sdpa"]\n[fixed]\nseq_len = 64\n')
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    cases = [
        ("--out", str(a_file)),  # exists and is not a directory
        ("--out", str(a_file / "below")),  # cannot be created
        ("--out", "/proc/attnbench-cannot-write-here"),
        ("--out", str(tmp_path / "o"), "--mem-budget", "lots"),
        ("--out", str(tmp_path / "o"), "--mem-budget", "-1GiB"),
        ("--out", str(tmp_path / "o"), "--budget-s", "-1"),
        ("--out", str(tmp_path / "o"), "--budget-s", "nan"),
        ("--out", str(tmp_path / "o"), "--passes", "0"),
        ("--out", str(tmp_path / "o"), "--passes", "two"),
        ("--out", str(tmp_path / "o"), "--isolate", "--point-timeout", "0"),
        ("--out", str(tmp_path / "o"), "--point-timeout", "5"),  # needs --isolate
        ("--out", str(tmp_path / "o"), "--check", "sometimes"),
        ("--out", str(tmp_path / "o"), "--no-such-flag"),
    ]
    for extra in cases:
        code, err = run_in_process(capsys, "run", str(suite), *extra)
        assert code == 2, (extra, err)
        assert_one_line(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "s.toml"]
    assert a_file.read_text() == "x"


def test_a_suite_timeout_without_isolation_is_refused(tmp_path, capsys):
    suite = tmp_path / "s.toml"
    suite.write_text(HEAD + 'implementations = ["sdpa"]\n' + MEASURE + "point_timeout_s = 5\n")
    code, err = run_in_process(capsys, "run", str(suite), "--out", str(tmp_path / "o"))
    assert code == 2 and "needs --isolate" in err
    assert_one_line(err)
    assert not (tmp_path / "o").exists()


# --- crash-safe resume ----------------------------------------------------------------------


def test_a_run_killed_mid_sweep_resumes_with_every_point_once(tmp_path, capsys):
    """The killed run is a real process (SIGKILL mid-sweep, then half a line appended, as a
    kill mid-write leaves it); the resume runs in this process."""
    suite = write_suite(
        tmp_path / "s.toml",
        'implementations = ["sdpa", "sdpa-math", "full"]\n[fixed]\nheads = 2\nhead_dim = 16\n'
        "[sweep]\nseq_len = [64, 96, 128, 160]\n",
    )
    expected = {p.point_id for p in load_suite(suite).points}
    out = tmp_path / "run"
    rows = out / ROWS_FILE
    args = ["run", str(suite), "--out", str(out), "--no-progress", "--no-table"]
    proc = subprocess.Popen(
        calibrated_cli_argv(*args), stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 300
    while (not rows.exists() or len(rows.read_bytes().splitlines()) < 3) and proc.poll() is None:
        assert time.monotonic() < deadline, "no rows appeared"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the sweep finished before it could be killed"
    before = [line for line in rows.read_bytes().splitlines() if line.endswith(b"}")]
    assert 3 <= len(before) < len(expected)
    with rows.open("ab") as fh:  # what a kill in the middle of a write leaves behind
        fh.write(before[-1][: len(before[-1]) // 2])

    code, err = run_in_process(capsys, *args, "--resume")
    assert code == 0, err
    assert f"({len(before)} already done)" in err

    with pytest.warns(ResultsWarning, match="truncated"):
        frame = load_rows(out)
    ids = list(frame["point_id"])
    assert sorted(ids) == sorted(expected)  # every point, each exactly once
    assert frame["run_id"].nunique() == 1
    assert [point_from_row(r).point_id for r in frame.to_dict("records")] == ids


# --- device faults --------------------------------------------------------------------------


def _seed_with_fault_early(suite_text: str, tmp_path: Path) -> int:
    """An order_seed whose first pass runs the faulting point second (one point before it,
    four after it), so the run has rows before the fault and points left after it."""
    from harness.measure import passes

    probe = tmp_path / "probe.toml"  # the same points, with a name this process knows
    probe.write_text(suite_text.replace("test-poison", "sdpa-math"))
    points = load_suite(probe).points
    fault = next(i for i, p in enumerate(points) if p.impl == "sdpa-math" and p.seq_len == 48)
    return next(seed for seed in range(200)
                if passes.pass_orders(len(points), 2, seed)[0].index(fault) == 1)


def test_a_device_fault_costs_one_point_and_the_run_goes_on_in_fresh_processes(
    tmp_path, plugin_env, crashers_here, capsys
):
    """A point that raises a CUDA error that poisons its process (a device-side assert) is an
    error row with the CUDA message; the row before it stays; every later point, of every
    implementation and pass, runs in a fresh child and is ok; one line says so. ``--resume``
    afterwards has nothing left to run. (Before: every later point was an error too.)"""
    body = ('implementations = ["test-poison", "sdpa", "full"]\n[fixed]\nheads = 2\n'
            "head_dim = 16\n[sweep]\nseq_len = [48, 64]\n")
    text = HEAD + body + MEASURE + "passes = 2\n"
    suite = tmp_path / "s.toml"
    suite.write_text(text + f"order_seed = {_seed_with_fault_early(text, tmp_path)}\n")
    out = tmp_path / "run"
    result = cli("run", str(suite), "--out", str(out), "--no-progress", "--no-table",
                 env=plugin_env)
    assert result.returncode == 1, result.stderr  # a point failed: CI must see it
    assert ("attnbench: test-poison: 1 of 2 points ended in error; first: AcceleratorError: "
            "CUDA error: device-side assert triggered") in result.stderr
    frame = load_rows(out)
    fault = (frame["impl"] == "test-poison") & (frame["seq_len"] == 48)
    assert frame.loc[fault, "status"].tolist() == ["error"]
    assert frame.loc[fault, "reason"].iloc[0] == (
        "AcceleratorError: CUDA error: device-side assert triggered")
    assert (frame.loc[~fault, "status"] == "ok").all(), frame[["impl", "seq_len", "reason"]]
    assert (frame.loc[~fault, "passes"] == 2).all()
    switched = [line for line in result.stderr.splitlines() if "fresh child process" in line]
    assert len(switched) == 1 and "test-poison n=48 hit a CUDA error" in switched[0]
    assert "1 error, 5 ok" in result.stderr

    # the resume runs nothing (the poisoning point is not run again): this process does it
    code, err = run_in_process(capsys, "run", str(suite), "--out", str(out), "--resume",
                               "--no-progress", "--no-table")
    assert code == 1, err  # judged on every row of the run, resumed too
    assert "0 points" in err and "(6 already done)" in err
    assert len(load_rows(out)) == 6


# --- memory budget --------------------------------------------------------------------------


def test_over_budget_full_point_is_skipped_with_the_prediction_and_the_rest_runs(tmp_path, capsys):
    suite = write_suite(
        tmp_path / "s.toml",
        'implementations = ["full", "sdpa-flash"]\n[fixed]\nheads = 4\nhead_dim = 32\n'
        "[sweep]\nseq_len = [256, 2048]\n",
    )
    out = tmp_path / "run"
    code, err = run_in_process(
        capsys,
        "run",
        str(suite),
        "--out",
        str(out),
        "--mem-budget",
        "16MiB",
        "--no-progress",
        "--no-table",
    )
    assert code == 0, err
    frame = load_rows(out).set_index(["impl", "seq_len"])
    skipped = frame.loc[("full", 2048)]
    point = next(p for p in load_suite(suite).points if p.impl == "full" and p.seq_len == 2048)
    predicted = cost_of(point).peak_bytes
    assert predicted > 16 * 2**20 and skipped["predicted_mem_bytes"] == predicted
    assert skipped["status"] == "skipped"
    assert skipped["reason"] == f"predicted peak {predicted / 2**20:.0f} MiB > budget 16 MiB"
    huge = Point("full", seq_len=2**25)
    petabytes = cost_of(huge).peak_bytes / 2**50
    assert petabytes > 1
    row = run_point(huge, MeasureConfig(), get_device("cpu"), mem_budget=2**30)
    assert row["reason"] == f"predicted peak {petabytes:.1f} PiB > budget 1.0 GiB"  # not MiB
    tiny = run_point(Point("full", seq_len=64), MeasureConfig(), get_device("cpu"), mem_budget=1024)
    assert tiny["reason"].endswith("> budget 1 KiB")  # not "0 MiB"
    rest = frame.drop(index=("full", 2048))
    assert len(rest) == 3 and set(rest["status"]) == {"ok"}


# --- isolation ------------------------------------------------------------------------------


def _segfault(payload: dict) -> dict:
    import ctypes

    return {"never": ctypes.string_at(0)}


def _abort(payload: dict) -> dict:
    os.abort()


def _killed(payload: dict) -> dict:
    os.kill(os.getpid(), signal.SIGKILL)
    return {}


def _exits(payload: dict) -> dict:
    os._exit(3)


def _raises(payload: dict) -> dict:
    raise ValueError("bad shape\nmore detail")


def _sleeps(payload: dict) -> dict:
    time.sleep(3600)
    return {}


def _answers(payload: dict) -> dict:
    return {"status": "ok", "pid": os.getpid(), "echo": payload["x"]}


def test_a_child_returns_its_result_as_json():
    outcome = run_isolated(_answers, {"x": [1, 2.5, "three"]}, timeout_s=120)
    assert outcome.status == "ok" and outcome.result["echo"] == [1, 2.5, "three"]
    assert outcome.result["pid"] != os.getpid()


@pytest.mark.parametrize(
    ("fn", "status", "reason"),
    [
        (_segfault, "error", "killed by SIGSEGV"),
        (_abort, "error", "killed by SIGABRT"),
        (_killed, "error", "killed by SIGKILL (out of memory?)"),
        (_exits, "error", "exited with code 3"),
        (_raises, "ok", None),
    ],
    ids=["segfault", "abort", "oom-killer", "exit", "raises"],
)
def test_a_dying_child_becomes_an_outcome(fn, status, reason):
    outcome = run_isolated(fn, {}, timeout_s=120)
    assert outcome.status == status
    if reason is not None:
        assert reason in outcome.reason and outcome.result is None
    else:
        assert outcome.result == {"status": "error", "reason": "ValueError: bad shape"}


def test_a_hung_child_is_killed_at_the_timeout():
    outcome = run_isolated(_sleeps, {}, timeout_s=1.0)
    assert outcome.status == "timeout" and "1 s" in outcome.reason
    assert outcome.seconds >= 1.0


def test_exit_descriptions():
    assert describe_exit(-signal.SIGSEGV) == "child process killed by SIGSEGV (Segmentation fault)"
    assert describe_exit(-signal.SIGKILL) == "child process killed by SIGKILL (out of memory?)"


def test_isolated_sweep_survives_segfault_abort_and_hang(tmp_path, plugin_env):
    """The one end-to-end run of the real command in a subprocess: ``python -m harness.cli run
    --isolate`` with plug-ins installed as a third party installs them (an entry point found
    on PYTHONPATH by the parent and its children), the table printed at the end."""
    suite = write_suite(
        tmp_path / "s.toml",
        'implementations = ["test-segfault", "sdpa", "test-abort", "test-hang", "full"]\n'
        "[fixed]\nheads = 2\nhead_dim = 16\nseq_len = 64\n",
    )
    out = tmp_path / "run"
    result = cli(
        "run",
        str(suite),
        "--out",
        str(out),
        "--isolate",
        "--point-timeout",  # a point's child here takes ~0.5 s (load 3): 10x that
        "5",
        "--no-progress",
        env=plugin_env,
    )
    assert result.returncode == 1, result.stderr  # the crashes fail the run; it went on
    for impl, signal_name in (("test-segfault", "SIGSEGV"), ("test-abort", "SIGABRT")):
        assert re.search(rf"^attnbench: {impl}: 1 of 1 point ended in error; first: child "
                         rf"process killed by {signal_name}", result.stderr, re.M), result.stderr
    frame = load_rows(out).set_index("impl")
    # rows come in pass order (shuffled), not suite order
    expected = ["test-segfault", "sdpa", "test-abort", "test-hang", "full"]
    assert sorted(frame.index) == sorted(expected)
    assert frame.loc["test-segfault", "status"] == "error"
    assert re.search(r"SIGSEGV", frame.loc["test-segfault", "reason"])
    assert frame.loc["test-abort", "status"] == "error"
    assert "SIGABRT" in frame.loc["test-abort", "reason"]
    assert frame.loc["test-hang", "status"] == "timeout"
    assert frame.loc["sdpa", "status"] == "ok" and frame.loc["full", "status"] == "ok"
    # each point's child compares its bytes with the run's calibration (env.json), as rows
    # measured in-process do, instead of measuring a bandwidth of its own
    for impl in ("sdpa", "full"):
        assert frame.loc[impl, "bw_source"] == "env.json calibration"
        assert frame.loc[impl, "bw_fraction"] > 0
    assert frame.loc["test-segfault", "family"] == "test"  # identity columns are filled in
    assert "2 error" in result.stderr and "1 timeout" in result.stderr
    assert "median time (ms)" in result.stdout and "not shown" in result.stdout


# --- security -------------------------------------------------------------------------------

DANGEROUS = re.compile(
    r"\bpickle\b|\bmarshal\b|\bshelve\b|torch\.load\b|(?<![.\w])eval\(|(?<![.\w])exec\(|__import__\("
    r"|yaml\.(unsafe_)?load\b|read_pickle|runpy|importlib\.util\.spec_from_file_location"
)


def test_no_code_path_executes_imports_or_unpickles_file_contents():
    """Suites, claims and results are parsed as TOML/JSON data; the only dynamic imports are
    the registry's own package and installed entry points, the scenario folders of the
    harness's own scenarios package (and the CLI's fixed module list), and the plug-in files a
    user names (``--plugin FILE``, ``ATTNBENCH_PLUGINS``: code by request, as an entry point is;
    harness/plugins.py only), and the kernels' public face, which imports modules of its own
    fixed lists on first use (implementations/triton_kernels.py), and a predicate mask
    feature's ``"module:function"`` Triton twin, named by the feature's own code (never by a
    suite or result file: a suite cannot name a plug-in feature), resolved in
    implementations/_kernels/triton/band_plan.py."""
    LOADS_BY_PATH = (
        "harness/plugins.py",  # a --plugin file the user named
        "harness/execute/kernel_cache.py",  # the checkout's own lease/ cache tools
    )
    dynamic_import_ok = (
        "implementations/triton_kernels.py",
        "implementations/_kernels/triton/band_plan.py",
        "harness/registry.py",
        "harness/scenarios/__init__.py",
        "harness/scenarios/interface.py",
        "harness/cli/__init__.py",
        "harness/execute/isolate.py",
    )
    offenders = []
    for folder in ("harness", "implementations"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                literal = re.search(r"import_module\(\"[\w.]+\"\)", code)
                dynamic = "import_module(" in code and not literal
                where = path.relative_to(ROOT).as_posix()
                plugin_file = where in LOADS_BY_PATH and "spec_from_file_location" in code
                dangerous = DANGEROUS.search(code) and not plugin_file
                if dangerous or (dynamic and where not in dynamic_import_ok):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
