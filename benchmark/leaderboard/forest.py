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
    height = 0.9 + ROW_IN * (len(rows) + 1.2 * len(panels))
    fig = Figure(figsize=(11.5, height))
    gs = fig.add_gridspec(
        len(panels),
        1,
        height_ratios=[len(p) + 1 for p in panels],
        left=0.5,
        right=0.97,
        top=1 - 0.55 / height,
        bottom=0.45 / height,
        hspace=0.9 / max(1, len(panels)) + 0.15,
    )
    fig.suptitle(title, fontsize=10)
    for i, (metric, pairs) in enumerate(zip(metrics, panels)):
        ax = fig.add_subplot(gs[i])
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
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_yticks(ys, [_label(r, p) for r, p in pairs], fontsize=8)
        ax.set_ylim(-0.7, len(pairs) - 0.3)
        ax.set_xlabel(f"{metric}: better − worse", fontsize=9)
        ax.grid(axis="x", color="#eee")
        ax.tick_params(axis="x", labelsize=8)
    return fig
