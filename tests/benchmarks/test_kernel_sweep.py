"""``benchmarks/kernel_sweep.py`` without a GPU: ``--list`` enumerates every config of each
group's kernel on its 3 shapes (the class default first) and the peers; a run without CUDA
refuses in one line (exit 2); ``--smoke`` runs every path of the sweep on small shapes in
Triton's interpreter (recording, replay with forced configs, the check against the default,
rows and tables) and budgets itself.

The script runs as a script once (:func:`smoke`: one interpreted run whose rows three tests
read); ``--list``, the refusal and the budget run its ``main`` in this process (:func:`_main`),
which spares each a second interpreter importing torch, pandas and the harness."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
import torch

pytest.importorskip("triton")

from implementations.triton_kernels import autotune, plan_tables

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "benchmarks" / "kernel_sweep.py"
GROUP_KERNELS = {"fwd": "band_fwd", "dq": "band_dq", "dkdv": "band_dkdv", "band": "band_fwd",
                 "decode": "band_fwd_split"}


def _sweep(*args: str, interpret: bool = False, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    if interpret:  # NumPy's OpenBLAS on one thread, as in the kernel tests (their conftest)
        env["TRITON_INTERPRET"] = "1"
        env["OPENBLAS_NUM_THREADS"] = "1"
    return subprocess.run([sys.executable, str(SWEEP), *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=timeout)


def _load() -> ModuleType:
    """A fresh copy of the script's module (its module-level state its own)."""
    spec = importlib.util.spec_from_file_location("kernel_sweep", SWEEP)
    module = importlib.util.module_from_spec(spec)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "kernel_sweep", module)  # its dataclasses look it up
        spec.loader.exec_module(module)
    return module


def _main(sweep: ModuleType, *args: str) -> subprocess.CompletedProcess:
    """``kernel_sweep.py args`` run by ``sweep.main`` in this process, as a finished process:
    its exit status and what it printed."""
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        mp.setattr(sys, "argv", [str(SWEEP), *args])
        code = sweep.main()
    return subprocess.CompletedProcess([str(SWEEP), *args], code, out.getvalue(), err.getvalue())


def _table(stdout: str) -> list[list[str]]:
    lines = [line for line in stdout.splitlines() if line.startswith("|")][2:]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


@pytest.fixture(scope="module")
def sweep() -> ModuleType:
    """The script's module, loaded once for the runs that change none of its state."""
    return _load()


@pytest.fixture(scope="module")
def hopper_schedule(sweep) -> subprocess.CompletedProcess:
    """``--list --capability 9.0`` of every group: one run read by the two schedule tests."""
    return _main(sweep, "--list", "--capability", "9.0")


SMOKE_PEERS = ("sdpa", "flash-tiled", "flash-tiled-tma", "flash-tiled-ws", "sdpa-cudnn")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[subprocess.CompletedProcess, list[dict], Path]:
    """One ``--smoke`` run of the script, in Triton's interpreter (sm_90 class): decode (split-KV
    and combine replayed together), the dQ kernel of a backward call and the forward, two
    configs each, forced, then the candidates (decode's other split rules, dQ's and the
    forward's Hopper ones); SDPA beside each shape, our backward at its defaults and with
    dQ's and dK/dV's first TMA and first warp-specialized candidates, SDPA's cuDNN backward.
    (The process, its rows, its folder.) The budget is wide: this run's rows must all run."""
    out = tmp_path_factory.mktemp("smoke") / "sweep"
    result = _sweep("--smoke", "--groups", "decode", "dq", "fwd", "--cases", "decode-32k-mha",
                    "d64", "--configs", "2", "--peers", *SMOKE_PEERS, "--capability", "9.0",
                    "--minutes", "10", "--out", str(out), interpret=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    return result, rows, out


def test_list_enumerates_every_config_of_each_group_on_three_shapes(hopper_schedule):
    result = hopper_schedule
    assert result.returncode == 0, result.stderr
    rows = _table(result.stdout)
    ours = [r for r in rows if r[2] == "flash-tiled" and r[3] != "backward"]
    for group, kernel in GROUP_KERNELS.items():
        mine = [r for r in ours if r[0] == group]
        assert {r[3] for r in mine} == {kernel}
        cases = list(dict.fromkeys(r[1] for r in mine))
        assert len(cases) == 3
        for case in cases:
            listed = [r[4] for r in mine if r[1] == case]
            d = 64 if case in ("d64", "w256-16k", "w256-64k") else 128
            want = [autotune.config_label(c) for c in autotune.class_configs(kernel, d, (9, 0))]
            assert listed[: len(want)] == want  # the class's list, then any candidates
            assert next(r[5] for r in mine if r[1] == case) == "True"  # the default first
    peers = {(r[0], r[2], r[3]) for r in rows if r[2] != "flash-tiled" or r[3] == "backward"}
    for peer in ("sdpa", "sdpa-flash", "flex"):
        assert {("fwd", peer, "forward"), ("decode", peer, "forward"),
                ("bwd", peer, "backward")} <= peers
    assert ("bwd", "flash-tiled", "backward") in peers
    assert f"{len(rows)} rows: {len(ours)} kernel configs" in result.stdout


def test_the_schedule_lists_the_backward_hopper_candidates_beside_sdpa_cudnn(hopper_schedule,
                                                                           sweep):
    """On sm_90 every dQ and dK/dV candidate (TMA, warp-specialized) is listed on each dense
    shape after the class's configs, and the whole backward runs with the first TMA and the
    first warp-specialized ones beside ours at the defaults, SDPA's default and its cuDNN
    backward by name (read from the schedule of every group); on sm_80 (``--groups dq dkdv``)
    none of them."""
    result = hopper_schedule
    assert result.returncode == 0, result.stderr
    rows = _table(result.stdout)
    for group, kernel in (("dq", "band_dq"), ("dkdv", "band_dkdv")):
        for case, d in (("d128", 128), ("d64", 64), ("d128-causal", 128)):
            want = [autotune.config_label(c) for c in autotune.candidate_configs(kernel, d,
                                                                                 (9, 0))]
            assert want and all("tma" in w.split() for w in want)
            assert any("ws" in w.split() for w in want)
            got = [r[4] for r in rows if r[0] == group and r[1] == case and r[6] == "True"]
            assert got == want, (group, case)
    bwd = {(r[1], r[2]): r[4] for r in rows if r[0] == "bwd"}
    for case, d in (("d128", 128), ("d64", 64), ("d128-causal", 128)):
        assert {"flash-tiled", "sdpa", "sdpa-cudnn"} <= {impl for c, impl in bwd if c == case}
        for impl, ws in (("flash-tiled-tma", False), ("flash-tiled-ws", True)):
            picks = [next(c for c in autotune.candidate_configs(k, d, (9, 0))
                          if bool(c.kwargs.get("WS")) == ws) for k in ("band_dq", "band_dkdv")]
            labels = [autotune.config_label(c) for c in picks]
            assert bwd[case, impl] == f"dq {labels[0]} + dkdv {labels[1]}"
    ampere = _table(_main(sweep, "--list", "--capability", "8.0", "--groups", "dq",
                          "dkdv").stdout)
    assert ampere and not any("tma" in r[4] or r[2] in ("flash-tiled-tma", "flash-tiled-ws")
                              for r in ampere)
    assert {r[2] for r in ampere if r[0] == "bwd"} >= {"flash-tiled", "sdpa-cudnn"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's run (CPU)")
def test_the_whole_backward_runs_with_the_hopper_candidates(smoke):
    """Our backward with dQ's and dK/dV's first TMA and first warp-specialized candidates, in
    the interpreter (sm_90 class), after our listed configs; SDPA's cuDNN backward is skipped
    with its reason off CUDA."""
    _, rows, _ = smoke
    peers = {r["impl"]: r for r in rows if r["kernel"] == "backward"}
    assert set(peers) == {"flash-tiled", "sdpa", "flash-tiled-tma", "flash-tiled-ws",
                          "sdpa-cudnn"}
    for impl in ("flash-tiled-tma", "flash-tiled-ws"):
        assert peers[impl]["status"] == "ok" and peers[impl]["ms"] > 0, peers[impl]
        assert "tma" in peers[impl]["config"] and "dkdv" in peers[impl]["config"]
    assert ("ws" in peers["flash-tiled-ws"]["config"].split()
            and "ws" not in peers["flash-tiled-tma"]["config"].split())
    assert peers["sdpa-cudnn"]["status"] == "skipped: cuDNN attention is CUDA's"
    candidates = [r for r in rows if r["candidate"]]
    assert candidates and all(r["status"] == "ok" and r["rel_err"] <= 2e-2 for r in candidates)
    order = [r["impl"] for r in rows]
    assert order.index("sdpa-cudnn") < order.index("flash-tiled-tma")  # with the candidates


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU refusal")
def test_without_a_gpu_it_exits_2_with_one_line(tmp_path, sweep):
    result = _main(sweep, "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kernel_sweep: no CUDA GPU here"), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's run (CPU)")
def test_smoke_runs_every_path_and_checks_each_config_against_the_default(smoke):
    """Decode (split-KV and combine replayed together) and the dQ kernel of a backward call,
    two configs each, forced, then the candidates (decode's other split rules, dQ's Hopper
    ones); every row ok and within the tolerance of the default's output; our backward and
    SDPA's beside them."""
    result, rows, out = smoke
    ours = [r for r in rows if r["impl"] == "flash-tiled" and r["kernel"] != "backward"]
    mine = [r for r in ours if r["kernel"] != "band_fwd"]  # the forward's: the next test's
    n_hopper = len(autotune.candidate_configs("band_dq", 64, (9, 0)))
    assert n_hopper and all(r["config"].split()[3] == "tma" for r in mine[-n_hopper:])
    assert [(r["kernel"], r["case"], r["default"]) for r in mine] == [
        ("band_fwd_split", "decode-32k-mha", True), ("band_fwd_split", "decode-32k-mha", False),
        ("band_dq", "d64", True), ("band_dq", "d64", False),
        *[("band_fwd_split", "decode-32k-mha", False)] * 3,  # the split rule at 1, 4, 8 waves
        *[("band_dq", "d64", False)] * n_hopper]  # dQ's Hopper candidates (sm_90 class)
    waves = [r for r in ours if "waves=" in r["config"]]
    assert [r["config"].split()[-1] for r in waves] == ["waves=1", "waves=4", "waves=8"]
    assert all(r["candidate"] and r["splits"] > 1 for r in waves)  # 301 keys in 64-key chunks
    assert all(r["status"] == "ok" for r in ours), ours
    assert all(r["rel_err"] <= 2e-2 and r["ms"] > 0 and r["bytes"] > 0 for r in ours)
    peers = {(r["group"], r["impl"], r["kernel"]): r for r in rows if r not in ours}
    assert set(peers) == {("decode", "sdpa", "forward"), ("fwd", "sdpa", "forward"),
                          *(("bwd", impl, "backward") for impl in SMOKE_PEERS)}
    assert all(r["status"] == "ok" for k, r in peers.items() if k[1] != "sdpa-cudnn")
    assert "torch's choice" in peers["decode", "sdpa", "forward"]["backend"]
    assert (out / "sweep.md").read_text().count("band_dq") == 2 + n_hopper
    assert "best" in result.stdout and "0 skipped for the budget" in result.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's run (CPU)")
def test_the_hopper_candidates_run_after_the_listed_configs_against_the_default(smoke):
    """The forward's TMA candidates (sm_90 class) forced in the interpreter: each agrees with
    the default's output; they come after the class's configs and the peers."""
    _, rows, _ = smoke
    rows = [r for r in rows if r["group"] == "fwd"]
    order = [(r["impl"], bool(r["candidate"])) for r in rows]
    assert order == [("flash-tiled", False), ("flash-tiled", False), ("sdpa", False),
                     *[("flash-tiled", True)] * (len(rows) - 3)]
    tma = [r for r in rows if r["candidate"]]
    assert len(tma) >= 2 and all("tma" in r["config"].split() for r in tma)
    assert all(r["status"] == "ok" and r["rel_err"] <= 2e-2 for r in tma), tma


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's run (CPU)")
def test_what_does_not_fit_the_budget_is_skipped_and_said(tmp_path, monkeypatch):
    """In this process (a copy of the module of its own: --smoke shrinks its shapes), under
    the interpreter as the conftest sets it; what --smoke sets elsewhere is put back after."""
    monkeypatch.setattr(plan_tables, "MIN_SPLIT_KEYS", plan_tables.MIN_SPLIT_KEYS)
    monkeypatch.setenv(autotune.TUNING_ENV, os.environ.get(autotune.TUNING_ENV, "off"))
    out = tmp_path / "sweep"
    result = _main(_load(), "--smoke", "--groups", "fwd", "--minutes", "0.05", "--peers",
                   "sdpa", "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert rows and all(r["status"].startswith("skipped: budget") for r in rows)
    assert f"({len(rows)} skipped for the budget, 0 failed)" in result.stdout


def test_compiles_ahead_stop_at_their_share_of_the_budget(monkeypatch, sweep):
    """Compiles go 2·workers at a time through triton.AsyncCompileMode until 40% of the budget
    is spent; the rest compile when first run (faked compiles of 0.15 s, one worker)."""
    monkeypatch.setattr(sweep.autotune, "interpreted", lambda: False)
    compiled = []

    class Job:
        def compile(self, config):
            time.sleep(0.15)
            compiled.append(config)

    jobs = [(Job(), i) for i in range(10)]
    budget = sweep.Budget(1.0)
    assert sweep.compile_all(jobs, 1, budget)[0] == 10 and compiled == list(range(10))
    compiled.clear()
    budget.end = budget.start + 0.5  # 0.2 s to compile ahead: one chunk of two
    done, seconds = sweep.compile_all(jobs, 1, budget)
    assert done == 2 and compiled == [0, 1] and seconds < 1.0
