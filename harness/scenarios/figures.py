"""The report figures a scenario brings (:attr:`harness.scenarios.interface.Scenario.panels`):
declarations, as data, that :mod:`harness.render` draws from a run's rows of that scenario. The
scenario says what to draw (its columns, its baselines, its guide lines); the renderer knows
how, and names no scenario's column.

Each panel is one section of the report (``key`` its anchor, ``title`` and ``caption`` above
it); a run without rows for it lists the section among those with nothing to show.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Guides = Callable[[float], tuple[tuple[float, str], ...]]


def no_guides(value: float) -> tuple[tuple[float, str], ...]:
    """No guide lines."""
    return ()


@dataclass(frozen=True)
class ReportPanel:
    """One report section a scenario adds: ``key`` names its anchor (and its figure's file),
    ``title`` heads it, ``caption`` says under the title how to read it."""

    key: str
    title: str
    caption: str


@dataclass(frozen=True)
class MetricPanel(ReportPanel):
    """``metric`` against ``over`` on log-log axes, a series per implementation with its fitted
    slope, per group of the other fields that vary; its fits as the section's table."""

    metric: str
    over: str = "seq_len"


@dataclass(frozen=True)
class CrossoverPanel(ReportPanel):
    """A timed ``metric`` of the scenario's implementations and of its ``baselines`` against
    ``over``, per group of the other fields, with where each implementation stops being
    cheaper than each baseline.

    - the table: each crossover in units of ``relative_to`` (``names`` are the short names of
      ``over`` and ``relative_to`` in its headers, ``crossover_n_over_d``; ``subject`` heads
      the implementations' column), judged against ``expect_min`` (cheaper below it);
    - the figure (``figure_title``): a series per implementation; ``split`` = (baseline,
      column, label) draws that baseline once per value of the column (``conv k=3``) and the
      others at its smallest value; vertical lines at ``guides(value of relative_to)`` and at
      the measured crossing of the first implementation with ``measured_against``.
    """

    metric: str = "time_median_s"
    baselines: tuple[str, ...] = ()
    over: str = "seq_len"
    relative_to: str = "d_model"
    names: tuple[str, str] = ("n", "d")
    subject: str = "impl"
    expect_min: float = 1.0
    split: tuple[str, str, str] | None = None
    guides: Guides = no_guides
    measured_against: str | None = None
    figure_title: str = ""
