"""The Case contract between scenarios and the runner, and how much of the output to check."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from harness.cost.checksize import full_check_fits
from harness.measure.timing import Measurement
from harness.sweep.vocab import CHECK_MODES

SAMPLED_ROWS = 256  # seeded random rows, on top of the tile-boundary rows
# Query tiles of the implementations are powers of two from 16 to 256 rows. Every multiple of
# 64 is also a boundary of the 128- and 256-row tiles, so the first and last row of every 64-row
# tile cover all of 64/128/256 at 2·n/64 rows (n/32: the reference stays ~3% of a full check).
# Finer strides (16, 32) are used when their boundary rows fit in this budget.
BOUNDARY_ROWS_BUDGET = 512
TILE_STRIDES = (16, 32, 64)


@dataclass(frozen=True)
class CheckPlan:
    """What agreement check a point gets: ``full``, ``rows`` (sampled query rows) or ``none``."""

    mode: str
    grads: bool

    def describe(self) -> str:
        return f"{self.mode}{'+grads' if self.grads else ''}"


def check_plan(point, requested: str = "auto") -> CheckPlan:
    """``auto`` = full check (grads too for backward) up to FULL_CHECK_MAX_PAIRS, else rows."""
    if requested not in CHECK_MODES:
        raise ValueError(f"check must be {'|'.join(CHECK_MODES)}, got {requested!r}")
    if requested == "auto":
        requested = "full" if full_check_fits(point) else "rows"
    return CheckPlan(requested, grads=point.backward and requested == "full")


def boundary_stride(n_q: int, budget: int = BOUNDARY_ROWS_BUDGET) -> int:
    """The finest tile stride in TILE_STRIDES whose boundary rows fit ``budget`` (64 at most,
    even over budget: a 64/128/256-row tile must never be missed)."""
    for stride in TILE_STRIDES[:-1]:
        if 2 * -(-n_q // stride) <= budget:
            return stride
    return TILE_STRIDES[-1]


def boundary_rows(n_q: int, stride: int) -> Tensor:
    """First and last row of every ``stride``-row tile, plus the last row (1-D long, sorted)."""
    starts = torch.arange(0, n_q, stride)
    return torch.cat([starts, starts[1:] - 1, torch.tensor([n_q - 1])]).unique()


def sample_rows(n_q: int, count: int = SAMPLED_ROWS, seed: int = 0) -> Tensor:
    """Sorted query rows to check (1-D long): every tile boundary row (see
    :func:`boundary_stride`) and ``count`` seeded random rows; all rows when that is not fewer."""
    edges = boundary_rows(n_q, boundary_stride(n_q))
    if n_q <= count + len(edges):
        return torch.arange(n_q)
    gen = torch.Generator().manual_seed(seed)
    picked = torch.randperm(n_q, generator=gen)[:count]
    return torch.cat([edges, picked]).unique()


@dataclass
class Case:
    """One point ready to run. ``run`` is what gets timed; everything else stays outside."""

    run: Callable[[], object]
    tokens: int  # tokens processed per call (tokens/s = tokens / time)
    check: Callable[[], dict]  # agreement columns, run once, untimed
    # columns measured after timing: extra(measurement_of_run, timer) where timer(fn) -> Measurement
    extra: Callable[[Measurement, Callable[[Callable[[], object]], Measurement]], dict] = field(
        default=lambda m, timer: {}
    )
    columns: dict = field(default_factory=dict)  # static extra columns (e.g. check mode)
