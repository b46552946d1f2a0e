"""The Ray Tune callback of a search: it tells the live view what happened, writes the row of a
trial that ended without writing its own (stopped early by ASHA: `pruned`; its worker died after
every retry: `failed`), frees the workers' placement group a stopped trial of several workers
leaves reserved, tells the progress board which trials have ended (a trial whose runs are Ray
tasks cancels those still training: search/dispatch.py), and decides when the whole search must
stop (`StopAll`):

- the results disk is full (a trial or this callback could not write a row): stop scheduling,
  keep what is written, tell the user how to resume;
- no trial has started for `pending_timeout_s` while trials wait, or, with every run its own
  task (search/dispatch.py), no run has started while runs wait: the cluster cannot hold one (a
  node was lost, or something else holds what a run asks for): say what is free, never hang.

Each decision is a `Halt` (search/halt.py), the first one kept. On each step it also refreshes
this driver's entry in the study's registry (search/roster.py)."""

from __future__ import annotations

import math
import time

from ray.tune import Callback
from ray.tune.stopper import Stopper

from benchmark.search import rows
from benchmark.search.context import TrialContext
from benchmark.search.halt import Halt
from benchmark.search.live import LiveView
from benchmark.search.ray_session import free_resources
from benchmark.store import StoreFull
from benchmark.trial import release_workers


class SearchCallback(Callback):
    def __init__(
        self,
        view: LiveView,
        ctx: TrialContext,
        pending_timeout_s: float | None = None,
        asks: str = "",
        searcher=None,
        poll=None,
        beat=None,
    ):
        self.view, self.ctx, self.searcher, self.poll, self.beat = view, ctx, searcher, poll, beat
        self.metric = view.metric
        self.pending_timeout_s, self.asks = pending_timeout_s, asks
        self.halt: Halt | None = None
        self._progress = time.monotonic()
        self.runs = {"asked": 0, "started": 0}  # run tasks waiting, training (progress.Board)

    def stop(self, halt: Halt) -> None:
        """Ask the search to stop; the first reason given is the one reported."""
        self.halt = self.halt or halt

    def on_step_begin(self, iteration, trials, **info):
        if self.beat is not None:
            self.beat()
        if self.poll is not None and (state := self.poll()):
            self.view.progress(state["progress"])
            self.runs = state["runs"]
        what = self._waiting([t.status for t in trials])
        if what is None or self.pending_timeout_s is None:
            self._progress = time.monotonic()
            return
        waited = time.monotonic() - self._progress
        if waited > self.pending_timeout_s and self.halt is None:
            self.stop(
                Halt(
                    "resources",
                    f"no {what} has started for {waited:.0f} s: each asks for {self.asks}, "
                    f"and the cluster has {free_resources()}. Lower --cpus-per-trial / "
                    "--gpus-per-trial, or add a node that has them",
                )
            )

    def _waiting(self, statuses: list[str]) -> str | None:
        """What waits with none of its kind running: "trial", "run" (a run task, whose trial holds
        no resources and so is always running), or None."""
        if "PENDING" in statuses and "RUNNING" not in statuses:
            return "trial"
        if self.runs["asked"] and not self.runs["started"]:
            return "run"
        return None

    def on_trial_start(self, iteration, trials, trial, **info):
        self.view.trial_started(trial.trial_id)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        value = result.get(self.metric)
        if value is not None and math.isfinite(value):
            spec = trial.config.get("spec") or {}
            self.view.trial_result(
                value, f"{trial.config.get('family')} {spec.get('d_model', '')}d"
            )

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._done(trial, error=False)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._done(trial, error=True)

    def on_trial_recover(self, iteration, trials, trial, **info):
        self._release(trial)

    def _release(self, trial) -> None:
        """A trial of several workers: its Train job's placement group, left reserved when the
        trial's actor was stopped or died with the job's controller (trial/distributed.py)."""
        if self.ctx.workers is not None:
            release_workers(trial.trial_id)

    def _done(self, trial, error: bool) -> None:
        self._release(trial)
        if self.ctx.progress is not None:  # its runs' tasks, if any still train, are cancelled
            self.ctx.progress.stop.remote(int(trial.config["optuna_trial"]))
        last = trial.last_result or {}
        self.view.forget(
            f"t{int(trial.config['optuna_trial']):04d}"
        )  # its rows' names (TrialContext.trial_id)
        if last.get("store_full"):
            self.stop(Halt("store_full", last["store_full"]))
        if last.get("row_written"):
            self.view.trial_done(
                trial.trial_id, last.get("status", "ok"), float(last.get("trial_wall_s") or 0.0)
            )
            return
        status = "failed" if error else "pruned"
        number = int(trial.config["optuna_trial"])
        try:
            if not (
                status == "failed" and rows.trial_rows(self.ctx.study_dir, number)
            ):  # else: written by the trial
                reason = (
                    None
                    if status == "pruned"
                    else str(getattr(trial, "error_msg", None) or "the trial's worker died")
                )
                rows.write(self.ctx, rows.unfinished(self.ctx, trial.config, last, status, reason))
        except StoreFull as e:
            self.stop(Halt("store_full", str(e)))
        self.view.trial_done(trial.trial_id, status, None)


class StopAll(Stopper):
    """Stops every trial once the callback says the search must stop."""

    def __init__(self, callback: SearchCallback):
        self.callback = callback

    def __call__(self, trial_id, result) -> bool:
        return False

    def stop_all(self) -> bool:
        searcher = self.callback.searcher
        if searcher is not None and searcher.halt:
            self.callback.stop(searcher.halt)  # the study's database is full, or did not answer
        return self.callback.halt is not None
