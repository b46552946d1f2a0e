"""The results store: one Parquet file per finished trial attempt under
`<results>/<study>/trials/`, so `pandas.read_parquet("<results>/<study>")` reads a study as one
table and nothing finished is ever lost when a run dies. `<results>` is a local folder or a URI
(s3://bucket/prefix, ...: store.location).

A row is validated and serialised in memory, then published whole (store.location.write_bytes): a
reader sees a whole file or none. The schema is explicit and versioned (`SCHEMA_VERSION`); columns
a caller adds beyond it are kept in the `extra` JSON column rather than silently changing the
table's shape.

Faults are survived, never hidden: a damaged file (truncated, emptied, overwritten by something
else) is skipped by every reader and named (a ResultsWarning, or the caller's `skipped` list),
`quarantine` moves such files aside, and a row that finds the disk full is kept in a local
fallback folder (StoreFull says where) until `recover` brings it back.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from benchmark.store import location
from benchmark.store.errors import (
    ResultsError,
    ResultsWarning,
    StoreFull,
)
from benchmark.store.metrics import DIAGNOSTICS, LOOP_LOSSES, PARAM_COLUMNS, TIME_SPLIT

__all__ = [
    "COLUMNS",
    "PHASES",
    "SCHEMA",
    "SCHEMA_VERSION",
    "STATUSES",
    "check_study_name",
    "damaged_files",
    "finished_trials",
    "quarantine",
    "read_files",
    "read_study",
    "read_table",
    "recover",
    "sweep_orphans",
    "to_table",
    "trial_files",
    "trials_dir",
    "write_row",
]

# 2: the hyper-connection diagnostics (DIAGNOSTICS); files of version 1 read with them null.
# 3: node_id, the Ray node that ran the trial (a cluster search), and precision, what the training
#    steps ran in (bf16, fp32, fp32+tf32); older files read them null.
# 4: the trial's time split (TIME_SPLIT: compile, train, eval, quantise seconds); older files read
#    them null.
# 5: the per-loop losses (LOOP_LOSSES: val_loss_r1, _r2, _r4, _r8); params_non_embedding_head (a
#    count rule per PARAM_COLUMNS); what INT4 costs (int4_ppl_increase, int4_rtn_ppl_increase) and
#    the quantisation settings that measured it (quantize, JSON); a data-parallel trial's world_size,
#    parallel (none, ddp, fsdp), backend, per-rank batch (rank_batch_size, rank_grad_accum) and
#    peak memory per rank (peak_mem_bytes_by_rank, JSON; peak_mem_bytes is their max); what a
#    hyper-connected model's streams were stored in (stream_dtype); older files read them null.
# 6: loss_spike, the largest rise of the training loss over its best so far (trial/curve.py); a
#    tuned study's phase (tune or final) and tuned setting (JSON: the training settings the `tune:`
#    grid set); older files read them null (a null phase is a final row).
# 7: the data a run read (tokens_by_source, JSON: each part's tokens in the training split;
#    epochs_by_source, JSON: the passes the run made over each; sampling, how its batches drew:
#    data/sampling.py) and oom_retries (the times an out-of-memory error halved the micro-batch,
#    trial/run.py); resumed_from_step and resumes, the step a run last continued from after a
#    stop (its saved state: trial/runstate.py) and how many times it did; stalls, how many times
#    the watchdog ended it (trial/watchdog.py). Older files read them null.
SCHEMA_VERSION = 7
# infeasible: the sampled point has no candidate within the budget (nothing was trained).
STATUSES = ("ok", "failed", "pruned", "diverged", "infeasible")
# The key of a measured row (trial/run.py) holding its training curve: no column, as the curve's
# own file beside the row holds it (store/curves.py).
CURVE = "curve"
# A tuned study's rows (space/tuning.py): a run of the tuning grid, or a final seed at the chosen point.
PHASES = ("tune", "final")

_str, _i64, _f64 = pa.string(), pa.int64(), pa.float64()
SCHEMA = pa.schema(
    [
        ("schema_version", _i64),
        ("study", _str),
        ("trial_id", _str),
        ("attempt", _i64),
        ("status", _str),
        ("error", _str),
        ("family", _str),
        ("structure", _str),
        ("spec", _str),
        ("training", _str),
        ("quantize", _str),
        ("axes", _str),
        ("budget", _i64),
        ("budget_count", _str),
        ("budget_distance", _f64),
        *((name, _i64) for name in PARAM_COLUMNS),
        ("params_attention", _i64),
        ("params_ffn", _i64),
        ("flops_per_token_train", _f64),
        ("flops_per_token_infer", _f64),
        ("tokens_trained", _i64),
        ("train_loss", _f64),
        ("val_loss", _f64),
        ("val_ppl", _f64),
        ("val_ppl_unigram", _f64),
        ("val_loss_by_source", _str),
        ("tokens_by_source", _str),
        ("epochs_by_source", _str),
        ("sampling", _str),
        ("val_ppl_by_loops", _str),
        *((name, _f64) for name in LOOP_LOSSES),
        ("evals", _str),
        ("loss_spike", _f64),
        ("resumed_from_step", _i64),
        ("resumes", _i64),
        ("stalls", _i64),
        ("phase", _str),
        ("tuned", _str),
        ("val_ppl_int8", _f64),
        ("val_ppl_int4", _f64),
        ("val_ppl_int4_rtn", _f64),
        ("int4_ppl_increase", _f64),
        ("int4_rtn_ppl_increase", _f64),
        ("bf16_bytes", _i64),
        ("int8_bytes", _i64),
        ("int4_bytes", _i64),
        *((name, _f64) for name in DIAGNOSTICS),
        ("tokens_per_s", _f64),
        ("flops_per_s", _f64),
        ("peak_mem_bytes", _i64),
        ("precision", _str),
        ("stream_dtype", _str),
        ("wall_s", _f64),
        ("world_size", _i64),
        ("parallel", _str),
        ("backend", _str),
        ("rank_batch_size", _i64),
        ("rank_grad_accum", _i64),
        ("oom_retries", _i64),
        ("peak_mem_bytes_by_rank", _str),
        *((name, _f64) for name in TIME_SPLIT),
        ("seed", _i64),
        ("optuna_trial", _i64),
        ("node_id", _str),
        ("dataset_id", _str),
        ("tokenizer_id", _str),
        ("code_version", _str),
        ("packages", _str),
        ("hardware", _str),
        ("started_at", _str),
        ("finished_at", _str),
        ("extra", _str),
    ]
)
COLUMNS = tuple(SCHEMA.names)
REQUIRED = ("study", "trial_id", "status")


def check_study_name(name: str) -> str:
    """A study name is one path component: it names the folder <results>/<name>/ and nothing
    outside it. Raises ValueError otherwise."""
    if (
        not isinstance(name, str)
        or not name.strip()
        or name in (".", "..")
        or any(c in name for c in "/\\")
        or name != name.strip()
    ):
        raise ValueError(
            f"{name!r} is not a study name: use one folder name, without '/', '\\', '.' or '..' "
            "(e.g. hyperloop-vs-looped)"
        )
    return name


Location = str | os.PathLike


def trials_dir(study_dir: Location) -> str:
    return location.join(study_dir, "trials")


def _cell(name: str, value: Any) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, (dict, list, tuple)) and pa.types.is_string(SCHEMA.field(name).type):
        return json.dumps(value, sort_keys=True, default=str)
    return value


def to_table(row: Mapping[str, Any]) -> pa.Table:
    """One validated row as a table with exactly SCHEMA."""
    missing = [k for k in REQUIRED if not row.get(k)]
    if missing:
        raise ResultsError(f"a result row needs {', '.join(missing)}")
    if row["status"] not in STATUSES:
        raise ResultsError(f"status '{row['status']}' is not one of {', '.join(STATUSES)}")
    extra = {k: v for k, v in row.items() if k not in COLUMNS and k != CURVE}
    full = {
        **{k: row.get(k) for k in COLUMNS},
        "schema_version": SCHEMA_VERSION,
        "attempt": row.get("attempt") or 0,
    }
    if extra:
        full["extra"] = json.dumps(
            {**json.loads(row.get("extra") or "{}"), **extra}, sort_keys=True, default=str
        )
    return pa.Table.from_pylist([{k: _cell(k, v) for k, v in full.items()}], schema=SCHEMA)


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)


def row_name(trial_id: str, attempt: int) -> str:
    """A trial attempt's file name, `<trial id>.a<attempt>.parquet`: its row's under `trials/`
    and its curve's under `_curves/` (store/curves.py)."""
    return f"{_safe_name(trial_id)}.a{int(attempt or 0)}.parquet"


def row_file(study_dir: Location, trial_id: str, attempt: int) -> str:
    """Where a trial attempt's row lives: `<study>/trials/<row_name>`."""
    return location.join(trials_dir(study_dir), row_name(trial_id, attempt))


def write_row(study_dir: Location, row: Mapping[str, Any], fallback: Location | None = None) -> str:
    """Atomically add one trial attempt to a study; returns the file written (a path or a URI).
    The file is read back from memory before it is written, so what becomes visible is a valid
    one-row table. A full disk raises StoreFull, after keeping the row in
    `<fallback>/<study>/trials/` when a (local) fallback folder is given: `recover` brings it back."""
    table = to_table(row)
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf)
    data = buf.getvalue().to_pybytes()
    if pq.read_table(pa.BufferReader(data)).num_rows != 1:
        raise ResultsError(f"{row['trial_id']}: the row did not serialise to a readable table")
    final = row_file(study_dir, row["trial_id"], table["attempt"][0].as_py())
    try:
        location.write_bytes(final, data)
    except OSError as err:
        if err.errno not in location.FULL:
            raise
        raise _full(final, data, study_dir, fallback) from err
    return final


def _full(final: str, data: bytes, study_dir: Location, fallback: Location | None) -> StoreFull:
    if fallback is None:
        return StoreFull(final, len(data), None)
    aside = location.join(_aside(study_dir, fallback), location.basename(final))
    try:
        location.write_bytes(aside, data)
    except OSError as err:
        return StoreFull(
            final, len(data), None, f" (the fallback {aside} failed too: {location.reason(err)})"
        )
    return StoreFull(final, len(data), aside)


def _aside(study_dir: Location, fallback: Location) -> str:
    """Where write_row keeps a study's rows that found the disk full: <fallback>/<study>/trials."""
    return location.join(fallback, location.basename(study_dir), "trials")


def recover(study_dir: Location, fallback: Location) -> list[str]:
    """Moves the rows write_row kept in `fallback` back into the study; returns their file names.
    A file there that does not read is left where it is (and named in a ResultsWarning)."""
    aside, recovered = _aside(study_dir, fallback), []
    for name in _row_names(aside):
        path = location.join(aside, name)
        data = location.read_bytes(path)
        parsed = _parse(data)
        if isinstance(parsed, str):
            warnings.warn(
                f"{path}: not a readable Parquet file ({parsed}); left where it is",
                ResultsWarning,
                stacklevel=2,
            )
            continue
        location.write_bytes(location.join(trials_dir(study_dir), name), data)
        location.remove(path)
        recovered.append(name)
    for folder in (aside, location.parent(aside)):  # the fallback's study folder, once empty
        if (local := location.local_path(folder)) is not None:
            try:
                os.rmdir(local)
            except OSError:
                pass
    return recovered


def sweep_orphans(study_dir: Location, older_than_s: float = 0.0, also: Sequence[str] = ()) -> int:
    """Remove temporary files left by a writer that died mid-write, in the study's trials folder
    and in its folders named in `also` (a run's saved state killed mid-save); returns how many.
    (Only a local store has any: an object store never shows an unfinished upload.)"""
    folders = [trials_dir(study_dir), *(location.join(study_dir, name) for name in also)]
    now, n = time.time(), 0
    for folder in map(location.local_path, folders):
        if folder is None or not os.path.isdir(folder):
            continue
        for p in Path(folder).glob(".*"):  # atomic_open's (and this store's older ".tmp-" ones)
            if not (p.name.endswith(".tmp") or p.name.startswith(".tmp-")):
                continue
            try:
                if now - p.stat().st_mtime >= older_than_s:
                    p.unlink()
                    n += 1
            except FileNotFoundError:
                pass
    return n


def _row_names(folder: Location, prefix: str = "") -> list[str]:
    # Names starting with "." (mid-write) or "_" are skipped, as pyarrow's own dataset reader does.
    return sorted(
        n
        for n in location.files(folder)
        if n.endswith(".parquet") and not n.startswith((".", "_")) and n.startswith(prefix)
    )


def trial_files(study_dir: Location, prefix: str = "") -> list[str]:
    """The study's result files whose names start with `prefix` (e.g. "t0007." or "t0007-s"),
    sorted, as paths or URIs."""
    folder = trials_dir(study_dir)
    return [location.join(folder, n) for n in _row_names(folder, prefix)]


def read_table(study_dir: Location, skipped: list | None = None) -> pa.Table:
    """Every trial attempt of the study as one Arrow table (empty, with SCHEMA, if none yet).
    Files are concatenated with permissive schema promotion: a column missing from older files
    (or all-null in a failed trial) does not break the read. A damaged file is skipped: its path
    is appended to `skipped`, or, with no list, said in one ResultsWarning."""
    return _concat(trial_files(study_dir), skipped)


def read_files(files, skipped: list | None = None) -> list[dict[str, Any]]:
    """The rows of the given result files (paths or URIs), as plain Python values."""
    return _concat(list(map(str, files)), skipped).to_pylist()


def read_study(study_dir: Location, skipped: list | None = None):
    """The study as one pandas DataFrame (see read_table)."""
    return read_table(study_dir, skipped).to_pandas()


def finished_trials(study_dir: Location, skipped: list | None = None) -> dict[str, dict]:
    """trial_id -> its latest attempt's row, for every trial that has a result."""
    df = read_study(study_dir, skipped)
    if df.empty:
        return {}
    df = df.sort_values(["trial_id", "attempt"])
    return {r["trial_id"]: r for r in df.groupby("trial_id").tail(1).to_dict("records")}


def damaged_files(study_dir: Location) -> list[str]:
    """The study's files that read_table skips."""
    skipped: list[str] = []
    read_table(study_dir, skipped)
    return skipped


def quarantine(study_dir: Location) -> list[str]:
    """Moves each damaged file into `<study>/_quarantine/` (whose "_" keeps it out of every reader,
    pandas' included), a name taken there getting a numbered suffix; returns the new locations."""
    folder, moved = location.join(study_dir, "_quarantine"), []
    for path in damaged_files(study_dir):
        name = location.basename(path)
        target, n = location.join(folder, name), 1
        while location.exists(target):
            target, n = location.join(folder, f"{name}.{n}"), n + 1
        location.move(path, target)
        moved.append(target)
    return moved


# ---- reading ---------------------------------------------------------------------------------


def _concat(files: list[str], skipped: list | None) -> pa.Table:
    pairs, damaged = [], []
    for path, read in zip(files, _load_all(files)):
        if isinstance(read, str):
            damaged.append((path, read))
        elif read is not None:
            pairs.append((path, read))
    tables = _matching(pairs, damaged)
    for path, why in sorted(damaged):
        if skipped is not None:
            skipped.append(path)
        else:
            warnings.warn(
                f"{path}: not a readable Parquet file ({why}); skipped",
                ResultsWarning,
                stacklevel=3,
            )
    return (
        pa.concat_tables(tables, promote_options="permissive") if tables else SCHEMA.empty_table()
    )


def _load_all(files: list[str]) -> list:
    if not any(map(location.is_uri, files)):
        return list(map(_load, files))
    location.resolve(files[0])  # the filesystem, made (and cached) once rather than by each thread
    with ThreadPoolExecutor(
        16
    ) as pool:  # an object store answers each file in tens of ms: ask for several at once
        return list(pool.map(_load, files))


def _load(path: str) -> pa.Table | str | None:
    """The file's table; a str saying why it is no Parquet file; None when it is gone (a reader
    racing `quarantine`). Any other failure to read it is an error."""
    try:
        data = location.read_bytes(path)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise ResultsError(f"{path}: cannot be read ({location.reason(err)})") from err
    return _parse(data)


def _parse(data: bytes) -> pa.Table | str:
    # For files of a few kB, pyarrow's defaults cost more than the reading: read_table's dataset
    # discovery (2x), and pre-buffering, which hands each file to the IO thread pool (1.5x).
    try:
        return pq.ParquetFile(pa.BufferReader(data), pre_buffer=False).read(use_threads=False)
    except (pa.ArrowException, OSError) as err:  # thrift's decoding errors are OSErrors
        return location.reason(err) if data else "empty file"


def _matching(pairs: list[tuple[str, pa.Table]], damaged: list) -> list[pa.Table]:
    """The tables whose columns promote to one table with SCHEMA's; a file whose columns do not (a
    number column holding text) is damaged. Checked file by file only when the whole set does not
    unify."""
    tables = [t for _, t in pairs]
    try:
        pa.unify_schemas([SCHEMA, *(t.schema for t in tables)], promote_options="permissive")
        return tables
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        pass
    kept, schema = [], SCHEMA
    for path, table in pairs:
        try:
            schema = pa.unify_schemas([schema, table.schema], promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
            damaged.append((path, f"its columns do not match the study's: {location.reason(err)}"))
            continue
        kept.append(table)
    return kept
