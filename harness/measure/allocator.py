"""The C allocator's state while CPU points are timed: one fixed state, whatever ran before.

Why: torch's CPU tensors come from ``malloc`` (glibc's ptmalloc). For a block of 128 KiB to
32 MiB, glibc decides at every call whether it comes from ``mmap`` (fresh pages: a minor
page fault per 4 KiB page on first touch, counted as *system* CPU time) or from the heap, by a
threshold that moves with the process's history (freeing an mmapped block raises it to that
block's size), and whether a freed heap block goes back to the OS (the heap top is trimmed
once it exceeds ``M_TRIM_THRESHOLD``, twice the moving mmap threshold) depends on what lies
above it in the heap. So ``full`` and ``sdpa-math`` at n = 1024 (16 MiB score matrices) timed
in one of two modes per process or pass: ~0 faults a call, or every buffer of the call faulted
in again on every call (2,700-10,700 faults a call; ``sdpa-math`` causal 45.7 against 26.1 ms
CPU, 15.9 ms of it system time; docs/noise.md, "Two modes of the memory-heavy points";
``scripts/malloc_modes.py``).

The fixed state (:func:`tune`, applied when a :class:`~harness.measure.device.CpuDevice` is
made, so in every process that measures on a CPU: an in-process run, each isolated child, the
environment child, a rerun): ``M_MMAP_THRESHOLD = 32 MiB`` (glibc's largest: every block below
it comes from the heap, every block from it up from ``mmap``, whatever ran before) and
``M_TRIM_THRESHOLD = -1`` (the heap is never trimmed on ``free``). Setting either also switches
the moving threshold off. A timed call then reuses the heap memory the warm-up calls faulted
in for every block under 32 MiB, as a caching allocator would: its time is the algorithm's
work and memory traffic, not the kernel handing out zeroed pages. Blocks of 32 MiB and more
are fresh pages on every call, as they always were with glibc (its moving threshold stops at
32 MiB): their rows keep that cost, and the heap is not asked to hold them (a heap reusing
blocks that large held about twice a call's peak: measured at n = 2048, docs/noise.md). The
first call (``first_call_s``) still pays for fresh memory.

What it does not change: peak memory. ``torch-profiler`` (the CPU method) sums torch's own
allocation events, which no allocator setting moves; ``rss-hwm`` (its fallback) calls
``malloc_trim(0)`` before the call, which returns every free heap page to the OS whatever the
trim threshold, so the call's pages are counted again. Between points, a free heap of more
than 512 MiB goes back to the OS (:func:`release`, from ``CpuDevice.release_memory``), so a
large point's memory does not stay resident through the rest of a run.

``ATTNBENCH_MALLOC=default`` leaves glibc as it comes (to measure what an untuned process
sees); the row's ``malloc_tuning`` column and ``env.json`` say which state the numbers were
taken in.
"""

from __future__ import annotations

import ctypes
import os
import platform
from functools import cache

from harness.errors import CliError

MALLOC_ENV = "ATTNBENCH_MALLOC"
SETTINGS = ("tuned", "default")
# mallopt parameter numbers (glibc <malloc.h>)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2**20  # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)

TUNED = "glibc: M_MMAP_THRESHOLD=32MiB M_TRIM_THRESHOLD=-1"
DEFAULT = f"glibc default ({MALLOC_ENV}=default)"
UNTUNED = "untuned: no CPU device made in this process"

# free heap kept between points (release); above it the free pages go back to the OS
RELEASE_ABOVE = 512 * 2**20

_state: str | None = None  # what tune() set in this process (a fork inherits both)


def setting() -> str:
    """``tuned`` (unset or empty) or ``default``, from ``ATTNBENCH_MALLOC``; another value is
    a one-line error."""
    value = os.environ.get(MALLOC_ENV, "").strip() or "tuned"
    if value not in SETTINGS:
        raise CliError(f"{MALLOC_ENV}={value!r}: expected one of {', '.join(SETTINGS)}")
    return value


@cache
def _libc() -> ctypes.CDLL | None:
    """This process's glibc (the ``malloc`` torch calls), or None elsewhere."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.malloc_trim.argtypes = (ctypes.c_size_t,)
        return libc
    except (OSError, AttributeError):
        return None


def tune() -> str:
    """Put this process's allocator into the fixed state (once; later calls return the state
    set the first time) and return what the ``malloc_tuning`` column records."""
    global _state
    wanted = setting()  # a bad setting is an error whenever a device is made
    if _state is not None:
        return _state
    if wanted == "default":
        _state = DEFAULT
        return _state
    libc = _libc()
    preload = os.environ.get("LD_PRELOAD", "")
    if libc is None:
        _state = f"unavailable: not glibc ({platform.system()} {platform.libc_ver()[0]})"
    elif "malloc" in preload:  # jemalloc/tcmalloc replace malloc: glibc's settings are moot
        _state = f"unavailable: LD_PRELOAD={preload} replaces malloc"
    elif libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and libc.mallopt(M_TRIM_THRESHOLD, -1):
        _state = TUNED
    else:
        _state = "unavailable: glibc refused mallopt(M_MMAP_THRESHOLD / M_TRIM_THRESHOLD)"
    return _state


def state() -> str:
    """The allocator state this process's CPU numbers are taken in."""
    return _state or UNTUNED


MALLINFO2_FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                    "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")


class _Info(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (glibc >= 2.33)."""

    _fields_ = [(name, ctypes.c_size_t) for name in MALLINFO2_FIELDS]


def mallinfo() -> dict[str, int] | None:
    """glibc's allocator counters now (``mallinfo2``: ``arena`` heap bytes, ``hblkhd`` bytes
    in mmapped blocks, ``fordblks`` free heap bytes, ...); None without ``mallinfo2``."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        return None
    libc.mallinfo2.restype = _Info
    info = libc.mallinfo2()
    return {name: int(getattr(info, name)) for name in MALLINFO2_FIELDS}


def release(keep: int | None = None) -> bool:
    """Between points (never inside a timed pass): hand the heap's free pages back to the OS
    (``malloc_trim(0)``) once it holds more than ``keep`` bytes free (default
    :data:`RELEASE_ABOVE`), so a large point's memory does not stay resident through the rest
    of a run. Below that the pages stay: a point's next pass then reuses memory that is
    touched already, where a trimmed heap made its first samples fault their buffers in
    again. Returns whether it trimmed (never when the allocator is not tuned)."""
    libc = _libc()
    if _state != TUNED or libc is None:
        return False
    info = mallinfo()
    if info is not None and info["fordblks"] <= (RELEASE_ABOVE if keep is None else keep):
        return False
    libc.malloc_trim(0)
    return True
