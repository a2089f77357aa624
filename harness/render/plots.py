"""The report's plots, from plain numbers and labels to PNG bytes (matplotlib, Agg backend: no
display, no network): the primitives (series and panels, one style per label, grids of axes,
log axes with enough labelled ticks) and the plot kinds built from them (log-log panels with
fits and claimed slopes, line panels, annotated heat maps, a roofline, one metric across runs,
a time claim's fit over its utilization). Nothing here reads result rows or imports the rest
of the harness but the number formatter; :mod:`harness.render.panels` turns rows into these
panels.

Figures are drawn at :data:`DPI` and meant to be shown at ``css_width(png)`` CSS pixels (their
size in inches at 96 px per inch), so fonts keep their point size on the page and stay sharp
on high-density screens; a figure is at least :data:`MIN_WIDTH` inches wide. Series keep one
colour, marker and line style per label across every panel of a figure; alternate series have
hollow markers, so coinciding series stay visible. Intervals are drawn as error bars (95 %
CI of each median), never as shaded bands; shading marks regions of the axis (a plateau).
"""

# size: the drawing primitives and the plot kinds built on them are read together (one
# style, one tick and legend rule for every plot); nothing here knows about result rows.

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
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

from harness import fmt

DPI = 160
CSS_PX_PER_INCH = 96
COLORS = plt.get_cmap("tab10").colors
MARKERS = ("o", "s", "^", "D", "v", "P", "X")  # 7 markers x 10 colours: 70 distinct styles
LINESTYLES = ("-", "--", "-.", ":")
MAX_PANELS = 12
LEGEND_BELOW = 5  # more legend entries than this: the legend goes under the axes
LABEL_WIDTH = 46  # legend labels wrap at this many characters
PANEL_W, PANEL_H = 5.4, 3.9  # inches; two panels a row fill an ~1050 CSS px page
MIN_WIDTH = 7.6  # inches: a one-panel figure is shown ~730 CSS px wide, not ~520
FONT = {"title": 10, "label": 9.5, "tick": 8.5, "legend": 8}
BEATEN = "(!) calibration beaten"  # title note where a point is above its calibrated bound


@dataclass
class Series:
    """One line on a panel: measured points, optionally their 95 % interval (``low``..
    ``high``, drawn as error bars), its fit and the claimed slope."""

    label: str
    x: Sequence[float]
    y: Sequence[float]
    fit: dict | None = None  # exponent, prefactor, offset, x_lo, x_hi
    claimed: float | None = None  # exponent, drawn through the fitted constant
    low: Sequence[float] | None = None
    high: Sequence[float] | None = None


@dataclass
class Panel:
    """One set of axes: its title, its series, labelled vertical lines and guides (reference
    curves drawn dashed and grey without markers: a tolerance, a 100 % line)."""

    title: str
    series: list[Series] = field(default_factory=list)
    vlines: list[tuple[float, str]] = field(default_factory=list)  # (x, label)
    guides: list[Series] = field(default_factory=list)


# --- primitives ----------------------------------------------------------------------------


def png(fig) -> bytes:
    """Render and close a figure.

    The constrained layout is done here, at :data:`DPI`, and then turned off: ``savefig`` of a
    figure with a layout engine draws it twice (once, with drawing disabled, to lay it out; once
    to paint), and the first draw was an eighth of a report's time. Same pixels either way."""
    fig.set_dpi(DPI)
    engine = fig.get_layout_engine()
    if engine is not None:
        engine.execute(fig)
        fig.set_layout_engine(None)  # "none" would leave a placeholder engine: a second draw
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


def log_ticks(axis, low: float, high: float) -> None:
    """Major ticks on a log axis with at least two labels inside ``low..high``: decades when
    two or more fit, else 1-2-5 steps, else every integer multiple (a range under 2.5x)."""
    decades = math.floor(math.log10(high)) - math.ceil(math.log10(low)) + 1
    if decades >= 2:
        subs = (1.0,)
    elif high / low >= 2.5:
        subs = (1.0, 2.0, 5.0)
    else:
        subs = tuple(float(s) for s in range(1, 10))
    axis.set_major_locator(LogLocator(base=10, subs=subs, numticks=30))
    axis.set_major_formatter(tick_labels(3 if len(subs) > 1 else 6))
    axis.set_minor_formatter(NullFormatter())
    if len(subs) > 1:  # the majors are already dense: no unlabelled minors between them
        axis.set_minor_locator(NullLocator())


def axes_style(ax, title: str, xlabel: str, ylabel: str, log_y: bool, log_x: bool = True):
    """Log2 x axis, optional log y (:func:`log_ticks`), plain-number tick labels (mathtext
    layout is slow), a legend beside or under the axes."""
    if log_x:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(tick_labels())
        ax.xaxis.set_minor_formatter(NullFormatter())
    if log_y:
        with warnings.catch_warnings():  # constant data (e.g. a flat decode step): fine
            warnings.filterwarnings("ignore", message="Attempting to set identical")
            ax.set_yscale("log")
        low, high = ax.get_ylim()
        log_ticks(ax.yaxis, low, high)
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
        if len(p.series) + len(p.guides) > LEGEND_BELOW:
            labels = [s.label for s in [*p.series, *p.guides]]
            lines = sum(len(textwrap.wrap(t, LABEL_WIDTH)) or 1 for t in labels)
            room = max(room, 0.5 + 0.19 * math.ceil(lines / legend_cols(labels)))
    return room


def grid(n: int, cols: int = 2, width: float = PANEL_W, height: float = PANEL_H):
    """A figure with ``n`` axes, ``cols`` a row, each ``width`` x ``height`` inches (at least
    :data:`MIN_WIDTH` in all; the unused cells of the last row hidden): (figure, the ``n``
    axes)."""
    cols = max(1, min(n, cols))
    rows = math.ceil(n / cols)
    total = max(width * cols, MIN_WIDTH)
    fig, axes = plt.subplots(
        rows, cols, figsize=(total, height * rows), squeeze=False, layout="constrained"
    )
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def drawable(panels: list[Panel]) -> list[Panel]:
    """Panels with at least one finite positive point (log axes need one), at most MAX_PANELS."""

    def has_points(s: Series) -> bool:
        y = np.asarray(s.y, float)
        return bool(np.any(np.isfinite(y) & (y > 0)))

    kept = [
        Panel(p.title, [s for s in p.series if has_points(s)], p.vlines, p.guides)
        for p in panels
    ]
    return [p for p in kept if p.series][:MAX_PANELS]


def draw_series(ax, s: Series, style: dict, label: str, line: bool) -> None:
    """Markers (joined by a line when ``line``) at the finite points of ``s``, with error bars
    from its ``low``..``high`` interval where given."""
    x, y = np.asarray(s.x, float), np.asarray(s.y, float)
    keep = np.isfinite(x) & np.isfinite(y)
    if s.low is not None and s.high is not None:
        low, high = np.asarray(s.low, float), np.asarray(s.high, float)
        good = keep & np.isfinite(low) & np.isfinite(high)
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
        x[keep],
        y[keep],
        ls=style["linestyle"] if line else "none",
        marker=style["marker"],
        color=style["color"],
        markerfacecolor=style["markerfacecolor"],
        ms=5.5,
        mew=1.3,
        lw=1.3,
        label=textwrap.fill(label, LABEL_WIDTH),
    )


def draw_guides(ax, guides: list[Series]) -> None:
    """Reference curves: dashed grey lines, labelled in the legend."""
    for i, g in enumerate(guides):
        x, y = np.asarray(g.x, float), np.asarray(g.y, float)
        keep = np.isfinite(x) & np.isfinite(y) & (y > 0)
        if keep.any():
            ax.plot(x[keep], y[keep], ls=("--", ":")[i % 2], color="dimgrey", lw=1.2,
                    label=textwrap.fill(g.label, LABEL_WIDTH))


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


# --- plot kinds ----------------------------------------------------------------------------


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


def _fitted(ax, s: Series, style: dict) -> str:
    """Draw a series' fit (solid, over its region) and claimed slope (dotted); its label."""
    label = s.label
    x = np.asarray(s.x, float)
    if s.fit and np.isfinite(s.fit.get("exponent", np.nan)):
        f = s.fit
        xs = np.geomspace(f["x_lo"], f["x_hi"], 40)
        ax.plot(xs, f["offset"] + f["prefactor"] * xs ** f["exponent"], "-",
                color=style["color"], alpha=0.55, lw=2.2)
        label += f" (fit {fmt.fixed(f['exponent'], 2)})"
    if s.claimed is not None and len(x):
        xs = np.geomspace(x.min(), x.max(), 30)
        ax.plot(xs, claimed_line(s, xs), ":", color=style["color"], lw=1.4)
        label += f" [claim {fmt.number(s.claimed, 6)}]"
    return label


def loglog_panels(
    panels: list[Panel], xlabel: str, ylabel: str, suptitle: str = "", log_y: bool = True
) -> bytes:
    """Up to MAX_PANELS log-log panels; each series: markers with error bars, its fit (solid,
    over the fitted region, slope in the legend) and the claimed slope (dotted, through the
    fitted constant)."""
    panels = drawable(panels)
    fig, axes = grid(len(panels), height=PANEL_H + legend_room(panels))
    style = Styles()
    for ax, panel in zip(axes, panels, strict=True):
        for s in panel.series:
            st = style(s.label)
            draw_series(ax, s, st, _fitted(ax, s, st), line=False)
        draw_guides(ax, panel.guides)
        vlines(ax, panel.vlines)
        axes_style(ax, panel.title, xlabel, ylabel, log_y)
    if suptitle:
        fig.suptitle(suptitle, fontsize=FONT["title"] + 1)
    return png(fig)


def heatmaps(maps: list[tuple[str, object]], value_label: str, digits: int = 3) -> bytes:
    """Annotated heat maps (cells to ``digits`` significant digits), one per (title, complete
    pivot table rows=heads x cols=d_model)."""
    maps = maps[:MAX_PANELS]
    fig, axes = grid(len(maps))
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
                ax.text(c, r, fmt.number(v, digits), ha="center", va="center",
                        fontsize=FONT["tick"], color="white" if v < mid else "black")
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
    """Line panels over a log2 x axis (throughput, speedups, errors), error bars where given,
    each panel's guides and an optional labelled horizontal line. Panels in one figure share
    each label's style, so a side-by-side pair reads as one."""
    panels = drawable(panels)
    fig, axes = grid(len(panels), cols=cols, height=PANEL_H + legend_room(panels))
    style = Styles()
    for ax, panel in zip(axes, panels, strict=True):
        for s in panel.series:
            draw_series(ax, s, style(s.label), s.label, line=True)
        draw_guides(ax, panel.guides)
        if hline is not None:
            ax.axhline(hline[0], color="grey", ls="--", lw=1, label=hline[1])
        vlines(ax, panel.vlines)
        axes_style(ax, panel.title, xlabel, ylabel, log_y)
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
    per label, under each device's roof ``min(peak, intensity x bandwidth)``. Points above every
    roof at their intensity are counted in the title: the calibration was beaten."""
    room = legend_room([Panel("", points)])
    fig, (ax,) = grid(1, cols=1, width=PANEL_W * 1.6, height=PANEL_H * 1.3 + room)
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
            f"{roof.label}{fmt.number(roof.peak_flops / 1e12, 3)} TFLOP/s, "
            f"{fmt.number(roof.bandwidth / 1e9, 3)} GB/s",
            (xs[-1], ys[-1]), fontsize=FONT["tick"], ha="right", va="bottom",
        )
    above = 0
    for s in points:
        draw_series(ax, s, style(s.label), s.label, line=False)
        x, y = np.asarray(s.x, float), np.asarray(s.y, float) * 1e12
        top = np.max([np.minimum(r.peak_flops, x * r.bandwidth) for r in roofs], axis=0)
        above += int(np.sum(y > top * 1.0001))
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(tick_labels())
    if above:
        title += f"\n{BEATEN}: {above} point{'s' if above > 1 else ''} above the roof"
    axes_style(
        ax, title, "arithmetic intensity (FLOP / compulsory byte)", "TFLOP/s", True, log_x=False
    )
    return png(fig)


def history(runs: list[str], series: list[Series], ylabel: str, title: str) -> bytes:
    """One metric across runs (x: the runs in order, labelled), a line per series."""
    room = legend_room([Panel("", series)])
    fig, (ax,) = grid(1, cols=1, width=max(PANEL_W, 1.1 * len(runs) + 2), height=PANEL_H + room)
    style = Styles()
    for s in series:
        draw_series(ax, s, style(s.label), s.label, line=True)
    ax.set_xticks(range(len(runs)), runs, rotation=20, ha="right")
    axes_style(ax, title, "run", ylabel, log_y=True, log_x=False)
    return png(fig)


def fit_over_utilization(
    fitted: list[Series],
    utilization: list[Series],
    regions: list[tuple[float, float]],
    *,
    xlabel: str,
    ylabel: str,
    util_label: str,
    title: str,
    percent: bool = True,
) -> bytes:
    """A time claim's evidence, two panels sharing the x axis: the metric with its fit over
    the plateau (log-log) above, and utilization against the same axis below, each plateau
    region shaded; a dashed 100 % line (and a title note) where a point beats its
    calibration (``percent``: utilization in % of the bound)."""
    room = legend_room([Panel("", fitted)])
    fig, axes = plt.subplots(
        2, 1, figsize=(MIN_WIDTH, PANEL_H * 1.55 + room), sharex=True, layout="constrained",
        height_ratios=(3, 2),
    )
    style = Styles()
    top, bottom = axes
    for s in fitted:
        st = style(s.label)
        draw_series(top, s, st, _fitted(top, s, st), line=False)
    for lo, hi in sorted(set(regions)):  # groups sharing a region shade it once
        for ax in axes:
            ax.axvspan(lo, hi, color="tab:green", alpha=0.08, lw=0)
    beaten = False
    for s in utilization:
        draw_series(bottom, s, style(s.label), s.label, line=True)
        beaten |= percent and bool(np.nanmax(np.asarray(s.y, float), initial=0) > 100)
    if beaten:
        bottom.axhline(100, color="firebrick", ls="--", lw=1, label="calibrated bound (100%)")
        title += f"\n{BEATEN}: utilization above 100%"
    axes_style(top, title, "", ylabel, True)
    below = ("shaded: plateau (the time verdict is fitted there)" if regions
             else "no plateau: utilization is not level, so no time verdict")
    axes_style(bottom, below, xlabel, util_label, True)
    return png(fig)


def ratio_along(
    series: list[Series],
    *,
    band: tuple[float, float] | None,
    fan: tuple[float, float] | None,
    xlabel: str,
    ylabel: str,
    title: str,
) -> bytes:
    """A ratio or trend claim's evidence on one log-log panel: each group's ratio at its
    matched points with their 95 % intervals, and what was claimed. ``band``: a ratio claim's
    (low, high) ratio, shaded (an infinite side runs to the panel's edge); ``fan``: a trend
    claim's (lowest, highest) exponent, shaded between the two power laws through the first
    series' claimed line at the geometric middle of its points; the fit (solid) and the
    claimed exponent (dotted) as on every exponent figure. The x axis is logarithmic unless
    an axis value is 0 or below (a ratio along ``prefix_len`` from 0)."""
    fig, (ax,) = grid(1, cols=1, height=PANEL_H + legend_room([Panel("", series)]))
    style = Styles()
    for s in series:
        st = style(s.label)
        draw_series(ax, s, st, _fitted(ax, s, st) if s.fit else s.label, line=False)
    first = series[0]
    x = np.asarray(first.x, float)
    log_x = all(np.all(np.asarray(s.x, float) > 0) for s in series)  # else a linear axis
    if (fan is not None and np.all(np.isfinite(fan)) and first.claimed is not None and len(x)
            and log_x):
        xs = np.geomspace(x.min(), x.max(), 30)
        middle = float(np.exp(np.log(x).mean()))
        at = claimed_line(first, np.array([middle]))[0]
        low, high = (at * (xs / middle) ** e for e in fan)
        ax.fill_between(xs, np.minimum(low, high), np.maximum(low, high), color="tab:green",
                        alpha=0.12, lw=0, label=f"claimed: exponent {fmt.number(fan[0], 3)}"
                        f"..{fmt.number(fan[1], 3)}")
    if band is not None:
        lo, hi = (v if np.isfinite(v) and v > 0 else None for v in band)
        bottom, top = ax.get_ylim()  # the panel holds the data and each finite edge
        bottom = min(bottom, (lo or bottom) / 1.25, (hi or bottom) / 1.25)
        top = max(top, (hi or top) * 1.25, (lo or top) * 1.25)
        ax.axhspan(lo or bottom, hi or top, color="tab:green", alpha=0.12, lw=0,
                   label=f"claimed: [{fmt.number(band[0], 3)}, {fmt.number(band[1], 3)}]")
        for v in (lo, hi):
            if v is not None:
                ax.axhline(v, color="tab:green", ls="--", lw=1)
        ax.set_ylim(bottom, top)
    axes_style(ax, title, xlabel, ylabel, True, log_x=log_x)
    return png(fig)
