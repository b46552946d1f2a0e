"""Budget bands: candidates compared against each other share a parameter budget.

A search states its budget, and every candidate lies within a tolerance of it, so the `budget`
column names the band. Where it is missing (older trials, hand-made runs) the band is recovered from
the parameter counts: sorted ascending, a band opens at its smallest count p and takes every count
up to p (1 + t) / (1 - t), the width of one budget's window [B (1 - t), B (1 + t)]. A band is named
by the median count of its members.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

DEFAULT_TOLERANCE = 0.005  # the 0.5% a search space allows by default (SPEC: `tolerance`)


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
