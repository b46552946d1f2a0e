"""Runs taken from other studies instead of trained again (`--reuse-runs FOLDER`): a run of this
search whose model, training settings (seed and tuned ones included), quantisation, data (corpus,
tokenizer, how batches draw), hardware (CPU or GPU, and its torch threads) and processes (one; a
run of several workers always trains) are those of a measured run (ok or diverged) in FOLDER's
studies is that run: its row is copied into this study under this run's name, its curve with it,
and says where it came from (`reused_from`, in the row's `extra`: `<study>/trials/<row file>`).
Two studies that share an arm (the same model at the same budget, tokens and grid) so train it
once; `shapebench plan --reuse-runs FOLDER` says beforehand which runs would be taken
(search/reuse_plan.py, by these keys).

What the key leaves out is the code: a row keeps its own `code_version`, so a study that reuses the
runs of an older commit shows both; reuse only from studies whose code trains as this one's does
(docs/searches-and-results.md). Nothing else of the run is copied: no weights (`--save-weights`
keeps only the runs trained here) and no saved state."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping, Sequence

from benchmark.arch import ArchSpec
from benchmark.recipe import settings_json
from benchmark.search import rows
from benchmark.search.context import TrialContext
from benchmark.search.preflight import OLD_SAMPLING
from benchmark.store import location, read_files, trial_files
from benchmark.store.curves import KEY as CURVE
from benchmark.store.curves import curve_points
from benchmark.store.results import row_file, row_name, trials_dir

# what makes two runs the same run: the columns of its row, as trial/run.py writes them, and the
# value a row from before a column existed had (batches drew with replacement; one process)
KEY = {
    "spec": None,
    "training": None,
    "quantize": None,
    "dataset_id": None,
    "tokenizer_id": None,
    "sampling": OLD_SAMPLING,
    "hardware": None,
    "world_size": 1,
    "parallel": "none",
}
MEASURED = ("ok", "diverged")
REUSED = "reused_from"  # the row's `extra` key: "<study>/trials/<row file>"
# a diverged run never quantised (its `quantize` is null): it stands for a run of any quantisation
NOT_QUANTISED = "diverged before quantisation"


class ReuseError(ValueError):
    """--reuse-runs names a folder without a study."""


def run_key(values: Mapping[str, Any]) -> str:
    """The run's identity: a digest of KEY's values (JSON ones compared as values, key order aside;
    a missing one as KEY says); a diverged row's quantisation is NOT_QUANTISED."""

    def value(column):
        v = values.get(column)
        if column == "quantize" and values.get("status") == "diverged":
            return NOT_QUANTISED
        if v is None:
            return KEY[column]
        return json.loads(v) if isinstance(v, str) and v[:1] in "{[" else v

    text = json.dumps([value(c) for c in KEY], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def studies_in(folder: str) -> list[str]:
    """The study folders `folder` names: itself when it holds rows, else its folders that do."""
    try:
        if location.is_dir(trials_dir(folder)):
            return [folder]
        found = [
            location.join(folder, name)
            for name in sorted(location.folders(folder))
            if not name.startswith((".", "_"))
            and location.is_dir(trials_dir(location.join(folder, name)))
        ]
    except OSError as err:
        raise ReuseError(
            f"--reuse-runs {folder}: cannot be read ({location.reason(err)})"
        ) from None
    if not found:
        raise ReuseError(
            f"--reuse-runs {folder}: no study there (no trials/ folder in it or in its folders)"
        )
    return found


def index(folders: Sequence[str], own: str) -> dict[str, str]:
    """run key -> the row file of a measured run in `folders`' studies (the first found), the study
    `own` (this search's) left out: its rows are its own to resume."""
    found: dict[str, str] = {}
    own = location.absolute(own).rstrip("/")
    for folder in folders:
        for study in studies_in(location.absolute(folder).rstrip("/")):
            if study == own:
                continue
            for row in read_files(trial_files(study), skipped=[]):
                if row.get("status") in MEASURED:
                    path = row_file(study, row["trial_id"], int(row.get("attempt") or 0))
                    found.setdefault(run_key(as_planned(row)), path)
    return found


def as_planned(row: Mapping[str, Any]) -> Mapping[str, Any]:
    """The row as its run was planned: out-of-memory retries (the row's `oom_retries`, r) halved
    its micro-batch and doubled its accumulation r times (trial/run.train_fitting), and its
    `training` holds what it trained with; the run planned at 2^r times that micro-batch, which on
    the same hardware (in the key) runs out of memory and retries the same way, is this run.
    Its `training` comes back as a dict: run_key compares JSON columns as values."""
    retries = row.get("oom_retries")
    if not isinstance(retries, (int, float)) or not retries > 0 or not row.get("training"):
        return row
    training = json.loads(row["training"])
    factor = 2 ** int(retries)
    training.update(
        batch_size=training["batch_size"] * factor, grad_accum=training["grad_accum"] // factor
    )
    return {**row, "training": training}


def planned(spec: Mapping[str, Any], cfg, quantize, data, hardware: str) -> dict[str, Any]:
    """KEY's values of a run about to train in one process, as trial/run.py would write them in its
    row; `quantize` None: a run that will not quantise."""
    return {
        "spec": ArchSpec.from_dict(dict(spec)).to_json(),
        "training": settings_json(cfg),
        "quantize": settings_json(quantize) if quantize else None,
        "dataset_id": data.dataset_id,
        "tokenizer_id": data.tokenizer.tokenizer_id,
        "sampling": data.sampling,
        "hardware": hardware,
    }


def find(index: Mapping[str, str], planned: Mapping[str, Any]) -> str | None:
    """The row file of the run `planned` (its KEY values) is: one measured as it would be, or
    one that diverged before quantising (which it would too)."""
    return index.get(run_key(planned)) or index.get(run_key({**planned, "status": "diverged"}))


def source_row(path: str) -> dict[str, Any] | None:
    """The row a reused run copies, with its curve's points under CURVE and REUSED naming it (or
    the run it was itself taken from); None when it is gone."""
    rows = read_files([path], skipped=[])
    if not rows:
        return None
    row = rows[0]
    study, attempt = location.parent(location.parent(path)), int(row["attempt"] or 0)
    here = f"{location.basename(study)}/trials/{location.basename(path)}"
    row[REUSED] = json.loads(row.get("extra") or "{}").get(REUSED) or here
    if points := curve_points(study, row_name(row["trial_id"], attempt)):
        row[CURVE] = points
    return row


def taken(ctx: TrialContext, config: Mapping[str, Any], trial_id: str, cfg, data) -> dict | None:
    """The row of run `trial_id` taken from the run of its key in ctx.reuse, placed in this study
    (its trial, axes, budget; attempt 0), not yet written; None when there is none to take."""
    if not ctx.reuse or data is None or ctx.workers is not None:  # a Train job's runs train
        return None
    from benchmark.trial.run import row_hardware  # asks torch its threads: the worker's

    values = planned(config["spec"], cfg, ctx.quantize_config(), data, row_hardware())
    row = source_row(path) if (path := find(ctx.reuse, values)) else None
    if row is None:
        return None
    # its phase and tuned point are this trial's (attempts sets them), not the source's
    return {
        **row,
        **rows.identity(ctx, config, trial_id),
        "attempt": 0,
        "phase": None,
        "tuned": None,
    }


def taken_in(study_dir: str, df, files) -> int:
    """How many of the study's row files `files` hold a run taken from another study (`df`: the
    study's rows)."""
    if not len(df) or "extra" not in df:
        return 0
    return sum(
        1
        for r in df[["trial_id", "attempt", "extra"]].itertuples()
        if isinstance(r.extra, str)
        and REUSED in json.loads(r.extra)
        and row_file(study_dir, r.trial_id, int(r.attempt or 0)) in files
    )
