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


def storage_url(study_dir: str | Path, storage: str | None = None) -> str:
    """Where the Optuna study lives: `--storage` (an RDB URL several drivers can share), else
    SQLite in the study folder; for results on a URI (SQLite cannot live in an object store), a
    SQLite file kept by the driver (mirror_path) and copied to <study>/_optuna.db (mirror)."""
    from benchmark.store.location import is_uri

    if storage:
        return storage
    path = mirror_path(study_dir) if is_uri(study_dir) else Path(study_dir) / OPTUNA_DB
    return f"sqlite:///{path.resolve()}"


def mirror_path(study_dir: str) -> Path:
    import hashlib

    from benchmark.data import cache_root

    digest = hashlib.sha1(str(study_dir).encode()).hexdigest()[:12]
    return cache_root() / "studies" / digest / OPTUNA_DB


def mirror(study_dir: str | Path, storage: str | None, push: bool) -> bool:
    """For results on a URI: copy the driver's SQLite study to <study>/_optuna.db (push, after a
    search), or fetch that copy before one, unless this driver's own file is newer (a driver killed
    after its last copy). Returns whether a copy was made."""
    import sqlite3
    from contextlib import closing

    import pyarrow.fs as pafs

    from benchmark.store.location import is_uri, join, resolve
    from benchmark.store.results import trial_files

    if storage or not is_uri(study_dir):
        return False
    local, (fs, remote) = mirror_path(str(study_dir)), resolve(join(study_dir, OPTUNA_DB))
    if push:
        if not local.exists():
            return False
        snapshot = local.with_suffix(".snapshot")
        with closing(sqlite3.connect(local)) as src, closing(sqlite3.connect(snapshot)) as dst:
            src.backup(dst)  # a consistent copy, even of a database in use
        pafs.copy_files(str(snapshot), remote, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
        snapshot.unlink()
        return True
    info = fs.get_file_info(remote)
    if info.type != pafs.FileType.File:
        # No copy there: a new study (a local file left from an older study of this URI goes), or
        # a driver killed before it copied (its rows are there: keep the local study).
        if local.exists() and not trial_files(study_dir):
            local.unlink()
        return False
    if local.exists() and info.mtime is not None and local.stat().st_mtime >= info.mtime.timestamp():
        return False  # this driver's study is newer (it was killed after its last copy): keep it
    local.parent.mkdir(parents=True, exist_ok=True)  # else the copy beside the rows is the study's truth
    pafs.copy_files(remote, str(local), source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())
    return True


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


def open_study(url: str, name: str, ctx_names: list[str], directions: list[str],
               grid_points: list[dict[str, Any]] = ()):
    """Load or create the persisted study and name its metrics (also on resume, for studies made
    before names existed). A new study of a finite space starts with its points enqueued, so no
    candidate repeats while others are untried."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    storage = optuna.storages.RDBStorage(url)
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


def run_again(study, set_aside: list[str], done: dict[int, list[dict]]) -> None:
    """Trials whose row files were damaged and set aside run again with the same parameters
    (their Optuna trials stay as they were; the rerun is a new trial number)."""
    import re

    from benchmark.store.location import basename

    numbers = {int(m.group(1)) for p in set_aside if (m := re.match(r"t(\d+)", basename(p)))}
    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    for number in sorted(numbers - set(done)):
        if number in by_number and by_number[number].params:
            study.enqueue_trial(by_number[number].params)


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

