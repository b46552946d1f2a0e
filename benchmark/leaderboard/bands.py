"""Budget bands: candidates compared against each other share a parameter budget.

A search states its budget, and every candidate lies within a tolerance of it, so the `budget`
column names the band. Where it is missing (older trials, hand-made runs) the band is recovered from
the parameter counts: sorted ascending, a band opens at its smallest count p and takes every count
up to p (1 + t) / (1 - t), the width of one budget's window [B (1 - t), B (1 + t)]. A band is named
by the median count of its members.

Within a budget, candidates are ranked together only when they were counted and trained alike
(`cohorts`): the same count rule and recipe. In a tuned study, the settings each candidate chose on
the study's grid (its rows' `tuned`) are its own; the grid it searched is its recipe.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from benchmark.space.budget import DEFAULT_TOLERANCE  # the 0.5% a search space allows by default


def cluster(params: np.ndarray, tolerance: float = DEFAULT_TOLERANCE) -> np.ndarray:
    """Band value (float) for each count in `params`; NaN stays NaN."""
    params = np.asarray(params, dtype=float)
    out = np.full(len(params), np.nan)
    order = np.argsort(params)  # NaNs sort last
    values = params[order]
    n = int(np.isfinite(values).sum())
    reach = (1 + tolerance) / (1 - tolerance)
    start = 0
    while start < n:
        stop = int(np.searchsorted(values[:n], values[start] * reach, side="right"))
        out[order[start:stop]] = np.median(values[start:stop])
        start = stop
    return out


def bands(candidates: pd.DataFrame, tolerance: float = DEFAULT_TOLERANCE) -> pd.Series:
    """The band of each candidate: its `budget` when recorded, else its params cluster."""
    band = pd.Series(np.nan, index=candidates.index)
    if "budget" in candidates:
        band = candidates["budget"].astype(float)
    missing = band.isna().to_numpy()
    if missing.any() and "params_total" in candidates:
        band[missing] = cluster(candidates.loc[missing, "params_total"].to_numpy(), tolerance)
    return band


# Settings of a trial's recipe that do not change what it trains: where and how fast it ran, and
# the seed (a study's candidates differ in seed by design).
_NOT_RECIPE = ("seed", "device", "compile", "eval_every")


def cohorts(trials: pd.DataFrame, grids: dict[str, dict[str, str]] | None = None) -> pd.Series:
    """Which rows may be ranked together: the same parameter count rule (`budget_count`) and the
    same recipe (the `training` settings, the data and the tokenizer). Rows of studies trained
    differently never share a rank (a non-embedding count against a non-embedding-plus-head one
    compares rules, and a WSD schedule against a cosine one compares recipes). Named by the count
    rule and, where recipes differ, the settings that set a recipe apart from the most common one
    (`non_embedding · schedule wsd`); '' where every row is alike.

    A tuned study's setting (a row's `tuned`: the point of its study's grid that its candidate
    chose) is the candidate's own: its recipe holds the grid searched, not the point chosen, so
    that arms tuned on one grid rank together at their own best points, and apart from rows
    trained on another grid or at a setting given by hand (Dahl et al. 2023, arXiv 2306.07179, §4:
    a comparison of training algorithms fixes the tuning protocol, not the hyperparameters).
    `grids`: each tuned study's grid, key -> its values as text (tuning.grids); a key without one
    reads "tuned"."""
    cols = [
        c
        for c in ("budget_count", "training", "tuned", "study", "dataset_id", "tokenizer_id")
        if c in trials
    ]
    if not cols or trials.empty:
        return pd.Series("", index=trials.index, dtype=object)
    # Each distinct combination is read once: a large board has 100,000 rows and a few recipes.
    frame = trials[cols].astype(object).where(trials[cols].notna(), None)
    codes, distinct = pd.factorize(pd.Series(list(zip(*(frame[c] for c in cols))), dtype=object))
    found = [dict(zip(cols, d)) for d in distinct]
    recipes = [
        {
            **_recipe(f.get("training"), f.get("tuned"), (grids or {}).get(f.get("study")) or {}),
            **{c: f.get(c) for c in ("dataset_id", "tokenizer_id")},
        }
        for f in found
    ]
    keys = [json.dumps(r, sort_keys=True, default=str) for r in recipes]
    weights = np.bincount(codes[codes >= 0], minlength=len(keys))
    totals: dict[str, int] = {}
    for k, w in zip(keys, weights):
        totals[k] = totals.get(k, 0) + int(w)
    common = json.loads(max(totals, key=totals.get))
    labels = []
    for f, r in zip(found, recipes):
        # every key of either recipe: a setting the common recipe has and this one lacks sets it
        # apart as well
        apart = [
            f"{name} {r.get(name, '—')}"
            for name in sorted(set(r) | set(common))
            if common.get(name) != r.get(name)
            and name not in ("dataset_id", "tokenizer_id", "tokens_per")
        ]
        apart += [
            str(r[c]).split("@")[0]
            for c in ("dataset_id", "tokenizer_id")
            if r.get(c) != common.get(c)
        ]
        labels.append(" · ".join([str(f.get("budget_count") or ""), *apart]).strip(" ·"))
    if len(set(labels)) <= 1:
        return pd.Series("", index=trials.index, dtype=object)
    return pd.Series(
        np.append(np.array(labels, dtype=object), "")[codes], index=trials.index, dtype=object
    )


def _recipe(training, tuned, grid: dict[str, str]) -> dict:
    """A row's `training` settings less those that do not make a recipe, each setting it was tuned
    to (`tuned`, the JSON of the grid point its study chose for it) read as the grid searched."""
    parsed, chosen = _object(training), _object(tuned)
    return {
        k: (f"tuned over {grid[k]}" if k in grid else "tuned") if k in chosen else v
        for k, v in parsed.items()
        if k not in _NOT_RECIPE
    }


def _object(text) -> dict:
    try:
        parsed = json.loads(text) if isinstance(text, str) else {}
    except ValueError:
        parsed = {}
    return parsed if isinstance(parsed, dict) else {}
