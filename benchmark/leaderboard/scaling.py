"""Scaling fits over a budget ladder: a study whose ok rows span several budgets.

Per study and family (or family and structure), L(N) = a N^(-alpha) + c is fitted to the validation
loss of the group's best candidate at each budget, N its parameters (the count the budget uses).
This is Hoffmann et al. (2022) eq. 2 at a fixed token-to-parameter ratio, where the data term folds
into the power law and the constant; Kaplan et al. (2020) fit the same form without c. The best
candidate per budget is the envelope such laws describe.

The fit is a grid over alpha with least squares for a and c at each alpha (closed form, with
a, c >= 0), so 3-4 points never send a nonlinear solver astray. Intervals are percentile bootstrap intervals over
seeds: each candidate's seeds are resampled within its budget, the best candidate chosen again, the
law fitted again. They count seed noise only, not the choice of the law, and a prediction beyond
the largest measured budget is labelled an extrapolation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from benchmark.leaderboard import stats
from benchmark.leaderboard.board import KEY, Board
from benchmark.leaderboard.formats import Column, Table
from benchmark.leaderboard.tables import MISSING, count

METRIC = "val_loss"  # the law's L is a cross-entropy loss
MIN_BUDGETS = 3  # three parameters (a, alpha, c) need three points
DRAWS = 1000
# Candidates per budget that may be a bootstrap draw's best: those ranked further down by mean
# loss practically never are, and a search holds hundreds per budget.
CONTENDERS = 16
# Exponents from nearly flat to steep: Kaplan's alpha_N is 0.076, Hoffmann's 0.34. The coarse
# grid's best is refined on REFINE points spanning its neighbours: steps under 1%, which move a
# prediction far less than seed noise does.
ALPHAS = np.geomspace(0.01, 3.0, 64)
REFINE = 21
BY = {"family": ("family",), "structure": ("family", "structure")}
LAW = "L(N) = a·N^-α + c"


@dataclass(frozen=True, kw_only=True)
class Fit:
    study: str
    group: str  # the family, or "family structure"
    family: str
    n: np.ndarray  # (P,) parameters of the best candidate at each budget, ascending
    loss: np.ndarray  # (P,) its mean loss over seeds
    se: np.ndarray  # (P,) its standard error (NaN for one seed)
    seeds: np.ndarray  # (P,) its seed count
    n0: float  # N is scaled by this (the points' geometric mean) inside the fit
    a: float  # of the scaled law: L = a (N / n0)^-alpha + c
    alpha: float
    c: float
    draws: np.ndarray | None  # (DRAWS, 3): bootstrap a, alpha, c; None with one seed everywhere

    def predict(self, n) -> np.ndarray:
        return law(np.asarray(n, dtype=float) / self.n0, self.a, self.alpha, self.c)

    def predict_draws(self, n: float) -> np.ndarray | None:
        if self.draws is None:
            return None
        a, alpha, c = self.draws.T
        return law(n / self.n0, a, alpha, c)


@dataclass(frozen=True, kw_only=True)
class Scaling:
    by: str
    params: str  # the column N is read from
    fits: tuple[Fit, ...]
    target: float | None = None  # --predict
    predictions: pd.DataFrame = field(default_factory=pd.DataFrame)
    notes: tuple[str, ...] = ()


def law(x, a, alpha, c):
    return a * np.power(x, -alpha) + c


def fit_law(n: np.ndarray, y: np.ndarray, alphas: np.ndarray = ALPHAS):
    """Least squares L = a x^-alpha + c with a >= 0 and c >= 0, x = n / geometric mean of n, for
    each row of y (..., P): for every alpha on the grid a and c are the constrained regression of
    y on x^-alpha (_ols), and the alpha with the least residual sum of squares wins; then again on
    a finer grid around it. The constraints are the law's meaning: loss falls with N (a >= 0) to a
    floor no lower than zero (c >= 0, Hoffmann et al.'s E). Unconstrained, three nearly log-linear
    points fit best with alpha -> 0 and c -> -24 (seen on the quickstart ladder), a curve that
    says nothing beyond its points. Returns n0 and arrays a, alpha, c of shape y[..., 0]."""
    n0 = float(np.exp(np.log(n).mean()))
    logx = np.log(n / n0)
    alpha = _best_alpha(logx, y, np.broadcast_to(alphas, (*y.shape[:-1], len(alphas))))
    step = alphas[1] / alphas[0]
    alpha = _best_alpha(logx, y, alpha[..., None] * step ** np.linspace(-1, 1, REFINE))
    a, c, _ = _ols(np.exp(-alpha[..., None] * logx), y)
    return n0, a, alpha, c


def _ols(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """a, c and the residual sum of squares of y ~ a x + c over the last axis with a, c >= 0: the
    free regression where it is feasible, else through the origin (c = 0), else flat (a = 0)."""
    xm, ym = x.mean(axis=-1, keepdims=True), y.mean(axis=-1, keepdims=True)
    xc, yc = x - xm, y - ym
    a = (xc * yc).sum(axis=-1) / (xc**2).sum(axis=-1)
    c = ym[..., 0] - a * xm[..., 0]
    origin = np.maximum((x * y).sum(axis=-1) / (x**2).sum(axis=-1), 0.0)
    a, c = np.where(c < 0, origin, a), np.where(c < 0, 0.0, c)
    a, c = np.where(a < 0, 0.0, a), np.where(a < 0, ym[..., 0], c)
    rss = ((y - a[..., None] * x - c[..., None]) ** 2).sum(axis=-1)
    return a, c, rss


def _best_alpha(logx: np.ndarray, y: np.ndarray, alphas: np.ndarray) -> np.ndarray:
    """The alpha of `alphas` (..., G) whose constrained regression of y (..., P) on x^-alpha
    leaves the least residual."""
    x = np.exp(-alphas[..., None] * logx)  # (..., G, P)
    _, _, rss = _ols(x, np.broadcast_to(y[..., None, :], x.shape))
    return np.take_along_axis(alphas, rss.argmin(axis=-1)[..., None], axis=-1)[..., 0]


def fit(
    board: Board, by: str = "family", target: float | None = None, draws: int = DRAWS, seed: int = 0
) -> Scaling:
    """Every group with MIN_BUDGETS budgets or more, fitted; the predictions at `target` (params)."""
    if by not in BY:
        raise ValueError(f"fit by {by!r}: choose {' or '.join(BY)}")
    params = next(
        (o.column for o in board.objectives if o.column.startswith("params_")), "params_total"
    )
    t = board.trials
    if METRIC not in t or params not in t:
        return Scaling(
            by=by,
            params=params,
            fits=(),
            target=target,
            notes=(f"no scaling fit: the results have no {METRIC if METRIC not in t else params}",),
        )
    usable = (
        (t["status"] == "ok").to_numpy()
        & np.isfinite(t[METRIC].to_numpy(float))
        & np.isfinite(t[params].to_numpy(float))
    )
    # The columns first: the trials hold every column of every row, and copying them all is most
    # of this function's time on a large study.
    ok = t[[*KEY, *BY[by], params, METRIC]][usable].merge(board.candidates[[*KEY, "band"]], on=KEY)
    ladder = (
        ok.groupby("study", sort=False)["band"].transform("nunique") >= MIN_BUDGETS
    ).to_numpy()
    notes = [
        _short_note(study, rows, [], False)
        for study, rows in ok[~ladder].groupby("study", sort=False)
    ]
    fits = []
    if ladder.any():  # the usual study has one budget: no ladder, nothing more to do
        fits, short = _fit_ladders(ok[ladder], by, params, draws, np.random.default_rng(seed))
        notes += short
    if target is not None and not fits:
        notes.append(f"no prediction at {count(target)}: no scaling fit to predict from")
    predictions = _predict(tuple(fits), target) if target is not None and fits else pd.DataFrame()
    return Scaling(
        by=by,
        params=params,
        fits=tuple(fits),
        target=target,
        predictions=predictions,
        notes=tuple(notes),
    )


def _fit_ladders(
    ok: pd.DataFrame, by: str, params: str, draws: int, rng: np.random.Generator
) -> tuple[list[Fit], list[str]]:
    """Every group of every study in `ok` (ok rows with their band) that has MIN_BUDGETS budgets."""
    # Every candidate's losses as one matrix, candidates x seeds (NaN-padded), built once: a
    # search holds tens of thousands of candidates.
    losses = ok.assign(k=ok.groupby(KEY).cumcount()).pivot(index=KEY, columns="k", values=METRIC)
    values = losses.to_numpy(float)
    info = (
        ok.groupby(KEY, sort=False)[[*BY[by], params, "band"]]
        .first()
        .reindex(losses.index)
        .reset_index()
    )
    info["mean"] = np.nanmean(values, axis=1)
    fits, notes = [], []
    for study, rows in info.groupby("study", sort=False):
        done, short = [], []
        for key, group in rows.groupby(list(BY[by]), sort=True, dropna=False):
            label = " ".join(str(k) for k in (key if isinstance(key, tuple) else (key,)))
            if group["band"].nunique() < MIN_BUDGETS:
                short.append(f"{label} ({group['band'].nunique()})")
                continue
            done.append(_fit_group(study, label, group, values[group.index], params, draws, rng))
        fits += done
        if short:
            notes.append(_short_note(study, rows, short, bool(done)))
    return fits, notes


def _short_note(study: str, rows: pd.DataFrame, short: list[str], some: bool) -> str:
    if not some:
        budgets = sorted(rows["band"].unique())
        return (
            f"no scaling fit for {study}: {len(budgets)} budget{'s' * (len(budgets) != 1)} "
            f"({', '.join(map(count, budgets))}); {LAW} needs {MIN_BUDGETS} or more"
        )
    return (
        f"no scaling fit for {study}: {', '.join(short)} budgets; {LAW} needs {MIN_BUDGETS} or more"
    )


def _fit_group(
    study: str,
    label: str,
    group: pd.DataFrame,
    values: np.ndarray,
    params: str,
    draws: int,
    rng: np.random.Generator,
) -> Fit:
    """`group`: its candidates (band, parameters, mean loss), `values` their losses per seed.
    At each budget the CONTENDERS best by mean go to fit_points."""
    n, samples = [], []
    bands, means = group["band"].to_numpy(float), group["mean"].to_numpy(float)
    for band in np.unique(bands):
        at = np.flatnonzero(bands == band)
        at = at[np.argsort(means[at], kind="stable")][:CONTENDERS]
        seeds = np.isfinite(values[at]).sum(axis=1).max()
        samples.append(values[at, :seeds])  # rows are filled from the left: the rest is padding
        n.append(float(group[params].to_numpy(float)[at[0]]))
    # the best candidate's seeds at each budget, NaN-padded: budgets may hold different numbers of
    # seeds (a ladder whose top rung is still running)
    best = np.full((len(samples), max(at.shape[1] for at in samples)), np.nan)
    for p, at in enumerate(samples):
        best[p, : at.shape[1]] = at[0]
    mean, se, seeds = stats.mean_se(best)
    n0, a, alpha, c, boot = fit_points(np.array(n), samples, draws, rng)
    return Fit(
        study=study,
        group=label,
        family=str(group["family"].iloc[0]),
        n=np.array(n),
        loss=mean,
        se=se,
        seeds=seeds,
        n0=n0,
        a=a,
        alpha=alpha,
        c=c,
        draws=boot,
    )


def fit_points(n: np.ndarray, samples: list[np.ndarray], draws: int, rng: np.random.Generator):
    """The law through the best candidate's mean loss at each budget. samples[p] is the p-th
    budget's (parameters n[p]) candidates x seeds losses, NaN-padded. In each bootstrap draw every
    candidate's seeds are resampled and the best chosen again (among those that can win a draw at
    all: a search holds hundreds). Returns n0, a, alpha, c and the draws' (a, alpha, c) as a
    (draws, 3) array, None when no candidate has two seeds."""
    best = np.array([np.nanmin(np.nanmean(at, axis=1)) for at in samples])
    n0, a, alpha, c = fit_law(n, best)
    boot = None
    if any(
        (np.isfinite(at).sum(axis=1) > 1).any() for at in samples
    ):  # else every draw is the same
        # (draws, P): per budget, the least of its candidates' resampled means.
        y = np.column_stack(
            [stats.bootstrap_means(_contenders(at), draws, rng).min(axis=1) for at in samples]
        )
        boot = np.column_stack(fit_law(n, y)[1:])
    return n0, float(a), float(alpha), float(c), boot


def _contenders(candidates: np.ndarray) -> np.ndarray:
    """The rows (candidates) whose least possible resampled mean is below the greatest possible
    one of the candidate surest to be low: no other is ever the best of a draw."""
    lo, hi = stats.bootstrap_range(candidates)
    return candidates[lo <= hi.min()]


def _predict(fits: tuple[Fit, ...], target: float) -> pd.DataFrame:
    """Predicted loss at `target` parameters per fit, and its rank among its study's fits, each
    with its bootstrap interval (ranks of the same draw compared)."""
    rows = []
    for study in dict.fromkeys(f.study for f in fits):
        ours = [f for f in fits if f.study == study]
        point = np.array([float(f.predict(target)) for f in ours])
        rank = pd.Series(point).rank(method="min").to_numpy()
        boot = [f.predict_draws(target) for f in ours]
        if all(b is not None for b in boot):
            draws = np.column_stack(boot)  # (DRAWS, groups)
            lo, hi = stats.percentile_interval(draws)
            rank_lo, rank_hi = stats.percentile_interval(
                pd.DataFrame(draws).rank(axis=1, method="min").to_numpy()
            )
        else:
            lo = hi = rank_lo = rank_hi = np.full(len(ours), np.nan)
        for i, f in enumerate(ours):
            rows.append(
                {
                    "study": study,
                    "group": f.group,
                    "loss": point[i],
                    "lo": lo[i],
                    "hi": hi[i],
                    "rank": int(rank[i]),
                    "rank_lo": rank_lo[i],
                    "rank_hi": rank_hi[i],
                    "extrapolation": bool(target > f.n.max() or target < f.n.min()),
                }
            )
    return pd.DataFrame(rows)


# --- the table ----------------------------------------------------------------------------------


def _with_interval(value: float, lo: float, hi: float, digits: int = 3) -> str:
    if not math.isfinite(value):
        return MISSING
    shown = f"{value:.{digits}f}"
    return shown + (
        f" [{lo:.{digits}f}, {hi:.{digits}f}]" if math.isfinite(lo) and math.isfinite(hi) else ""
    )


def table(scaling: Scaling) -> Table | None:
    """One row per fit; with --predict the predicted loss and rank at the target. None: no fit."""
    if not scaling.fits:
        return None
    several = len({f.study for f in scaling.fits}) > 1
    pred = scaling.predictions.set_index(["study", "group"]) if len(scaling.predictions) else None
    rows = []
    for f in scaling.fits:
        alpha_lo, alpha_hi = (
            stats.percentile_interval(f.draws[:, 1]) if f.draws is not None else (np.nan, np.nan)
        )
        c_lo, c_hi = (
            stats.percentile_interval(f.draws[:, 2]) if f.draws is not None else (np.nan, np.nan)
        )
        row = {
            "study": f.study,
            "group": f.group,
            "budgets": f"{len(f.n)}: {count(f.n.min())}–{count(f.n.max())}",
            "seeds": _span(f.seeds),
            "alpha": _with_interval(f.alpha, alpha_lo, alpha_hi),
            "c": _with_interval(f.c, c_lo, c_hi),
        }
        if pred is not None:
            p = pred.loc[(f.study, f.group)]
            ranks = (
                f" [{p['rank_lo']:.0f}–{p['rank_hi']:.0f}]" if math.isfinite(p["rank_lo"]) else ""
            )
            row.update(
                loss=_with_interval(p["loss"], p["lo"], p["hi"]),
                rank=f"{p['rank']}{ranks}",
                kind="extrapolation" if p["extrapolation"] else "interpolation",
            )
        rows.append(row)
    frame = pd.DataFrame(rows)
    at = count(scaling.target) if scaling.target is not None else ""
    heads = [("study", "Study")] * several + [
        ("group", scaling.by.capitalize()),
        ("budgets", "Budgets"),
        ("seeds", "Seeds"),
        ("alpha", "α"),
        ("c", "c (loss as N → ∞)"),
    ]
    if pred is not None:
        heads += [("loss", f"Loss at {at}"), ("rank", f"Rank at {at}"), ("kind", "Prediction")]
    return Table(
        title="Scaling fits",
        columns=[Column(header=h, cells=frame[c].tolist()) for c, h in heads],
        caption=(
            f"{LAW} fitted to each {scaling.by}'s best candidate per budget ({METRIC}, N = {scaling.params}); "
            f"[95% percentile bootstrap interval over seeds]; a prediction beyond the largest measured budget "
            f"is an extrapolation"
            + (
                f"; a fit to {MIN_BUDGETS} budgets has as many points as the law has parameters: it meets them "
                f"where a, c ≥ 0 allow, and nothing tests its form"
                if any(len(f.n) == MIN_BUDGETS for f in scaling.fits)
                else ""
            )
        ),
    )


def _span(seeds: np.ndarray) -> str:
    lo, hi = int(seeds.min()), int(seeds.max())
    return str(lo) if lo == hi else f"{lo}–{hi}"
