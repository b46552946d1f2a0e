"""Ray Tune's OptunaSearch, extended so that every finished trial carries its Parquet row as
Optuna user attributes: what optuna-dashboard, `load_study` and `trials_dataframe()` show beside
the values. Attributes are set before the trial is told, as Optuna freezes a finished trial."""

from __future__ import annotations

from typing import Any

from ray.tune.search.optuna import OptunaSearch

from benchmark.search import rows
from benchmark.search.context import TrialContext


class AttributedSearch(OptunaSearch):
    def __init__(self, *args, ctx: TrialContext, **kwargs):
        super().__init__(*args, **kwargs)
        self._ctx = ctx

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False):
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is not None and trial_id not in self._completed_trials:
            attrs = rows.user_attrs(rows.trial_rows(self._ctx.study_dir, ot_trial.number))
            if not attrs:  # stopped by ASHA, or its worker died: the Tune callback writes its row
                attrs = {"status": "failed" if error else "pruned",
                         **({"tokens_trained": result["tokens"]} if result and "tokens" in result else {})}
            for key, value in attrs.items():
                ot_trial.set_user_attr(key, value)
        super().on_trial_complete(trial_id, result, error)


def make_searcher(sample, ctx: TrialContext, sampler, modes: list[str], storage) -> AttributedSearch:
    names = list(ctx.objectives)
    return AttributedSearch(space=sample, metric=names if len(names) > 1 else names[0],
                            mode=modes if len(modes) > 1 else modes[0], sampler=sampler,
                            study_name=ctx.study, storage=storage, ctx=ctx)
