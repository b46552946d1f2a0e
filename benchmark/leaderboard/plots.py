"""Figures: Pareto frontiers (overall, per family, study against study) and loop-scaling curves.

Figures are built on matplotlib's object API with an Agg canvas: no pyplot, so no global state and
no display is ever needed. Dominated points are drawn faded and rasterised (a search can hold
thousands; as vectors they would bloat the SVG), the frontier as a step line on top. The frame
(panels, ticks that fit, axis labels from the metric registry) is layout.py's.
"""

from __future__ import annotations

import io
import json
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, NullLocator

from benchmark import FAMILIES
from benchmark.leaderboard import frontier, layout, scaling
from benchmark.leaderboard.board import KEY, Board
from benchmark.leaderboard.objectives import Objective
from benchmark.store import metric

# Fixed colours per registered family, so a family looks the same in every plot of every study.
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
MAX_PANELS = 4  # loop-scaling panels (budget bands) per figure


@dataclass(frozen=True)
class Plot:
    """A figure the board supports, planned but not yet drawn: what names it and where it goes is
    known at once, so the documents can be written while a separate process draws (see render)."""

    name: str  # file stem
    title: str  # caption on the page and alt text
    wide: bool  # several panels: the page lets it span the whole row
    draw: Callable[[], Figure]


def plan(board: Board) -> tuple[list[Plot], list[str]]:
    """Every figure the board supports, and a note for each one it cannot draw. (The scaling fits'
    figure is scaling_plot: scaling.fit says why a study has none.)"""
    plots, notes = [], []
    for objs in board.pairs:
        plots.append(frontier_plot(board, objs))
    plots.append(family_grid(board, board.objectives))
    for make in (eval_loop_plot, train_loop_plot):
        plot, note = make(board)
        plots += [plot] if plot else []
        notes += [note] if note else []
    return plots, notes


def render_all(plots: list[Plot]) -> dict[str, dict[str, bytes]]:
    """Plot name -> its PNG and SVG files."""
    return {plot.name: render(plot) for plot in plots}


# SVG text stays text (the default turns every glyph into a path: slower, and three times larger),
# and element ids are salted with a constant so the same plot gives the same file.
SVG_STYLE = {"svg.fonttype": "none", "svg.hashsalt": "shapebench"}


def render(plot: Plot) -> dict[str, bytes]:
    figure = plot.draw()
    png, svg = io.BytesIO(), io.BytesIO()
    # zlib level 1: the default (6) spends more time compressing than drawing, for ~20% smaller files.
    figure.savefig(png, format="png", dpi=100, pil_kwargs={"compress_level": 1})
    with matplotlib.rc_context(SVG_STYLE):
        figure.savefig(svg, format="svg", dpi=100, metadata={"Date": None})
    return {"png": png.getvalue(), "svg": svg.getvalue()}


def family_color(family: str) -> str:
    if family in FAMILIES:
        return PALETTE[FAMILIES.index(family)]
    return PALETTE[zlib.crc32(family.encode()) % len(PALETTE)]  # stable across runs, unlike hash()


def study_color(study: str, studies: list[str]) -> str:
    return PALETTE[studies.index(study) % len(PALETTE)]


def _versus(objs: tuple[Objective, ...]) -> str:
    """'validation perplexity vs parameters': y against x, in the registry's labels."""
    return f"{objs[-1].metric.label} vs {objs[0].metric.label}"


def _front(
    ax,
    pts: pd.DataFrame,
    x: Objective,
    y: Objective,
    mask: np.ndarray,
    colour: str,
    label: str | None = None,
    point_colours: np.ndarray | None = None,
    step: bool = True,
):
    """Faded dominated points, then the frontier: step line, seed error bars, solid points.
    `point_colours` (one per row of `pts`) overrides `colour` for the points only."""
    xs, ys = pts[x.column].to_numpy(float), pts[y.column].to_numpy(float)
    colours = np.asarray(
        point_colours if point_colours is not None else [colour] * len(pts), dtype=object
    )
    for c in pd.unique(colours[~mask]):
        # One marker-only line per colour: Agg stamps a cached marker, where a scatter would draw
        # every point as its own path, which dominates drawing a large study.
        faded = ~mask & (colours == c)
        ax.plot(
            xs[faded],
            ys[faded],
            linestyle="none",
            marker="o",
            markersize=3,
            markeredgewidth=0,
            color=c,
            alpha=0.3,
            rasterized=True,
        )
    order = np.argsort(xs[mask], kind="stable")
    fx, fy, fc = xs[mask][order], ys[mask][order], colours[mask][order]
    if step and len(fx):
        # The attained region's boundary: for a minimised x the line runs right, then drops.
        ax.step(
            fx,
            fy,
            where="pre" if x.maximize else "post",
            color=colour,
            linewidth=1.5,
            zorder=3,
            label=label,
        )
    if f"{y.column}_se" in pts:
        _error_bars(ax, fx, fy, pts[f"{y.column}_se"].to_numpy(float)[mask][order], colour)
    ax.scatter(
        fx,
        fy,
        s=30,
        c=list(fc),
        edgecolors="black",
        linewidths=0.6,
        zorder=4,
        label=None if step else label,
    )


def _error_bars(ax, xs: np.ndarray, ys: np.ndarray, se: np.ndarray, colour) -> None:
    """Vertical +-1 s.e. bars as one line collection: errorbar() builds several artists per call,
    which dominated the loop plots' drawing time."""
    shown = np.isfinite(se)
    bars = np.stack([np.column_stack([xs, ys - se]), np.column_stack([xs, ys + se])], axis=1)[shown]
    ax.add_collection(LineCollection(bars, colors=colour, linewidths=1, zorder=3), autolim=False)


def frontier_plot(board: Board, objs: tuple[Objective, ...]) -> Plot:
    """All candidates on the first and last objective. One study: coloured by family, its frontier
    in black. Several studies: one colour and one frontier per study, hypervolumes in the legend."""
    what = "3-objective frontier, projected" if len(objs) == 3 else "Pareto frontier"
    title = f"{what}: {_versus(objs)}"
    return Plot(
        f"frontier_{'_'.join(o.column for o in objs)}",
        title,
        False,
        partial(_draw_frontier, board, objs, title),
    )


def _draw_frontier(board: Board, objs: tuple[Objective, ...], title: str) -> Figure:
    x, y = objs[0], objs[-1]
    cols = [o.column for o in objs]
    cands = board.candidates[np.isfinite(board.candidates[cols].to_numpy(float)).all(axis=1)]
    fig, (ax,) = layout.new(title, legend=1.7)
    mask = frontier.frontier_mask(cands, objs, by=["study"]).to_numpy()
    studies = board.studies
    if len(studies) == 1:
        codes, families = pd.factorize(cands["family"])
        colours = np.array([family_color(f) for f in families], dtype=object)[codes]
        _front(ax, cands, x, y, mask, "black", "frontier", colours, step=len(objs) == 2)
        for family in sorted(cands["family"].unique(), key=_family_order):
            ax.scatter([], [], s=30, color=family_color(family), label=family)  # legend entry only
    else:
        hv = board.hypervolumes.set_index(["objectives", "study", "family"])["hypervolume"]
        key = " vs ".join(map(str, objs))
        for study in studies:
            part = (cands["study"] == study).to_numpy()
            label = f"{study} (HV {hv.get((key, study, 'all'), float('nan')):.4g})"
            _front(
                ax,
                cands[part],
                x,
                y,
                mask[part],
                study_color(study, studies),
                label,
                step=len(objs) == 2,
            )
    layout.style(ax, cands[x.column].to_numpy(float), cands[y.column].to_numpy(float))
    ax.set_xlabel(layout.axis_label(x))
    ax.set_ylabel(layout.axis_label(y))
    layout.figure_legend(fig, [ax])
    return fig


def _family_order(family: str):
    return (family not in FAMILIES, FAMILIES.index(family) if family in FAMILIES else 0, family)


def family_grid(board: Board, objs: tuple[Objective, ...]) -> Plot:
    """One panel per family with that family's own frontier (per study when several)."""
    families = sorted(board.candidates["family"].unique(), key=_family_order)
    title = f"Frontier per family: {_versus(objs)}"
    return Plot(
        f"frontier_by_family_{'_'.join(o.column for o in objs)}",
        title,
        len(families) > 2,
        partial(_draw_family_grid, board, objs, families, title),
    )


def _draw_family_grid(
    board: Board, objs: tuple[Objective, ...], families: list[str], title: str
) -> Figure:
    x, y = objs[0], objs[-1]
    cands = board.candidates
    ncols = min(3, len(families))
    nrows = math.ceil(len(families) / ncols)
    studies = board.studies
    fig, axes = layout.new(
        title,
        ncols,
        nrows,
        width=3.5 * ncols + 0.6,
        height=2.5 * nrows + 0.9,
        legend=1.6 if len(studies) > 1 else 0.0,
        hidden=ncols * nrows - len(families),
    )
    for ax, family in zip(axes, families):
        ours = cands[cands["family"] == family]
        for study in studies:  # in the board's order, as the legend lists them
            part = ours[ours["study"] == study]
            if not len(part):
                continue
            colour = family_color(family) if len(studies) == 1 else study_color(study, studies)
            _front(
                ax,
                part,
                x,
                y,
                part["family_front"].to_numpy(bool),
                colour,
                study,
                step=len(objs) == 2,
            )
        ax.set_title(family, fontsize=10, y=1.0)  # a fixed y skips measuring every tick label
        layout.style(
            ax, cands[x.column].to_numpy(float), cands[y.column].to_numpy(float)
        )  # all: axes are shared
    if len(studies) > 1:
        layout.figure_legend(fig, axes)
    fig.supxlabel(layout.axis_label(x), fontsize=10)
    fig.supylabel(layout.axis_label(y), fontsize=10)
    return fig


# --- loop scaling -------------------------------------------------------------------------------


def eval_loop_curves(board: Board) -> pd.DataFrame:
    """Perplexity against test-time loop count (AbbIE Fig. 6) for the best-ranked candidate of each
    study, band and family that has `val_ppl_by_loops`, averaged over its seeds.
    Long table: study, line, band, family, loops, ppl, se."""
    t = board.trials
    if "val_ppl_by_loops" not in t:
        return pd.DataFrame()
    with_curve = ((t["status"] == "ok") & t["val_ppl_by_loops"].notna()).to_numpy()
    cands = board.candidates
    best = _best_per_family(cands[cands["candidate"].isin(t.loc[with_curve, "candidate"])])[
        [*KEY, "band", "family"]
    ]
    # Only the chosen candidates' curves are parsed (and their long JSON strings copied).
    rows = t.loc[
        with_curve & t["candidate"].isin(best["candidate"]).to_numpy(), [*KEY, "val_ppl_by_loops"]
    ]
    points = [
        (study, cand, int(k), float(v))
        for study, cand, curve in rows.itertuples(index=False)
        for k, v in json.loads(curve).items()
    ]
    long = pd.DataFrame(points, columns=[*KEY, "loops", "ppl"])
    if long.empty:
        return long
    stats = long.groupby([*KEY, "loops"])["ppl"].agg(["mean", "std", "count"]).reset_index()
    stats = stats.assign(
        ppl=stats["mean"], se=stats["std"] / np.sqrt(stats["count"]), line=stats["candidate"]
    )
    return stats.merge(best, on=KEY)


def train_loop_curves(board: Board) -> pd.DataFrame:
    """Perplexity against training loop count (Hyperloop Fig. 2: the same layers iterated more), for
    the sweep holding the best-ranked candidate of each study, band and family. A sweep is the set
    of candidates whose specs differ only in `loops` (and `eval_loops`). Same table as above."""
    c = board.candidates
    if "val_ppl" not in c or c["loops"].nunique() < 2:
        return pd.DataFrame()
    # `spec` is compact JSON with sorted keys (board._canonical), so blanking the loop keys in the
    # string (vectorised) gives the sweep's key without parsing every spec again.
    line = c["spec"].str.replace(r'"(eval_)?loops":(\[[^\]]*\]|\d+)', "", regex=True)
    c = c.assign(line=line, ppl=c["val_ppl"], se=c.get("val_ppl_se"))
    c = c[c.groupby(["study", "line"])["loops"].transform("nunique") > 1]
    return c.merge(_best_per_family(c)[["study", "line"]].drop_duplicates(), on=["study", "line"])


def _best_per_family(cands: pd.DataFrame) -> pd.DataFrame:
    """The best-ranked row of each study, band and family."""
    return cands.loc[cands.groupby(["study", "band", "family"])["rank"].idxmin()]


def eval_loop_plot(board: Board) -> tuple[Plot | None, str | None]:
    curves = eval_loop_curves(board)
    if curves.empty:
        return (
            None,
            "loop-scaling plot (test-time loops) skipped: no val_ppl_by_loops in the results",
        )
    title = "Perplexity vs test-time loops (best candidate per family and budget)"
    return _loop_plot(board, curves, "loops at evaluation", title, "loops_eval"), None


def train_loop_plot(board: Board) -> tuple[Plot | None, str | None]:
    curves = train_loop_curves(board)
    if curves.empty:
        return (
            None,
            "loop-scaling plot (training loops) skipped: no candidates that differ only in loops",
        )
    title = "Perplexity vs training loops (best sweep per family and budget)"
    return _loop_plot(board, curves, "loops in training", title, "loops_train"), None


def _loop_plot(board: Board, curves: pd.DataFrame, xlabel: str, title: str, name: str) -> Plot:
    """One panel per budget band, a curve per family (see the *_curves functions for which), and
    non-looped families as dashed horizontal lines at their best perplexity, as in Fig. 2."""
    bands = sorted(curves["band"].unique())
    if len(bands) > MAX_PANELS:
        title += f" (smallest {MAX_PANELS} of {len(bands)} budgets)"
        bands = bands[:MAX_PANELS]
    return Plot(
        name, title, len(bands) > 1, partial(_draw_loops, board, curves, bands, xlabel, title)
    )


def _draw_loops(board: Board, curves: pd.DataFrame, bands: list, xlabel: str, title: str) -> Figure:
    cands = board.candidates
    loops = sorted(curves.loc[curves["band"].isin(bands), "loops"].unique())
    fig, axes = layout.new(
        title, len(bands), 1, width=4.0 * len(bands) + 0.6, height=4.2, legend=2.0
    )
    studies = board.studies
    styles = [
        "-",
        "--",
        "-.",
        (0, (5, 1, 1, 1, 1, 1)),
    ]  # one per study; dotted is for the baselines
    for ax, band in zip(axes, bands):
        for (study, family), line in curves[curves["band"] == band].groupby(
            ["study", "family"], sort=True
        ):
            line = line.sort_values("loops")
            label = family if len(studies) == 1 else f"{family} ({study})"
            xs, ys = line["loops"].to_numpy(float), line["ppl"].to_numpy(float)
            ax.plot(
                xs,
                ys,
                marker="o",
                markersize=4,
                color=family_color(family),
                linestyle=styles[studies.index(study) % 4],
                label=label,
            )
            _error_bars(ax, xs, ys, line["se"].to_numpy(float), family_color(family))
        flat = cands[
            (cands["band"] == band)
            & (cands["loops"] == 1)
            & ~cands["family"].isin(curves["family"])
        ]
        for family, rows in flat.groupby("family"):
            ax.axhline(
                rows["val_ppl"].min(),
                color=family_color(family),
                linestyle=":",
                linewidth=1.2,
                label=f"{family} (no loops)",
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(loops, labels=[f"{n:g}" for n in loops])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_title(f"budget {EngFormatter(sep='')(band)}", fontsize=10, y=1.0)
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel(metric("val_ppl").axis_label())
    layout.figure_legend(fig, axes)
    return fig


# --- scaling fits -------------------------------------------------------------------------------


def scaling_plot(fits: scaling.Scaling) -> Plot:
    """One panel per study (the first MAX_PANELS): each group's best candidate per budget (mean
    and s.e. over seeds), its fitted law, solid over the budgets measured and dashed beyond, and
    with --predict the prediction at the target with its bootstrap interval."""
    studies = list(dict.fromkeys(f.study for f in fits.fits))[:MAX_PANELS]
    title = f"Scaling fits: {metric(scaling.METRIC).label} vs parameters, {scaling.LAW}"
    return Plot("scaling", title, len(studies) > 1, partial(_draw_scaling, fits, studies, title))


def _draw_scaling(fits: scaling.Scaling, studies: list[str], title: str) -> Figure:
    target = fits.target
    fig, axes = layout.new(
        title, len(studies), 1, width=5.0 * len(studies) + 0.6, height=4.4, legend=1.8
    )
    predicted = fits.predictions.set_index(["study", "group"]) if len(fits.predictions) else None
    for ax, study in zip(axes, studies):
        ours = [f for f in fits.fits if f.study == study]
        xs, ys = [target] if target else [], []
        for f in ours:
            colour = family_color(f.family)
            ax.plot(
                f.n, f.loss, linestyle="none", marker="o", markersize=5, color=colour, label=f.group
            )
            _error_bars(ax, f.n, f.loss, f.se, colour)
            inside = np.geomspace(f.n.min(), f.n.max(), 64)
            ax.plot(inside, f.predict(inside), color=colour, linewidth=1.4)
            if target and target > f.n.max():
                beyond = np.geomspace(f.n.max(), target, 32)
                ax.plot(beyond, f.predict(beyond), color=colour, linewidth=1.2, linestyle="--")
            if predicted is not None:
                p = predicted.loc[(study, f.group)]
                ax.plot(
                    [target],
                    [p["loss"]],
                    marker="D",
                    markersize=6,
                    color=colour,
                    markerfacecolor="white",
                    linestyle="none",
                )
                _error_bars(
                    ax,
                    np.array([target]),
                    np.array([p["loss"]]),
                    np.array([(p["hi"] - p["lo"]) / 2]),
                    colour,
                )
                ys += [p["lo"], p["hi"]]
            xs += f.n.tolist()
            ys += f.loss.tolist()
        if target:
            beyond = target > max(f.n.max() for f in ours)
            ax.axvline(target, color="grey", linestyle=":", linewidth=1)
            ax.annotate(
                f"{'extrapolation' if beyond else 'prediction'} at {EngFormatter(sep='')(target)}",
                (target, 1.0),
                xycoords=("data", "axes fraction"),
                ha="right",
                va="top",
                fontsize=8,
                rotation=90,
                color="grey",
            )
        layout.style(ax, np.array(xs, dtype=float), np.array(ys, dtype=float))
        ax.set_title(study, fontsize=10, y=1.0)
        ax.set_xlabel(metric(fits.params).axis_label())
    axes[0].set_ylabel(metric(scaling.METRIC).axis_label())
    layout.figure_legend(fig, axes)
    return fig
