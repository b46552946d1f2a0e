"""A candidate's tuning runs (the space's `tune:`, space/tuning.py), inside its trial: every point of
the grid with every tuning seed, each a row of phase `tune` named `t0007-g1-s100` (grid point 1,
seed 100), then the point chosen by the declared metric, at which the trial trains its final
seeds (rows of phase `final`, `tuned` saying the point).

Resume: a tuning run with its final row is never trained again. A trial killed part-way is run
again as a trial that continues it (resume.close_running), reading its tuning rows as its own, as
it reads the final rows of the trials it continues; so a continued candidate chooses the same point."""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Mapping

from benchmark.search import rows
from benchmark.search.context import TrialContext
from benchmark.store import PHASES, metrics, read_files, trial_files

TUNE, FINAL = PHASES  # the rows' `phase`


def trial_id(number: int, point: int, seed: int) -> str:
    return f"t{number:04d}-g{point}-s{seed}"


def files_of(study_dir: str, number: int) -> list[str]:
    """The tuning row files of Optuna trial `number`."""
    return trial_files(study_dir, f"t{number:04d}-g")


def setting_text(setting: Mapping[str, Any]) -> str:
    """A grid point as the `tuned` column holds it (JSON, keys sorted)."""
    return json.dumps(dict(setting), sort_keys=True)


def columns(ctx: TrialContext, setting: Mapping[str, Any] | None, phase: str) -> dict[str, Any]:
    """A row's `phase` and `tuned`; nothing for a space without `tune:`."""
    if ctx.tune is None:
        return {}
    return {"phase": phase, "tuned": setting_text(setting) if setting is not None else None}


def done(ctx: TrialContext, number: int, continues=()) -> dict[tuple[str, int], dict[str, Any]]:
    """(tuned, seed) -> the final row of each tuning run this candidate has: its own trial's and
    those of the trials it continues; a run failed short of its last attempt is still to train."""
    latest: dict[str, dict[str, Any]] = {}
    for n in (*continues, number):
        for row in read_files(files_of(ctx.study_dir, n)):
            if (
                row["trial_id"] not in latest
                or row["attempt"] >= latest[row["trial_id"]]["attempt"]
            ):
                latest[row["trial_id"]] = row
    return {
        (r["tuned"], int(r["seed"])): r
        for r in latest.values()
        if r.get("status") != "failed" or int(r.get("attempt") or 0) >= ctx.retries
    }


def grid(
    ctx: TrialContext, have: Mapping[tuple[str, int], Mapping[str, Any]]
) -> tuple[list[dict[str, Any]], list[tuple[int, dict[str, Any], int]]]:
    """The grid as far as the tuning rows `have` ((tuned, seed) -> row) have taken it: (its points,
    each at its index in the trial ids, g0.., the declared ones first and each extension's after;
    the runs of it not yet trained, as (index, setting, seed)). A choice on an edge that `extend`
    names adds the next value past it (space/tuning.Tune.beyond) once every run of the grid so far
    has its row: the extension is read from the rows, so a resumed trial extends as its first did."""
    tune = ctx.tune
    axes = [(k, list(v)) for k, v in tune.grid]
    order: list[str] = []  # the points' JSON in index order
    while True:
        points = tune.points(axes)
        order += [t for t in map(setting_text, points) if t not in order]
        missing = [
            (order.index(setting_text(p)), p, seed)
            for p in points
            for seed in tune.seeds
            if (setting_text(p), seed) not in have
        ]
        if missing:
            return points, missing
        pick = choose(ctx, [have[(setting_text(p), s)] for p in points for s in tune.seeds])
        grown = next(
            (
                (key, nxt)
                for key, _ in tune.extend
                if pick is not None and (nxt := tune.beyond(axes, key, pick[key])) is not None
            ),
            None,
        )
        if grown is None:
            return points, []
        axes = [(k, v + [grown[1]] if k == grown[0] else v) for k, v in axes]


def wanted(
    ctx: TrialContext, number: int, have: Mapping[tuple[str, int], Mapping[str, Any]]
) -> list[tuple[str, int, dict[str, Any]]]:
    """The tuning runs candidate `number` still needs, given the rows it has ((tuned, seed) -> row:
    `done`): (trial id, seed, setting) each, none once its choice is settled. A scheduler trains
    them (side by side, if it can), then asks again: an extension of the grid is wanted only once
    the runs before it are in."""
    return [(trial_id(number, i, seed), seed, p) for i, p, seed in grid(ctx, have)[1]]


def settle(
    config: Mapping[str, Any], ctx: TrialContext, number: int, train: Callable[..., dict]
) -> dict | None:
    """Train the tuning runs this candidate lacks (`train(trial_id, seed, setting)` trains one and
    returns its row) until none is wanted, then the chosen point; None when no point trained to a
    finite metric on every tuning seed."""
    return settle_batches(config, ctx, number, lambda todo: [train(*run) for run in todo])


def settle_batches(
    config: Mapping[str, Any], ctx: TrialContext, number: int, train_all: Callable[..., list]
) -> dict | None:
    """settle, each batch of wanted runs trained by `train_all(runs)` (runs: (trial id, seed,
    setting) each; side by side where it can: search/dispatch.py) returning their rows in order."""
    have = done(ctx, number, config.get(rows.CONTINUES) or ())
    while todo := wanted(ctx, number, have):
        for (_, seed, point), row in zip(todo, train_all(todo)):
            have[(setting_text(point), seed)] = row
    points, _ = grid(ctx, have)
    return choose(ctx, [have[(setting_text(p), s)] for p in points for s in ctx.tune.seeds])


def values_of(ctx: TrialContext, tuned_rows: list[Mapping[str, Any]]) -> dict[str, list[float]]:
    """Each point's metric on its tuning seeds, in the seeds' order; NaN for a run that failed or
    diverged (a point with one is no recipe to trust: Tune.decide)."""
    by_point: dict[str, dict[int, float]] = {}
    for r in tuned_rows:
        ok = r.get("status") == "ok"
        value = metrics.row_value(r, ctx.tune.metric, ctx.count) if ok else math.nan
        by_point.setdefault(r["tuned"], {})[int(r["seed"])] = value
    return {p: [v.get(s, math.nan) for s in ctx.tune.seeds] for p, v in by_point.items()}


def choose(ctx: TrialContext, tuned_rows: list[Mapping[str, Any]]) -> dict | None:
    """The point the space's rule chooses (space/tuning.Tune.decide: the best mean over the tuning
    seeds, points within the margin of it tied and the tie broken by the declared rule)."""
    pick, _, _ = ctx.tune.decide(values_of(ctx, tuned_rows))
    return None if pick is None else json.loads(pick)
