"""The function Ray Tune runs in a worker for each sampled candidate: train it for every seed
(with bounded retries), write one row per attempt, report every searchable metric to Tune.

It reports the intermediate metrics of the registry at each evaluation (ASHA's rungs), and at the
end the mean over ok seeds of every searchable metric, so any objective a space may declare is in
the result Tune hands to Optuna."""

from __future__ import annotations

from typing import Any

from benchmark.search import rows
from benchmark.search.context import TrialContext
from benchmark.store import metrics

INTERMEDIATE = tuple(m.name for m in metrics.METRICS if m.intermediate)


def trainable(config: dict[str, Any], ctx: TrialContext) -> None:
    import torch
    from ray import tune

    from benchmark.data import prepare

    torch.set_num_threads(max(1, ctx.threads))
    number = int(config["optuna_trial"])
    if "infeasible" in config:  # the sampled point has no candidate within the budget
        rows.write(ctx, rows.infeasible(ctx, config))
        raise RuntimeError(config["infeasible"])
    data = prepare(ctx.data)
    written = []
    for k, seed in enumerate(ctx.seed_list()):
        report = _intermediate_report(tune) if k == 0 else None
        written.append(attempts(config, ctx, ctx.trial_id(number, seed), seed, data, report))
    if not any(r["status"] == "ok" for r in written):  # Optuna has no value: the trial ends as FAIL
        raise RuntimeError(f"trial {number}: {written[-1]['status']}: {written[-1]['error']}")
    final = dict(zip(metrics.SEARCHABLE, rows.values(written, metrics.SEARCHABLE, ctx.count)))
    tune.report({**final, "tokens": max(r.get("tokens_trained") or 0 for r in written), "row_written": True,
                 "status": "ok", "trial_wall_s": sum(r.get("wall_s") or 0 for r in written)})


def _intermediate_report(tune):
    def report(record: dict[str, Any]) -> None:
        tune.report({"tokens": record["tokens"], **{n: record[n] for n in INTERMEDIATE}, "row_written": False})
    return report


def attempts(config, ctx: TrialContext, trial_id: str, seed: int, data, report) -> dict[str, Any]:
    """Run one seed of a trial with bounded retries; every attempt leaves a row."""
    from benchmark.trial.run import run_trial

    cfg = ctx.train_config(seed)
    for attempt in range(ctx.retries + 1):
        started = rows.now()
        try:
            row = rows.measured(ctx, config, trial_id, run_trial(config["spec"], cfg, data=data, on_eval=report,
                                                                 checkpoint_dir=ctx.checkpoint_dir(trial_id)), attempt)
        except Exception as e:  # recorded, then retried: a search never dies with one candidate
            row = rows.failed(ctx, config, trial_id, seed, e, started, attempt)
        rows.write(ctx, row)
        if row["status"] != "failed":
            return row
    return row
