"""lease/warm_cache.py and lease/triton_listen: the carried Triton cache.

Whether the cache hits on a GPU can only be proven there (docs/lease.md); here: the
manifest check refuses a cache made for another Triton and installs nothing, pruning keeps the
three kinds of file a launch reads, an install lands under the fixed path, the stand-in
arguments specialize as torch tensors do, and the listener records compiles (a real sm_90
compile on this CPU where Triton's NVIDIA backend is present) and counts the misses.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LISTEN = ROOT / "lease" / "triton_listen"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


warm_cache = _load("warm_cache", ROOT / "lease" / "warm_cache.py")
cache = warm_cache.tc  # lease/triton_cache.py, as warm_cache imports it
triton_misses = _load("triton_misses", LISTEN / "triton_misses.py")


def _nvidia_triton() -> str | None:
    """Why the tests that run Triton's NVIDIA backend skip here (None: they run)."""
    if importlib.util.find_spec("triton") is None:
        return "triton not installed"
    try:
        from triton.backends.nvidia.compiler import get_ptxas  # noqa: F401
    except Exception as exc:  # any failure to import is the reason
        return f"triton's NVIDIA backend does not import: {exc}"
    return None


needs_triton = pytest.mark.skipif(_nvidia_triton() is not None, reason=str(_nvidia_triton()))

FACTS = {"triton": "3.6.0", "python": "3.12", "ptxas": "ptxas V12.8.93", "triton_key": "k1",
         "arch": "sm_90", "env": {}}


def _cache_folder(tmp_path: Path, manifest: dict, files: dict[str, bytes]) -> Path:
    """A --out folder: manifest.json and cache.tar.gz holding ``files``."""
    src, out = tmp_path / "src", tmp_path / "out"
    for name, data in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    out.mkdir()
    cache.pack(src, out / cache.ARCHIVE)
    (out / cache.MANIFEST).write_text(json.dumps(manifest))
    return out


KERNEL = {"AB12/__grp__band_fwd.json": b"{}", "AB12/band_fwd.json": b"{}",
          "AB12/band_fwd.cubin": b"\x7fELF"}


@pytest.mark.parametrize("field, value", [("triton", "3.5.1"), ("ptxas", "ptxas V13.0.48"),
                                          ("triton_key", "other"), ("python", "3.11"),
                                          ("env", {"TRITON_DEFAULT_FP_FUSION": "1"})])
def test_a_cache_for_another_triton_is_refused_and_nothing_installed(tmp_path, field, value):
    folder = _cache_folder(tmp_path, {**FACTS, field: value}, KERNEL)
    target = tmp_path / "cache"
    said = cache.install(folder, target, FACTS)
    assert len(said) == 1 and said[0].startswith(f"compiling: cache is for {field} ")
    assert not target.exists() or not any(target.rglob("*"))


def test_a_matching_cache_installs_its_files(tmp_path):
    folder = _cache_folder(tmp_path, FACTS, KERNEL)
    target = tmp_path / "cache"
    said = cache.install(folder, target, {**FACTS, "arch": None})  # no GPU: arch unchecked
    assert said == [f"triton cache: 3 files of cache.tar.gz installed in {target}"]
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file()) == sorted(
        KERNEL)


def test_a_folder_without_a_cache_says_so(tmp_path):
    said = cache.install(tmp_path, tmp_path / "cache", FACTS)
    assert said[0].startswith("compiling: cache is for nothing")


def test_prune_keeps_exactly_group_metadata_and_cubin(tmp_path):
    names = ["__grp__band_fwd.json", "band_fwd.json", "band_fwd.cubin", "band_fwd.ttir",
             "band_fwd.ttgir", "band_fwd.llir", "band_fwd.ptx", "band_fwd.source",
             "__triton_launcher.so"]
    for name in names:
        (tmp_path / "H" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "H" / name).write_text("x")
    kept, deleted = cache.prune(tmp_path)
    left = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert left == ["__grp__band_fwd.json", "band_fwd.cubin", "band_fwd.json"]
    assert (kept, deleted) == (3, len(names) - 3)


def test_a_harvest_beside_the_cache_is_checked_by_its_own_manifest(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # none here
    folder = _cache_folder(tmp_path, FACTS, KERNEL)
    lease = tmp_path / "lease"
    (lease / "CD34").mkdir(parents=True)
    (lease / "CD34" / "__triton_launcher.so").write_bytes(b"\x7fELF")
    (lease / "CD34" / "band_fwd.ttir").write_text("not carried")
    cache.harvest(folder / cache.HARVEST, lease, {**FACTS, "triton_key": "lease"})
    with tarfile.open(folder / cache.HARVEST) as tar:
        assert sorted(tar.getnames()) == ["manifest.json", "triton/CD34/__triton_launcher.so"]
    said = cache.install(folder, tmp_path / "cache", FACTS)
    assert said[0].startswith("triton cache: 3 files")
    assert said[1].startswith("compiling: cache is for triton_key lease")
    assert not (tmp_path / "cache" / "CD34").exists()


@functools.cache
def _running_facts() -> dict:
    """This Python's facts, once (torch's import and hashing libtriton.so take seconds)."""
    return cache.running_facts()


def _compiling_env(**extra: str) -> dict[str, str]:
    """This environment for a process that compiles: without TRITON_INTERPRET (the test
    suite sets it; kernels imported under it are interpreted functions)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return {**env, **extra}


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    script = ROOT / "lease" / "warm_cache.py"
    return subprocess.run([sys.executable, str(script), *args],
                          capture_output=True, text=True, timeout=300, env=_compiling_env(**env))


@needs_triton
def test_install_refuses_another_cache_dir(tmp_path):
    folder = _cache_folder(tmp_path, FACTS, KERNEL)
    done = _cli("--install", str(folder), TRITON_CACHE_DIR=str(tmp_path / "elsewhere"))
    assert done.returncode == 0
    assert done.stdout.startswith(
        f"compiling: cache is for TRITON_CACHE_DIR={cache.CACHE_DIR}")
    assert not (tmp_path / "elsewhere").exists()


@needs_triton
def test_install_of_a_cache_for_another_triton_prints_the_line_and_installs_nothing(tmp_path):
    name = f"attnbench-test-{os.getpid()}-refused"
    folder = _cache_folder(tmp_path, {**_running_facts(), "triton": "0.0.1"},
                           {f"{name}/band_fwd.cubin": b"\x7fELF"})
    done = _cli("--install", str(folder), TRITON_CACHE_DIR=cache.CACHE_DIR)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("compiling: cache is for triton 0.0.1, ")
    assert not (Path(cache.CACHE_DIR) / name).exists()


def test_warming_under_the_interpreter_is_refused(tmp_path):
    done = _cli("--arch", "sm_90", "--out", str(tmp_path / "out"), TRITON_INTERPRET="1")
    assert done.returncode == 2 and done.stderr.startswith("warm_cache: unset TRITON_INTERPRET")
    assert not (tmp_path / "out").exists()


def test_an_unwritable_out_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "file").write_text("")
    done = _cli("--harvest", str(tmp_path / "file" / "h.tar.gz"))
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("warm_cache: ")


@needs_triton
def test_install_lands_under_the_fixed_path(tmp_path):
    facts = _running_facts()
    name = f"attnbench-test-{os.getpid()}"  # a key folder no compile makes
    folder = _cache_folder(tmp_path, facts, {f"{name}/band_fwd.cubin": b"\x7fELF"})
    landed = Path(cache.CACHE_DIR) / name / "band_fwd.cubin"
    try:
        done = _cli("--install", str(folder), TRITON_CACHE_DIR=cache.CACHE_DIR)
        assert done.returncode == 0, done.stderr
        assert "1 files of cache.tar.gz installed" in done.stdout
        assert landed.read_bytes() == b"\x7fELF"
    finally:
        landed.unlink(missing_ok=True)
        landed.parent.rmdir() if landed.parent.exists() else None


@needs_triton
def test_stand_in_arguments_specialize_as_torch_tensors():
    import torch
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import native_specialize_impl

    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.int32, torch.int64):
        t = torch.empty(64, dtype=dtype)
        name = str(dtype).removeprefix("torch.")
        for tensor, aligned in ((t, True), (t[1:], False)):
            got = native_specialize_impl(BaseBackend, cache._Arg(name, aligned), False, True,
                                         True)
            assert got == native_specialize_impl(BaseBackend, tensor, False, True, True)


def test_the_smoke_suites_fused_calls_are_enumerated():
    pytest.importorskip("triton")
    shapes = warm_cache.suite_shapes(("gpu-smoke",))
    # local (window 255, causal) and flash-tiled (causal and not) at n 1024 and 4096, B2 D64
    masks = {(s[3][0].causal, s[3][0].window) for s in shapes}
    assert masks == {(False, None), (True, None), (True, (255, 0))}
    assert {(s[0], s[1], s[3][1]) for s in shapes} == {(2, 64, 1024), (2, 64, 4096)}


def test_the_smoke_jobs_are_every_listed_sm90_config_of_each_mask_once():
    pytest.importorskip("triton")
    from implementations._kernels.triton import aot_check

    jobs = warm_cache.compile_jobs("sm_90", ("gpu-smoke",))
    assert json.loads(json.dumps(jobs)) == jobs  # carried to the compile process as JSON
    listed = aot_check.listed(aot_check.record("band", 64)[0], "sm_90")  # band_fwd, D 64
    assert len(listed) > 1 and {job["kernel"] for job in jobs} == {"band_fwd"}
    # three masks (full, causal, causal window 255); n 1024 and 4096 specialize alike
    assert len(jobs) == 3 * len(listed)
    keys = {(job["config"], json.dumps(job["args"]), json.dumps(job["kwargs"], sort_keys=True))
            for job in jobs}
    assert len(keys) == len(jobs)


def test_the_paged_decode_is_warmed_at_both_page_sizes_with_every_listed_config():
    """The GPU serving suite's paged decode (D 128, bf16, pages of 16 and 64 tokens): each
    split launch with every sm_90 config its autotuner may time, each combine with its own."""
    pytest.importorskip("triton")
    from implementations._kernels.triton import autotune

    recorded = warm_cache.paged_launches("sm_90")
    assert [r[0] for r in recorded] == ["paged_decode", "paged_combine"] * 2
    split = [r for r in recorded if r[0] == "paged_decode"]
    assert {r[3]["PAGE"] for r in split} == {16, 64}
    listed = autotune.class_configs("paged_decode", 128, (9, 0))
    assert all(r[4] == listed and r[5] == 128 for r in split) and len(listed) > 1
    jobs = [j for r in recorded for j in warm_cache._jobs("suites", *r)]
    assert {j["kernel"] for j in jobs} == {"paged_decode", "paged_combine"}
    assert json.loads(json.dumps(jobs)) == jobs


# -- the listener ---------------------------------------------------------------------------

def test_record_appends_a_line_per_compile_and_count_counts_misses(tmp_path, monkeypatch):
    path = tmp_path / "compiles.jsonl"
    monkeypatch.setenv(triton_misses.ENV, str(path))

    class Src:
        name = "band_fwd"

    class Times:
        total = 2_500_000

    triton_misses.record(src=Src(), metadata={"hash": "ab"}, metadata_group={}, times=Times(),
                         cache_hit=False)
    triton_misses.record(src=Src(), metadata={}, metadata_group={}, times=Times(), cache_hit=True)
    with open(path, "a") as fh:
        fh.write("not json\n")
    assert triton_misses.count(path) == {"compiles": 2, "hits": 1, "misses": 1, "miss_s": 2.5,
                                         "kernels": {"band_fwd": 1}}
    assert triton_misses.summary_line(path) == (
        "triton compiles: 2 (1 hits, 1 misses: 2.5 s; band_fwd x1)")
    assert triton_misses.count(tmp_path / "absent")["compiles"] == 0


def test_the_summary_line_from_the_command_line(tmp_path):
    path = tmp_path / "compiles.jsonl"
    path.write_text(triton_misses.line("band_dq", False, 3_000_000) + "\n")
    done = subprocess.run([sys.executable, str(LISTEN / "triton_misses.py"), str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "triton compiles: 1 (0 hits, 1 misses: 3.0 s; band_dq x1)"


def test_record_without_the_variable_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(triton_misses.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    triton_misses.record(src=None, metadata={}, metadata_group={}, times=None, cache_hit=False)
    assert not any(tmp_path.iterdir())


def test_sitecustomize_chains_to_the_next_one_and_needs_no_triton(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['CHAINED'] = 'yes'\n")
    code = "import os, sys; print(os.environ.get('CHAINED'), 'triton' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": f"{LISTEN}{os.pathsep}{other}",
           triton_misses.ENV: str(tmp_path / "c.jsonl")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["yes", "False"]  # chained; Triton not imported on our behalf


KERNEL_SCRIPT = """
import sys
sys.path.insert(0, {bench!r})
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
import triton_cache

@triton.jit
def copy(x, y, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(y + o, tl.load(x + o, mask=o < n), mask=o < n)

class Target:
    target = GPUTarget("cuda", 90, 32)
    def get_current_device(self): return 90
    def get_current_stream(self, device=None): return 0
    def get_current_target(self): return self.target
    def is_active(self): return True

driver.set_active(Target())
arg = triton_cache._Arg("float32", True)
copy.warmup(arg, arg, 100, BLOCK=128, grid=(1,))
"""


@needs_triton
def test_the_listener_sees_a_real_compile_miss_then_hit(tmp_path):
    """A tiny kernel compiled for sm_90 on this CPU twice in two processes, one cache: a miss,
    then a hit; both lines counted."""
    script = tmp_path / "k.py"
    script.write_text(KERNEL_SCRIPT.format(bench=str(ROOT / "lease")))
    log = tmp_path / "compiles.jsonl"
    env = _compiling_env(PYTHONPATH=str(LISTEN), TRITON_CACHE_DIR=str(tmp_path / "cache"),
                         **{triton_misses.ENV: str(log)})
    for _ in range(2):
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              timeout=300, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["kernel"], r["hit"]) for r in rows] == [("copy", False), ("copy", True)]
    counted = triton_misses.count(log)
    assert (counted["misses"], counted["hits"]) == (1, 1) and counted["miss_s"] > 0
