"""The Optuna side of a search: the persisted study (named metrics, the space's declaration as
study attributes, each trial's row as trial attributes), the sampler, and closing what a killed
driver left RUNNING.

Sampler (`--sampler`, default `auto`): Optuna's sampler guide, as its AutoSampler decides for
studies of the size these are: below 250 trials, TPE (multivariate, grouped for conditional axes,
with a constant liar when trials run in parallel) when the space has categorical or conditional
axes, the Gaussian-process sampler when every axis is numeric; from 250 trials, NSGA-II for several
objectives. (NSGA-II's populations are meant for hundreds to thousands of trials.) The choice is
recorded in the study and a resumed study keeps it; the sampler is re-seeded with the number of
trials already told, as a restored sampler's random state is not in the storage (Optuna #3992)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from benchmark.search import rows
from benchmark.search.context import TrialContext

OPTUNA_DB = "_optuna.db"
SAMPLERS = ("auto", "tpe", "nsga2", "gp", "random")
MANY_TRIALS = 250  # Optuna's guide: beyond this, evolutionary samplers for several objectives


class StudyError(ValueError):
    pass


def storage_url(study_dir: Path) -> str:
    return f"sqlite:///{(Path(study_dir) / OPTUNA_DB).resolve()}"


def resolve_sampler(requested: str | None, recorded: str | None, space, n_objectives: int) -> str:
    """The sampler's name: a resumed study keeps its own; `auto` follows Optuna's guide."""
    if recorded and requested not in (None, recorded):
        raise StudyError(f"this study was run with --sampler {recorded}; resume it with the same sampler "
                         f"(or start a new study with --name)")
    name = recorded or requested or "auto"
    if name != "auto":
        return name
    if space.trials >= MANY_TRIALS:
        return "nsga2" if n_objectives > 1 else "tpe"
    numeric = all(type(a.domain).__name__ in ("IntRange", "FloatRange") and a.when is None for a in space.axes)
    return "gp" if numeric and space.axes else "tpe"


def make_sampler(name: str, seed: int, n_objectives: int, parallel: bool, trials: int):
    import optuna

    with warnings.catch_warnings():  # multivariate/group/constant_liar are marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if name == "tpe":
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=parallel)
        if name == "gp":
            return optuna.samplers.GPSampler(seed=seed)
        if name == "nsga2":
            return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, min(50, trials // 10)))
        if name == "random":
            return optuna.samplers.RandomSampler(seed=seed)
    raise StudyError(f"unknown sampler {name!r}; choose one of {', '.join(SAMPLERS)}")


def open_study(study_dir: Path, name: str, ctx_names: list[str], directions: list[str],
               grid_points: list[dict[str, Any]] = ()):
    """Load or create the persisted study and name its metrics (also on resume, for studies made
    before names existed). A new study of a finite space starts with its points enqueued, so no
    candidate repeats while others are untried."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(storage_url(study_dir))
    study = optuna.create_study(storage=storage, study_name=name, directions=directions, load_if_exists=True)
    if [d.name.lower() for d in study.directions] != directions:
        raise StudyError(f"study {name!r} was created with directions {[d.name.lower() for d in study.directions]}, "
                         f"the space now declares {directions}; start a new study with --name")
    if study.metric_names != ctx_names:
        with warnings.catch_warnings():  # experimental since Optuna 3.2, stable in use
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(list(ctx_names))
    if not study.trials:
        for point in grid_points:
            study.enqueue_trial(point)
    return study, storage


def set_study_attrs(study, info: dict[str, Any]) -> None:
    for key, value in info.items():
        if value is not None and study.user_attrs.get(key) != value:
            study.set_user_attr(key, value)


def close_running(study, ctx: TrialContext) -> None:
    """No trial stays RUNNING: one with Parquet rows is told its values (or failed if none was ok);
    one without rows never finished and is failed and enqueued to run again."""
    from optuna.trial import TrialState

    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        found = rows.trial_rows(ctx.study_dir, t.number)
        for key, value in rows.user_attrs(found).items():
            study._storage.set_trial_user_attr(t._trial_id, key, value)
        if any(r["status"] == "ok" for r in found):
            study.tell(t.number, rows.values(found, ctx.objectives, ctx.count))
        else:
            study.tell(t.number, state=TrialState.FAIL)
            if not found:
                study.enqueue_trial(t.params)


class Sample:
    """The space's define-by-run function, tagged with the Optuna trial number (which names the
    trial's rows). A class, not a closure: Tune pickles the searcher into its experiment state."""

    def __init__(self, space):
        self.space = space

    def __call__(self, trial) -> dict[str, Any]:
        from benchmark.space.candidates import define_by_run
        from benchmark.space.language import SpaceError

        try:
            return {**define_by_run(self.space)(trial), "optuna_trial": trial.number}
        except SpaceError as e:  # recorded as an infeasible trial, not a crashed search
            return {"optuna_trial": trial.number, "infeasible": str(e)}


def finished_numbers(finished: dict[str, dict]) -> dict[int, list[dict]]:
    """Optuna trial number -> its finished rows (one per seed)."""
    out: dict[int, list[dict]] = {}
    for row in finished.values():
        number = row.get("optuna_trial")
        if number is not None and number == number:  # skips NaN (rows written outside a search)
            out.setdefault(int(number), []).append(row)
    return out

