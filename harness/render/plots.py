"""The plot kinds of the report, each from plain numbers and labels to PNG bytes: log-log panels
with fits and claimed slopes, line panels, annotated heat maps, a roofline and one metric across
runs (:mod:`harness.render.figures` turns result rows into these calls; the primitives are in
:mod:`harness.render.draw`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness import fmt
from harness.render.draw import (
    FONT,
    MAX_BANDS,
    MAX_PANELS,
    PANEL_H,
    PANEL_W,
    Panel,
    Series,
    Styles,
    axes_style,
    draw_series,
    drawable,
    grid,
    legend_room,
    png,
    tick_labels,
    vlines,
)


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


def loglog_panels(
    panels: list[Panel], xlabel: str, ylabel: str, suptitle: str = "", log_y: bool = True
) -> bytes:
    """Up to MAX_PANELS log-log panels; each series: markers with its CI band, its fit (solid,
    over the fitted region, slope in the legend) and the claimed slope (dotted, through the
    fitted constant)."""
    panels = drawable(panels)
    fig, axes = grid(len(panels), height=PANEL_H + legend_room(panels))
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
                label += f" (fit {fmt.fixed(f['exponent'], 2)})"
            if s.claimed is not None and len(x):
                xs = np.geomspace(x.min(), x.max(), 30)
                ax.plot(xs, claimed_line(s, xs), ":", color=st["color"], lw=1.4)
                label += f" [claim {fmt.number(s.claimed, 6)}]"
            draw_series(ax, s, st, label, line=False, band=len(panel.series) <= MAX_BANDS)
        vlines(ax, panel.vlines)
        axes_style(ax, panel.title, xlabel, ylabel, log_y)
    if suptitle:
        fig.suptitle(suptitle, fontsize=FONT["title"] + 1)
    return png(fig)


def heatmaps(maps: list[tuple[str, pd.DataFrame]], value_label: str, digits: int = 3) -> bytes:
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
                ax.text(
                    c,
                    r,
                    fmt.number(v, digits),
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
    panels = drawable(panels)
    fig, axes = grid(len(panels), cols=cols, height=PANEL_H + legend_room(panels))
    style = Styles()
    for ax, panel in zip(axes, panels, strict=True):
        for s in panel.series:
            band = len(panel.series) <= MAX_BANDS
            draw_series(ax, s, style(s.label), s.label, line=True, band=band)
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
    per label, under each device's roof ``min(peak, intensity x bandwidth)``."""
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
            (xs[-1], ys[-1]),
            fontsize=FONT["tick"],
            ha="right",
            va="bottom",
        )
    for s in points:
        draw_series(ax, s, style(s.label), s.label, line=False)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(tick_labels())
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
