"""Every kernel test's compiles stay few: the launches a test makes are watched, and the kernel
variants a GPU would compile for them (:func:`kernel_launch.compile_keys`: every config of the
class when a launch autotunes, one when it is pinned or forced) are counted. On an H100 each
Triton compile of these kernels takes 1-3 s; with ``ATTNBENCH_AUTOTUNE=off`` (tests/conftest.py)
a test that runs one mask forward and backward compiles 4 (forward, delta, dK/dV, dQ).

NumPy's OpenBLAS runs on one thread in these tests (:func:`one_blas_thread`).
"""

from __future__ import annotations

import pytest

try:
    from implementations._kernels.triton import kernel_launch
except ImportError:  # no Triton: the kernel tests skip themselves
    kernel_launch = None

try:
    from threadpoolctl import threadpool_limits
except ImportError:  # not installed: OpenBLAS keeps its threads
    threadpool_limits = None

MAX_COMPILES = 6  # per test, as counted for an sm_90 GPU


@pytest.fixture(autouse=True, scope="module")
def one_blas_thread():
    """NumPy's OpenBLAS on one thread: the interpreter's ``tl.dot`` tiles (128x64 @ 64x64 and
    the like) are each too small to share, and on a 2-core runner whose cores the other
    pytest-xdist worker keeps busy, a second OpenBLAS thread spins waiting for its turn: a
    tile product took ~8 ms of CPU instead of ~20 us (measured), and a GPU-tile-size test
    7.2 CPU-s instead of 3.7. One thread also makes the interpreted products' rounding the
    same on every machine: with two threads OpenBLAS splits some of these products
    differently (Haswell kernels), as it would with sixteen on a larger machine."""
    if threadpool_limits is None:
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield


@pytest.fixture(autouse=True)
def compiles(request) -> set[tuple]:
    """The kernel variants the test's launches compile on a GPU (sm_90); at most
    ``MAX_COMPILES`` unless the test is marked ``autotunes`` (it autotunes on purpose)."""
    seen: set[tuple] = set()
    if kernel_launch is None:
        yield seen
        return
    with kernel_launch.watching(lambda launch: seen.update(kernel_launch.compile_keys(launch))):
        yield seen
    if request.node.get_closest_marker("autotunes") is None:
        names = sorted({key[0] for key in seen})
        assert len(seen) <= MAX_COMPILES, f"{len(seen)} kernel compiles ({names})"
