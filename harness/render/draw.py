"""Drawing primitives for the report's plots (matplotlib, Agg backend: no display, no network):
series and panels as plain numbers and labels, one style per label, grids of axes, log axes,
and PNG bytes. The plot kinds built from them are in :mod:`harness.render.plots`; nothing here
reads result rows or imports the rest of the harness but the number formatter.

Figures are drawn at :data:`DPI` and meant to be shown at ``css_width(png)`` CSS pixels (their
size in inches at 96 px per inch), so fonts keep their point size on the page and stay sharp
on high-density screens. Series keep one colour, marker and line style per label across every
panel of a figure; alternate series have hollow markers, so coinciding series stay visible.
"""

from __future__ import annotations

import io
import math
import struct
import textwrap
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import FuncFormatter, NullFormatter

from harness import fmt

DPI = 160
CSS_PX_PER_INCH = 96
COLORS = plt.get_cmap("tab10").colors
MARKERS = ("o", "s", "^", "D", "v", "P", "X")  # 7 markers x 10 colours: 70 distinct styles
LINESTYLES = ("-", "--", "-.", ":")
MAX_PANELS = 12
MAX_BANDS = 4  # more series than this in a panel: error bars only (bands would hide each other)
LEGEND_BELOW = 5  # more legend entries than this: the legend goes under the axes
LABEL_WIDTH = 46  # legend labels wrap at this many characters
PANEL_W, PANEL_H = 5.4, 3.9  # inches; two panels a row fill an ~1050 CSS px page
FONT = {"title": 10, "label": 9.5, "tick": 8.5, "legend": 8}


@dataclass
class Series:
    """One line on a panel: measured points, optionally a confidence band (``low``..``high``),
    its fit and the claimed slope."""

    label: str
    x: Sequence[float]
    y: Sequence[float]
    fit: dict | None = None  # exponent, prefactor, offset, x_lo, x_hi
    claimed: float | None = None  # exponent, drawn through the fitted constant
    low: Sequence[float] | None = None
    high: Sequence[float] | None = None


@dataclass
class Panel:
    """One set of axes: its title, its series and labelled vertical lines."""

    title: str
    series: list[Series] = field(default_factory=list)
    vlines: list[tuple[float, str]] = field(default_factory=list)  # (x, label)


def png(fig) -> bytes:
    """Render and close a figure."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    plt.close(fig)
    return buf.getvalue()


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) in pixels from a PNG's IHDR chunk."""
    return struct.unpack(">II", data[16:24])


def css_width(data: bytes) -> int:
    """The width in CSS pixels a PNG from :func:`png` is meant to be shown at."""
    return round(png_size(data)[0] * CSS_PX_PER_INCH / DPI)


class Styles:
    """One (colour, marker, line style, hollow) per label, in order of first use."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}

    def __call__(self, label: str) -> dict:
        i = self._seen.setdefault(label, len(self._seen))
        color = COLORS[i % len(COLORS)]
        return {
            "color": color,
            "marker": MARKERS[i % len(MARKERS)],
            "linestyle": LINESTYLES[(i // 2) % len(LINESTYLES)],
            "markerfacecolor": "none" if i % 2 else color,
        }


def tick_labels(digits: int = 6) -> FuncFormatter:
    """Plain-number tick labels, ``digits`` significant digits (6: as ``%g`` writes them)."""
    return FuncFormatter(lambda v, _: fmt.number(v, digits))


def axes_style(ax, title: str, xlabel: str, ylabel: str, log_y: bool, log_x: bool = True):
    """Log2 x axis, optional log y, plain-number tick labels (mathtext layout is slow)."""
    if log_x:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(tick_labels())
        ax.xaxis.set_minor_formatter(NullFormatter())
    if log_y:
        with warnings.catch_warnings():  # constant data (e.g. a flat decode step): fine
            warnings.filterwarnings("ignore", message="Attempting to set identical")
            ax.set_yscale("log")
        ax.yaxis.set_major_formatter(tick_labels())
        low, high = ax.get_ylim()
        small = high / low < 10  # no decade tick inside: label the minor ticks instead
        ax.yaxis.set_minor_formatter(tick_labels(3) if small else NullFormatter())
    ax.set_title(title, fontsize=FONT["title"])
    ax.set_xlabel(xlabel, fontsize=FONT["label"])
    ax.set_ylabel(ylabel, fontsize=FONT["label"])
    ax.tick_params(labelsize=FONT["tick"])
    ax.grid(True, which="major", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if len(handles) > LEGEND_BELOW:
        ax.legend(
            fontsize=FONT["legend"],
            loc="upper center",
            bbox_to_anchor=(0.5, -0.16),
            ncol=legend_cols(labels),
            frameon=False,
        )
    elif handles:
        ax.legend(fontsize=FONT["legend"], loc="best", framealpha=0.8)


def legend_cols(labels: list[str]) -> int:
    """Columns of a legend under the axes: two for many short labels, else one."""
    short = max((len(t) for t in labels), default=0) <= LABEL_WIDTH // 2
    return 2 if len(labels) > 8 and short else 1


def legend_room(panels: list[Panel]) -> float:
    """Extra inches per panel row for a legend placed under the axes (wrapped labels)."""
    room = 0.0
    for p in panels:
        if len(p.series) > LEGEND_BELOW:
            labels = [s.label for s in p.series]
            lines = sum(len(textwrap.wrap(t, LABEL_WIDTH)) or 1 for t in labels)
            room = max(room, 0.5 + 0.19 * math.ceil(lines / legend_cols(labels)))
    return room


def grid(n: int, cols: int = 2, width: float = PANEL_W, height: float = PANEL_H):
    """A figure with ``n`` axes, ``cols`` a row, each ``width`` x ``height`` inches (the unused
    cells of the last row hidden): (figure, list of the ``n`` axes)."""
    cols = max(1, min(n, cols))
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(width * cols, height * rows), squeeze=False, layout="constrained"
    )
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def drawable(panels: list[Panel]) -> list[Panel]:
    """Panels with at least one finite positive point (log axes need one), at most MAX_PANELS."""

    def has_points(s: Series) -> bool:
        y = np.asarray(s.y, float)
        return bool(np.any(np.isfinite(y) & (y > 0)))

    kept = [Panel(p.title, [s for s in p.series if has_points(s)], p.vlines) for p in panels]
    return [p for p in kept if p.series][:MAX_PANELS]


def draw_series(ax, s: Series, style: dict, label: str, line: bool, band: bool = True) -> None:
    """Markers (joined by a line when ``line``) at the finite points of ``s``, with error bars
    and, when ``band``, a shaded band from its ``low``..``high`` interval."""
    x, y = np.asarray(s.x, float), np.asarray(s.y, float)
    keep = np.isfinite(x) & np.isfinite(y)
    if not keep.all():  # a point without a value: leave it out, do not break the line
        x, y = x[keep], y[keep]
        s = Series(
            s.label,
            x,
            y,
            s.fit,
            s.claimed,
            None if s.low is None else np.asarray(s.low, float)[keep],
            None if s.high is None else np.asarray(s.high, float)[keep],
        )
    if s.low is not None and s.high is not None:
        low, high = np.asarray(s.low, float), np.asarray(s.high, float)
        good = np.isfinite(low) & np.isfinite(high)
        if good.any() and band:
            ax.fill_between(x[good], low[good], high[good], color=style["color"], alpha=0.15, lw=0)
        if good.any():
            ax.errorbar(
                x[good],
                y[good],
                yerr=np.maximum([y[good] - low[good], high[good] - y[good]], 0),
                fmt="none",
                ecolor=style["color"],
                elinewidth=1,
                capsize=2.5,
            )
    ax.plot(
        x,
        y,
        ls=style["linestyle"] if line else "none",
        marker=style["marker"],
        color=style["color"],
        markerfacecolor=style["markerfacecolor"],
        ms=5.5,
        mew=1.3,
        lw=1.3,
        label=textwrap.fill(label, LABEL_WIDTH),
    )


def vlines(ax, marks: list[tuple[float, str]]) -> None:
    """Dashed vertical lines at x, each with its label written along it."""
    for x_at, text in marks:
        ax.axvline(x_at, color="grey", ls="--", lw=1)
        ax.annotate(
            text,
            (x_at, 0.02),
            xycoords=("data", "axes fraction"),
            rotation=90,
            fontsize=FONT["tick"],
            color="grey",
            ha="right",
            va="bottom",
        )
