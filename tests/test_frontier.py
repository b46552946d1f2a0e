"""Pareto frontiers, hypervolume and seed aggregation against brute force and hand-computed values;
objectives read through the metric registry."""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmark.leaderboard.frontier import (
    aggregate_seeds,
    frontier_mask,
    hypervolume,
    non_dominated,
    reference_point,
)
from benchmark.leaderboard.objectives import Objective
from benchmark.store.metrics import METRICS, MetricError


def brute_non_dominated(points: np.ndarray, maximize) -> np.ndarray:
    """The definition, O(n^2): finite, and no other point at least as good everywhere and better somewhere."""
    pts = np.where(maximize, -points, points)
    keep = []
    for p in pts:
        if not np.isfinite(p).all():
            keep.append(False)
            continue
        dominated = any(np.isfinite(q).all() and (q <= p).all() and (q < p).any() for q in pts)
        keep.append(not dominated)
    return np.array(keep, dtype=bool)


# Small integer coordinates make ties (equal vectors, equal single coordinates) common.
coordinate = st.one_of(st.integers(0, 5).map(float), st.just(math.nan))
cloud = st.integers(2, 3).flatmap(
    lambda d: st.tuples(
        st.lists(st.lists(coordinate, min_size=d, max_size=d), min_size=0, max_size=40),
        st.lists(st.booleans(), min_size=d, max_size=d),
    )
)


@settings(max_examples=300, deadline=None)
@given(cloud)
def test_frontier_equals_brute_force(case):
    rows, maximize = case
    points = np.array(rows, dtype=float).reshape(len(rows), len(maximize))
    assert (
        non_dominated(points, maximize).tolist()
        == brute_non_dominated(points, np.array(maximize)).tolist()
    )


def test_ties_are_all_kept_and_nan_never_enters():
    points = np.array([[1, 2], [1, 2], [2, 1], [2, 2], [np.nan, 0], [0, np.inf]])
    assert non_dominated(points).tolist() == [True, True, True, False, False, False]


def test_direction_flips_the_frontier():
    points = np.array([[1.0, 10.0], [2.0, 20.0]])
    assert non_dominated(points).tolist() == [True, False]
    assert non_dominated(points, maximize=[False, True]).tolist() == [True, True]


def test_hypervolume_by_hand():
    staircase = [[1, 3], [2, 2], [3, 1]]
    assert (
        hypervolume(staircase, [4, 4]) == 3 * 1 + 2 * 1 + 1 * 1
    )  # slabs of width 1 under y = 3, 2, 1
    # A dominated point, a point beyond the reference and a NaN add nothing.
    assert hypervolume(staircase + [[3, 3], [5, 0], [np.nan, 0]], [4, 4]) == 6
    assert hypervolume([[4, 1]], [4, 4]) == 0  # on the reference's boundary: no volume
    # Maximised throughput: (params 1, 10 tok/s) against (params 4, 0 tok/s) spans 3 x 10.
    assert hypervolume([[1, 10]], [4, 0], maximize=[False, True]) == 30
    # 3-D: three unit-overlapping boxes in [1,3]^3 by inclusion-exclusion: 3 x 4 - 3 x 2 + 1.
    assert hypervolume([[1, 2, 1], [2, 1, 1], [1, 1, 2]], [3, 3, 3]) == 7
    assert hypervolume([], [1, 1]) == 0


@settings(max_examples=150, deadline=None)
@given(
    st.integers(2, 3).flatmap(
        lambda d: st.lists(
            st.lists(st.integers(0, 4), min_size=d, max_size=d), min_size=1, max_size=12
        )
    )
)
def test_hypervolume_counts_dominated_unit_cells(rows):
    # With integer points and reference 5, the volume is the number of unit cells [c, c + 1]
    # whose lower corner some point weakly dominates.
    points = np.array(rows, dtype=float)
    d = points.shape[1]
    cells = sum(
        any((p <= c).all() for p in points)
        for c in map(np.array, itertools.product(range(5), repeat=d))
    )
    assert hypervolume(points, [5.0] * d) == cells


def test_reference_point_is_ten_percent_past_the_worst():
    points = [[1.0, 10.0], [2.0, 20.0], [np.nan, 99.0]]
    assert reference_point(points) == pytest.approx([2.2, 22.0])
    assert reference_point(points, maximize=[False, True]) == pytest.approx([2.2, 9.0])


def test_seed_aggregation_mean_and_standard_error():
    df = pd.DataFrame(
        {"spec": ["a", "a", "a", "b", "c", "c"], "val_ppl": [1.0, 2.0, 3.0, 5.0, 7.0, np.nan]}
    )
    out = aggregate_seeds(df, ["spec"], ["val_ppl", "absent_column"]).set_index("spec")
    assert out.loc["a", "val_ppl"] == 2.0
    assert out.loc["a", "val_ppl_se"] == pytest.approx(
        1 / math.sqrt(3)
    )  # sample std 1 over sqrt(3)
    assert math.isnan(out.loc["b", "val_ppl_se"])  # one seed: no error bar
    assert (
        out.loc["c", "val_ppl"] == 7.0
        and out.loc["c", "val_ppl_n"] == 1
        and out.loc["c", "n_seeds"] == 2
    )
    assert "absent_column" not in out


def test_aggregating_many_metrics_leaves_an_unfragmented_frame():
    """A row carries dozens of metrics: built a column at a time, the frame warned on every board
    (pandas' PerformanceWarning) and the board's own column additions warned again."""
    metrics = [f"m{i}" for i in range(60)]
    df = pd.DataFrame({"spec": ["a", "a", "b"], **{m: [1.0, 2.0, 3.0] for m in metrics}})
    with warnings.catch_warnings():
        warnings.simplefilter("error", pd.errors.PerformanceWarning)
        out = aggregate_seeds(df, ["spec"], metrics)
        for k in range(5):
            out[f"extra{k}"] = 0.0
    assert out.set_index("spec").loc["a", "m59_se"] == pytest.approx(
        0.5
    )  # sample std 0.707 over sqrt(2)


def test_frontier_mask_per_group():
    df = pd.DataFrame(
        {"family": ["a", "a", "b", "b"], "params_total": [1, 2, 3, 4], "val_ppl": [5, 4, 9, 10]}
    )
    objs = (Objective.parse("params"), Objective.parse("val_ppl"))
    assert frontier_mask(df, objs).tolist() == [True, True, False, False]
    assert frontier_mask(df, objs, by=["family"]).tolist() == [True, True, True, False]


def test_objective_parsing():
    assert Objective.parse("params") == Objective(column="params_total", maximize=False)
    assert Objective.parse("tokens_per_s") == Objective(column="tokens_per_s", maximize=True)
    assert Objective.parse("val_ppl:max") == Objective(column="val_ppl", maximize=True)
    with pytest.raises(ValueError, match="direction must be 'min' or 'max'"):
        Objective.parse("val_ppl:lowest")


@pytest.mark.parametrize("metric", [m for m in METRICS if m.searchable], ids=lambda m: m.name)
def test_every_searchable_metric_parses_by_name_alias_and_column(metric):
    """The registry is the leaderboard's one vocabulary: a name, each alias and the column all
    name one objective, in the registry's natural direction unless one is given."""
    column = metric.column_for("total")
    expected = Objective(column=column, maximize=metric.direction == "max")
    for text in (metric.name, *metric.aliases, column):
        assert Objective.parse(text) == expected
        assert Objective.parse(f"{text}:max") == Objective(column=column, maximize=True)
    assert str(expected) == f"{column}:{metric.direction}" and expected.metric.label


def test_params_are_what_the_study_counts_and_other_names_are_refused():
    assert Objective.parse("params", count="non_embedding") == Objective(
        column="params_non_embedding"
    )
    assert Objective.parse("throughput") == Objective(column="tokens_per_s", maximize=True)
    assert Objective.parse("loss").describe() == "validation loss (val_loss:min)"
    with pytest.raises(
        MetricError, match="unknown metric 'perplexity'; choose one of val_loss, val_ppl"
    ):
        Objective.parse("perplexity")
    with pytest.raises(MetricError, match="stream_cosine is a diagnostic column, not an objective"):
        Objective.parse("stream_cosine")
    with pytest.raises(MetricError, match="'ppl' is not a results column; did you mean val_ppl"):
        Objective(column="ppl")
