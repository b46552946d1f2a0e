"""The leaderboard's figures read at a glance: drawn for small boards (synthetic, the kept quickstart
studies, a narrow band of counts), no two tick labels touch, and every axis is labelled with the
metric registry's label and unit."""

from __future__ import annotations

import json
import shutil
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest
from fixture_studies import fixture_study
from matplotlib.figure import Figure
from matplotlib.text import Text
from synthetic_studies import synthetic_trials

from benchmark.leaderboard import (
    build_board,
    find_studies,
    plots,
    read_declarations,
    read_studies,
)
from benchmark.leaderboard.layout import axis_label, new, style
from benchmark.store.metrics import metric

KEPT = ["quickstart-faithful-families", "quickstart-original-families", "hyper-init-and-read"]


def _kept(tmp: Path, *names: str, declare: dict | None = None, at_300k: bool = False):
    """A board of kept studies, copied so that a declaration (_study.json) can be added; `at_300k`
    moves the parameter counts into a band of about 100 just above 300k, where the per-family
    figure's ticks once ran together ('300k 300.02k300.04k', '300.1k300k' across panels)."""
    for name in names:
        shutil.copytree(fixture_study(name), tmp / name)  # frozen rows (tests/fixtures/README.md)
        if declare:
            (tmp / name / "_study.json").write_text(json.dumps(declare))
    studies = find_studies([tmp / n for n in names])
    trials = read_studies(studies)
    if at_300k:
        trials["params_total"] = (
            300_000 + (trials["params_total"] - trials["params_total"].min()) * 0.15
        )
    return build_board(trials, declared=read_declarations(studies))


BOARDS = {
    "synthetic": lambda tmp: build_board(synthetic_trials("broad", shapes=1, seeds=2)),
    "declared": lambda tmp: _kept(
        tmp,
        "quickstart-faithful-families",
        declare={"objectives": [["val_loss", "min"], ["params", "min"]]},
    ),
    "three studies": lambda tmp: _kept(tmp, *KEPT),
    "300k": lambda tmp: _kept(tmp, "quickstart-faithful-families", at_300k=True),
}


@pytest.fixture(scope="module", params=list(BOARDS))
def figures(request, tmp_path_factory) -> list[tuple[plots.Plot, Figure]]:
    board = BOARDS[request.param](tmp_path_factory.mktemp("kept"))
    figs = []
    for plot in plots.plan(board)[0]:
        figure = plot.draw()
        figure.draw_without_rendering()  # places every tick and label as saving does, and paints nothing
        figs.append((plot, figure))
    return board, figs


def drawn(axis) -> list[Text]:
    """An axis's tick labels as drawn: visible, non-empty, and with the tick in view (a locator
    also returns ticks just outside the view, which are never drawn)."""
    lo, hi = sorted(axis.get_view_interval())
    slack = 1e-9 * max(abs(lo), abs(hi))
    return [
        t.label1
        for t in axis.get_major_ticks()
        if lo - slack <= t.get_loc() <= hi + slack
        and t.label1.get_visible()
        and t.label1.get_text()
    ]


def drawn_tick_labels(fig: Figure) -> list[Text]:
    return [
        label
        for ax in fig.axes
        if ax.get_visible()
        for axis in (ax.xaxis, ax.yaxis)
        for label in drawn(axis)
    ]


def overlapping(texts: list[Text]) -> list[tuple[str, str]]:
    boxes = [(t.get_text(), t.get_window_extent()) for t in texts]
    return [
        (a, b)
        for (a, box_a), (b, box_b) in combinations(boxes, 2)
        if min(box_a.x1, box_b.x1) > max(box_a.x0, box_b.x0)
        and min(box_a.y1, box_b.y1) > max(box_a.y0, box_b.y0)
    ]


def test_no_two_tick_labels_overlap(figures):
    board, figs = figures
    for plot, fig in figs:
        labels = drawn_tick_labels(fig)
        shown = [ax for ax in fig.axes if ax.get_visible()]
        assert labels, plot.name
        # Every panel says where its points lie: a shared axis keeps its labels on the panels
        # at the bottom of each column, hidden panels below included.
        assert all(drawn(ax.xaxis) for ax in shown if _bottom_of_column(ax, shown)), plot.name
        assert overlapping(labels) == [], plot.name


def _bottom_of_column(ax, shown) -> bool:
    x0 = ax.get_position().x0
    return all(
        other.get_position().y0 >= ax.get_position().y0
        for other in shown
        if abs(other.get_position().x0 - x0) < 1e-6
    )


def test_axes_are_labelled_from_the_metric_registry(figures):
    board, figs = figures
    x, y = board.objectives[0], board.objectives[-1]
    for plot, fig in figs:
        texts = {t.get_text() for t in fig.findobj(Text)}
        if plot.name.startswith("frontier_"):
            first, last = next(
                pair for pair in board.pairs if plot.name.endswith("_".join(o.column for o in pair))
            )
            assert axis_label(first) in texts and axis_label(last) in texts, plot.name
        else:  # loop scaling: perplexity against loop counts
            assert metric("val_ppl").axis_label() in texts, plot.name
    grid = next(fig for plot, fig in figs if plot.name.startswith("frontier_by_family"))
    assert axis_label(x) in {t.get_text() for t in grid.findobj(Text)}
    assert axis_label(y) in {t.get_text() for t in grid.findobj(Text)}


def test_axis_labels_carry_the_registrys_label_and_unit():
    board = build_board(
        synthetic_trials("units", shapes=1, seeds=1, budgets=(30e6,), statuses={"ok": 1.0})
    )
    x, y = board.objectives
    assert axis_label(x) == "parameters, lower is better"
    assert axis_label(y) == "validation perplexity, lower is better"
    assert board.pairs[2][0].metric.axis_label() == "INT4 model size (bytes)"


def test_the_overlap_check_catches_crowded_labels():
    """The check above can fail: forty long labels on a narrow axis run into each other."""
    fig, (ax,) = new("crowded", width=3.0, height=2.0)
    ax.set_xticks(np.linspace(0, 1, 40), labels=[f"1.{i:04d}M" for i in range(40)])
    fig.draw_without_rendering()
    assert len(overlapping(drawn_tick_labels(fig))) > 30


def test_a_narrow_band_of_counts_gets_round_ticks_that_fit():
    """A 300k budget with counts within 0.05% of it: round steps, every label distinct."""
    fig, axes = new("narrow", ncols=3, width=3.5 * 3 + 0.6, height=3.4)
    xs = np.array([299_880.0, 299_930, 300_010, 300_060])
    for ax in axes:
        ax.plot(xs, [1, 2, 3, 4], "o")
        style(ax, xs, np.array([1, 2, 3, 4.0]))
    fig.draw_without_rendering()
    assert overlapping(drawn_tick_labels(fig)) == []
    assert [t.get_text() for t in drawn(axes[0].xaxis)] == ["299.9k", "300k"]


@pytest.mark.parametrize(("tolerance", "drawn_over_params"), [(0.005, False), (1e-5, True)])
def test_no_frontier_over_counts_that_differ_by_the_budgets_rounding(
    tmp_path, tolerance, drawn_over_params
):
    """The quickstart at one budget: its parameter counts (1.49962M to 1.50031M) spread 0.05%,
    inside the 0.5% the space allows, so loss against parameters would order rounding, not
    architectures: that frontier is left out, with a note. The tolerance is the study's own: at
    0.001% the same counts are real differences and the frontier is drawn."""
    board = _kept(
        tmp_path,
        "quickstart-faithful-families",
        declare={
            "objectives": [["val_loss", "min"], ["flops_per_token_train", "min"]],
            "tolerance": tolerance,
        },
    )
    names = [plot.name for plot in plots.plan(board)[0]]
    assert (
        "frontier_flops_per_token_train_val_loss" in names
        and "frontier_int4_bytes_val_ppl_int4" in names
    )
    assert ("frontier_params_total_val_loss" in names) == drawn_over_params
    note = "frontier params_total vs val_loss skipped: params_total varies by 0.05% only, within the budget tolerance 0.5%"
    assert (note in board.notes) != drawn_over_params
