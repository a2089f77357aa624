"""Shared fixtures: fresh seeded random inputs (never zeros) at deliberately odd sizes."""

from __future__ import annotations

import atexit
import contextlib
import copy
import gc
import json
import os
import shutil
import sys
import tempfile
from typing import ClassVar

import numpy as np
import pytest
import torch

# Without a GPU the fused Triton kernels run in Triton's NumPy interpreter. The flag is read
# when a kernel is defined, so it is set here, before any test imports the kernel modules.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# The fused kernels launch their class default config, not autotuned (one compile per kernel and
# mask mode; on a GPU autotuning compiles and times every config); one test autotunes on purpose.
os.environ.setdefault("ATTNBENCH_AUTOTUNE", "off")

# Probe outcomes the tests' runs record go to a scratch cache, not the user's (harness.probecache);
# set in the environment, so the CLI subprocesses that tests start use it too.
# Made once, by the first process (pytest-xdist's workers inherit it), and removed when that
# process exits: before, every worker and every inner pytest made one and none was removed.
if "ATTNBENCH_CACHE_DIR" not in os.environ:
    os.environ["ATTNBENCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="attnbench-test-cache-")
    atexit.register(shutil.rmtree, os.environ["ATTNBENCH_CACHE_DIR"], ignore_errors=True)

# after the environment above: loading the plug-ins defines the Triton kernels
from harness import registry
from harness.measure import calibrate
from harness.measure.device import profiler_peak_bytes
from harness.spec import Problem


class InterpreterProducts(torch.overrides.TorchFunctionMode):
    """Float32 CPU matrix products (``@``, ``matmul``, ``bmm``) computed by NumPy, as Triton's
    interpreter computes ``tl.dot`` (``np.matmul``): a naive same-dtype evaluation under this
    mode rounds its products in the order the interpreted kernel does.

    Why: the agreement rule scales a path's error by the naive evaluation's. The interpreter's
    products go through NumPy's OpenBLAS, whose kernels (``OPENBLAS_CORETYPE``: Haswell on
    this machine kind's AMD CPUs, SkylakeX on its Intel ones) sum a 256-term dot product in
    different orders, while torch's go through MKL: FAVOR+'s large logits (terms of one sign
    summing to ~256) then carry 3x the naive error under one BLAS and 1x under another. With
    both sides in the same arithmetic the scale holds on every BLAS (measured: the fused
    FAVOR+ error equals this naive's to 1 % under Haswell, Sandybridge, Nehalem and Katmai)."""

    PRODUCTS: ClassVar = frozenset(
        {torch.matmul, torch.bmm, torch.Tensor.__matmul__, torch.Tensor.matmul}
    )

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.PRODUCTS and not kwargs and all(
            isinstance(x, torch.Tensor) and x.device.type == "cpu" and x.dtype == torch.float32
            for x in args[:2]
        ):
            a, b = (x.detach().numpy() for x in args[:2])
            return torch.from_numpy(np.matmul(a, b))
        return func(*args, **kwargs)


def kernel_arithmetic() -> contextlib.AbstractContextManager:
    """The products of the arithmetic the fused kernels run in here: NumPy's under Triton's
    interpreter (:class:`InterpreterProducts`), torch's own on a GPU. A naive evaluation
    that scales a kernel's error is made under it."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available()
    return InterpreterProducts() if interpreted else contextlib.nullcontext()


COMPILE_HEAVY = ("_kernels/triton/test_masked_attention.py", "gradients")
"""Tests whose node id holds both strings compile a forward and two backward kernels for their
mask mode: 40-85 s each on the H100's 16 busy cores (the proof of 2026-11-26, lease 3)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a CUDA machine the compile-heavy kernel tests go first (a stable sort, the same in
    every pytest-xdist worker), so the workers do not end on a lone 80 s compile."""
    if torch.cuda.is_available():
        items.sort(key=lambda item: not all(part in item.nodeid for part in COMPILE_HEAVY))


HEAVY_FILES = (
    # 117 compiles on 2 processes: 120-180 s in a fresh checkout, 15 s once pytest's cache
    # holds them (test_aot_check.triton_cache); first, for a fresh checkout's run
    "tests/implementations/_kernels/triton/test_aot_check.py",
    "tests/implementations/_kernels/triton/test_masked_attention.py",  # 67 s
    "tests/harness/execute/test_reliability.py",  # 56 s
    "tests/harness/render/test_report.py",  # 52 s
    "tests/implementations/_kernels/triton/test_feature_attention.py",  # 39 s
    "tests/harness/cli/test_claims_cli.py",  # 37 s
    "tests/implementations/test_matrix.py",  # 37 s
    "tests/benchmarks/test_kernel_sweep.py",  # 33 s
    "tests/harness/scenarios/test_decode.py",  # 28 s
    "tests/harness/distributed/test_launcher.py",  # 28 s
    "tests/implementations/test_linear_launches.py",  # 26 s
    "tests/harness/scenarios/test_kvcache.py",  # 25 s
    "tests/benchmarks/test_gpu_scripts.py",  # 24 s
    "tests/implementations/_kernels/triton/test_blas_orders.py",  # 23 s, 2 tests
    "tests/harness/render/test_browser.py",  # 23 s
)
"""The test files that take longest, dearest first: each file's seconds in the README's test
command (``pytest -n auto --dist loadfile`` on 2 cores, junit, 2026-11-29 21:06, load ~2.5),
the AOT file's as in a fresh checkout. pytest-xdist's ``--dist loadfile`` hands files out in
order of their test counts, so a dear file with few tests (the BLAS-order subprocess: 2 tests,
23 s) came late and ended the run alone (a worker idle for the last 23 s, measured at 21:17);
handed out longest first, the many small files fill in at the end."""


def heavy_first(counts: dict[str, int]) -> list[str]:
    """The test files of ``counts`` (file -> number of tests) in the order to hand them out:
    :data:`HEAVY_FILES` first, in their order, then the others by their number of tests, most
    first (xdist's own order; a tie keeps the order given)."""
    rank = {f: i for i, f in enumerate(HEAVY_FILES)}
    return sorted(counts, key=lambda f: (rank.get(f, len(rank)), -counts[f]))


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadfile`` with :func:`heavy_first`'s order of files (the longest-first rule:
    the workers finish together); any other ``--dist`` is xdist's own."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class HeavyFirst(LoadFileScheduling):
        ordered = False

        def _assign_work_unit(self, node) -> None:
            # the queue of files (file -> its tests) is complete at the first hand-out; the
            # workers' own collections (what a hand-out's indexes point into) stay as they are
            if not self.ordered:
                self.ordered = True
                counts = {scope: len(tests) for scope, tests in self.workqueue.items()}
                for scope in heavy_first(counts):
                    self.workqueue.move_to_end(scope)
            super()._assign_work_unit(node)

    return HeavyFirst(config, log)


# The core implementations: every test over the core set uses this list.
CORE_IMPLEMENTATIONS = [
    "full",
    "sdpa",
    "sdpa-math",
    "sdpa-flash",
    "sdpa-efficient",
    "sdpa-cudnn",
    "flash-tiled",
    "xformers",
    "flash-attn",
]


def make_qkv(
    batch: int,
    heads: int,
    n_q: int,
    n_k: int,
    head_dim: int,
    *,
    kv_heads: int | None = None,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    requires_grad: bool = False,
):
    """q: (B, H, n_q, D), k/v: (B, H_kv, n_k, D), N(0, 1) from a seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    kv = kv_heads or heads
    shapes = [(batch, heads, n_q, head_dim), (batch, kv, n_k, head_dim), (batch, kv, n_k, head_dim)]
    return tuple(
        torch.randn(s, generator=gen, dtype=dtype).requires_grad_(requires_grad) for s in shapes
    )


def prepared_peak_beyond_output(name: str, problem: Problem, q, k, v) -> int:
    """Peak bytes of one no-grad call of ``name`` prepared for ``problem``, as the runner calls
    it, after a first call that fills its caches, less its output (the size of q): profiler
    allocation events on the CPU, the allocator's peak above the live bytes on CUDA."""
    attn = registry.get(name).prepare(problem)

    def call():
        with torch.no_grad():
            return attn(q, k, v)

    call()
    if q.device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        call()
        measured = torch.cuda.max_memory_allocated() - base
    else:
        measured = profiler_peak_bytes(call)
    return measured - q.numel() * q.element_size()


@pytest.fixture(scope="module", autouse=True)
def _frozen_heap():
    """The objects alive when a test file starts (torch, its compilers, pandas, every imported
    test module: ~430k) are moved out of the cyclic garbage collector's sight for that file
    (``gc.freeze``), and handed back when it ends. The runner calls ``gc.collect()`` after
    every point, and each full collection walked them all: 0.19 s a call, a third of the
    wall time of the CLI and shard tests. Reference counting still frees what it always
    freed; a file's own objects stay collectable, and what the file left behind is collected
    at its end."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


def unusable_tensors() -> list[str]:
    """``module.name[key]`` of every tensor without usable data (a fake CUDA tensor a
    stand-in device made on a machine without CUDA, a meta tensor of the AOT check's
    recording) held by a module-level dict of the project's loaded modules: state that would
    break whichever test reads it next."""
    found = []
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] not in ("harness", "implementations", "benchmarks") or not module:
            continue
        for attr, value in list(vars(module).items()):
            if not isinstance(value, dict):
                continue
            found += [f"{name}.{attr}[{key!r}]" for key, x in list(value.items())
                      if isinstance(x, torch.Tensor) and not _usable(x.device)]
    return found


def _usable(device: torch.device) -> bool:
    return device.type == "cpu" or (device.type == "cuda" and torch.cuda.is_available())


@pytest.fixture(scope="module", autouse=True)
def _no_leaked_tensors():
    """A test file must leave no tensor without usable data in the project's modules: the
    next file to read that state fails, in one order and not another (a fake CUDA counter
    left by the stand-in device once failed 12 tests of another file, run serially)."""
    yield
    leaked = unusable_tensors()
    assert not leaked, f"this test file left tensors without usable data: {leaked}"


_CALIBRATIONS: dict[tuple, dict] = {}
"""(device, dtypes, threads) -> the calibration this test process measured for it."""


def measured_once(device="cpu", dtypes=None) -> dict:
    """:func:`harness.measure.calibrate.calibrate` measured for real once per test process
    (pytest-xdist worker) and device, dtypes and thread count; later calls get a copy of that
    one, left in ``calibrate._THIS_RUN`` as the real call leaves it."""
    name = calibrate._device_of(device)[0]
    key = (name, dtypes, torch.get_num_threads())
    if key not in _CALIBRATIONS:
        _CALIBRATIONS[key] = _REAL_CALIBRATE(device, dtypes)
    calibrate._THIS_RUN[torch.device(name).type] = _CALIBRATIONS[key]
    return copy.deepcopy(_CALIBRATIONS[key])


_REAL_CALIBRATE = calibrate.calibrate


@pytest.fixture(scope="module")
def calibrated_once():
    """``attnbench run`` measures the device calibration for each new run (a 2048² GEMM and a
    256 MiB copy, up to 7 repeats each: 2 s at load 2, 5 s at load 5). The modules that use
    this fixture test a command, not the calibration: the first run of a device, dtypes and
    thread count in this test process measures it for real, later runs (of this module or
    another that uses the fixture) get a copy of that one, as ``attnbench verdicts`` hands
    its suites one calibration. ``tests/harness/measure`` and ``test_env.py`` test the
    calibration itself, unpatched."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(calibrate, "calibrate", measured_once)
        yield


def calibration_prelude() -> str:
    """Python source that makes a fresh process's CPU runs get :func:`measured_once`'s
    calibration (measured by this test process, on this machine) instead of measuring their
    own: for tests of what a separate process does (a kill, a poisoned process, a copied
    package tree), not of the calibration. Other devices and dtypes still measure theirs."""
    given = json.dumps(measured_once("cpu"))
    return (
        "import json\n"
        "from harness.measure import calibrate\n"
        f"_given = json.loads({given!r})\n"
        "def _once(device='cpu', dtypes=None, _real=calibrate.calibrate):\n"
        "    if dtypes or calibrate._device_of(device)[0] != 'cpu':\n"
        "        return _real(device, dtypes)\n"
        "    calibrate._THIS_RUN['cpu'] = dict(_given)\n"
        "    return dict(_given)\n"
        "calibrate.calibrate = _once\n"
    )


CALIBRATED_SITE = os.path.join(os.path.dirname(__file__), "calibrated_site")


def calibrated_children_env(env: dict | None = None) -> dict:
    """``env`` (default: this process's) for a process whose own children or workers run
    points (an isolated run's forkserver, Ray workers, submitit jobs): with
    ``tests/calibrated_site`` on PYTHONPATH, every such process gets :func:`measured_once`'s
    CPU calibration as the processes of :func:`calibration_prelude` do. For tests of what those
    processes do, not of the calibration."""
    env = dict(os.environ if env is None else env)
    env["ATTNBENCH_TEST_CALIBRATION"] = json.dumps(measured_once("cpu"))
    env["PYTHONPATH"] = os.pathsep.join(
        [CALIBRATED_SITE, *filter(None, [env.get("PYTHONPATH")])])
    return env


def calibrated_cli_argv(*args: str) -> list[str]:
    """argv of ``attnbench ARGS`` in a fresh process, calibrated by
    :func:`calibration_prelude`."""
    main = "import sys\nfrom harness.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    return [sys.executable, "-c", calibration_prelude() + main, *args]


@pytest.fixture(autouse=True)
def _two_threads():
    """Pin intra-op threads so memory and timing behave the same on every 2-core runner."""
    before = torch.get_num_threads()
    torch.set_num_threads(min(2, before))
    yield
    torch.set_num_threads(before)


class FakeCapture:
    """torch.cuda's stream and graph API on a CPU, as the launch code uses it.

    Capture runs the call once (the graph's output is what it returns); a replay runs the call
    again and writes the result into that output in place, as a graph's kernels do. Like a real
    graph, which holds raw device addresses and no Python references, a fake graph holds its
    call only weakly: once nothing else keeps the call (and its buffers) alive, a replay writes
    nothing. ``empty`` makes every graph record nothing (a call whose kernels went to another
    stream than the capture's); ``fail`` makes the capture raise, as a capture of a host sync
    does."""

    fail: str | None = None
    empty: bool = False
    current = None  # the graph being captured

    class Stream:
        def wait_stream(self, other) -> None:
            pass

    class CUDAGraph:
        work = None  # weak reference to the captured call, and the output to write

        def replay(self) -> None:
            if FakeCapture.empty or self.work is None:
                return
            call, out = self.work[0](), self.work[1]
            if call is not None:
                for mine, new in zip(_tensors(out), _tensors(call()), strict=True):
                    mine.copy_(new)

    @staticmethod
    def stream(_stream):
        import contextlib

        return contextlib.nullcontext()

    @classmethod
    def graph(cls, graph):
        import contextlib

        @contextlib.contextmanager
        def capturing():
            yield
            if cls.fail:
                raise RuntimeError(cls.fail)

        return capturing()

    @classmethod
    def current_stream(cls):
        return cls.Stream()


def _tensors(out) -> list[torch.Tensor]:
    return [t for t in (out if isinstance(out, tuple | list) else [out])
            if isinstance(t, torch.Tensor)]


@pytest.fixture
def fake_capture(monkeypatch):
    """CUDA graph capture on a CPU (:class:`FakeCapture`), for the launch code's tests."""
    import weakref

    from harness.measure import graphs

    for name in ("Stream", "CUDAGraph", "stream", "graph", "current_stream"):
        monkeypatch.setattr(torch.cuda, name, getattr(FakeCapture, name))
    monkeypatch.setattr(FakeCapture, "fail", None)
    monkeypatch.setattr(FakeCapture, "empty", False)
    captured = graphs.GraphedCall.__init__

    def init(self, call):
        captured(self, call)
        self.graph.work = (weakref.ref(call), self.out)

    monkeypatch.setattr(graphs.GraphedCall, "__init__", init)
    return FakeCapture
