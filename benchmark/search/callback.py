"""The Ray Tune callback of a search: it tells the live view what happened, writes the row of a
trial that ended without writing its own (stopped early by ASHA: `pruned`; its worker died after
every retry: `failed`), and decides when the whole search must stop (`Halt`):

- the results disk is full (a trial or this callback could not write a row): stop scheduling,
  keep what is written, tell the user how to resume (issue 18);
- no trial has started for `pending_timeout_s` while trials wait: the cluster cannot hold one (a
  node was lost, or resources were asked that no node has): say which (issue 11), never hang."""

from __future__ import annotations

import math
import time

from ray.tune import Callback
from ray.tune.stopper import Stopper

from benchmark.search import rows
from benchmark.search.context import TrialContext
from benchmark.search.live import LiveView
from benchmark.store.results import StoreFull


class SearchCallback(Callback):
    def __init__(self, view: LiveView, ctx: TrialContext, pending_timeout_s: float | None = None,
                 asks: str = "", searcher=None, poll=None):
        self.view, self.ctx, self.searcher, self.poll = view, ctx, searcher, poll
        self.metric = view.metric
        self.pending_timeout_s, self.asks = pending_timeout_s, asks
        self.halt: tuple[str, str] | None = None   # (kind, message): "store_full" or "resources"
        self._progress = time.monotonic()

    def on_step_begin(self, iteration, trials, **info):
        if self.poll is not None and (state := self.poll()):
            self.view.progress(state)
        statuses = [t.status for t in trials]
        if "RUNNING" in statuses or "PENDING" not in statuses or self.pending_timeout_s is None:
            self._progress = time.monotonic()
            return
        waited = time.monotonic() - self._progress
        if waited > self.pending_timeout_s and self.halt is None:
            from benchmark.search.ray_session import free_resources

            self.halt = ("resources", f"no trial has started for {waited:.0f} s: each asks for {self.asks}, "
                                      f"and the cluster has {free_resources()}. Lower --cpus-per-trial / "
                                      "--gpus-per-trial, or add a node that has them")

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
        self.view.forget(f"t{int(trial.config['optuna_trial']):04d}")  # its rows' names (TrialContext.trial_id)
        if last.get("store_full"):
            self.halt = self.halt or ("store_full", last["store_full"])
        if last.get("row_written"):
            self.view.trial_done(trial.trial_id, last.get("status", "ok"), float(last.get("trial_wall_s") or 0.0))
            return
        status = "failed" if error else "pruned"
        number = int(trial.config["optuna_trial"])
        try:
            if not (status == "failed" and rows.trial_rows(self.ctx.study_dir, number)):  # else: written by the trial
                reason = None if status == "pruned" else str(getattr(trial, "error_msg", None) or "the trial's worker died")
                rows.write(self.ctx, rows.unfinished(self.ctx, trial.config, last, status, reason))
        except StoreFull as e:
            self.halt = self.halt or ("store_full", str(e))
        self.view.trial_done(trial.trial_id, status, None)


class Halt(Stopper):
    """Stops every trial once the callback says the search must stop."""

    def __init__(self, callback: SearchCallback):
        self.callback = callback

    def __call__(self, trial_id, result) -> bool:
        return False

    def stop_all(self) -> bool:
        searcher = self.callback.searcher
        if self.callback.halt is None and searcher is not None and searcher.full:
            self.callback.halt = ("store_full", searcher.full)  # the study database could not be written
        return self.callback.halt is not None
