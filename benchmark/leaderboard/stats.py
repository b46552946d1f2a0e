"""The leaderboard's statistics, in one place: a mean and its standard error over seeds, the
difference of two groups with a t interval (paired by seed when the seeds match, Welch's
otherwise), the smallest difference a comparison could have detected, the verdict on an expected
ordering, and percentile bootstrap draws over seeds.

Every function works along the last axis of its arrays, so a test can run hundreds of synthetic
experiments in one call; NaN marks "no value" (a single seed has no standard error).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Student's t quantile, from scipy.special: scipy.stats imports every distribution for this one
# function, a cost the leaderboard's start would pay each run.
from scipy.special import stdtr, stdtrit

LEVEL = 0.95  # two-sided confidence of every interval the leaderboard prints
POWER = 0.80  # the power at which the minimum detectable difference is stated
VERDICTS = ("reproduced", "contradicted", "inconclusive")


def t_quantile(p: float, df) -> np.ndarray:
    """The p quantile of Student's t with `df` degrees of freedom (NaN where df < 1 or NaN)."""
    df = np.asarray(df, dtype=float)
    ok = np.isfinite(df) & (df > 0)
    return np.where(ok, stdtrit(np.where(ok, df, 1.0), p), np.nan)


def p_value(estimate, se, df) -> np.ndarray:
    """The two-sided p-value of a t test of `estimate` = 0: 2 x P(T_df > |estimate / se|); NaN
    without a standard error. A zero standard error (every seed's difference the same) gives 0 for
    a nonzero estimate and 1 for a zero one, as its zero-width interval does."""
    estimate = np.asarray(estimate, dtype=float)
    se, df = np.asarray(se, dtype=float), np.asarray(df, dtype=float)
    ok = np.isfinite(se) & (se > 0) & np.isfinite(df) & (df > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        t = np.abs(estimate / np.where(ok, se, 1.0))
    exact = np.isfinite(df) & (df > 0) & (se == 0) & np.isfinite(estimate)
    return np.where(
        ok,
        2 * stdtr(np.where(ok, df, 1.0), -t),
        np.where(exact, (estimate == 0).astype(float), np.nan),
    )


def holm(p) -> np.ndarray:
    """Holm's step-down adjustment (Holm 1979) of a family of p-values: the i-th smallest of m is
    multiplied by m - i + 1 (i from 1), made non-decreasing in that order and capped at 1, so that
    rejecting where the adjusted p < 0.05 keeps the chance of any false rejection under 5%. NaNs
    are not tests: they stay NaN and do not count in m."""
    p = np.asarray(p, dtype=float)
    out = np.full(p.shape, np.nan)
    tested = np.flatnonzero(np.isfinite(p))
    order = tested[np.argsort(p[tested], kind="stable")]
    m = len(order)
    out[order] = np.minimum(1.0, np.maximum.accumulate(p[order] * (m - np.arange(m))))
    return out


def bh(p) -> np.ndarray:
    """Benjamini-Hochberg's step-up adjustment (Benjamini and Hochberg 1995): the i-th smallest of
    m is multiplied by m / i, made non-decreasing from the largest down and capped at 1, so that
    rejecting where the adjusted p < 0.05 keeps the expected share of false rejections among the
    rejections (the false discovery rate) under 5%. NaNs are not tests, as in holm."""
    p = np.asarray(p, dtype=float)
    out = np.full(p.shape, np.nan)
    tested = np.flatnonzero(np.isfinite(p))
    order = tested[np.argsort(p[tested], kind="stable")]
    m = len(order)
    scaled = p[order] * m / np.arange(1, m + 1)
    out[order] = np.minimum(1.0, np.minimum.accumulate(scaled[::-1])[::-1])
    return out


# How a family of p-values is adjusted before a verdict reads it: Holm keeps the family-wise error
# rate (the chance of any false verdict) at 5%, BH the false discovery rate, none neither (each
# test at 5% on its own). The verdicts of claims say which one they were decided at.
ADJUSTMENTS = {"holm": holm, "bh": bh, "none": lambda p: np.asarray(p, dtype=float)}
DEFAULT_ADJUSTMENT = "holm"
ALPHA = 1 - LEVEL  # the error rate a verdict is decided at, after the adjustment


def adjust(p, method: str = DEFAULT_ADJUSTMENT) -> np.ndarray:
    """The p-values adjusted by `method` (ADJUSTMENTS)."""
    return ADJUSTMENTS[method](p)


def power(effect, se, df, level: float = LEVEL) -> np.ndarray:
    """The chance that a two-sided t test at 1 - level rejects when the true difference is `effect`
    and the estimate's standard error is `se` on `df` degrees of freedom (the shifted-t
    approximation that detectable() inverts): P(T > t_crit - |effect|/se) + P(T < -t_crit - |effect|/se)."""
    shift = np.abs(np.asarray(effect, dtype=float)) / np.asarray(se, dtype=float)
    crit = t_quantile((1 + level) / 2, df)
    df = np.asarray(df, dtype=float)
    ok = np.isfinite(df) & (df > 0)
    dfs = np.where(ok, df, 1.0)
    return np.where(ok, stdtr(dfs, shift - crit) + stdtr(dfs, -crit - shift), np.nan)


def mean_se(values) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean, standard error of the mean (sample sd / sqrt(n); NaN below 2 values) and n along the
    last axis, skipping NaNs."""
    values = np.asarray(values, dtype=float)
    n = np.isfinite(values).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.nansum(values, axis=-1) / np.where(n > 0, n, np.nan)
        dev = np.where(np.isfinite(values), values - mean[..., None], 0.0)
        var = (dev**2).sum(axis=-1) / np.where(n > 1, n - 1, np.nan)
        return mean, np.sqrt(var / n), n


def interval(estimate, se, df, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """estimate -/+ t_{(1+level)/2, df} x se."""
    half = t_quantile((1 + level) / 2, df) * np.asarray(se, dtype=float)
    return estimate - half, estimate + half


def detectable(se, df, level: float = LEVEL, power: float = POWER) -> np.ndarray:
    """The minimum detectable difference: the true difference a two-sided test at 1 - level
    rejects with probability `power`, (t_{1-a/2} + t_{power}) x s.e. of the difference (the usual
    normal-theory power formula with t quantiles for these few degrees of freedom)."""
    return (t_quantile((1 + level) / 2, df) + t_quantile(power, df)) * np.asarray(se, dtype=float)


def paired(a, b) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean of a - b, its s.e. and degrees of freedom (n - 1), a[i] and b[i] from the same seed:
    seed-to-seed variation common to both (data order, initialisation) cancels."""
    mean, se, n = mean_se(np.asarray(a, dtype=float) - np.asarray(b, dtype=float))
    return mean, se, np.where(n > 1, n - 1, np.nan).astype(float)


def ratio_interval(a, b, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """a / b - 1 from paired positive samples (a[i], b[i] taken together) and its interval: the
    geometric mean ratio and a t interval of the mean log-ratio, back on the ratio scale. Drift
    common to a pair cancels (benchmark.perf: step times of two paths timed back to back on a
    shared CPU)."""
    mean, se, df = paired(np.log(np.asarray(a, dtype=float)), np.log(np.asarray(b, dtype=float)))
    lo, hi = interval(mean, se, df, level)
    return np.expm1(mean), np.expm1(lo), np.expm1(hi)


def welch(a, b) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """mean(a) - mean(b), its s.e. and the Welch-Satterthwaite degrees of freedom: independent
    samples of unequal size and variance (Welch 1947)."""
    ma, sa, na = mean_se(a)
    mb, sb, nb = mean_se(b)
    va, vb = sa**2, sb**2  # squared standard errors: s^2 / n
    with np.errstate(invalid="ignore", divide="ignore"):
        df = (va + vb) ** 2 / (va**2 / (na - 1) + vb**2 / (nb - 1))
    return ma - mb, np.sqrt(va + vb), df


def verdict(lo, hi, expected_sign) -> np.ndarray:
    """'reproduced' when the interval excludes 0 on the expected side, 'contradicted' when it
    excludes 0 on the other, else 'inconclusive' (also for a missing interval)."""
    lo, hi, sign = np.asarray(lo, float), np.asarray(hi, float), np.asarray(expected_sign, float)
    above, below = lo > 0, hi < 0
    agrees = np.where(sign > 0, above, below)
    disagrees = np.where(sign > 0, below, above)
    return np.where(agrees, VERDICTS[0], np.where(disagrees, VERDICTS[1], VERDICTS[2]))


@dataclass(frozen=True, kw_only=True)
class Difference:
    """first - second, with its interval at `level` and the minimum detectable difference."""

    method: str  # "paired" (by seed) or "welch"
    estimate: float
    se: float
    df: float
    lo: float
    hi: float
    detectable: float
    p: float = float("nan")  # two-sided p-value of first - second = 0 (p_value)
    level: float = LEVEL
    power: float = POWER


def differences(a, b) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """mean(a) - mean(b) along the last axis, a and b laid out on one seed axis (NaN: no value
    for that seed): its s.e., degrees of freedom, and whether it was paired. Paired by seed
    where a and b hold the same seeds, Welch's otherwise (one row of many at a time, or all)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    same = (np.isfinite(a) == np.isfinite(b)).all(axis=-1)
    est, se, df = (np.where(same, p, w) for p, w in zip(paired(a, b), welch(a, b)))
    return est, se, df, same


def compare(a: dict[int, float], b: dict[int, float]) -> Difference:
    """Two groups' per-seed values (seed -> value): paired by seed when both hold the same seeds,
    Welch's interval otherwise. NaN interval below 2 seeds a side."""
    seeds = sorted(a.keys() | b.keys())
    est, se, df, same = differences(
        [a.get(s, np.nan) for s in seeds], [b.get(s, np.nan) for s in seeds]
    )
    lo, hi = interval(est, se, df)
    return Difference(
        method="paired" if same else "welch",
        estimate=float(est),
        se=float(se),
        df=float(df),
        lo=float(lo),
        hi=float(hi),
        detectable=float(detectable(se, df)),
        p=float(p_value(est, se, df)),
    )


def _widened(values: np.ndarray) -> np.ndarray:
    """The values the bootstrap resamples, (K, m) as given (a sample per row, NaN-padded): each
    row's deviations from its mean scaled by sqrt(n / (n - 1)). Plain resampling gives a mean the
    variance (n - 1)/n x s^2/n, a third too small at 3 seeds."""
    mean, _, n = mean_se(values)
    scale = np.sqrt(n / np.maximum(n - 1, 1))
    return mean[:, None] + (values - mean[:, None]) * scale[:, None]


def bootstrap_means(values, draws: int, rng: np.random.Generator) -> np.ndarray:
    """(draws, K): the mean of each row of `values` (K, m; a sample per row, padded with NaN after
    its n values) resampled with replacement (_widened), `draws` times. A sample of one value has
    no spread to resample: it stays fixed."""
    values = _widened(np.atleast_2d(np.asarray(values, dtype=float)))
    k, m = values.shape
    n = np.isfinite(values).sum(axis=1)  # (K,)
    picks = (rng.random((draws, k, m)) * n[:, None]).astype(np.intp)  # (draws, K, m), each < n
    drawn = values[np.arange(k)[None, :, None], picks]
    used = np.arange(m)[None, None, :] < n[None, :, None]  # the first n draws of a row
    return np.where(used, drawn, 0.0).sum(axis=2) / n


def bootstrap_range(values) -> tuple[np.ndarray, np.ndarray]:
    """(K,) each: the least and greatest mean bootstrap_means can draw from each row of `values`."""
    values = _widened(np.atleast_2d(np.asarray(values, dtype=float)))
    return np.nanmin(values, axis=1), np.nanmax(values, axis=1)


def percentile_interval(
    draws: np.ndarray, level: float = LEVEL, axis: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """The percentile bootstrap interval: the (1 - level)/2 and (1 + level)/2 quantiles of the draws."""
    lo, hi = np.nanquantile(draws, [(1 - level) / 2, (1 + level) / 2], axis=axis)
    return lo, hi
