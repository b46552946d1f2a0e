"""The claims' forest plot: each compared pair's difference (better - worse) with its 95% interval,
the paper's own difference beside it and zero marked, one panel per metric (a loss in nats and a
relative INT4 cost do not share an axis). Read with the verdicts table: a point left of zero is on
the side a minimised metric's claim expects."""

from __future__ import annotations

import math
import textwrap
from functools import partial

from matplotlib.figure import Figure

from benchmark.leaderboard.claims import Result
from benchmark.leaderboard.claims.check import CONTRADICTED, REPRODUCED
from benchmark.leaderboard.plots import Plot

NAME = "claims-forest"
COLOURS = {REPRODUCED: "#2ca02c", CONTRADICTED: "#d62728"}  # not decided: grey
ROW_IN = 0.32  # inches per pair


def forest_plot(results: list[Result]) -> Plot | None:
    """None when no pair has a difference to draw."""
    rows = [
        (r, p)
        for r in results
        for p in r.pairs
        if p.difference is not None and math.isfinite(p.difference.estimate)
    ]
    if not rows:
        return None
    title = "Claims: better − worse, 95% interval (○ the paper's difference; colour: the verdict at the adjusted p)"
    return Plot(NAME, title, True, partial(_draw, rows, title))


def _label(r: Result, p) -> str:
    text = f"{r.claim.claim} ({p.better} − {p.worse})" if len(r.pairs) > 1 else r.claim.claim
    return textwrap.shorten(text, 90, placeholder="…")


def _draw(rows, title: str) -> Figure:
    metrics = list(dict.fromkeys(r.claim.metric.column for r, _ in rows))
    panels = [[(r, p) for r, p in rows if r.claim.metric.column == m] for m in metrics]
    fig, axes, _ = _figure(title, panels, ROW_IN, head_in=0.9, top_in=0.55)
    for ax, metric, pairs in zip(axes, metrics, panels):
        ys = list(range(len(pairs)))[::-1]
        for y, (r, p) in zip(ys, pairs):
            d = p.difference
            colour = COLOURS.get(p.verdict, "#7f7f7f")
            if math.isfinite(d.lo):
                ax.plot([d.lo, d.hi], [y, y], color=colour, linewidth=2)
            ax.plot([d.estimate], [y], marker="s", color=colour, markersize=5)
            if p.published is not None:
                ax.plot(
                    [p.published],
                    [y],
                    marker="o",
                    markerfacecolor="white",
                    color="black",
                    markersize=5,
                )
        _frame(ax, ys, [_label(r, p) for r, p in pairs], metric)
    return fig


def _figure(title: str, panels: list[list], row_in: float, head_in: float, top_in: float):
    """A figure of one panel per metric, each as tall as its rows, under `title`: (figure, axes,
    height in inches)."""
    height = head_in + row_in * (sum(map(len, panels)) + 1.2 * len(panels))
    fig = Figure(figsize=(11.5, height))
    gs = fig.add_gridspec(
        len(panels),
        1,
        height_ratios=[len(p) + 1 for p in panels],
        left=0.5,
        right=0.97,
        top=1 - top_in / height,
        bottom=0.45 / height,
        hspace=0.9 / max(1, len(panels)) + 0.15,
    )
    fig.suptitle(title, fontsize=10)
    return fig, [fig.add_subplot(gs[i]) for i in range(len(panels))], height


def _frame(ax, ys: list[int], labels: list[str], metric: str) -> None:
    """A panel's zero line, its pairs' names and its metric's axis."""
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(ys, labels, fontsize=8)
    ax.set_ylim(-0.7, len(ys) - 0.3)
    ax.set_xlabel(f"{metric}: better − worse", fontsize=9)
    ax.grid(axis="x", color="#eee")
    ax.tick_params(axis="x", labelsize=8)


# The passes' plot (claims/compare.py): one marker per pass, in the order the passes ran.
PASS_MARKERS = ("o", "^", "s", "D")
PASSES_NAME = "claims-passes"


def passes_plot(rows: list[tuple[str, str, str, list]], names: list[str]) -> Plot | None:
    """Each compared pair across the passes of a study: `rows` (claim, pair, metric, per pass None
    or ((estimate, lo, hi), outcome)) from claims.compare, `names` the passes ("first", ...).
    None when no pass has a difference to draw."""
    rows = [r for r in rows if any(r[3])]
    if not rows:
        return None
    title = (
        "Claims across passes: better − worse, 95% interval (marker: the pass; colour: its verdict "
        "at its adjusted p, green reproduced, red contradicted, grey not decided)"
    )
    return Plot(PASSES_NAME, title, True, partial(_draw_passes, rows, names, title))


def _draw_passes(rows, names, title: str) -> Figure:
    from matplotlib.lines import Line2D

    metrics = list(dict.fromkeys(r[2] for r in rows))
    panels = [[r for r in rows if r[2] == m] for m in metrics]
    fig, axes, height = _figure(title, panels, ROW_IN * 1.6, head_in=1.4, top_in=0.95)
    step = 0.6 / max(1, len(names) - 1)  # the passes of a pair spread over 0.6 of its row
    for ax, metric, pairs in zip(axes, metrics, panels):
        ys = list(range(len(pairs)))[::-1]
        for y, (*_, drawn) in zip(ys, pairs):
            for k, cell in enumerate(drawn):
                if cell is None:
                    continue
                (estimate, lo, hi), outcome = cell
                at = y + 0.3 - k * step  # the first pass on top
                colour = COLOURS.get(outcome, "#7f7f7f")
                if math.isfinite(lo) and math.isfinite(hi):
                    ax.plot([lo, hi], [at, at], color=colour, linewidth=1.6)
                ax.plot([estimate], [at], marker=PASS_MARKERS[k], color=colour, markersize=5)
        # the claim shortened, never its pair: which difference a row is
        labels = [f"{textwrap.shorten(c, 70, placeholder='…')} ({pair})" for c, pair, *_ in pairs]
        _frame(ax, ys, labels, metric)
    fig.legend(
        handles=[
            Line2D([], [], marker=m, color="black", linestyle="none", label=f"{n} pass")
            for m, n in zip(PASS_MARKERS, names)
        ],
        loc="upper center",
        bbox_to_anchor=(0.5, 1 - 0.4 / height),
        ncols=len(names),
        fontsize=8,
        frameon=False,
    )
    return fig
