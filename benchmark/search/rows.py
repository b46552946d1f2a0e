"""Every row a search writes, built here: a trial's measurements (`trial.run.run_trial`: ok or
diverged) joined with its identity in the study, and the rows of trials that produced no
measurements: `failed` (an exception, after retries), `infeasible` (the sampled point has no
candidate within the budget), `pruned` (ASHA stopped it) or a worker that died. The same rows give
Optuna its values and the trial's user attributes, so the study and the Parquet files agree."""

from __future__ import annotations

import json
import math
import shutil
import statistics
import time
import traceback
from pathlib import Path
from typing import Any, Mapping

from benchmark.arch import variant
from benchmark.search.context import TrialContext
from benchmark.store import (
    disk_full,
    metric,
    metrics,
    read_files,
    trial_files,
    write_curve,
    write_row,
)
from benchmark.store.curves import KEY as CURVE
from benchmark.store.location import is_uri, join, resolve
from benchmark.store.results import row_name

ERROR_CHARS = 1500
NOT_AXES = ("spec", "optuna_trial", "node_id", "continues")
# The Optuna user attribute (and config key) of a trial that continues earlier trials of the same
# candidate, which stopped before every seed had its row: their rows count as its own seeds.
CONTINUES = "continues"


def identity(ctx: TrialContext, config: Mapping[str, Any], trial_id: str) -> dict[str, Any]:
    """The columns that place a row in its study: trial, sampled axes, budget."""
    return {
        "study": ctx.study,
        "trial_id": trial_id,
        "optuna_trial": int(config["optuna_trial"]),
        "node_id": config.get("node_id"),  # the Ray node that ran it (set by the trainable)
        "axes": json.dumps({k: v for k, v in config.items() if k not in NOT_AXES}, default=str),
        "budget": config.get("budget"),
        "budget_count": config.get("count"),
        "budget_distance": config.get("budget_distance"),
    }


def _candidate(config: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "family": config.get("family"),
        "spec": json.dumps(config.get("spec"), sort_keys=True),
        **{k: config.get(k) for k in metrics.PARAM_COLUMNS},
    }


def measured(
    ctx: TrialContext, config, trial_id: str, row: Mapping[str, Any], attempt: int
) -> dict[str, Any]:
    """run_trial's row (ok / diverged) in its study."""
    return {**row, **identity(ctx, config, trial_id), "attempt": attempt}


def failed(
    ctx: TrialContext,
    config,
    trial_id: str,
    seed: int,
    error: BaseException,
    started: str,
    attempt: int,
) -> dict[str, Any]:
    tb = traceback.format_exc(limit=8)
    return {
        **_candidate(config),
        **identity(ctx, config, trial_id),
        "status": "failed",
        "attempt": attempt,
        "error": f"{type(error).__name__}: {error}\n{tb[-ERROR_CHARS:]}",
        "started_at": started,
        "seed": seed,
    }


def infeasible(ctx: TrialContext, config) -> dict[str, Any]:
    number = int(config["optuna_trial"])
    return {
        "study": ctx.study,
        "trial_id": ctx.trial_id(number),
        "optuna_trial": number,
        "status": "infeasible",
        "error": config["infeasible"],
        "seed": ctx.seed,
        "node_id": config.get("node_id"),
    }


def unfinished(
    ctx: TrialContext, config, last: Mapping[str, Any], status: str, error: str | None
) -> dict[str, Any]:
    """A trial that ended without writing a row: ASHA stopped it (`pruned`), or its worker died."""
    loss = last.get("val_loss")
    number = int(config["optuna_trial"])
    return {
        **_candidate(config),
        **identity(ctx, config, ctx.trial_id(number)),
        "status": status,
        "error": error,
        "seed": ctx.seed,
        "tokens_trained": last.get("tokens"),
        "val_loss": loss,
        "val_ppl": math.exp(loss) if loss is not None and math.isfinite(loss) else None,
    }


def write(ctx: TrialContext, row: Mapping[str, Any]) -> str:
    """Write a row where the study lives, its training curve first (store/curves.py: a row that
    exists has its curve); when the disk is full, keep the row in the search's fallback folder
    (for `--resume` to recover) and raise StoreFull."""
    row = dict(row)
    if row.get(CURVE):
        try:
            write_curve(ctx.study_dir, row, row_name(row["trial_id"], row.get("attempt")))
        except OSError as err:  # the row matters more: it is written (or kept aside) all the same
            if not disk_full(err):
                raise
    row.pop(CURVE, None)
    return write_row(ctx.study_dir, row, fallback=ctx.fallback_dir)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


# ---- reading a trial's rows back: Optuna's values and attributes ------------------------------


def trial_rows(
    study_dir: str | Path, number: int, continues: tuple[int, ...] | list[int] = ()
) -> list[dict[str, Any]]:
    """The latest attempt of each seed of Optuna trial `number` (files t0007.a0.parquet,
    t0007-s1.a1.parquet, ...), read from the study's files alone; with `continues` (the trials it
    continues), their rows of the seeds it has none of as well."""
    own = _latest(number, study_dir)
    seeds = {r.get("seed") for r in own}
    for earlier in continues:
        own += [r for r in _latest(earlier, study_dir) if r.get("seed") not in seeds]
        seeds = {r.get("seed") for r in own}
    return own


def trial_files_of(study_dir: str | Path, number: int) -> list[str]:
    """The row files of Optuna trial `number`: every seed, every attempt."""
    return trial_files(study_dir, f"t{number:04d}.a") + trial_files(study_dir, f"t{number:04d}-s")


def _latest(number: int, study_dir: str | Path) -> list[dict[str, Any]]:
    files = trial_files_of(study_dir, number)
    latest: dict[str, dict[str, Any]] = {}
    for row in read_files(files):
        if row["trial_id"] not in latest or row["attempt"] >= latest[row["trial_id"]]["attempt"]:
            latest[row["trial_id"]] = row
    return list(latest.values())


def finished_seeds(found: list[Mapping[str, Any]], retries: int) -> dict[int, dict[str, Any]]:
    """Seed -> its final row: measured (ok or diverged), or failed on its last allowed attempt.
    A seed without one (never reached, or stopped between retries) is still to train."""
    return {
        int(r["seed"]): dict(r)
        for r in found
        if _present(r.get("seed"))
        and (r.get("status") != "failed" or int(r.get("attempt") or 0) >= retries)
    }


def worst(name: str, vocab: int | None) -> float | None:
    """What a diverged run counts as in a metric: a uniform guess over the vocabulary (loss ln V,
    perplexity V), the worst a model can be; None for a metric without such a bound."""
    if not vocab:
        return None
    if name.startswith("val_loss"):
        return math.log(vocab)
    if name.startswith("val_ppl"):
        return float(vocab)
    return None


def values(
    rows: list[Mapping[str, Any]],
    names: tuple[str, ...] | list[str],
    count: str,
    vocab: int | None = None,
) -> list[float]:
    """Each metric's mean over the trial's seeds, what Optuna is told: its ok rows, and each seed
    that diverged at the metric's worst (`worst`; the space's `diverged: worst`), not left out."""
    ok = [r for r in rows if r.get("status") == "ok"]
    lost = sum(r.get("status") == "diverged" for r in rows)
    if not ok:
        return [math.nan] * len(names)
    out = []
    for n in names:
        bound = worst(n, vocab)
        lost_at = [bound] * lost if bound is not None else []
        out.append(statistics.fmean([metrics.row_value(r, n, count) for r in ok] + lost_at))
    return out


ATTRS = (
    "family",
    "structure",
    *metrics.PARAM_COLUMNS,
    "flops_per_token_train",
    "val_loss",
    "val_ppl",
    "val_ppl_int4",
    "int4_ppl_increase",
    "tokens_per_s",
    "wall_s",
    "tokens_trained",
)


def user_attrs(rows: list[Mapping[str, Any]]) -> dict[str, Any]:
    """What a person wants beside a trial's values in optuna-dashboard or trials_dataframe():
    the candidate, its counts and costs, its measurements (mean over ok seeds), status, seeds,
    the Parquet files, and the error line of a trial that has no ok row."""
    if not rows:
        return {}
    ok = [r for r in rows if r.get("status") == "ok"] or rows
    first = ok[0]
    out: dict[str, Any] = {}
    for key in ATTRS:
        vals = [r.get(key) for r in ok if _present(r.get(key))]
        if vals:
            out[key] = statistics.fmean(vals) if isinstance(vals[0], float) else vals[0]
    spec = json.loads(first["spec"]) if first.get("spec") else None
    if spec and (label := variant(spec)):
        out["variant"] = label
    statuses = sorted({r["status"] for r in rows})
    out["status"] = statuses[0] if len(statuses) == 1 else ",".join(statuses)
    out["seeds"] = sorted(int(r["seed"]) for r in rows if _present(r.get("seed")))
    out["rows"] = sorted(row_name(r["trial_id"], r.get("attempt")) for r in rows)
    errors = [r["error"] for r in rows if r.get("error")]
    if errors and not any(r.get("status") == "ok" for r in rows):
        out["error"] = errors[-1].splitlines()[0][:300]
    return out


def _present(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def upload_checkpoint(ctx: TrialContext, trial_id: str) -> None:
    """For results on a URI: copy the weights a trial saved locally to <study>/_checkpoints/."""
    local = ctx.checkpoint_dir(trial_id)
    if local is None or not is_uri(ctx.study_dir) or not local.is_dir():
        return

    import pyarrow.fs as pafs

    fs, remote = resolve(join(ctx.study_dir, "_checkpoints", trial_id))
    pafs.copy_files(
        str(local), remote, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs
    )
    shutil.rmtree(local, ignore_errors=True)


def best_row(ok, objective: str, direction: str, count: str) -> dict[str, Any] | None:
    """The ok row best at the study's first declared objective (read from its column under the
    budget's count rule), with that objective's name and value; None when no row has it."""
    import pandas as pd

    column = metric(objective).column_for(count)
    values = pd.to_numeric(ok[column], errors="coerce") if column in ok else pd.Series(dtype=float)
    if values.isna().all():
        return None
    row = ok.loc[values.idxmin() if direction == "min" else values.idxmax()]
    keep = ("trial_id", "family", "structure", "params_total", "val_loss", "val_ppl")
    return {
        **{k: row.get(k) for k in keep},
        "objective": objective,
        "value": float(values[row.name]),
    }
