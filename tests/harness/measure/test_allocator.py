"""The host allocator's fixed state (harness/measure/allocator.py, docs/noise.md "Two modes of
the memory-heavy points"): what glibc does with a large block once it is applied, that every
process which measures on a CPU applies it and its rows say so, and that peak memory stays the
call's own. Assertions read the allocator's bookkeeping and page-fault counters, never a time."""

from __future__ import annotations

import ctypes
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.cli import main
from harness.errors import CliError
from harness.execute.isolate import point_task, run_isolated
from harness.measure import allocator
from harness.measure.device import CpuDevice, profiler_peak_bytes, rss_hwm_peak_bytes
from harness.measure.timing import TimingConfig, measure
from harness.sweep.suite import MeasureConfig, Suite, load_suite

ROOT = Path(__file__).resolve().parents[3]
MiB = 2**20
BLOCK = 16 * MiB  # a score matrix of n = 1024, four heads: under the fixed 32 MiB threshold
LARGE = 64 * MiB  # above it (and above glibc's largest moving threshold): always mmapped

glibc_only = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc"
    or allocator.mallinfo() is None,
    reason="the allocator settings are glibc's (counters read by mallinfo2: glibc >= 2.33)",
)

# Run in a fresh interpreter (the allocator's state is per process): make the CPU device as a
# run does, then for each block size in turn allocate, touch, free and reallocate one block;
# report glibc's counters for each.
PROBE = """
import json, resource, torch
from harness.measure.allocator import mallinfo
from harness.measure.device import CpuDevice

torch.set_num_threads(1)  # every page is touched by this thread, whose faults are counted
device = CpuDevice()

def cycle(floats):
    faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    x = torch.empty(floats).fill_(1.0)
    held = mallinfo()
    del x
    freed = mallinfo()
    return (resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - faults, held, freed)

found = {{}}
for block in {blocks}:
    _, held, freed = cycle(block // 4)
    faults = [cycle(block // 4)[0] for _ in range(3)]
    found[block] = {{"state": device.malloc_tuning, "mmapped_while_held": held["hblkhd"],
                    "heap_kept_after_free": freed["arena"], "heap_while_held": held["arena"],
                    "later_cycle_faults": faults}}
print(json.dumps(found))
"""


def probe(malloc_env: str | None, *blocks: int) -> dict[int, dict]:
    """Block size -> what :data:`PROBE` found for it, the blocks probed in the order given in
    one fresh process."""
    env = {k: v for k, v in os.environ.items() if k != allocator.MALLOC_ENV}
    if malloc_env is not None:
        env[allocator.MALLOC_ENV] = malloc_env
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(blocks=list(blocks))],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return {int(block): found for block, found in json.loads(out.stdout).items()}


@pytest.fixture(scope="module")
def tuned() -> dict[int, dict]:
    """The tuned state's probe of both sizes, in one process (each process imports torch:
    seconds): BLOCK first, in a fresh process as a run's first such block; then LARGE, whose
    fate the tuned state fixes whatever came before (a fixed threshold does not move)."""
    return probe(None, BLOCK, LARGE)


@glibc_only
def test_tuned_a_block_under_32_mib_comes_from_the_heap_and_stays_there(tuned):
    """Tuned: a 16 MiB block (one n = 1024 score matrix) is heap memory, not mmapped, and the
    heap keeps it after free. Whether the next such block reuses those pages is not asserted:
    under CPU contention torch's block sometimes lands 16 MiB + 128 B higher each cycle (a
    small allocation taken from the freed block's tail), in fresh pages (docs/noise.md, what
    the tuning does not fix)."""
    found = tuned[BLOCK]
    assert found["state"] == allocator.TUNED
    assert found["mmapped_while_held"] < BLOCK
    assert found["heap_kept_after_free"] >= BLOCK


@glibc_only
def test_untuned_the_first_such_block_is_mmapped():
    """The control: glibc as it comes starts with a 128 KiB threshold, so a fresh process's
    first 16 MiB block is mmapped (its later ones depend on what was freed before: the two
    modes), and the tuned test above would fail if tune() changed nothing."""
    found = probe("default", BLOCK)[BLOCK]
    assert found["state"] == allocator.DEFAULT
    assert found["mmapped_while_held"] >= BLOCK


@glibc_only
def test_tuned_a_block_of_32_mib_or_more_is_still_mmapped(tuned):
    """The boundary: from 32 MiB up a block comes from mmap in the tuned state too (fresh pages
    every call, as glibc always gave a block that large), so the heap never holds one."""
    found = tuned[LARGE]
    assert found["state"] == allocator.TUNED
    assert found["mmapped_while_held"] >= LARGE


SUITE = """name = "alloc"
scenario = "attention"
implementations = ["full"]
device = "cpu"
[fixed]
batch = 1
heads = 2
head_dim = 16
dtype = "float32"
seq_len = 97
[measure]
budget_s = 0.02
min_samples = 2
threads = 1
passes = 2
"""


def _suite(tmp_path: Path) -> tuple[Suite, Path]:
    path = tmp_path / "alloc.toml"
    path.write_text(SUITE)
    return load_suite(path), path


@glibc_only
def test_an_isolated_worker_applies_it_and_its_row_says_so(tmp_path, monkeypatch):
    """A point's child process (``--isolate``) makes its CPU device, so it times in the tuned
    state, and its row's ``malloc_tuning`` names that state."""
    monkeypatch.delenv(allocator.MALLOC_ENV, raising=False)
    suite, _ = _suite(tmp_path)
    config: MeasureConfig = suite.measure
    payload = {
        "point": suite.points[0].fields(),
        "config": config,
        "mem_budget": None,
        "pass_index": 0,
    }
    outcome = run_isolated(point_task, payload, timeout_s=300)
    assert outcome.result is not None, outcome.reason
    assert outcome.result["status"] == "ok", outcome.result.get("reason")
    assert outcome.result["malloc_tuning"] == allocator.TUNED


@glibc_only
def test_a_run_writes_the_state_in_rows_and_env(tmp_path, monkeypatch):
    """In-process ``attnbench run``: every row and ``env.json`` carry ``malloc_tuning``."""
    monkeypatch.delenv(allocator.MALLOC_ENV, raising=False)
    _, path = _suite(tmp_path)
    out = tmp_path / "run"
    assert main(["run", str(path), "--out", str(out), "--no-progress", "--no-table"]) == 0
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert rows and all(r["malloc_tuning"] == allocator.state() for r in rows)
    assert allocator.state() in (allocator.TUNED, allocator.DEFAULT)
    assert json.loads((out / "env.json").read_text())["malloc_tuning"] == allocator.state()


def test_a_measurement_on_a_cpu_device_records_the_state():
    m = measure(
        lambda: torch.ones(8).sum(),
        CpuDevice(),
        TimingConfig(budget_s=0.01, min_samples=2, max_samples=3, min_sample_s=0.0),
    )
    assert m.columns()["malloc_tuning"] == allocator.state() != allocator.UNTUNED


def test_a_bad_setting_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(allocator.MALLOC_ENV, "jemalloc")
    with pytest.raises(CliError, match="ATTNBENCH_MALLOC='jemalloc': expected one of tuned"):
        allocator.setting()
    _, path = _suite(tmp_path)
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "ATTNBENCH_MALLOC" in err


@glibc_only
def test_memory_readings_stay_the_calls_own_in_the_tuned_state():
    """The tuned heap keeps freed pages resident, yet both CPU methods still read the call's
    own 16 MiB every time: the profiler sums torch's allocation events, and the RSS method
    trims the heap first (without that its second reading would be ~0: the pages are kept)."""
    CpuDevice()  # this process tuned, as in a run
    if allocator.state() != allocator.TUNED:
        pytest.skip(f"allocator not tuned here: {allocator.state()}")

    def call():
        return torch.empty(BLOCK // 4).fill_(1.0)

    for _ in range(2):
        assert profiler_peak_bytes(call) == BLOCK
        assert abs(rss_hwm_peak_bytes(call) - BLOCK) < 2 * MiB


@glibc_only
def test_release_keeps_a_small_free_heap_and_hands_a_large_one_back(monkeypatch):
    """Between points ``release_memory`` leaves a free heap of up to RELEASE_ABOVE resident
    (the next pass reuses touched pages) and trims a larger one (RSS drops by the freed block),
    so a large point's memory does not stay resident through a run."""
    device = CpuDevice()
    if allocator.state() != allocator.TUNED:
        pytest.skip(f"allocator not tuned here: {allocator.state()}")
    for above, trims in ((2**40, False), (0, True)):
        monkeypatch.setattr(allocator, "RELEASE_ABOVE", above)
        ctypes.CDLL(None).malloc_trim(0)
        x = torch.empty(BLOCK // 4).fill_(1.0)
        del x
        kept = _rss()
        device.release_memory()
        if trims:
            assert kept - _rss() >= BLOCK - 2 * MiB
        else:
            assert abs(kept - _rss()) < 2 * MiB


def _rss() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmRSS:"))
