"""A study as a tabular benchmark, in the layout of Syne Tune's blackbox repository
(syne_tune/blackbox_repository/blackbox_tabular.py, `serialize`), so HPO researchers load it with
pandas and numpy alone, or with Syne Tune's `deserialize`:

    <dir>/<study>/hyperparameters.parquet     one row per configuration (candidate), hp_* columns
    <dir>/<study>/configspace.json            each hp_* column's domain (Categorical: the values run)
    <dir>/<study>/fidelityspace.json          hp_tokens: Integer over the token counts measured
    <dir>/<study>/objectives_evaluations.npy  (tasks = 1, configurations, seeds, fidelities, objectives)
    <dir>/<study>/fidelities_values.npy       (fidelities,): training tokens, ascending
    <dir>/<study>/metadata.json               objectives_names, objectives_modes (min/max), task_names,
                                              seeds (the seed of each seed index), metric_default, ...
and, beside them (Syne Tune ignores them):
    <dir>/<study>/architectures.parquet       per configuration: its spec, structure, shape, parameters
    <dir>/<study>/trials.parquet              per exported row: trial_id -> configuration, seed, fidelity

Choices (the conventions leave them open):
- A configuration is a candidate (one resolved spec); its hyperparameters are the axes the search
  sampled (the `axes` column, without the budget solver's outputs) and its budget; rows without
  `axes` stand in the architecture's descriptors. hp_spec is added if those do not tell two apart.
- Seeds: the study's distinct seed values, ascending; `metadata["seeds"][k]` is seed index k.
- Fidelity: training tokens. A row's final evaluation sits at its `tokens_trained`, its periodic
  evaluations (the `evals` column) at theirs; the grid is every token count any row was measured at,
  NaN where a configuration was not. Costs (parameters, FLOPs, bytes, throughput, memory) are the
  same at every fidelity a row reached, as fcnet repeats n_params; wall time is prorated by tokens
  (fcnet_import interpolates elapsed time the same way); other metrics only at the end.
- Values are float64 (Syne Tune writes float32, which rounds parameter counts above 2^24).
- Only ok rows. Two ok rows of one configuration and seed (a point sampled twice) keep the later;
  metadata["repeats_dropped"] names the others.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from benchmark.arch import describe
from benchmark.leaderboard.board import Board
from benchmark.leaderboard.loading import LeaderboardError
from benchmark.store import METRICS, PARAM_COLUMNS

FIDELITY = "hp_tokens"
# What the search adds to a sampled point (candidates.Candidate.config): results of the budget
# solver, not axes.
DERIVED = (*PARAM_COLUMNS, "budget", "count", "budget_distance", "infeasible")
# Per-run measurements that hold at every fidelity the run reached.
STATIC = ("cost",)
MAX_VALUES = (
    100_000_000  # 800 MB of float64: beyond it the dense array is no way to hand a study over
)


def write(board: Board, folder: str | Path) -> list[Path]:
    """Every study of the board, each to <folder>/<study>/; returns the files written."""
    return [p for study in board.studies for p in write_study(board, study, Path(folder) / study)]


def _objectives(rows: pd.DataFrame) -> list:
    """The registry's searchable metrics this study measured (params, whose column depends on the
    study, is there under each count rule: PARAM_COLUMNS)."""
    return [
        m
        for m in METRICS
        if m.searchable
        and "{" not in m.column
        and m.column in rows
        and np.isfinite(pd.to_numeric(rows[m.column], errors="coerce").to_numpy(float)).any()
    ]


def write_study(board: Board, study: str, folder: Path) -> list[Path]:
    rows, dropped, skipped = _rows(board, study)
    configs, seeds = np.sort(rows["candidate"].unique()), np.sort(rows["seed"].unique())
    curves = _curves(rows)
    fidelities = np.unique(
        np.concatenate(
            [rows["tokens_trained"].to_numpy(np.int64), curves["tokens"].to_numpy(np.int64)]
        )
    )
    metrics = _objectives(rows)
    shape = (1, len(configs), len(seeds), len(fidelities), len(metrics))
    if np.prod(shape, dtype=float) > MAX_VALUES:
        raise LeaderboardError(
            f"export {study}: {len(configs)} configurations x {len(seeds)} seeds x "
            f"{len(fidelities)} token counts x {len(metrics)} objectives is more than "
            f"{MAX_VALUES:,} values"
        )
    index = {
        "config": np.searchsorted(configs, rows["candidate"]),
        "seed": np.searchsorted(seeds, rows["seed"]),
        "fidelity": np.searchsorted(fidelities, rows["tokens_trained"]),
    }
    values = np.full(shape, np.nan)
    _fill(values[0], rows, curves, index, fidelities, metrics)
    hps = _hyperparameters(board, rows, configs)
    files = {
        "hyperparameters.parquet": lambda p: hps.to_parquet(p, index=False),
        "configspace.json": lambda p: _json(p, {c: _domain(hps[c]) for c in hps}),
        "fidelityspace.json": lambda p: _json(
            p,
            {
                FIDELITY: {
                    "domain_cls": "Integer",
                    "domain_kwargs": {
                        "lower": int(fidelities.min()),
                        "upper": int(fidelities.max()),
                    },
                }
            },
        ),
        "objectives_evaluations.npy": lambda p: np.save(p, values, allow_pickle=False),
        "fidelities_values.npy": lambda p: np.save(p, fidelities, allow_pickle=False),
        "metadata.json": lambda p: _json(
            p, _metadata(board, study, rows, metrics, seeds, dropped, skipped)
        ),
        "architectures.parquet": lambda p: _architectures(board, study, configs).to_parquet(
            p, index=False
        ),
        "trials.parquet": lambda p: pd.DataFrame(
            {
                "trial_id": rows["trial_id"].to_numpy(),
                "config": index["config"],
                "seed": rows["seed"].to_numpy(),
                "seed_index": index["seed"],
                FIDELITY: rows["tokens_trained"].to_numpy(np.int64),
                "fidelity_index": index["fidelity"],
            }
        ).to_parquet(p, index=False),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, save in files.items():
        save(folder / name)
    return [folder / name for name in files]


def _rows(board: Board, study: str) -> tuple[pd.DataFrame, list[str], list[str]]:
    """The study's ok rows that have a token count, one per configuration and seed (the later of
    a repeat); the trial ids of the repeats dropped and of the rows without tokens_trained."""
    t = board.trials
    if "tokens_trained" not in t:
        raise LeaderboardError(f"export {study}: the results have no tokens_trained (the fidelity)")
    rows = t[(t["study"] == study) & (t["status"] == "ok")]
    seed = rows["seed"] if "seed" in rows else pd.Series(0, index=rows.index)
    rows = rows.assign(seed=seed.fillna(-1).astype(np.int64))  # -1: a row that recorded no seed
    skipped = rows.loc[rows["tokens_trained"].isna(), "trial_id"].tolist()
    rows = rows[rows["tokens_trained"].notna()]
    rows = rows.sort_values("finished_at", kind="stable") if "finished_at" in rows else rows
    repeats = rows.duplicated(["candidate", "seed"], keep="last")
    if not (~repeats).any():
        raise LeaderboardError(f"export {study}: no ok row with tokens_trained")
    return rows[~repeats], rows.loc[repeats, "trial_id"].tolist(), skipped


def _curves(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows' periodic evaluations, long: position (in rows), tokens, val_loss, val_ppl."""
    points = []
    if "evals" in rows:
        for pos, text in enumerate(rows["evals"].tolist()):
            for record in json.loads(text) if isinstance(text, str) and text else []:
                if record.get("tokens") is not None:
                    points.append(
                        {
                            "pos": pos,
                            "tokens": int(record["tokens"]),
                            "val_loss": record.get("val_loss"),
                            "val_ppl": record.get("val_ppl"),
                        }
                    )
    return pd.DataFrame(points, columns=["pos", "tokens", "val_loss", "val_ppl"])


def _fill(
    values: np.ndarray,
    rows: pd.DataFrame,
    curves: pd.DataFrame,
    index: dict,
    fidelities: np.ndarray,
    metrics: list,
) -> None:
    """values (configs, seeds, fidelities, objectives): each row's final measurements, then its
    periodic evaluations."""
    final = rows[[m.column for m in metrics]].apply(pd.to_numeric, errors="coerce").to_numpy(float)
    values[index["config"], index["seed"], index["fidelity"]] = final
    if curves.empty:
        return
    pos = curves["pos"].to_numpy()
    at = (
        index["config"][pos],
        index["seed"][pos],
        np.searchsorted(fidelities, curves["tokens"].to_numpy()),
    )
    share = curves["tokens"].to_numpy(float) / rows["tokens_trained"].to_numpy(float)[pos]
    for j, m in enumerate(metrics):
        if m.intermediate:  # measured at every evaluation (registry: val_loss, val_ppl)
            values[(*at, j)] = pd.to_numeric(curves[m.column], errors="coerce").to_numpy(float)
        elif m.name == "wall_s":
            values[(*at, j)] = final[pos, j] * share
        elif m.kind in STATIC:
            values[(*at, j)] = final[pos, j]


def _hyperparameters(board: Board, rows: pd.DataFrame, configs: np.ndarray) -> pd.DataFrame:
    first = rows.drop_duplicates("candidate").set_index("candidate").loc[configs]
    if "axes" in first and first["axes"].notna().all():
        hps = pd.DataFrame(
            [{k: v for k, v in json.loads(a).items() if k not in DERIVED} for a in first["axes"]]
        )
    else:
        hps = first[["family", *describe.COLUMNS]].reset_index(drop=True)
    # The budget the row was solved for; rows without one, their budget band (bands.py).
    bands = board.candidates.set_index(["study", "candidate"])["band"]
    budget = first["budget"] if "budget" in first else pd.Series(np.nan, index=first.index)
    hps["budget"] = [
        b if pd.notna(b) else bands.get((s, c), np.nan)
        for b, s, c in zip(budget, first["study"], configs)
    ]
    hps = hps.map(lambda v: json.dumps(v, sort_keys=True) if isinstance(v, (list, dict)) else v)
    if hps.duplicated().any():  # the sampled axes do not tell every candidate apart: the spec does
        hps["spec"] = first["spec"].to_numpy() if "spec" in first else configs
    return hps.rename(columns=lambda c: f"hp_{c}")


def _domain(column: pd.Series) -> dict:
    """Syne Tune's config_space.to_dict form of a Categorical over the values the study ran."""
    values = sorted(pd.unique(column.dropna()).tolist(), key=lambda v: (isinstance(v, str), v))
    return {"domain_cls": "Categorical", "domain_kwargs": {"categories": values}}


def _architectures(board: Board, study: str, configs: np.ndarray) -> pd.DataFrame:
    c = board.candidates
    ours = c[c["study"] == study].set_index("candidate").reindex(configs)
    cols = [k for k in ("family", *describe.COLUMNS, *PARAM_COLUMNS, "band", "spec") if k in ours]
    return (
        ours[cols]
        .rename(columns={"band": "budget"})
        .reset_index(names="candidate")
        .assign(config=np.arange(len(configs)))
    )


def _metadata(board: Board, study: str, rows, metrics, seeds, dropped: list, skipped: list) -> dict:
    names = [f"metric_{m.column}" for m in metrics]
    ranked = f"metric_{board.metric.column}"

    def distinct(col):
        return sorted(map(str, pd.unique(rows[col].dropna()))) if col in rows else []

    return {
        "objectives_names": names,
        "objectives_modes": [m.direction for m in metrics],
        "task_names": [study],
        "metric_default": ranked if ranked in names else names[0],
        **({"metric_elapsed_time": "metric_wall_s"} if "metric_wall_s" in names else {}),
        "resource_attr": FIDELITY,
        "seeds": [int(s) for s in seeds],
        "objectives_labels": {n: m.axis_label() for n, m in zip(names, metrics)},
        "source": {
            "study": study,
            "code_version": distinct("code_version"),
            "dataset_id": distinct("dataset_id"),
            "tokenizer_id": distinct("tokenizer_id"),
            "writer": "shapebench board --export",
        },
        "repeats_dropped": dropped,
        "rows_without_tokens": skipped,
    }


def _json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
