"""Tile-level parallelism on CPU: contiguous chunks of tiles on worker threads, one per
intra-op thread, each running single-threaded ops.

Why not let every op use the intra-op (OpenMP) pool? A band of n = 16k has ~256 tiles of ~4
ops each, so ~1000 fork/join barriers per call. On an idle machine that costs little, but when
the cores are shared (a CI runner, several benchmarks at once) every barrier waits for a
descheduled thread and the same call was measured 5-10x slower. Worker threads that share
nothing but the output (disjoint rows) meet once per call, as compiled kernels (FlexAttention)
do. The ops release the GIL, so the workers run in parallel.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

from implementations._kernels.tiles.tile_plan import Tile

T = TypeVar("T")


class _Pools:
    """Worker pools by size, created on first use."""

    def __init__(self) -> None:
        self.pools: dict[int, ThreadPoolExecutor] = {}
        self.lock = threading.Lock()

    def get(self, workers: int) -> ThreadPoolExecutor:
        with self.lock:
            if workers not in self.pools:
                self.pools[workers] = ThreadPoolExecutor(workers, thread_name_prefix="attn-tiles")
            return self.pools[workers]

    def after_fork_in_child(self) -> None:
        """A forked child inherits the pools (maybe a held lock) but not their threads: work
        submitted there would wait forever. Start afresh."""
        self.__init__()


_POOLS = _Pools()
os.register_at_fork(after_in_child=_POOLS.after_fork_in_child)


def split(tiles: Sequence[Tile], parts: int) -> list[Sequence[Tile]]:
    """Contiguous chunks of about equal executed pairs (at most ``parts``, none empty)."""
    weights = [(t.r1 - t.r0) * t.n_cols for t in tiles]
    total, chunks, start, acc = sum(weights), [], 0, 0
    for i, w in enumerate(weights):
        acc += w
        if acc * parts >= total * (len(chunks) + 1) and i + 1 < len(tiles):
            chunks.append(tiles[start : i + 1])
            start = i + 1
    chunks.append(tiles[start:])
    return [c for c in chunks if len(c)]


def _single_threaded(work: Callable[[Sequence[Tile]], T], chunk: Sequence[Tile]) -> T:
    # Grad mode is per thread and on by default: the kernel builds no graph of its own.
    with torch.no_grad():
        torch.set_num_threads(1)  # this worker's OpenMP/MKL threads (thread-local settings)
        return work(chunk)


def map_tiles(
    tiles: Sequence[Tile], work: Callable[[Sequence[Tile]], T], device: torch.device
) -> list[T]:
    """``work`` over chunks of ``tiles``: on CPU one chunk per intra-op thread, in parallel;
    elsewhere (CUDA orders its own work) or with one thread, one chunk in this thread."""
    threads = torch.get_num_threads()
    if device.type != "cpu" or threads == 1 or len(tiles) < 2:
        return [work(tiles)]
    chunks = split(tiles, threads)
    try:
        futures = [_POOLS.get(threads).submit(_single_threaded, work, c) for c in chunks]
        return [f.result() for f in futures]
    finally:
        # set_num_threads(1) in a worker also lowers the process-wide default that new
        # threads start from; put back this thread's setting.
        torch.set_num_threads(threads)
