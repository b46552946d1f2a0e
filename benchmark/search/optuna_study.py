"""The Optuna side of a search: the persisted study (named metrics, the space's declaration as
study attributes, each trial's row as trial attributes), the sampler, and closing what a killed
driver left RUNNING.

Sampler (`--sampler`, default `auto`): Optuna's sampler guide, as its AutoSampler decides for
studies of the size these are: below 250 trials, TPE (multivariate, grouped for conditional axes,
with a constant liar when trials run in parallel) when the space has categorical or conditional
axes, the Gaussian-process sampler when every axis is numeric; from 250 trials, NSGA-II for several
objectives. (NSGA-II's populations are meant for hundreds to thousands of trials.) The choice is
recorded in the study and a resumed study keeps it; the sampler is re-seeded with the number of
trials already told, as a restored sampler's random state is not in the storage (Optuna #3992).

Several drivers may run one study at once (a shared `--storage`, or the SQLite file beside rows on
a local disk): the study is created, and a finite space's points enqueued, by exactly one of them;
each trial names the driver that asked it (user attribute `driver`), so a driver closes only the
RUNNING trials of dead drivers; and `Quota` stops every driver once the study's trials are taken.
A study also keeps its declaration (`declaration`): a space edited since is refused on resume
(`check_declared`), as one study is one experiment and Optuna cannot change an axis's choices."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import re
import sqlite3
import warnings
from contextlib import closing
from pathlib import Path
from typing import Any

from benchmark.arch import ArchSpec, count_params
from benchmark.data import cache_root
from benchmark.recipe import fmt_count
from benchmark.search import rows
from benchmark.search.storage import STORAGE_WAIT_S, PatientStorage
from benchmark.space import SpaceError, define_by_run
from benchmark.store import trial_files
from benchmark.store.location import is_uri, join, parent, resolve

OPTUNA_DB = "_optuna.db"
SAMPLERS = ("auto", "tpe", "nsga2", "gp", "random")
MANY_TRIALS = 250  # Optuna's guide: beyond this, evolutionary samplers for several objectives


class StudyError(ValueError):
    pass


def storage_url(study_dir: str | Path, storage: str | None = None) -> str:
    """Where the Optuna study lives: `--storage` (an RDB URL several drivers can share), else
    SQLite in the study folder; for results on a URI (SQLite cannot live in an object store), a
    SQLite file kept by the driver (mirror_path) and copied to <study>/_optuna.db (mirror)."""
    if storage:
        return storage
    path = mirror_path(study_dir) if is_uri(study_dir) else Path(study_dir) / OPTUNA_DB
    return f"sqlite:///{path.resolve()}"


def mirror_path(study_dir: str) -> Path:
    digest = hashlib.sha1(str(study_dir).encode()).hexdigest()[:12]
    return cache_root() / "studies" / digest / OPTUNA_DB


def mirror(study_dir: str | Path, storage: str | None, push: bool) -> bool:
    """For results on a URI: copy the driver's SQLite study to <study>/_optuna.db (push, after a
    search), or fetch that copy before one, unless this driver's own file is newer (a driver killed
    after its last copy). Returns whether a copy was made."""
    import pyarrow.fs as pafs

    if storage or not is_uri(study_dir):
        return False
    local, (fs, remote) = mirror_path(str(study_dir)), resolve(join(study_dir, OPTUNA_DB))
    if push:
        if not local.exists():
            return False
        snapshot = local.with_suffix(".snapshot")
        with closing(sqlite3.connect(local)) as src, closing(sqlite3.connect(snapshot)) as dst:
            src.backup(dst)  # a consistent copy, even of a database in use
        pafs.copy_files(
            str(snapshot),
            remote,
            source_filesystem=pafs.LocalFileSystem(),
            destination_filesystem=fs,
        )
        snapshot.unlink()
        return True
    info = fs.get_file_info(remote)
    if info.type != pafs.FileType.File:
        # No copy there: a new study (a local file left from an older study of this URI goes), or
        # a driver killed before it copied (its rows are there: keep the local study).
        if local.exists() and not trial_files(study_dir):
            local.unlink()
        return False
    if (
        local.exists()
        and info.mtime is not None
        and local.stat().st_mtime >= info.mtime.timestamp()
    ):
        return False  # this driver's study is newer (it was killed after its last copy): keep it
    local.parent.mkdir(
        parents=True, exist_ok=True
    )  # else the copy beside the rows is the study's truth
    pafs.copy_files(
        remote, str(local), source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem()
    )
    return True


def resolve_sampler(requested: str | None, recorded: str | None, space, n_objectives: int) -> str:
    """The sampler's name: a resumed study keeps its own; `auto` follows Optuna's guide."""
    if recorded and requested not in (None, recorded):
        raise StudyError(
            f"this study was run with --sampler {recorded}; resume it with the same sampler "
            f"(or start a new study with --name)"
        )
    name = recorded or requested or "auto"
    if name != "auto":
        return name
    if space.trials >= MANY_TRIALS:
        return "nsga2" if n_objectives > 1 else "tpe"
    numeric = all(
        type(a.domain).__name__ in ("IntRange", "FloatRange") and a.when is None for a in space.axes
    )
    return "gp" if numeric and space.axes else "tpe"


def make_sampler(name: str, seed: int, n_objectives: int, parallel: bool, trials: int):
    import optuna

    with warnings.catch_warnings():  # multivariate/group/constant_liar are marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if name == "tpe":
            return optuna.samplers.TPESampler(
                seed=seed, multivariate=True, group=True, constant_liar=parallel
            )
        if name == "gp":
            return optuna.samplers.GPSampler(seed=seed)
        if name == "nsga2":
            return optuna.samplers.NSGAIISampler(
                seed=seed, population_size=max(4, min(50, trials // 10))
            )
        if name == "random":
            return optuna.samplers.RandomSampler(seed=seed)
    raise StudyError(f"unknown sampler {name!r}; choose one of {', '.join(SAMPLERS)}")


def engine_url(url: str) -> str:
    """SQLAlchemy's URL for an Optuna storage URL: `postgresql://` names the psycopg2 driver, so
    where only psycopg (3; the `postgres` extra) is installed it is asked for by name."""
    scheme, sep, rest = url.partition("://")
    if scheme not in ("postgresql", "postgres"):
        return url
    if importlib.util.find_spec("psycopg2") is not None:
        return url
    if importlib.util.find_spec("psycopg") is not None:
        return f"postgresql+psycopg{sep}{rest}"
    raise StudyError(
        "--storage postgresql://...: no PostgreSQL driver is installed; "
        "pip install -e '.[postgres]' (psycopg)"
    )


def open_study(
    url: str,
    name: str,
    ctx_names: list[str],
    directions: list[str],
    grid_points: list[dict[str, Any]] = (),
    wait_s: float | None = None,
):
    """Load or create the persisted study and name its metrics (also on resume, for studies made
    before names existed). A new study of a finite space starts with its points enqueued, so no
    candidate repeats while others are untried: by the driver that created it, so two drivers
    starting together enqueue them once. The storage rides through its database being away for
    up to `wait_s` (search/storage.py), else raises StorageUnavailable."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    storage = PatientStorage(engine_url(url), wait_s=STORAGE_WAIT_S if wait_s is None else wait_s)
    try:
        study, created = (
            optuna.create_study(storage=storage, study_name=name, directions=directions),
            True,
        )
    except optuna.exceptions.DuplicatedStudyError:
        study, created = optuna.load_study(storage=storage, study_name=name), False
    if [d.name.lower() for d in study.directions] != directions:
        raise StudyError(
            f"study {name!r} was created with directions {[d.name.lower() for d in study.directions]}, "
            f"the space now declares {directions}; start a new study with --name"
        )
    if study.metric_names != ctx_names:
        with warnings.catch_warnings():  # experimental since Optuna 3.2, stable in use
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(list(ctx_names))
    if created:
        for point in grid_points:
            study.enqueue_trial(point)
    return study, storage


def set_study_attrs(study, info: dict[str, Any]) -> None:
    for key, value in info.items():
        if value is not None and study.user_attrs.get(key) != value:
            study.set_user_attr(key, value)


DRIVER = "driver"  # the user attribute naming the driver that asked a trial


def trial_number(file_name: str) -> int | None:
    """The Optuna trial number in a row file's name (t0007-s1.a0.parquet -> 7)."""
    m = re.match(r"t(\d+)", file_name.rpartition("/")[2])
    return int(m.group(1)) if m else None


class Quota:
    """The study's `trials:` shared by every driver running it: a trial is taken once it has a
    row or is RUNNING. A trial asked beyond the quota (two drivers asking at once for the last
    one) is the surplus one of the two by trial number, so exactly one of them trains."""

    def __init__(self, study_dir: str, target: int):
        self.study_dir, self.target = study_dir, target

    def taken(self, study, upto: int | None = None) -> int:
        from optuna.trial import TrialState

        trials = study.get_trials(deepcopy=False)
        numbers = {n for f in trial_files(self.study_dir) if (n := trial_number(f)) is not None}
        numbers |= {t.number for t in trials if t.state == TrialState.RUNNING}
        numbers -= {
            n for t in trials for n in t.user_attrs.get(rows.CONTINUES) or ()
        }  # one candidate, counted once
        return sum(1 for n in numbers if upto is None or n <= upto)

    def reached(self, study) -> bool:
        return self.taken(study) >= self.target

    def surplus(self, study, number: int) -> bool:
        return self.taken(study, upto=number) > self.target


class Sample:
    """The space's define-by-run function, tagged with the Optuna trial number (which names the
    trial's rows). A class, not a closure: Tune pickles the searcher into its experiment state."""

    def __init__(self, space):
        self.space = space

    def __call__(self, trial) -> dict[str, Any]:
        try:
            config = define_by_run(self.space)(trial)
            # a sampled candidate the plan did not show: one whose schedule cannot fit trains nothing
            self.space.schedule(
                count_params(config["spec"]),
                about=f"trial {trial.number} ({config['family']}, "
                f"budget {fmt_count(config['budget'])})",
                budget=config["budget"],
            )
            self.space.check_objectives(
                ArchSpec.from_dict(config["spec"]), about=f"trial {trial.number}"
            )
            earlier = trial.user_attrs.get(rows.CONTINUES)
            return {
                **config,
                "optuna_trial": trial.number,
                **({rows.CONTINUES: earlier} if earlier else {}),
            }
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


# ---- the declaration: what a study is an experiment on ------------------------------------------

# Keys of the declaration that make two studies different experiments; a change to any of them
# is refused on resume. (`trials` may grow or shrink, `seeds` grow: the study continues.)
DECLARED = (
    "budget",
    "ladder",
    "count",
    "tolerance",
    "solve",
    "align",
    "anchor",
    "base",
    "variants",
    "axes",
    "objectives",
    "training",
    "quantize",
    "tune",
    "controlled",
)


def declaration(space) -> dict[str, Any]:
    """The space as plain data, as _study.json and the Optuna study attributes record it."""

    def axis(a):
        d = a.domain
        body = (
            list(d.values)
            if type(d).__name__ == "Choice"
            else {"kind": type(d).__name__, **dataclasses.asdict(d)}
        )
        return body if a.when is None else {"values": body, "when": a.when.text}

    def plain(x):
        return json.loads(
            json.dumps(
                x,
                default=lambda v: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else str(v),
            )
        )

    return plain(
        {
            "budget": space.budget,
            "ladder": list(space.ladder) or None,
            "count": space.count,
            "tolerance": space.tolerance,
            "solve": space.solve,
            "align": space.align,
            "anchor": space.anchor,
            "base": space.base,
            "variants": space.variants,
            "axes": {a.key: axis(a) for a in space.axes},
            "objectives": [list(o) for o in space.objectives],
            "training": dict(space.training),
            "quantize": dict(space.quantize),
            "pruner": space.pruner,
            "tune": space.tune.declared() if getattr(space, "tune", None) else None,
            "controlled": space.controlled,  # the shape held across candidates, or preferred
        }
    )


def check_declared(
    space,
    seeds: int,
    recorded: dict[str, Any],
    where: str,
    name: str,
    first_seed: int | None = None,
) -> None:
    """StudyError, one line, when the space differs from the study's declaration (`recorded`,
    from <study>/_study.json) in what makes it another experiment; nothing is written."""
    if not recorded:
        return
    now = declaration(space)
    changes = [
        c for key in DECLARED if key in recorded for c in _diff(key, recorded[key], now[key])
    ]
    if recorded.get("seeds") and seeds < recorded["seeds"]:
        changes.append(
            f"seeds: {recorded['seeds']} -> {seeds} (fewer than its trials were trained with)"
        )
    if (
        recorded.get("seed") is not None
        and first_seed is not None
        and first_seed != recorded["seed"]
    ):
        changes.append(
            f"seed: {recorded['seed']} -> {first_seed} (its trials' seeds start at {recorded['seed']})"
        )
    if changes:
        raise StudyError(
            f"the space changed since this study began ({where}): {'; '.join(changes)}. A study is "
            f"one experiment: undo the change to resume it, or run the changed space as a new study "
            f"(--name {name}-2) and rank both studies' rows together with "
            f"`shapebench board {_parent(where)}`"
        )


def _diff(path: str, old: Any, new: Any) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        return [
            c
            for k in sorted(set(old) | set(new), key=str)
            for c in _diff(f"{path}.{k}", old.get(k, _NONE), new.get(k, _NONE))
        ]
    if old == new:
        return []
    amounts = path.split(".")[0] in ("budget", "ladder")  # 1M, not 1000000
    return [f"{path}: {_shown(old, amounts)} -> {_shown(new, amounts)}"]


_NONE = object()


def _shown(v: Any, amounts: bool = False) -> str:
    """A declared value as a line shows it; `amounts`: numbers as 1M, 500K (budgets)."""
    if v is _NONE:
        return "(none)"
    if isinstance(v, list):
        return "[" + ", ".join(_shown(x, amounts) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_shown(x, amounts)}" for k, x in v.items()) + "}"
    if amounts and isinstance(v, (int, float)) and not isinstance(v, bool):
        return fmt_count(v)
    return "null" if v is None else str(v)


def _parent(study_file: str) -> str:
    return parent(parent(study_file))
