"""The Case contract between scenarios and the runner, and how much of the output to check."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from harness.timing import Measurement

# Full float64 checks above this many (query, key) pairs cost more than the point itself;
# beyond it we check a fixed sample of query rows (forward) and say so in the `check` column.
FULL_CHECK_MAX_PAIRS = 4096 * 4096
SAMPLED_ROWS = 256


@dataclass(frozen=True)
class CheckPlan:
    """What agreement check a point gets: ``full``, ``rows`` (sampled query rows) or ``none``."""

    mode: str
    grads: bool

    def describe(self) -> str:
        return f"{self.mode}{'+grads' if self.grads else ''}"


def check_plan(point, requested: str = "auto") -> CheckPlan:
    """``auto`` = full check (grads too for backward) up to FULL_CHECK_MAX_PAIRS, else rows."""
    if requested not in ("auto", "full", "rows", "none"):
        raise ValueError(f"check must be auto|full|rows|none, got {requested!r}")
    if requested == "auto":
        requested = "full" if point.n_q * point.seq_len <= FULL_CHECK_MAX_PAIRS else "rows"
    return CheckPlan(requested, grads=point.backward and requested == "full")


def sample_rows(n_q: int, count: int = SAMPLED_ROWS, seed: int = 0) -> Tensor:
    """Sorted query rows to check: first, last, and a seeded random spread (1-D long)."""
    if n_q <= count:
        return torch.arange(n_q)
    gen = torch.Generator().manual_seed(seed)
    picked = torch.randperm(n_q - 2, generator=gen)[: count - 2] + 1
    return torch.cat([torch.tensor([0, n_q - 1]), picked]).sort().values


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
