"""Drawing primitives for reports (matplotlib, Agg backend: no display, no network). Each
function takes plain numbers and labels and returns PNG bytes; nothing here reads result rows
or imports the rest of the harness (:mod:`harness.render.figures` turns rows into these calls).

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
import pandas as pd
from matplotlib.ticker import FuncFormatter, NullFormatter

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


def claimed_line(s: Series, xs: np.ndarray) -> np.ndarray:
    """The claimed power law ``offset + c·x^claimed`` with ``c`` fitted (least squares in log
    space) to the points in the fitted region, so a right claim lies on the data."""
    x, y = np.asarray(s.x, float), np.asarray(s.y, float)
    fit = s.fit or {}
    offset = fit.get("offset") or 0.0
    offset = offset if np.isfinite(offset) else 0.0
    lo, hi = fit.get("x_lo", x.min()), fit.get("x_hi", x.max())
    if not (np.isfinite(lo) and np.isfinite(hi)):
        lo, hi = x.min(), x.max()
    inside = (x >= lo) & (x <= hi) & (y - offset > 0)
    if not inside.any():
        inside, offset = y > 0, 0.0
    log_c = np.mean(np.log(y[inside] - offset) - s.claimed * np.log(x[inside]))
    return offset + np.exp(log_c) * xs**s.claimed


def _axes_style(ax, title: str, xlabel: str, ylabel: str, log_y: bool, log_x: bool = True):
    """Log2 x axis, optional log y, plain-number tick labels (mathtext layout is slow)."""
    if log_x:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    if log_y:
        with warnings.catch_warnings():  # constant data (e.g. a flat decode step): fine
            warnings.filterwarnings("ignore", message="Attempting to set identical")
            ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        low, high = ax.get_ylim()
        small = high / low < 10  # no decade tick inside: label the minor ticks instead
        ax.yaxis.set_minor_formatter(
            FuncFormatter(lambda v, _: f"{v:.3g}") if small else NullFormatter()
        )
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
            ncol=_legend_cols(labels),
            frameon=False,
        )
    elif handles:
        ax.legend(fontsize=FONT["legend"], loc="best", framealpha=0.8)


def _legend_cols(labels: list[str]) -> int:
    short = max((len(t) for t in labels), default=0) <= LABEL_WIDTH // 2
    return 2 if len(labels) > 8 and short else 1


def _legend_room(panels: list[Panel]) -> float:
    """Extra inches per panel row for a legend placed under the axes (wrapped labels)."""
    room = 0.0
    for p in panels:
        if len(p.series) > LEGEND_BELOW:
            labels = [s.label for s in p.series]
            lines = sum(len(textwrap.wrap(t, LABEL_WIDTH)) or 1 for t in labels)
            room = max(room, 0.5 + 0.19 * math.ceil(lines / _legend_cols(labels)))
    return room


def _grid(n: int, cols: int = 2, width: float = PANEL_W, height: float = PANEL_H):
    cols = max(1, min(n, cols))
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(width * cols, height * rows), squeeze=False, layout="constrained"
    )
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _drawable(panels: list[Panel]) -> list[Panel]:
    """Panels with at least one finite positive point (log axes need one), at most MAX_PANELS."""

    def has_points(s: Series) -> bool:
        y = np.asarray(s.y, float)
        return bool(np.any(np.isfinite(y) & (y > 0)))

    kept = [Panel(p.title, [s for s in p.series if has_points(s)], p.vlines) for p in panels]
    return [p for p in kept if p.series][:MAX_PANELS]


def _draw_series(ax, s: Series, style: dict, label: str, line: bool, band: bool = True) -> None:
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


def loglog_panels(
    panels: list[Panel], xlabel: str, ylabel: str, suptitle: str = "", log_y: bool = True
) -> bytes:
    """Up to MAX_PANELS log-log panels; each series: markers with its CI band, its fit (solid,
    over the fitted region, slope in the legend) and the claimed slope (dotted, through the
    fitted constant)."""
    panels = _drawable(panels)
    fig, axes = _grid(len(panels), height=PANEL_H + _legend_room(panels))
    style = Styles()
    for ax, panel in zip(axes, panels, strict=True):
        for s in panel.series:
            st = style(s.label)
            x = np.asarray(s.x, float)
            label = s.label
            if s.fit and np.isfinite(s.fit.get("exponent", np.nan)):
                f = s.fit
                xs = np.geomspace(f["x_lo"], f["x_hi"], 40)
                ax.plot(
                    xs,
                    f["offset"] + f["prefactor"] * xs ** f["exponent"],
                    "-",
                    color=st["color"],
                    alpha=0.55,
                    lw=2.2,
                )
                label += f" (fit {f['exponent']:.2f})"
            if s.claimed is not None and len(x):
                xs = np.geomspace(x.min(), x.max(), 30)
                ax.plot(xs, claimed_line(s, xs), ":", color=st["color"], lw=1.4)
                label += f" [claim {s.claimed:g}]"
            _draw_series(ax, s, st, label, line=False, band=len(panel.series) <= MAX_BANDS)
        _vlines(ax, panel.vlines)
        _axes_style(ax, panel.title, xlabel, ylabel, log_y)
    if suptitle:
        fig.suptitle(suptitle, fontsize=FONT["title"] + 1)
    return png(fig)


def _vlines(ax, vlines: list[tuple[float, str]]) -> None:
    for x_at, text in vlines:
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


def heatmaps(maps: list[tuple[str, pd.DataFrame]], value_label: str, fmt: str = "{:.3g}") -> bytes:
    """Annotated heat maps, one per (title, complete pivot table rows=heads x cols=d_model)."""
    maps = maps[:MAX_PANELS]
    fig, axes = _grid(len(maps))
    for ax, (title, table) in zip(axes, maps, strict=True):
        values = table.to_numpy(float)
        image = ax.imshow(values, cmap="viridis", aspect="auto", origin="lower")
        ax.set_xticks(range(table.shape[1]), [str(c) for c in table.columns])
        ax.set_yticks(range(table.shape[0]), [str(r) for r in table.index])
        ax.tick_params(labelsize=FONT["tick"])
        ax.set_xlabel(str(table.columns.name), fontsize=FONT["label"])
        ax.set_ylabel(str(table.index.name), fontsize=FONT["label"])
        ax.set_title(title, fontsize=FONT["title"])
        finite = values[np.isfinite(values)]
        mid = (finite.min() + finite.max()) / 2 if finite.size else 0
        for (r, c), v in np.ndenumerate(values):
            if np.isfinite(v):
                ax.text(
                    c,
                    r,
                    fmt.format(v),
                    ha="center",
                    va="center",
                    fontsize=FONT["tick"],
                    color="white" if v < mid else "black",
                )
        bar = fig.colorbar(image, ax=ax, shrink=0.9)
        bar.set_label(value_label, fontsize=FONT["label"])
        bar.ax.tick_params(labelsize=FONT["tick"])
    return png(fig)


def lines(
    panels: list[Panel],
    xlabel: str,
    ylabel: str,
    log_y: bool = False,
    hline: tuple[float, str] | None = None,
    suptitle: str = "",
    cols: int = 2,
) -> bytes:
    """Line panels over a log2 x axis (throughput, speedups, errors), CI bands where given.
    Panels in one figure share each label's style, so a side-by-side pair reads as one."""
    panels = _drawable(panels)
    fig, axes = _grid(len(panels), cols=cols, height=PANEL_H + _legend_room(panels))
    style = Styles()
    for ax, panel in zip(axes, panels, strict=True):
        for s in panel.series:
            band = len(panel.series) <= MAX_BANDS
            _draw_series(ax, s, style(s.label), s.label, line=True, band=band)
        if hline is not None:
            ax.axhline(hline[0], color="grey", ls="--", lw=1, label=hline[1])
        _vlines(ax, panel.vlines)
        _axes_style(ax, panel.title, xlabel, ylabel, log_y)
    if suptitle:
        fig.suptitle(suptitle, fontsize=FONT["title"] + 1)
    return png(fig)


@dataclass
class Roofs:
    """Calibrated ceilings: compute (FLOP/s) and memory bandwidth (bytes/s)."""

    peak_flops: float
    bandwidth: float
    label: str = ""


def roofline(points: list[Series], roofs: list[Roofs], title: str = "roofline") -> bytes:
    """Arithmetic intensity (FLOP/byte, x) against achieved TFLOP/s (y), log-log, one series
    per label, under each device's roof ``min(peak, intensity x bandwidth)``."""
    room = _legend_room([Panel("", points)])
    fig, (ax,) = _grid(1, cols=1, width=PANEL_W * 1.6, height=PANEL_H * 1.3 + room)
    style = Styles()
    xs_all = np.concatenate([np.asarray(s.x, float) for s in points] or [np.ones(1)])
    finite = xs_all[np.isfinite(xs_all) & (xs_all > 0)]
    lo = min(finite.min() / 4, 0.5) if finite.size else 0.5
    hi = max(finite.max() * 4, 64) if finite.size else 64
    for roof in roofs:
        ridge = roof.peak_flops / roof.bandwidth
        xs = np.geomspace(min(lo, ridge / 8), max(hi, ridge * 8), 200)
        ys = np.minimum(roof.peak_flops, xs * roof.bandwidth) / 1e12
        ax.plot(xs, ys, color="black", lw=1.6, alpha=0.75)
        ax.annotate(
            f"{roof.label}{roof.peak_flops / 1e12:.3g} TFLOP/s, {roof.bandwidth / 1e9:.3g} GB/s",
            (xs[-1], ys[-1]),
            fontsize=FONT["tick"],
            ha="right",
            va="bottom",
        )
    for s in points:
        _draw_series(ax, s, style(s.label), s.label, line=False)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    _axes_style(
        ax, title, "arithmetic intensity (FLOP / compulsory byte)", "TFLOP/s", True, log_x=False
    )
    return png(fig)


def history(runs: list[str], series: list[Series], ylabel: str, title: str) -> bytes:
    """One metric across runs (x: the runs in order, labelled), a line per series."""
    room = _legend_room([Panel("", series)])
    fig, (ax,) = _grid(1, cols=1, width=max(PANEL_W, 1.1 * len(runs) + 2), height=PANEL_H + room)
    style = Styles()
    for s in series:
        _draw_series(ax, s, style(s.label), s.label, line=True)
    ax.set_xticks(range(len(runs)), runs, rotation=20, ha="right")
    _axes_style(ax, title, "run", ylabel, log_y=True, log_x=False)
    return png(fig)
