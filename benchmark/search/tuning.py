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
import statistics
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


def settle(
    config: Mapping[str, Any], ctx: TrialContext, number: int, train: Callable[..., dict]
) -> dict | None:
    """Train the grid's runs this candidate lacks (`train(trial_id, seed, setting)` trains one and
    returns its row), then the chosen point; None when no point trained to a finite metric on
    every tuning seed."""
    have = done(ctx, number, config.get(rows.CONTINUES) or ())
    found: dict[tuple[str, int], dict] = {}
    for i, point in enumerate(ctx.tune.points()):
        for seed in ctx.tune.seeds:
            key = (setting_text(point), seed)
            found[key] = have[key] if key in have else train(trial_id(number, i, seed), seed, point)
    return choose(ctx, list(found.values()))


def choose(ctx: TrialContext, tuned_rows: list[Mapping[str, Any]]) -> dict | None:
    """The point whose mean metric over the tuning seeds is best (ctx.tune's direction); a point
    with a run that failed, diverged or has no finite value is not chosen: it is no recipe to trust."""
    by_point: dict[str, list[float]] = {}
    for r in tuned_rows:
        ok = r.get("status") == "ok"
        value = metrics.row_value(r, ctx.tune.metric, ctx.count) if ok else math.nan
        by_point.setdefault(r["tuned"], []).append(value)
    means = {
        p: statistics.fmean(v)
        for p, v in by_point.items()
        if len(v) == len(ctx.tune.seeds) and all(math.isfinite(x) for x in v)
    }
    if not means:
        return None
    pick = (min if ctx.tune.direction == "min" else max)(means, key=means.get)
    return json.loads(pick)
