"""The Ray Tune callback of a search: it tells the live view what happened and writes the row of a
trial that ended without writing its own (stopped early by ASHA: `pruned`; its worker died:
`failed`)."""

from __future__ import annotations

import math

from ray.tune import Callback

from benchmark.search import rows
from benchmark.search.context import TrialContext
from benchmark.search.live import LiveView


class SearchCallback(Callback):
    def __init__(self, view: LiveView, ctx: TrialContext):
        self.view, self.ctx = view, ctx
        self.metric = view.metric

    def on_trial_start(self, iteration, trials, trial, **info):
        self.view.trial_started(trial.trial_id)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        value = result.get(self.metric)
        if value is not None and math.isfinite(value):
            spec = trial.config.get("spec") or {}
            self.view.trial_result(value, f"{trial.config.get('family')} {spec.get('d_model', '')}d")

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._done(trial, error=False)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._done(trial, error=True)

    def _done(self, trial, error: bool) -> None:
        last = trial.last_result or {}
        if last.get("row_written"):
            self.view.trial_done(trial.trial_id, last.get("status", "ok"), float(last.get("trial_wall_s") or 0.0))
            return
        status = "failed" if error else "pruned"
        number = int(trial.config["optuna_trial"])
        if not (status == "failed" and rows.trial_rows(self.ctx.study_dir, number)):  # else: written by the trial
            reason = None if status == "pruned" else str(getattr(trial, "error_msg", None) or "the trial's worker died")
            rows.write(self.ctx, rows.unfinished(self.ctx, trial.config, last, status, reason))
        self.view.trial_done(trial.trial_id, status, None)

