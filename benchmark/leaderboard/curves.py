"""Learning curves on the page: one figure per checked claim, its arms in their own colours and
every seed a line of its own (the training loss over steps, the validation points as dots), so a
run that fell behind, or spiked, shows where it did. A run the instability rule marked
(claims/stability.py) is drawn dashed.

The curves come from the results store beside the rows (store/curves.py: read_study_curves)."""

from __future__ import annotations

from functools import partial

import pandas as pd
from matplotlib.figure import Figure

from benchmark.leaderboard import layout
from benchmark.leaderboard.plots import PALETTE, Plot
from benchmark.space import select
from benchmark.store import read_curves

MAX_FIGURES = 24  # claims drawn at most (a page is read, not searched)


def read_study_curves(studies: dict[str, str], trials: pd.DataFrame) -> pd.DataFrame:
    """Every curve of the studies (label -> folder), with `study` set to the label."""
    frames = [
        read_curves(folder, trials[trials["study"] == label]).assign(study=label)
        for label, folder in studies.items()
    ]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def plan(
    results: list, trials: pd.DataFrame, curves: pd.DataFrame, marked: pd.Series | None = None
) -> list[Plot]:
    """A figure per claim result whose arms have curves."""
    if curves is None or curves.empty:
        return []
    plots = []
    for k, r in enumerate(results[:MAX_FIGURES]):
        arms = _arms(r, trials, marked)
        if not any(len(curves_of(curves, r.study, runs)) for runs in arms.values()):
            continue
        title = f"Learning curves: {r.claim.claim} ({r.study})"
        plots.append(
            Plot(f"curves-{k:02d}", title, False, partial(_draw, arms, curves, r.study, title))
        )
    return plots


def _arms(r, trials: pd.DataFrame, marked: pd.Series | None) -> dict[str, pd.DataFrame]:
    """Arm -> its ok rows (trial_id, attempt, seed, marked)."""
    rows = trials[(trials["study"] == r.study).to_numpy() & (trials["status"] == "ok").to_numpy()]
    rows = rows.assign(
        _marked=(marked.reindex(rows.index).fillna("") != "") if marked is not None else False
    )
    rows = rows[select.mask(rows, r.claim.where)] if len(rows) else rows
    return {
        name: rows[select.mask(rows, r.claim.groups[name])] if len(rows) else rows
        for name in r.claim.order
    }


def curves_of(curves: pd.DataFrame, study: str, runs: pd.DataFrame) -> pd.DataFrame:
    keys = runs[["trial_id", "attempt"]].assign(study=study, _marked=runs["_marked"].to_numpy())
    return curves.merge(keys, on=["study", "trial_id", "attempt"])


def _draw(arms: dict[str, pd.DataFrame], curves: pd.DataFrame, study: str, title: str) -> Figure:
    fig, (ax,) = layout.new(title, 1, 1, width=7.0, height=4.4, legend=1.2)
    for i, (name, runs) in enumerate(arms.items()):
        colour = PALETTE[i % len(PALETTE)]
        mine = curves_of(curves, study, runs)
        for j, ((trial, attempt), run) in enumerate(
            mine.groupby(["trial_id", "attempt"], sort=True)
        ):
            run = run.sort_values("step")
            train = run.dropna(subset=["train_loss"])
            dashed = bool(run["_marked"].iloc[0])
            ax.plot(
                train["step"],
                train["train_loss"],
                color=colour,
                linewidth=0.9,
                alpha=0.75,
                linestyle="--" if dashed else "-",
                label=name if j == 0 else None,
            )
            val = run.dropna(subset=["val_loss"])
            ax.plot(
                val["step"],
                val["val_loss"],
                color=colour,
                marker="o",
                markersize=3,
                linestyle="none",
            )
    shown = curves_of(curves, study, pd.concat(arms.values()))
    late = shown[shown["step"] > 0.1 * shown["step"].max()][["train_loss", "val_loss"]].stack()
    if len(late):  # the first tenth falls from ln(vocabulary): the y axis is for the rest
        lo, hi = float(late.min()), float(late.max())
        ax.set_ylim(lo - 0.05 * (hi - lo + 1e-3), hi + 0.05 * (hi - lo + 1e-3))
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token): training (lines), validation (dots)")
    ax.grid(True, alpha=0.3)
    layout.figure_legend(fig, [ax])
    return fig
