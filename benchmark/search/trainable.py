"""The function Ray Tune runs in a worker for each sampled candidate: train it for every seed
(with bounded retries), write one row per attempt, report every searchable metric to Tune.

It reports the intermediate metrics of the registry at each evaluation (ASHA's rungs), and at the
end the mean over ok seeds of every searchable metric, so any objective a space may declare is in
the result Tune hands to Optuna.

A trial that ran and failed (every seed failed, or the point is infeasible) ends normally with
status `failed`/`infeasible` and NaN metrics; the searcher tells Optuna it failed. So an exception
out of this function means the worker or its node was lost, and Tune runs the trial again
elsewhere (RunConfig's FailureConfig), where it rewrites the same row files: recorded once.
A trial of several workers (ctx.workers) runs each seed as a Ray Train job (trial/distributed.py):
rank 0 reports its evaluations here through Train's TuneReportCallback and returns the row; a
worker lost mid-run raises out of this function as a lost node does, and the trial run again
continues the run from its last save (trial/runstate.py), as a run in one process does.
A full results disk ends the trial with `store_full`, and the driver stops the search."""

from __future__ import annotations

import math
from typing import Any

from benchmark.arch import ArchSpec, count_params
from benchmark.data import prepare
from benchmark.search import dispatch, reuse, rows, tuning
from benchmark.search.context import TrialContext
from benchmark.search.progress import reporter
from benchmark.store import StoreFull, location, metrics, write_curve
from benchmark.store.curves import KEY as CURVE
from benchmark.store.curves import curves_dir
from benchmark.store.results import row_name
from benchmark.trial import lost_worker, run_distributed

INTERMEDIATE = tuple(m.name for m in metrics.METRICS if m.intermediate)
NO_VALUES = {name: math.nan for name in metrics.SEARCHABLE}


def trainable(config: dict[str, Any], ctx: TrialContext) -> None:
    import ray
    import torch
    from ray import tune

    torch.set_num_threads(max(1, ctx.threads))
    config = {**config, "node_id": ray.get_runtime_context().get_node_id()}
    try:
        final = _trial(config, ctx, tune)
    except StoreFull as e:  # the row is in the fallback folder if there was room there
        final = {**NO_VALUES, "status": "store_full", "store_full": str(e)}
    tune.report({"tokens": 0, "row_written": True, "trial_wall_s": 0.0, **final})


def _trial(config: dict[str, Any], ctx: TrialContext, tune) -> dict[str, Any]:
    number = int(config["optuna_trial"])
    if "infeasible" in config:  # the sampled point has no candidate within the budget
        rows.write(ctx, rows.infeasible(ctx, config))
        return {**NO_VALUES, "status": "infeasible", "error": config["infeasible"]}
    setting = None
    train_all, runs = _trainer(config, ctx, tune)
    if ctx.tune is not None:  # the candidate's grid first, on its tuning seeds (search/tuning.py)
        setting = tuning.settle_batches(
            config, ctx, number, lambda todo: train_all([(*run, tuning.TUNE) for run in todo])
        )
        if setting is None:
            return _untuned(config, ctx, number)
    # A seed with its final row is not trained again: one of the trials this one continues finished
    # it (resume.continue_unfinished), or this trial's own earlier run did (Tune's retry after a lost node).
    earlier = rows.finished_seeds(
        rows.trial_rows(ctx.study_dir, number, config.get(rows.CONTINUES) or ()), ctx.retries
    )
    todo = [s for s in ctx.seed_list() if s not in earlier]
    jobs = [(ctx.trial_id(number, s), s, setting, tuning.FINAL) for s in todo]
    trained = dict(zip(todo, train_all(jobs, asha=True)))
    written = [earlier[s] if s in earlier else trained[s] for s in ctx.seed_list()]
    # the time inside the trial, its tuning runs' included: the driver's span less this is its own
    wall = sum(r.get("wall_s") or 0 for r in runs if reuse.REUSED not in r)
    if not any(r["status"] == "ok" for r in written):  # Optuna has no value: the trial ends as FAIL
        return {
            **NO_VALUES,
            "status": written[-1]["status"],
            "error": written[-1]["error"],
            "trial_wall_s": wall,
        }
    lost = [r for r in written if r["status"] == "diverged"]
    if lost and ctx.diverged == "fail":  # the space says a diverged seed fails its candidate
        return {
            **NO_VALUES,
            "status": "diverged",
            "error": f"{len(lost)} of {len(written)} seeds diverged ({lost[0]['error']})",
            "trial_wall_s": wall,
        }
    vocab = (config.get("spec") or {}).get("vocab_size")
    final = dict(
        zip(metrics.SEARCHABLE, rows.values(written, metrics.SEARCHABLE, ctx.count, vocab))
    )
    return {
        **final,
        "tokens": max(r.get("tokens_trained") or 0 for r in written),
        "status": "ok",
        "trial_wall_s": wall,
    }


def _trainer(config, ctx: TrialContext, tune):
    """(train_all, runs): `train_all(jobs)` trains runs ((trial id, seed, setting, phase) each) and
    returns their rows in order, side by side as Ray tasks when ctx.run_resources says so
    (search/dispatch.py), else here one after another; the first of a batch `asha` reports its
    evaluations to Tune (ASHA's rungs, Optuna's intermediate values) either way; `runs`
    collects every row trained."""
    runs: list[dict[str, Any]] = []
    data = prepare(ctx.data) if ctx.run_resources is None else None

    def train_all(jobs: list[tuple], asha: bool = False) -> list[dict[str, Any]]:
        rungs = asha and ctx.training.get("eval_every")
        if ctx.run_resources is not None:
            report = _intermediate_report(tune) if rungs else None
            out = dispatch.run_all(run_task, config, ctx, jobs, report)
        else:
            out = []
            for k, (trial_id, seed, setting, phase) in enumerate(jobs):
                report = _intermediate_report(tune) if rungs and k == 0 else None
                args = (config, ctx, trial_id, seed, data, report, setting)
                out.append(attempts(*args) if phase == tuning.FINAL else attempts(*args, phase))
        runs.extend(out)
        return out

    return train_all, runs


def run_task(
    config: dict[str, Any], ctx: TrialContext, job: tuple, posts: bool = False
) -> dict[str, Any]:
    """One run in a Ray task (search/dispatch.py): its row, written where the study lives.
    `posts`: its evaluations go to its trial, which reports them to Tune."""
    import ray
    import torch

    torch.set_num_threads(max(1, ctx.threads))
    config = {**config, "node_id": ray.get_runtime_context().get_node_id()}
    trial_id, seed, setting, phase = job
    dispatch.stage(ctx, trial_id, "started")
    first = dispatch.together_fault(ctx, trial_id, phase == tuning.FINAL)
    data = prepare(ctx.data)
    report = dispatch.post_evaluations(ctx, trial_id) if posts else None
    row = attempts(config, ctx, trial_id, seed, data, report, setting, phase, first_step=first)
    if report is not None:
        report.flush()
    return row


def intermediate(record: dict[str, Any]) -> dict[str, Any]:
    """What Tune receives at a periodic evaluation (ASHA's rung, Optuna's intermediate value)."""
    return {
        "tokens": record["tokens"],
        **{n: record[n] for n in INTERMEDIATE},
        "row_written": False,
    }


def _intermediate_report(tune):
    def report(record: dict[str, Any]) -> None:
        tune.report(intermediate(record))

    return report


def attempts(
    config,
    ctx: TrialContext,
    trial_id: str,
    seed: int,
    data,
    report,
    setting=None,
    phase: str = tuning.FINAL,
    first_step=None,
) -> dict[str, Any]:
    """Run one seed of a trial with bounded retries; every attempt leaves a row. `setting`: the
    training settings a `tune:` grid sets (a tuning run's point, or the candidate's choice);
    `first_step()`: called once, after the run's first step (a test's fault: dispatch.py)."""
    # torch loads in the worker that trains, not in the driver that hands Ray this module.
    from benchmark.trial.run import run_trial
    from benchmark.trial.runstate import DEFAULT_EVERY, RunState, parse_every, parse_limit

    cfg = ctx.train_config(seed, setting, config.get("budget"))
    # a run saves and continues its state, in one process or on a Train job's ranks
    every = parse_every(ctx.checkpoint_every or DEFAULT_EVERY)
    watch, limit_s = parse_limit(ctx.step_timeout)
    state = RunState(ctx.state_dir(), config["spec"], cfg, every, watch, limit_s, name=trial_id)
    if (row := reuse.taken(ctx, config, trial_id, cfg, data)) is not None:  # --reuse-runs
        row.update(tuning.columns(ctx, setting, phase))
        rows.write(ctx, row)
        _row_written(ctx, state, trial_id, row, 0)  # a state it saved part-way is done with too
        return row
    on_step = _after_first(reporter(ctx.progress, trial_id, cfg.tokens_per_step), first_step)
    on_point, on_eval = curve_reports(ctx, trial_id, report, _steps(config, cfg))
    for attempt in range(ctx.retries + 1):
        started = rows.now()
        # the curve so far, beside the rows, at each save (by rank 0 of a Train job)
        state.on_save = _live_curve(ctx, state, trial_id, seed, phase, attempt)
        try:
            if ctx.workers is None:
                measured = run_trial(
                    config["spec"],
                    cfg,
                    data=data,
                    on_eval=on_eval,
                    on_step=on_step,
                    quantize=ctx.quantize_config(),
                    checkpoint_dir=ctx.checkpoint_dir(trial_id),
                    on_point=on_point,
                    state=state,
                )
            else:
                measured = _distributed(
                    config, ctx, cfg, trial_id, on_step, report is not None, state
                )
            row = rows.measured(ctx, config, trial_id, measured, attempt)
        except Exception as e:  # recorded, then retried: a search never dies with one candidate
            if ctx.workers is not None and _lost_worker(e):
                raise  # into Tune's retry of the whole trial, as a lost node
            row = rows.failed(ctx, config, trial_id, seed, e, started, attempt)
        row.update(tuning.columns(ctx, setting, phase))
        rows.write(ctx, row)
        _row_written(ctx, state, trial_id, row, attempt)
        if row["status"] != "failed":
            return row
    return row


def _row_written(ctx: TrialContext, state, trial_id: str, row, attempt: int) -> None:
    """After a run's row: a run continued under a new trial's name that ends before its next save
    removes the curve it left under the old name (as a save would: _live_curve); its weights go
    where the study lives; once its row is final, its saved state is removed (unless
    --keep-checkpoints): the run never trains again."""
    try:
        if location.exists(state.name_path):
            _forget_old_curve(ctx, state, row_name(trial_id, attempt))
    except OSError:  # the row is written; a stale curve beside it is not worth the run
        pass
    if ctx.checkpoints and row["status"] == "ok" and reuse.REUSED not in row:
        rows.upload_checkpoint(ctx, trial_id)
    final = row["status"] != "failed" or attempt == ctx.retries
    if final and not ctx.keep_checkpoints:
        state.remove()


def _after_first(on_step, first):
    """run_trial's on_step: `on_step`'s, and `first()` once, after the first step."""
    if first is None:
        return on_step
    todo = [first]

    def both(step: int, total: int, loss: float) -> None:
        if todo:
            todo.pop()()
        if on_step is not None:
            on_step(step, total, loss)

    return both


def _forget_old_curve(ctx: TrialContext, state, name: str) -> None:
    """Names the run's curve `name` in its saved state; removes the curve an earlier, stopped
    attempt left under another name (a trial numbered anew on resume)."""
    if before := state.rename(name):
        old = location.join(curves_dir(ctx.study_dir), before)
        if location.exists(old):
            location.remove(old)


def _live_curve(ctx: TrialContext, state, trial_id: str, seed: int, phase: str, attempt: int):
    """Writes a run's curve so far where its finished curve will be (`<study>/_curves/`, the row
    file's name), so that `pd.read_parquet("<study>/_curves")` shows runs in flight too; the
    run's end writes it whole. A run continued under another trial's name (a trial numbered anew
    on resume) removes the curve it left under the old one. No phase column without `tune:`."""
    name = row_name(trial_id, attempt)
    keys = {"study": ctx.study, "trial_id": trial_id, "attempt": attempt, "seed": seed}
    keys.update(tuning.columns(ctx, None, phase) if ctx.tune is not None else {})

    def write(step: int, record: dict[str, Any]) -> None:
        row = {**keys, CURVE: record["curve"]["points"]}
        try:
            write_curve(ctx.study_dir, row, name)
            _forget_old_curve(ctx, state, name)
        except OSError:  # a view while it trains: the run's end writes the curve (or says why not)
            pass

    return write


def _steps(config, cfg) -> int:
    return cfg.steps(count_params(ArchSpec.from_dict(config["spec"])))  # cfg's tokens resolved


LOGGED_POINTS = 50  # curve points per run reported to Tune's loggers (the store keeps every point)


def curve_reports(ctx: TrialContext, trial_id: str, report, total: int):
    """With --tensorboard or --mlflow (ctx.report_curves): points of the curve (about LOGGED_POINTS
    of a `total`-step run: each report waits for the driver, which writes MLflow's metrics one by
    one) and every evaluation, reported to Tune under `curve/<trial_id>/...` at their steps, for
    Tune's logger callbacks (search/loggers.py); ASHA and Optuna skip these reports, which lack the
    objective. Returns (on_point, on_eval)."""
    if not ctx.report_curves:
        return None, report
    from ray import tune

    every, last = max(1, -(-total // LOGGED_POINTS)), [0]

    def on_point(point: dict[str, Any]) -> None:
        step = point["step"]
        if step // every > last[0] // every or step >= total:
            last[0] = step
            tune.report(
                {
                    "timesteps_total": step,
                    "curve": {trial_id: {k: v for k, v in point.items() if k != "step"}},
                }
            )

    def on_eval(record: dict[str, Any] | None) -> None:
        if report is not None:
            report(record)
        if record is not None:
            tune.report(
                {
                    "timesteps_total": record["step"],
                    "curve": {trial_id: {"val_loss": record["val_loss"]}},
                }
            )

    return on_point, on_eval


def _untuned(config, ctx: TrialContext, number: int) -> dict[str, Any]:
    """No point of the grid trained to a finite metric on every tuning seed: each final seed
    without a row gets a failed one (on its last attempt: not retried), and Optuna a failed trial."""
    error = (
        f"tune: no point of the grid trained to a finite {ctx.tune.metric} on every tuning seed "
        f"({ctx.tune.runs} runs; their rows: {tuning.trial_id(number, 0, ctx.tune.seeds[0])}, ...)"
    )
    have = rows.finished_seeds(
        rows.trial_rows(ctx.study_dir, number, config.get(rows.CONTINUES) or ()), ctx.retries
    )
    for seed in ctx.seed_list():
        if seed not in have:
            row = {
                **rows.failed(
                    ctx,
                    config,
                    ctx.trial_id(number, seed),
                    seed,
                    RuntimeError(error),
                    rows.now(),
                    ctx.retries,
                ),
                "error": error,
                **tuning.columns(ctx, None, tuning.FINAL),
            }
            rows.write(ctx, row)
    return {**NO_VALUES, "status": "failed", "error": error, "trial_wall_s": 0.0}


def _distributed(
    config, ctx: TrialContext, cfg, trial_id: str, on_step, reports: bool, state
) -> dict[str, Any]:
    return run_distributed(
        config["spec"],
        cfg,
        ctx.workers,
        ctx.data,
        name=f"{ctx.study}-{trial_id}",
        quantize=ctx.quantize_config(),
        checkpoint_dir=ctx.checkpoint_dir(trial_id),
        on_step=on_step,
        report=intermediate if reports else None,
        state=state,
    )


def _lost_worker(error: BaseException) -> bool:
    return lost_worker(error)
