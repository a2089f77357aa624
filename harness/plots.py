"""Figures for reports (matplotlib, Agg backend: no display, no network): drawing primitives
that return PNG bytes, and the functions that turn result rows into those figures and the
tables beside them. :mod:`harness.report` arranges them into sections."""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter, NullFormatter

COLORS = plt.get_cmap("tab10").colors
MAX_PANELS = 12


@dataclass
class Series:
    """One line on a panel: measured points, optionally its fit and the claimed slope."""

    label: str
    x: Sequence[float]
    y: Sequence[float]
    fit: dict | None = None  # exponent, prefactor, offset, x_lo, x_hi
    claimed: float | None = None  # exponent drawn through the largest measured point


@dataclass
class Panel:
    title: str
    series: list[Series] = field(default_factory=list)
    vlines: list[tuple[float, str]] = field(default_factory=list)  # (x, label)


def png(fig) -> bytes:
    """Render and close a figure."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def _axes_style(ax, title: str, xlabel: str, ylabel: str, log_y: bool) -> None:
    """Log2 x axis, optional log y, plain-text tick labels (mathtext layout is slow)."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    if log_y:
        with warnings.catch_warnings():  # constant data (e.g. a flat decode step): fine
            warnings.filterwarnings("ignore", message="Attempting to set identical")
            ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0e}"))
        low, high = ax.get_ylim()
        small = high / low < 10  # no decade tick inside: label the minor ticks instead
        ax.yaxis.set_minor_formatter(
            FuncFormatter(lambda v, _: f"{v:.3g}") if small else NullFormatter()
        )
    ax.set_title(title, fontsize=8)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(True, which="major", alpha=0.25)
    ax.legend(fontsize=6.5, loc="best")


def _grid(n: int, width: float = 4.6, height: float = 3.4):
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def loglog_panels(
    panels: list[Panel], xlabel: str, ylabel: str, suptitle: str = "", log_y: bool = True
) -> bytes:
    """Up to MAX_PANELS log-log panels; each series: markers, its fit (solid, over the fitted
    region, slope in the legend) and the claimed slope (dotted, through the largest point)."""
    panels = panels[:MAX_PANELS]
    fig, axes = _grid(len(panels))
    for ax, panel in zip(axes, panels, strict=True):
        for i, s in enumerate(panel.series):
            color = COLORS[i % len(COLORS)]
            x, y = np.asarray(s.x, float), np.asarray(s.y, float)
            label = s.label
            if s.fit and np.isfinite(s.fit.get("exponent", np.nan)):
                f = s.fit
                xs = np.geomspace(f["x_lo"], f["x_hi"], 40)
                ax.plot(
                    xs,
                    f["offset"] + f["prefactor"] * xs ** f["exponent"],
                    "-",
                    color=color,
                    alpha=0.6,
                    lw=1.5,
                )
                label += f" (fit {f['exponent']:.2f})"
            if s.claimed is not None and len(x):
                xs = np.geomspace(x.min(), x.max(), 20)
                ax.plot(xs, y[-1] * (xs / x[-1]) ** s.claimed, ":", color=color, lw=1.2)
                label += f" [claim {s.claimed:g}]"
            ax.plot(x, y, "o", color=color, ms=4, label=label)
        for x_at, text in panel.vlines:
            ax.axvline(x_at, color="grey", ls="--", lw=1)
            ax.annotate(
                text,
                (x_at, 0.02),
                xycoords=("data", "axes fraction"),
                rotation=90,
                fontsize=7,
                color="grey",
                ha="right",
                va="bottom",
            )
        _axes_style(ax, panel.title, xlabel, ylabel, log_y)
    if suptitle:
        fig.suptitle(suptitle, fontsize=10)
    fig.tight_layout()
    return png(fig)


def heatmaps(maps: list[tuple[str, pd.DataFrame]], value_label: str, fmt: str = "{:.3g}") -> bytes:
    """Annotated heat maps, one per (title, pivot table rows=heads x cols=d_model)."""
    maps = maps[:MAX_PANELS]
    fig, axes = _grid(len(maps), width=4.8, height=3.6)
    for ax, (title, table) in zip(axes, maps, strict=True):
        values = table.to_numpy(float)
        image = ax.imshow(values, cmap="viridis", aspect="auto", origin="lower")
        ax.set_xticks(range(table.shape[1]), [str(c) for c in table.columns], fontsize=7)
        ax.set_yticks(range(table.shape[0]), [str(r) for r in table.index], fontsize=7)
        ax.set_xlabel(str(table.columns.name), fontsize=8)
        ax.set_ylabel(str(table.index.name), fontsize=8)
        ax.set_title(title, fontsize=8)
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
                    fontsize=6.5,
                    color="white" if v < mid else "black",
                )
        fig.colorbar(image, ax=ax, label=value_label, shrink=0.85)
    fig.tight_layout()
    return png(fig)


def lines(
    panels: list[Panel],
    xlabel: str,
    ylabel: str,
    log_y: bool = False,
    hline: tuple[float, str] | None = None,
) -> bytes:
    """Plain line panels over a log2 x axis (FLOP/s fractions, errors)."""
    panels = panels[:MAX_PANELS]
    fig, axes = _grid(len(panels))
    for ax, panel in zip(axes, panels, strict=True):
        for i, s in enumerate(panel.series):
            ax.plot(s.x, s.y, "o-", color=COLORS[i % len(COLORS)], ms=4, lw=1, label=s.label)
        if hline is not None:
            ax.axhline(hline[0], color="grey", ls="--", lw=1, label=hline[1])
        _axes_style(ax, panel.title, xlabel, ylabel, log_y)
    fig.tight_layout()
    return png(fig)
