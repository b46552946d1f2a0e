"""Ray Tune's OptunaSearch, extended so that every finished trial carries its Parquet row as
Optuna user attributes: what optuna-dashboard, `load_study` and `trials_dataframe()` show beside
the values. Attributes are set before the trial is told, as Optuna freezes a finished trial.

A trial that ended `failed` or `infeasible` (the trainable reports NaN values) is told as FAIL.
One that ended because the results disk is full is not told at all: it stays RUNNING, and the
next `--resume` closes it from its row once the row is recovered (resume.close_running).

A trial's intermediate values (its first final seed's evaluations) are reported at the tokens
trained, as ASHA's rungs count (driver.py): a trial Tune runs again after a lost worker continues
its run from a save and reports from there, where Tune's own count (`training_iteration`, which
OptunaSearch reports at) starts again at 1 and Optuna would ignore the later evaluations as steps
already reported.

Each trial it asks names this driver (user attribute `driver`), and it asks none once the study's
`trials:` are taken by every driver running the study together (optuna_study.Quota): then it tells
Tune the search is finished.

A call to the study rides through its database being away for a moment (search/storage.py); one
that fails for the whole wait, finds the study's disk full or finds a trial it wrote gone (the
database replaced under the search), stops the search (`halt`), keeping
every row: the trial it was telling stays RUNNING, and `--resume` tells it from its rows."""

from __future__ import annotations

from typing import Any

from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from benchmark.search import rows
from benchmark.search.context import TrialContext
from benchmark.search.halt import Halt
from benchmark.search.optuna_study import DRIVER, Quota
from benchmark.search.storage import StorageUnavailable, record_lost, shown
from benchmark.store import disk_full

NOT_TOLD = "store_full"
FAILED = ("failed", "infeasible", "diverged")


class AttributedSearch(OptunaSearch):
    def __init__(
        self, *args, ctx: TrialContext, driver: str = "", quota: Quota | None = None, **kwargs
    ):
        super().__init__(*args, **kwargs)
        self._ctx, self._driver, self._quota = ctx, driver, quota
        self.halt: Halt | None = None  # the study's database is full or gone: the search stops
        self.asked: list[int] = []  # the Optuna trial numbers this driver asked
        self._reported: dict[str, int] = {}  # a trial's last intermediate value's tokens

    def suggest(self, trial_id: str):
        if self.halt:
            return None
        try:
            if self._quota is not None and self._quota.reached(self._ot_study):
                return Searcher.FINISHED
            config = super().suggest(trial_id)
            return self._own(trial_id, config)
        except Exception as e:
            return self._stop(e)

    def _own(self, trial_id: str, config):
        ot_trial = self._ot_trials[trial_id]
        if self._quota is not None and self._quota.surplus(self._ot_study, ot_trial.number):
            from optuna.trial import TrialState

            del self._ot_trials[trial_id]  # another driver asked the last one first: never trained
            ot_trial.set_user_attr("status", "surplus")
            self._ot_study.tell(ot_trial, state=TrialState.FAIL)
            return Searcher.FINISHED
        ot_trial.set_user_attr(DRIVER, self._driver)
        self.asked.append(ot_trial.number)
        return config

    def on_trial_result(self, trial_id: str, result: dict[str, Any]):
        if self.halt:  # the search is stopping: a database away would make each point wait again
            return None
        # A curve point reported for TensorBoard or MLflow (trainable.curve_reports) has no objective.
        if isinstance(self.metric, str) and self.metric not in result:
            return None
        if (
            isinstance(self.metric, list)
            or trial_id not in self._ot_trials
            or trial_id in self._completed_trials
        ):
            return super().on_trial_result(trial_id, result)  # nothing, or its warning
        step = int(result.get("tokens") or 0)
        if step > self._reported.get(trial_id, 0):
            try:
                self._ot_trials[trial_id].report(result[self.metric], step)
            except Exception as e:
                return self._stop(e)
            self._reported[trial_id] = step
        return None

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ):
        try:
            return self._complete(trial_id, result, error)
        except Exception as e:
            self._completed_trials.add(
                trial_id
            )  # its row is written; --resume tells Optuna from it
            return self._stop(e)

    def _stop(self, error: Exception) -> None:
        if isinstance(error, StorageUnavailable):
            self.halt = self.halt or Halt("storage", str(error))
        elif record_lost(error):
            self.halt = self.halt or Halt(
                "storage",
                f"the study's database {shown(self._storage.url)} no longer holds "
                f"study {self._ot_study.study_name!r} as this search wrote it (Optuna: {error.args[0]}): "
                "it was replaced while the search ran (a file copied or checked out over it, an "
                "older copy restored) or the study deleted; finished rows are kept. Put back the "
                "database this search wrote (an older copy gives out trial numbers its rows "
                "already hold)",
            )
        elif disk_full(error):
            self.halt = self.halt or Halt(
                "store_full",
                f"{self._ctx.study_dir}: the disk is full (the Optuna study could not be written)",
            )
        else:
            raise error

    def _complete(self, trial_id: str, result: dict[str, Any] | None, error: bool):
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is None or trial_id in self._completed_trials:
            return super().on_trial_complete(trial_id, result, error)
        status = (result or {}).get("status")
        if status == NOT_TOLD:
            self._completed_trials.add(trial_id)
            return None
        try:
            attrs = rows.user_attrs(
                rows.trial_rows(
                    self._ctx.study_dir,
                    ot_trial.number,
                    ot_trial.user_attrs.get(rows.CONTINUES) or (),
                )
            )
        except Exception:  # noqa: BLE001  (a damaged row must not stop the search; resume sets it aside)
            attrs = {}
        if not attrs:  # stopped by ASHA, or its worker died: the Tune callback writes its row
            attrs = {
                "status": "failed" if error else "pruned",
                **({"tokens_trained": result["tokens"]} if result and "tokens" in result else {}),
            }
        for key, value in attrs.items():
            ot_trial.set_user_attr(key, value)
        if status in FAILED:
            return super().on_trial_complete(trial_id, None, error=True)
        return super().on_trial_complete(trial_id, result, error)


def make_searcher(
    sample,
    ctx: TrialContext,
    sampler,
    modes: list[str],
    storage,
    driver: str = "",
    quota: Quota | None = None,
) -> AttributedSearch:
    names = list(ctx.objectives)
    return AttributedSearch(
        space=sample,
        metric=names if len(names) > 1 else names[0],
        mode=modes if len(modes) > 1 else modes[0],
        sampler=sampler,
        study_name=ctx.study,
        storage=storage,
        ctx=ctx,
        driver=driver,
        quota=quota,
    )
