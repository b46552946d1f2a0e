"""The frame of every figure: a grid of panels, one legend, axis labels from the metric registry,
and tick labels that never run into each other.

Margins are fixed, in inches, rather than constrained layout (measuring every tick label to place
the axes cost several times the drawing itself), so the ticks are chosen before drawing: from an
estimate of each label's width, as many as fit side by side within a panel and across the gap to
the next panel.
"""

from __future__ import annotations

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import (
    EngFormatter,
    Locator,
    LogLocator,
    MaxNLocator,
    NullLocator,
    ScalarFormatter,
)

from benchmark.leaderboard.objectives import Objective

TICK_PT = 10.0  # tick label size: matplotlib's "medium"
# Width of a tick label's character in em, a little over DejaVu Sans' widest ones (digits 0.64,
# "M" 0.86, "k" 0.58, "." 0.32): an estimate too narrow lets labels touch, one too wide only drops a tick.
CHAR_EM = 0.7
GAP_EM = 1.0  # clear space between neighbouring labels
MARGIN = 0.05  # matplotlib's autoscale margin: the view runs 5% of the data's span past each end
ENGINEERING = 1e4  # values from here on get engineering ticks: 30M, 1.4996M, 786k
# Tick steps (times a power of ten): without matplotlib's 2.5, a narrow band of parameter counts
# reads 1.4996M, 1.4998M, not 1.49965M, 1.4999M.
STEPS = (1, 2, 5, 10)
LOG_SPAN = 3.0  # positive engineering values spanning more than this ratio get a log axis
# Log ticks at these multiples of each decade, densest first; the first whose labels fit is used.
LOG_SUBS = ((1.0, 2.0, 3.0, 5.0), (1.0, 2.0, 5.0), (1.0, 3.0), (1.0,))


def new(
    title: str,
    ncols: int = 1,
    nrows: int = 1,
    width: float = 7.0,
    height: float = 4.6,
    legend: float = 0.0,
    hidden: int = 0,
):
    """Figure with a title and a grid of axes sharing their x and y; `legend` reserves that many
    inches on the right for a figure legend; the last `hidden` panels of the grid are not shown
    (the panel above one keeps its x tick labels, which sharing would have taken away)."""
    width += legend
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    several = ncols * nrows > 1
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=several, sharey=several)
    # wspace 0.3 of a panel: room for the halves of two 9-character tick labels at facing edges.
    fig.subplots_adjust(
        left=0.8 / width,
        right=1 - (0.25 + legend) / width,
        bottom=0.65 / height,
        top=1 - 0.55 / height,
        wspace=0.3 if ncols > 1 else 0.0,
        hspace=0.45,
    )
    fig.suptitle(title, y=1 - 0.12 / height, va="top")
    flat = axes.ravel()
    for i in range(len(flat) - hidden, len(flat)):
        flat[i].set_visible(False)
        if i >= ncols:
            flat[i - ncols].xaxis.set_tick_params(which="both", labelbottom=True)
    return fig, flat[: len(flat) - hidden]


def figure_legend(fig: Figure, axes) -> None:
    """One legend in the space `new` reserved on the right. Outside the axes it needs no "best"
    placement, which tests every data point for overlap (seconds on a large study)."""
    handles = {label: h for ax in axes for h, label in zip(*ax.get_legend_handles_labels())}
    fig.legend(handles.values(), handles.keys(), loc="center right", fontsize=8, frameon=False)


def axis_label(obj: Objective) -> str:
    """The registry's label and unit, and which way is better: 'parameters (count), lower is better'."""
    return f"{obj.metric.axis_label()}, {'higher' if obj.maximize else 'lower'} is better"


def style(ax, xs: np.ndarray, ys: np.ndarray) -> None:
    """Ticks for the values a panel (and the panels sharing its axes) shows, and a light grid."""
    _x_ticks(ax, np.asarray(xs, dtype=float))
    finite = np.asarray(ys, dtype=float)
    finite = finite[np.isfinite(finite)]
    if len(finite) and np.abs(finite).max() >= ENGINEERING:
        ax.yaxis.set_major_formatter(
            EngFormatter(sep="")
        )  # rows of labels stack: the default count fits
    ax.grid(True, which="major", alpha=0.3)


def _x_ticks(ax, xs: np.ndarray) -> None:
    """Engineering ticks for large values, a log axis when they span orders of magnitude, and as
    many ticks as their labels fit: matplotlib's own count allows 3 em a label, and '1.4996M'
    takes more (neighbouring panels' labels ran together, '300.15k300k')."""
    finite = xs[np.isfinite(xs)]
    if not len(finite):
        return
    lo, hi = float(finite.min()), float(finite.max())
    big = max(abs(lo), abs(hi)) >= ENGINEERING
    fig = ax.figure
    width = ax.get_position().width * fig.get_figwidth()  # inches
    gap = fig.subplotpars.wspace * width if fig.subplotpars.wspace else np.inf  # to the next panel
    formatter = (
        (lambda: EngFormatter(sep="")) if big else (lambda: ScalarFormatter(useOffset=False))
    )
    if big and lo > 0 and hi / lo > LOG_SPAN:
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(_log_locator(lo, hi, width, gap, formatter))
        ax.xaxis.set_minor_locator(NullLocator())  # tick objects, not drawing, dominate render time
    else:
        ax.xaxis.set_major_locator(_linear_locator(lo, hi, width, gap, formatter))
    ax.xaxis.set_major_formatter(formatter())


def _linear_locator(lo: float, hi: float, width: float, gap: float, formatter) -> Locator:
    pad = MARGIN * (hi - lo)
    vmin, vmax = MaxNLocator().nonsingular(
        lo - pad, hi + pad
    )  # widened around a single value, as autoscaling does
    for nbins in range(8, 0, -1):
        ticks = MaxNLocator(nbins=nbins, steps=STEPS).tick_values(vmin, vmax)
        if _fits(ticks, vmin, vmax, width, gap, formatter, log=False):
            break
    return MaxNLocator(nbins=nbins, steps=STEPS)


def _log_locator(lo: float, hi: float, width: float, gap: float, formatter) -> Locator:
    pad = (hi / lo) ** MARGIN  # the margin is a share of the span in log space
    vmin, vmax = lo / pad, hi * pad
    for subs in LOG_SUBS:
        for numticks in (15,) if len(subs) > 1 else range(15, 1, -1):  # fewer decades labelled
            locator = LogLocator(subs=subs, numticks=numticks)
            if _fits(locator.tick_values(vmin, vmax), vmin, vmax, width, gap, formatter, log=True):
                return locator
    return locator


def _fits(
    ticks: np.ndarray, vmin: float, vmax: float, width: float, gap: float, formatter, log: bool
) -> bool:
    """Whether the labels of `ticks` in view stand clear of each other, and overhang the panel's
    edges by at most half the gap to the next panel (whose labels may overhang towards them)."""
    ticks = ticks[(ticks >= vmin) & (ticks <= vmax)]
    if not len(ticks):
        return False
    scale = np.log10 if log else (lambda v: v)
    pos = (scale(ticks) - scale(vmin)) / (scale(vmax) - scale(vmin)) * width  # inches from the left
    em = TICK_PT / 72
    half = np.array([len(label) for label in _labels(formatter(), ticks)]) * CHAR_EM * em / 2
    clear = np.diff(pos) >= half[:-1] + half[1:] + GAP_EM * em
    overhang = max(half[0] - pos[0], half[-1] - (width - pos[-1]))
    return bool(clear.all()) and overhang <= gap / 2 - GAP_EM * em / 2


def _labels(formatter, ticks: np.ndarray) -> list[str]:
    """The labels `formatter` writes for `ticks`, as it will at drawing (a ScalarFormatter picks
    its decimals from all the ticks together)."""
    formatter.create_dummy_axis()
    formatter.set_locs(ticks)
    return [formatter(t) for t in ticks]
