"""Training curves, stored beside the rows: one Parquet file per trial attempt under
`<results>/<study>/_curves/`, named as its row (`t0007-s1.a0.parquet`), one row per point of
the curve (trial/curve.py: the mean training loss over a window of steps, the window's largest
loss, the learning rate, the gradient norm before clipping). The leading "_" keeps the folder out
of `pandas.read_parquet("<results>/<study>")`, which reads the rows alone; the curves read in one
line of their own:

    pd.read_parquet("results/my-study/_curves")    # every point of every trial of the study

The validation evaluations along the way are the row's `evals` column, and its last one the row's
val_loss; `read_curves` joins them in as `val_loss`, so a plot needs one call. A curve is written
before its row, with the same atomic writer, so a row that exists has its curve."""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from benchmark.store import location
from benchmark.store.errors import ResultsWarning
from benchmark.store.results import CURVE, read_study

FOLDER = "_curves"
KEY = CURVE  # the key of a measured row (trial/run.py) holding its curve's points
_i64, _f64, _str = pa.int64(), pa.float64(), pa.string()
SCHEMA = pa.schema(
    [
        ("study", _str),
        ("trial_id", _str),
        ("attempt", _i64),
        ("seed", _i64),
        ("phase", _str),
        ("step", _i64),
        ("tokens", _i64),
        ("train_loss", _f64),
        ("train_loss_max", _f64),
        ("lr", _f64),
        ("grad_norm", _f64),
    ]
)
POINT = tuple(n for n in SCHEMA.names if n not in ("study", "trial_id", "attempt", "seed", "phase"))


def curves_dir(study_dir: str) -> str:
    return location.join(study_dir, FOLDER)


def write_curve(study_dir: str, row: Mapping[str, Any], name: str) -> str | None:
    """The row's curve as `<study>/_curves/<name>` (name: the row file's); None when it has none."""
    points = row.get(KEY) or []
    if not points:
        return None
    keys = {
        "study": row.get("study"),
        "trial_id": row.get("trial_id"),
        "attempt": int(row.get("attempt") or 0),
        "seed": row.get("seed"),
        "phase": row.get("phase"),
    }
    table = pa.Table.from_pylist(
        [{**keys, **{k: p.get(k) for k in POINT}} for p in points], schema=SCHEMA
    )
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf)
    path = location.join(curves_dir(study_dir), name)
    location.write_bytes(path, buf.getvalue().to_pybytes())
    return path


def curve_points(study_dir: str, name: str) -> list[dict[str, Any]] | None:
    """The points of `<study>/_curves/<name>` as a measured row holds them (KEY); None without one."""
    path = location.join(curves_dir(study_dir), name)
    if not location.exists(path):
        return None
    table = pq.read_table(pa.BufferReader(location.read_bytes(path)), columns=list(POINT))
    return table.to_pylist()


def read_curves(study_dir: str, rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every curve of the study, long (SCHEMA's columns), with `val_loss` at the steps the trial
    evaluated (its `evals`, and the final evaluation at its last step) read from `rows` (default:
    the study's rows). Unreadable files are skipped with a ResultsWarning."""
    folder = curves_dir(study_dir)
    tables = []
    for name in sorted(location.files(folder)) if location.is_dir(folder) else []:
        if name.startswith((".", "_")) or not name.endswith(".parquet"):
            continue
        try:
            tables.append(
                pq.read_table(pa.BufferReader(location.read_bytes(location.join(folder, name))))
            )
        except (pa.ArrowException, OSError) as err:
            warnings.warn(
                f"{location.join(folder, name)}: not a readable curve ({location.reason(err)}); skipped",
                ResultsWarning,
                stacklevel=2,
            )
    train = (
        pa.concat_tables(tables, promote_options="permissive").to_pandas()
        if tables
        else SCHEMA.empty_table().to_pandas()
    )
    val = validation_points(read_study(study_dir) if rows is None else rows)
    if val.empty:
        return train.assign(val_loss=math.nan)
    keys = ["trial_id", "attempt", "step"]
    merged = train.merge(val[[*keys, "val_loss"]], on=keys, how="outer")
    return merged.sort_values(["trial_id", "attempt", "step"], kind="stable").reset_index(drop=True)


def validation_points(rows: pd.DataFrame) -> pd.DataFrame:
    """trial_id, attempt, step, tokens, val_loss: each row's evaluations during training (`evals`)
    and its final one (val_loss after tokens_trained, at the step its curve ends)."""
    out = []
    for r in rows.to_dict("records"):
        evals = json.loads(r["evals"]) if isinstance(r.get("evals"), str) and r["evals"] else []
        base = {"trial_id": r.get("trial_id"), "attempt": int(r.get("attempt") or 0)}
        out += [
            {
                **base,
                "step": e.get("step"),
                "tokens": e.get("tokens"),
                "val_loss": e.get("val_loss"),
            }
            for e in evals
            if e
        ]
        per_step = _tokens_per_step(r.get("training"))
        if per_step and _finite(r.get("val_loss")) and _finite(r.get("tokens_trained")):
            out.append(
                {
                    **base,
                    "step": int(round(r["tokens_trained"] / per_step)),
                    "tokens": int(r["tokens_trained"]),
                    "val_loss": float(r["val_loss"]),
                }
            )
    return pd.DataFrame(out, columns=["trial_id", "attempt", "step", "tokens", "val_loss"])


def _tokens_per_step(training: Any) -> int | None:
    """From the row's `training` JSON (TrainConfig.tokens_per_step)."""
    try:
        t = json.loads(training)
        return int(t["batch_size"]) * int(t["seq_len"]) * int(t.get("grad_accum") or 1)
    except (TypeError, ValueError, KeyError):
        return None


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)
