"""The results store: one Parquet file per finished trial attempt under
`<results>/<study>/trials/`, so `pandas.read_parquet("<results>/<study>")` reads a study as one
table and nothing finished is ever lost when a run dies.

A row is written to a hidden temporary name (readers skip names starting with "."), flushed and
fsynced, read back and validated, then renamed into place: a reader sees a whole file or none.
The schema is explicit and versioned (`SCHEMA_VERSION`); columns a caller adds beyond it are kept
in the `extra` JSON column rather than silently changing the table's shape.
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from typing import Any, Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from benchmark.store.atomic import atomic_open
from benchmark.store.metrics import DIAGNOSTICS

# 2: the hyper-connection diagnostics (DIAGNOSTICS); files of version 1 read with them null.
SCHEMA_VERSION = 2
# infeasible: the sampled point has no candidate within the budget (nothing was trained).
STATUSES = ("ok", "failed", "pruned", "diverged", "infeasible")

_str, _i64, _f64 = pa.string(), pa.int64(), pa.float64()
SCHEMA = pa.schema([
    ("schema_version", _i64), ("study", _str), ("trial_id", _str), ("attempt", _i64),
    ("status", _str), ("error", _str),
    ("family", _str), ("structure", _str), ("spec", _str), ("training", _str), ("axes", _str),
    ("budget", _i64), ("budget_count", _str), ("budget_distance", _f64),
    ("params_total", _i64), ("params_non_embedding", _i64), ("params_attention", _i64), ("params_ffn", _i64),
    ("flops_per_token_train", _f64), ("flops_per_token_infer", _f64),
    ("tokens_trained", _i64), ("train_loss", _f64), ("val_loss", _f64), ("val_ppl", _f64), ("val_ppl_unigram", _f64),
    ("val_loss_by_source", _str), ("val_ppl_by_loops", _str), ("evals", _str),
    ("val_ppl_int8", _f64), ("val_ppl_int4", _f64), ("val_ppl_int4_rtn", _f64),
    ("bf16_bytes", _i64), ("int8_bytes", _i64), ("int4_bytes", _i64),
    *((name, _f64) for name in DIAGNOSTICS),
    ("tokens_per_s", _f64), ("flops_per_s", _f64), ("peak_mem_bytes", _i64), ("wall_s", _f64),
    ("seed", _i64), ("optuna_trial", _i64), ("dataset_id", _str), ("tokenizer_id", _str),
    ("code_version", _str), ("packages", _str), ("hardware", _str),
    ("started_at", _str), ("finished_at", _str), ("extra", _str),
])
COLUMNS = tuple(SCHEMA.names)
REQUIRED = ("study", "trial_id", "status")


class ResultsError(ValueError):
    pass


def check_study_name(name: str) -> str:
    """A study name is one path component: it names the folder <results>/<name>/ and nothing
    outside it. Raises ValueError otherwise."""
    if not isinstance(name, str) or not name.strip() or name in (".", "..") or any(c in name for c in "/\\") \
            or name != name.strip():
        raise ValueError(f"{name!r} is not a study name: use one folder name, without '/', '\\', '.' or '..' "
                         "(e.g. hyperloop-vs-looped)")
    return name


def trials_dir(study_dir: str | Path) -> Path:
    return Path(study_dir) / "trials"


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
    extra = {k: v for k, v in row.items() if k not in COLUMNS}
    full = {**{k: row.get(k) for k in COLUMNS}, "schema_version": SCHEMA_VERSION, "attempt": row.get("attempt") or 0}
    if extra:
        full["extra"] = json.dumps({**json.loads(row.get("extra") or "{}"), **extra}, sort_keys=True, default=str)
    return pa.Table.from_pylist([{k: _cell(k, v) for k, v in full.items()}], schema=SCHEMA)


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)


def write_row(study_dir: str | Path, row: Mapping[str, Any]) -> Path:
    """Atomically add one trial attempt to a study; returns the file written. The file is read
    back from memory before it is written, so what becomes visible is a valid one-row table."""
    table = to_table(row)
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf)
    data = buf.getvalue()
    if pq.read_table(pa.BufferReader(data)).num_rows != 1:
        raise ResultsError(f"{row['trial_id']}: the row did not serialise to a readable table")
    final = trials_dir(study_dir) / f"{_safe_name(row['trial_id'])}.a{table['attempt'][0].as_py()}.parquet"
    with atomic_open(final, "wb") as f:
        f.write(data)
    return final


def sweep_orphans(study_dir: str | Path, older_than_s: float = 0.0) -> int:
    """Remove temporary files left by a writer that died mid-write; returns how many."""
    folder = trials_dir(study_dir)
    if not folder.is_dir():
        return 0
    now, n = time.time(), 0
    for p in folder.glob(".*"):  # atomic_open's temporaries (and this store's older ".tmp-" ones)
        if not (p.name.endswith(".tmp") or p.name.startswith(".tmp-")):
            continue
        try:
            if now - p.stat().st_mtime >= older_than_s:
                p.unlink()
                n += 1
        except FileNotFoundError:
            pass
    return n


def trial_files(study_dir: str | Path) -> list[Path]:
    """The study's result files; names starting with "." (mid-write) or "_" are skipped, as
    pyarrow's own dataset reader does."""
    folder = trials_dir(study_dir)
    return sorted(p for p in folder.glob("*.parquet") if not p.name.startswith((".", "_"))) if folder.is_dir() else []


def read_table(study_dir: str | Path) -> pa.Table:
    """Every trial attempt of the study as one Arrow table (empty, with SCHEMA, if none yet).
    Files are concatenated with permissive schema promotion: a column missing from older files
    (or all-null in a failed trial) does not break the read."""
    return _concat(trial_files(study_dir))


def _concat(files) -> pa.Table:
    tables = [_read_file(Path(f)) for f in files]
    return pa.concat_tables(tables, promote_options="permissive") if tables else SCHEMA.empty_table()


def _read_file(path: Path) -> pa.Table:
    # For files of a few kB, pyarrow's defaults cost more than the reading: read_table's dataset
    # discovery (2x), and pre-buffering, which hands each file to the IO thread pool (1.5x).
    try:
        return pq.ParquetFile(path, pre_buffer=False).read(use_threads=False)
    except (pa.ArrowInvalid, OSError) as err:
        raise ResultsError(f"{path}: not a readable Parquet file ({err})") from err


def read_files(files) -> list[dict[str, Any]]:
    """The rows of the given result files, as plain Python values."""
    return _concat(files).to_pylist()


def read_study(study_dir: str | Path):
    """The study as one pandas DataFrame (see read_table)."""
    return read_table(study_dir).to_pandas()


def finished_trials(study_dir: str | Path) -> dict[str, dict]:
    """trial_id -> its latest attempt's row, for every trial that has a result."""
    df = read_study(study_dir)
    if df.empty:
        return {}
    df = df.sort_values(["trial_id", "attempt"])
    return {r["trial_id"]: r for r in df.groupby("trial_id").tail(1).to_dict("records")}


