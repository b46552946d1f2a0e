"""Pareto frontiers, hypervolume and seed aggregation.

Conventions, used by every function here:

- A point is one row of an (n, d) array of objective values; each objective is minimised unless
  its `maximize` flag is set (internally such columns are negated, so the code only minimises).
  An Objective (objectives.py) carries that flag, from the metric registry's direction.
- Point a dominates b when a is no worse in every objective and strictly better in one. Points
  with identical objective vectors do not dominate each other, so ties are all kept on a frontier.
- A row with any non-finite value (a failed, diverged or unevaluated trial) never enters a
  frontier and adds nothing to a hypervolume.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from benchmark.leaderboard.objectives import Objective

# Fraction added to the worst observed value of each objective to place the default reference
# point: for positive minimised objectives (params, perplexity, bytes) this is 1.1 x the worst.
REF_MARGIN = 0.1


def _as_minimised(points, maximize: Sequence[bool] | None, dims: int = 0) -> np.ndarray:
    pts = np.array(points, dtype=float)  # (n, d), a copy we may negate
    if pts.ndim == 1:  # a single point, or no points at all
        pts = pts.reshape(1, -1) if pts.size else pts.reshape(0, dims)
    if maximize is not None:
        pts[:, np.asarray(maximize, dtype=bool)] *= -1
    return pts


def non_dominated(points, maximize: Sequence[bool] | None = None) -> np.ndarray:
    """Boolean mask (n,) of the rows of `points` (n, d) that no other row dominates.

    Rows holding NaN or inf are never on the frontier. Duplicate rows share one verdict.
    """
    pts = _as_minimised(points, maximize)
    mask = np.zeros(len(pts), dtype=bool)
    finite = np.isfinite(pts).all(axis=1)
    if not finite.any():
        return mask
    # Deduplicate so that "dominated" below can use <= without a tie ever counting as dominance,
    # and sort the distinct rows lexicographically, which both sweeps rely on.
    uniq, group = _sorted_unique(pts[finite])
    keep = _sweep_2d(uniq) if uniq.shape[1] == 2 else _sweep_nd(uniq)
    mask[finite] = keep[group]
    return mask


def _sorted_unique(pts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows in lexicographic order, and each input row's index among them.
    (np.unique(axis=0) does the same but is several times slower on 1e5 rows.)"""
    order = np.lexsort(pts.T[::-1])
    ordered = pts[order]
    new = np.ones(len(pts), dtype=bool)
    new[1:] = (ordered[1:] != ordered[:-1]).any(axis=1)
    group = np.empty(len(pts), dtype=np.intp)
    group[order] = np.cumsum(new) - 1
    return ordered[new], group


def _sweep_2d(uniq: np.ndarray) -> np.ndarray:
    # Rows are sorted by (x, y) and distinct, so only earlier rows can dominate a row, and one
    # does exactly when its y is <= ours: keep a row iff its y beats every earlier y.
    y = uniq[:, 1]
    best_before = np.minimum.accumulate(np.concatenate(([np.inf], y[:-1])))
    return y < best_before


def _sweep_nd(uniq: np.ndarray) -> np.ndarray:
    # In lexicographic order only earlier rows can dominate; if any earlier row does, an earlier
    # non-dominated one does too (dominance is transitive), so checking the frontier so far is enough.
    keep = np.zeros(len(uniq), dtype=bool)
    front = np.empty((0, uniq.shape[1]))
    for i, p in enumerate(uniq):
        if not (front <= p).all(axis=1).any():
            keep[i] = True
            front = np.vstack([front, p])
    return keep


def reference_point(
    points, maximize: Sequence[bool] | None = None, margin: float = REF_MARGIN
) -> np.ndarray:
    """The default hypervolume reference: each objective's worst finite value moved `margin` of
    its magnitude further away (1.1 x the worst for positive minimised objectives, 0.9 x the
    worst for positive maximised ones). Returned in the objectives' own directions."""
    pts = _as_minimised(points, maximize)
    pts = pts[np.isfinite(pts).all(axis=1)]
    if not len(pts):
        raise ValueError("no finite point to place a reference point from")
    worst = pts.max(axis=0)
    ref = worst + margin * np.abs(worst)
    return _as_minimised(ref, maximize)[0]


def hypervolume(points, ref, maximize: Sequence[bool] | None = None) -> float:
    """Exact volume dominated by `points` (n, d) and bounded by `ref` (d,).

    Only points strictly better than `ref` in every objective count; non-finite rows are ignored.
    2-D is an O(n log n) sweep; more objectives slice along the last one (HSO), exact and fast
    enough for frontiers of a few thousand points in 3-D.
    """
    ref_min = _as_minimised(ref, maximize)[0]
    pts = _as_minimised(points, maximize, dims=len(ref_min))
    pts = pts[np.isfinite(pts).all(axis=1) & (pts < ref_min).all(axis=1)]
    if not len(pts):
        return 0.0
    pts = pts[non_dominated(pts)]
    return float(_hv(pts, ref_min))


def _hv(pts: np.ndarray, ref: np.ndarray) -> float:
    # pts: mutually non-dominated (or at least all strictly inside ref), minimised.
    if pts.shape[1] == 1:
        return ref[0] - pts[:, 0].min()
    if pts.shape[1] == 2:
        pts = pts[np.lexsort((pts[:, 1], pts[:, 0]))]  # x ascending, so y descends on a frontier
        y_best = np.minimum.accumulate(pts[:, 1])
        widths = np.diff(np.append(pts[:, 0], ref[0]))
        return float(np.sum(widths * (ref[1] - y_best)))
    # Slab between consecutive values of the last objective: the points at or below the slab's
    # floor dominate a (d-1)-dimensional cross-section of constant volume.
    order = np.argsort(pts[:, -1], kind="stable")
    pts = pts[order]
    z = np.append(pts[:, -1], ref[-1])
    total = 0.0
    for i in range(len(pts)):
        depth = z[i + 1] - z[i]
        if depth > 0:
            below = pts[: i + 1, :-1]
            total += depth * _hv(below[non_dominated(below)], ref[:-1])
    return total


def aggregate_seeds(df: pd.DataFrame, key: Sequence[str], metrics: Sequence[str]) -> pd.DataFrame:
    """One row per `key` group (a candidate run under several seeds): for each metric its mean,
    `<metric>_se` (standard error of the mean, sample std / sqrt(n), NaN for a single seed) and
    `<metric>_n` (seeds that produced it), plus `n_seeds` (rows in the group). NaNs are skipped,
    so a seed that failed to produce a metric does not drag its mean."""
    metrics = [m for m in metrics if m in df.columns]
    grouped = df.groupby(list(key), sort=False, dropna=False)
    stats = grouped[metrics].agg(["mean", "std", "count"]) if metrics else None
    columns = {"n_seeds": grouped.size()}
    for m in metrics:
        n = stats[(m, "count")]
        columns |= {m: stats[(m, "mean")], f"{m}_se": stats[(m, "std")] / np.sqrt(n), f"{m}_n": n}
    # built at once: a column at a time fragments the frame (pandas warns past 100 inserts)
    return pd.DataFrame(columns).reset_index()


def frontier_mask(df: pd.DataFrame, objs: Sequence[Objective], by: Sequence[str] = ()) -> pd.Series:
    """Boolean Series over `df`: non-dominated within each `by` group (whole frame if empty)."""
    cols = [o.column for o in objs]
    maximize = [o.maximize for o in objs]
    mask = pd.Series(False, index=df.index)
    groups = df.groupby(list(by), sort=False).indices.values() if by else [np.arange(len(df))]
    values = df[cols].to_numpy(dtype=float)
    for rows in groups:
        mask.iloc[rows] = non_dominated(values[rows], maximize)
    return mask
